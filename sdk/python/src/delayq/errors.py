"""Errors: the same kinds, and the same stable codes, as the Rust client and the HTTP API.

Every error has a ``code``: the HTTP API's ``error.code`` for the same failure
(``invalid_id``, ``queue_not_found``, ``not_replicated``, ...). Input errors
(:class:`InvalidInput`) and :class:`QueueNotFound` are raised before anything is written.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

#: What a failed write may have done: nothing, or possibly everything it asked.
NOT_APPLIED = "not_applied"
UNKNOWN = "unknown"


class DelayqError(Exception):
    """Base class of every error the SDK raises."""

    code: str = "internal"

    @property
    def write_outcome(self) -> str:
        """``"not_applied"`` (nothing was written) or ``"unknown"`` (it may have been)."""
        return NOT_APPLIED


class InvalidInput(DelayqError, ValueError):
    """The caller passed something invalid; nothing was written.

    ``code`` is one of ``invalid_queue``, ``invalid_namespace``, ``invalid_id``,
    ``invalid_payload``, ``payload_too_large``, ``invalid_delay``, ``invalid_due_time``,
    ``invalid_priority``, ``invalid_timezone``, ``invalid_local_time``, ``batch_too_large``, ``invalid_option``, ``invalid_redis_url``
    (``InvalidInput::code()`` in src/error.rs). In a batch, ``index`` is the position of
    the invalid order.
    """

    def __init__(self, code: str, message: str, index: Optional[int] = None):
        self.code = code
        self.reason = message
        self.index = index
        super().__init__(message if index is None else f"message {index}: {message}")

    def in_batch(self, index: int) -> "InvalidInput":
        """The same error, naming the order's index in a batch."""
        return InvalidInput(self.code, self.reason, index)


class QueueNotFound(DelayqError):
    """The queue is not registered (create it first: ``delayq queue create <queue>``,
    ``PUT /v1/queues/{q}``, or a ``delayq serve`` that dispatches it). Nothing was written."""

    code = "queue_not_found"

    def __init__(self, queue: str):
        self.queue = queue
        super().__init__(
            f"queue {queue!r} does not exist (create it first: delayq queue create {queue})"
        )


class NotReplicated(DelayqError):
    """A durable schedule was not confirmed by enough replicas in time, or its connection
    broke before they answered. The order may be on the leader and may still fire;
    repeating the schedule is safe (idempotent)."""

    code = "not_replicated"

    def __init__(self, acked: int, wanted: int, timeout_ms: int):
        self.acked = acked
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        super().__init__(
            f"the schedule was confirmed by {acked} of {wanted} replicas within {timeout_ms} ms "
            "(or the connection broke before they answered); it may have reached the leader "
            "and may still fire, and repeating it is safe"
        )

    @property
    def write_outcome(self) -> str:
        return UNKNOWN


class RedisFailure(DelayqError):
    """Redis failed, refused a call, or could not be reached. ``write_outcome`` says whether
    a write may have been applied: a refused call (out of memory, a refused connection, a
    script's argument check) wrote nothing; one that timed out or lost its connection after
    it was sent may have.

    ``code``: ``redis_oom``, ``outcome_unknown``, ``redis_unavailable`` or ``internal``,
    as the HTTP API answers."""

    def __init__(self, context: str, cause: BaseException, outcome: str, transient: bool, oom: bool):
        self.context = context
        self.cause = cause
        self._outcome = outcome
        self.transient = transient
        if oom:
            self.code = "redis_oom"
        elif outcome == UNKNOWN:
            self.code = "outcome_unknown"
        elif transient:
            self.code = "redis_unavailable"
        else:
            self.code = "internal"
        super().__init__(f"redis error while {context}: {type(cause).__name__}: {cause}")

    @property
    def write_outcome(self) -> str:
        return self._outcome


class PartialBatch(DelayqError):
    """A batch failed part way: some of its script calls were applied, others were not or
    may have been. ``results`` holds ``(id, outcome)`` for every order in batch order, with
    outcome ``created``, ``updated``, ``unchanged``, ``not_written`` or ``unknown``;
    repeating the batch is safe (scheduling by id is idempotent)."""

    code = "partial_write"

    def __init__(self, results: Sequence[Tuple[str, str]], cause: DelayqError):
        self.results: List[Tuple[str, str]] = list(results)
        self.cause = cause
        written = sum(1 for _, o in self.results if o in ("created", "updated", "unchanged"))
        super().__init__(
            f"the batch was partly written ({written} of {len(self.results)} orders written); "
            f"repeating it is safe: {cause}"
        )

    @property
    def write_outcome(self) -> str:
        return UNKNOWN


class ApiError(DelayqError):
    """The HTTP API answered with an error (a :class:`delayq.Consumer` call). ``status`` is
    the HTTP status, ``code`` the API's ``error.code`` (``invalid_option``,
    ``queue_not_found``, ``unauthorized``, ...), ``message`` its text. A 4xx changed
    nothing; a 5xx may have (``write_outcome``). The token is never part of it."""

    def __init__(self, action: str, status: int, code: str, message: str):
        self.action = action
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"{action}: HTTP {status} {code}: {message}")

    @property
    def write_outcome(self) -> str:
        return NOT_APPLIED if self.status < 500 else UNKNOWN


class LeaseLost(ApiError):
    """409 ``lease_lost``: the receipt's lease ran out and the delivery was taken over (or
    it was settled already); nothing was changed. The order is another consumer's now."""


class ApiUnreachable(DelayqError):
    """The HTTP API could not be reached, or did not answer within the call's timeout.
    ``code`` is ``api_unreachable``; a call that was sent may have been applied."""

    code = "api_unreachable"

    def __init__(self, action: str, cause: BaseException, sent: bool):
        self.action = action
        self.cause = cause
        self._sent = sent
        super().__init__(f"{action}: the API did not answer: {type(cause).__name__}: {cause}")

    @property
    def write_outcome(self) -> str:
        return UNKNOWN if self._sent else NOT_APPLIED
