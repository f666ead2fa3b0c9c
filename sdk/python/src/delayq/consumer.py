"""Pull consumers over HTTP: receive due orders of a group from ``delayq serve``, handle
them here, and settle each by its receipt (``ack``, ``nack``, ``extend``).

Talks to the HTTP pull API only (``POST /v1/queues/{q}/groups/{g}:receive``, ``:ack``,
``:nack``, ``:extend``; see the top-level README, "Consumers in other languages"); no
Redis access is needed. Limits (``max``, ``lease_ms``, ``retry_in_ms``) are the server's:
a value out of range is answered 400 ``invalid_option`` naming the field and changes
nothing. Retries, ``max_attempts``, dead letters, history and metrics are the engine's own.

    consumer = delayq.Consumer("http://127.0.0.1:8080", token, "order-close", "close")
    for d in consumer.receive(max=10):
        close_order(d.id, d.payload)
        consumer.ack(d)
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

from ._http import Transport
from ._acks import AckBatch
from ._leases import _Leases
from .errors import ApiError, ApiUnreachable, InvalidInput, LeaseLost

log = logging.getLogger("delayq.consumer")

#: The lease of a receive or an extension unless one is given (the server's own default
#: for a receive, DEFAULT_LEASE in src/engine/worker/pull/mod.rs).
DEFAULT_LEASE_MS = 30_000
#: Seconds every HTTP call may take at most (past a receive's own wait), unless the
#: consumer is given another.
DEFAULT_TIMEOUT = 10.0
#: ``run``: how long each receive waits on the server for an order (a long poll; the
#: server's limit is 20,000 ms). A stop takes effect once the receive in flight returns.
DEFAULT_WAIT_MS = 5_000
#: ``run``: seconds the running handlers get to finish after a stop.
DEFAULT_GRACE = 30.0
#: ``run``: the first and the longest pause after a failed receive (seconds).
IDLE_MIN = 0.05
FAILURE_MAX = 5.0


@dataclass
class Delivery:
    """One order handed out by :meth:`Consumer.receive`."""

    id: str
    #: The payload, parsed.
    payload: Any
    #: The payload's JSON text, byte for byte as scheduled.
    payload_json: str
    priority: str
    #: 1 on the first delivery, 2 on the first retry, ...
    attempt: int
    due_at_ms: int
    dispatched_at_ms: int
    #: Opaque; settles this delivery. :meth:`Consumer.extend` replaces it.
    receipt: str = field(repr=False)
    #: When the lease given by the receive ends (unix ms, the server's clock).
    lease_until_ms: int = 0
    enqueued_at_ms: Optional[int] = None
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None
    #: The order's key (issue 42), when it has one.
    key: Optional[str] = None


ReceiptLike = Union[Delivery, str]


class RunReport(NamedTuple):
    """What :meth:`Consumer.run` did: deliveries acknowledged, nacked (the handler raised),
    and settlements refused because the lease had been lost meanwhile."""

    acked: int
    nacked: int
    lease_lost: int


# --- the raw payload text of each delivery -------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _value_spans(s: str, i: int) -> Tuple[List[Tuple[Optional[str], int, int]], int]:
    """The members of the JSON object or array starting at ``s[i]``: (key or None, start,
    end) of each value, and the index past the closing bracket."""
    close = {"{": "}", "[": "]"}[s[i]]
    out: List[Tuple[Optional[str], int, int]] = []
    i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
    if s[i] == close:
        return out, i + 1
    while True:
        key = None
        if close == "}":
            key, i = scanstring(s, i + 1)
            i = _WS.match(s, i).end()  # type: ignore[union-attr]
            if s[i] != ":":
                raise ValueError(f"':' expected at {i}")
            i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
        _, end = _DECODER.raw_decode(s, i)
        out.append((key, i, end))
        i = _WS.match(s, end).end()  # type: ignore[union-attr]
        if s[i] == close:
            return out, i + 1
        if s[i] != ",":
            raise ValueError(f"',' expected at {i}")
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]


def _deliveries(text: str) -> List[Delivery]:
    """The deliveries of a ``:receive`` answer, each payload kept as its exact text."""
    start = _WS.match(text, 0).end()  # type: ignore[union-attr]
    top, _ = _value_spans(text, start)
    spans = [(a, b) for k, a, b in top if k == "deliveries"]
    if not spans:
        raise ValueError("no 'deliveries' in the answer")
    items, _ = _value_spans(text, spans[0][0])
    out = []
    for _, a, b in items:
        obj = json.loads(text[a:b])
        raw = next(text[x:y] for k, x, y in _value_spans(text, a)[0] if k == "payload")
        out.append(
            Delivery(
                id=obj["id"],
                payload=obj["payload"],
                payload_json=raw,
                priority=obj.get("priority", "normal"),
                attempt=obj["attempt"],
                due_at_ms=obj["due_at_ms"],
                dispatched_at_ms=obj["dispatched_at_ms"],
                receipt=obj["receipt"],
                lease_until_ms=obj.get("lease_until_ms", 0),
                enqueued_at_ms=obj.get("enqueued_at_ms"),
                traceparent=obj.get("traceparent"),
                tracestate=obj.get("tracestate"),
                key=obj.get("key"),
            )
        )
    return out


def _receipts(what: Union[ReceiptLike, Iterable[ReceiptLike]]) -> List[ReceiptLike]:
    if isinstance(what, (Delivery, str)):
        return [what]
    out = list(what)
    for r in out:
        if not isinstance(r, (Delivery, str)):
            raise InvalidInput("invalid_option", f"receipts: {type(r).__name__} is neither a Delivery nor a receipt string")
    return out


def _receipt(r: ReceiptLike) -> str:
    return r.receipt if isinstance(r, Delivery) else r


def _fatal(e: BaseException) -> bool:
    """A receive failure asking again will not cure: a 4xx other than 429."""
    return isinstance(e, ApiError) and e.status < 500 and e.status != 429


def _error_text(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Consumer:
    """A pull consumer of one group of one queue, over the HTTP API (synchronous; every
    call bounded by ``timeout`` seconds). ``token`` is sent as ``Authorization: Bearer``
    and appears in no error, log line or repr. Thread-safe: each thread keeps its own
    connection open between calls (see ``delayq._http``).
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str],
        queue: str,
        group: str,
        lease_ms: int = DEFAULT_LEASE_MS,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidInput("invalid_option", f"base_url: {base_url!r} is not an http(s) URL")
        if parts.username is not None or parts.password is not None:
            raise InvalidInput("invalid_option", "base_url: credentials in the URL are not accepted (pass token)")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InvalidInput("invalid_option", f"timeout: {timeout!r} is not a positive number of seconds")
        for name, v in (("queue", queue), ("group", group)):
            if not isinstance(v, str) or not v:
                raise InvalidInput("invalid_option", f"{name}: {v!r} is not a name")
        self.base_url = base_url.rstrip("/")
        self.queue = queue
        self.group = group
        self.lease_ms = lease_ms
        self.timeout = float(timeout)
        self._http = Transport(self.base_url, token, self.timeout)
        self._path = f"/v1/queues/{urllib.parse.quote(queue, safe='')}/groups/{urllib.parse.quote(group, safe='')}"

    def __repr__(self) -> str:
        return f"Consumer(base_url={self.base_url!r}, queue={self.queue!r}, group={self.group!r}, lease_ms={self.lease_ms})"

    def _call(self, action: str, body: Dict[str, Any], wait: float = 0.0) -> str:
        """POSTs ``body`` to ``.../{group}:{action}`` (bounded by the timeout plus ``wait``
        seconds) over this thread's kept-alive connection; the answer's text, or an error."""
        return self._http.post(f"{self._path}:{action}", body, f"{action} on {self.queue}/{self.group}", wait)

    def close(self) -> None:
        """Closes the calling thread's kept-alive connection (optional: connections close
        with their threads; a later call opens a new one)."""
        self._http.close()

    def receive(self, max: int = 10, lease_ms: Optional[int] = None, wait_ms: int = 0) -> List[Delivery]:  # noqa: A002
        """Up to ``max`` due deliveries of the group, each leased for ``lease_ms`` (default:
        the consumer's). When nothing is due, the server waits up to ``wait_ms`` (a long
        poll, 0..=20000) for an order and answers as soon as one can be received; empty when
        none came (or the server is shutting down)."""
        body: Dict[str, Any] = {"max": max, "lease_ms": self.lease_ms if lease_ms is None else lease_ms}
        if wait_ms:
            body["wait_ms"] = wait_ms
        wait = wait_ms / 1000.0 if isinstance(wait_ms, (int, float)) and wait_ms > 0 else 0.0
        return _deliveries(self._call("receive", body, wait))

    def ack(self, what: Union[ReceiptLike, Iterable[ReceiptLike]]) -> List[str]:
        """Acknowledges deliveries (``Delivery`` objects or receipts): their status in order,
        ``"acked"`` or ``"lease_lost"``. Raises :class:`LeaseLost` when every lease was lost."""
        rs = _receipts(what)
        if not rs:
            return []
        text = self._call("ack", {"receipts": [_receipt(r) for r in rs]})
        return [r["status"] for r in json.loads(text)["results"]]

    def nack(
        self,
        delivery: ReceiptLike,
        retry_in_ms: Optional[int] = None,
        dead: bool = False,
        error: Optional[str] = None,
    ) -> None:
        """Gives a delivery back: retried after ``retry_in_ms`` (default: the group's
        backoff; dead-lettered once ``max_attempts`` is reached), or with ``dead=True``
        straight to the dead letters. ``error`` is kept as the failure's text. Raises
        :class:`LeaseLost` when the lease was lost."""
        body: Dict[str, Any] = {"receipt": _receipt(delivery)}
        if retry_in_ms is not None:
            body["retry_in_ms"] = retry_in_ms
        if dead:
            body["dead"] = True
        if error is not None:
            body["error"] = error
        self._call("nack", body)

    def extend(
        self, what: Union[ReceiptLike, Iterable[ReceiptLike]], lease_ms: Optional[int] = None
    ) -> List[Optional[str]]:
        """Extends leases to ``lease_ms`` from now (default: the consumer's). Each extended
        delivery gets a new receipt (the old one no longer settles it): ``Delivery`` objects
        are updated in place; the new receipts are returned in order, ``None`` where the
        lease was lost. Raises :class:`LeaseLost` when every lease was lost."""
        rs = _receipts(what)
        if not rs:
            return []
        lease = self.lease_ms if lease_ms is None else lease_ms
        text = self._call("extend", {"receipts": [_receipt(r) for r in rs], "lease_ms": lease})
        out: List[Optional[str]] = []
        for r, res in zip(rs, json.loads(text)["results"]):
            new = res.get("receipt") if res.get("status") == "extended" else None
            if new is not None and isinstance(r, Delivery):
                r.receipt = new
            out.append(new)
        return out

    def handle(self, handler: Callable[[Delivery], Any], d: Delivery) -> str:
        """Runs ``handler(d)`` and settles ``d``: acked when it returns, nacked with the
        exception's text when it raises. ``"acked"``, ``"nacked"`` or ``"lease_lost"``."""
        try:
            handler(d)
        except Exception as e:  # the handler's failure is the order's, not the loop's
            return self._settle(d, e)
        return self._settle(d, None)

    def _settle(self, d: Delivery, failure: Optional[BaseException]) -> str:
        """Acks ``d`` (no failure) or nacks it with the failure's text."""
        try:
            if failure is not None:
                self.nack(d, error=_error_text(failure))
                return "nacked"
            return "acked" if self.ack(d) == ["acked"] else "lease_lost"
        except LeaseLost:
            return "lease_lost"

    def run(
        self,
        handler: Callable[[Delivery], Any],
        concurrency: int = 1,
        stop: Optional[threading.Event] = None,
        wait_ms: int = DEFAULT_WAIT_MS,
        grace: float = DEFAULT_GRACE,
    ) -> RunReport:
        """Receives and handles deliveries until ``stop`` is set: ``handler(delivery)`` on
        up to ``concurrency`` threads, acked when it returns, nacked with the exception's
        text when it raises (retried with the group's backoff). Handlers that return while
        an ack call is in flight are acked together by the next call (up to 100).

        - Each receive is a long poll of up to ``wait_ms``: the server answers as soon as
          an order can be received; no pause is made between receives.
        - A handler still running half its lease after the receive (or the last extension)
          gets its lease extended by the consumer's ``lease_ms``, for as long as it runs.
        - Once ``stop`` is set no new receive is made (the one in flight returns within
          ``wait_ms`` and its deliveries are handled); the running handlers get ``grace``
          seconds to finish. Past it ``run`` returns, their leases are no longer extended
          and are left to run out (not nacked: a handler may still complete its work), so
          another consumer gets those orders after the lease, at the next attempt.

        A 4xx on receive (bad token, unknown queue, a group of another kind) is raised;
        transient failures are logged and retried with backoff."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput("invalid_option", f"concurrency: {concurrency!r} is not a positive integer")
        stop = stop or threading.Event()
        counts = {"acked": 0, "nacked": 0, "lease_lost": 0}
        lock = threading.Condition()
        running = [0]
        slots = threading.Semaphore(concurrency)
        failure_pause = IDLE_MIN
        leases = _Leases(self)
        acks = AckBatch(self)

        def one(d: Delivery) -> None:
            held = leases.hold(d)
            try:
                failure: Optional[BaseException] = None
                try:
                    handler(d)
                except Exception as e:  # the handler's failure is the order's, not the loop's
                    failure = e
                with held.lock:
                    leases.release(held)
                    if held.lost:
                        outcome = "lease_lost"
                    else:
                        try:
                            # Successes share :ack calls with the handlers finishing meanwhile.
                            outcome = self._settle(d, failure) if failure is not None else acks.ack(d)
                        except Exception as e:  # ack/nack could not be sent: the lease expires
                            log.warning("settling %s failed, its lease will run out: %s", d.id, e)
                            return
                with lock:
                    counts[outcome] += 1
            finally:
                with lock:
                    running[0] -= 1
                    lock.notify_all()
                slots.release()

        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="delayq-consumer")
        leases.start()
        try:
            while not stop.is_set():
                slots.acquire()
                free = 1
                while free < concurrency and slots.acquire(blocking=False):
                    free += 1
                try:
                    got = [] if stop.is_set() else self.receive(max=free, wait_ms=wait_ms)
                except (ApiError, ApiUnreachable) as e:
                    if _fatal(e):
                        for _ in range(free):
                            slots.release()
                        raise
                    log.warning("receive failed, asking again in %.2f s: %s", failure_pause, e)
                    for _ in range(free):
                        slots.release()
                    stop.wait(failure_pause)
                    failure_pause = min(failure_pause * 2, FAILURE_MAX)
                    continue
                failure_pause = IDLE_MIN
                for _ in range(free - len(got)):
                    slots.release()
                for d in got:
                    with lock:
                        running[0] += 1
                    pool.submit(one, d)
        finally:
            with lock:
                lock.wait_for(lambda: running[0] == 0, timeout=grace)
            leases.close()
            pool.shutdown(wait=False)
        return RunReport(counts["acked"], counts["nacked"], counts["lease_lost"])


class AsyncConsumer:
    """The asyncio :class:`Consumer`: the same calls, each HTTP request run in a worker
    thread (``asyncio.to_thread``) so the event loop never blocks; the same timeout."""

    def __init__(
        self,
        base_url: str,
        token: Optional[str],
        queue: str,
        group: str,
        lease_ms: int = DEFAULT_LEASE_MS,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        self.sync = Consumer(base_url, token, queue, group, lease_ms=lease_ms, timeout=timeout)

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    async def receive(self, max: int = 10, lease_ms: Optional[int] = None, wait_ms: int = 0) -> List[Delivery]:  # noqa: A002
        """As :meth:`Consumer.receive`."""
        return await asyncio.to_thread(self.sync.receive, max, lease_ms, wait_ms)

    async def ack(self, what: Union[ReceiptLike, Iterable[ReceiptLike]]) -> List[str]:
        """As :meth:`Consumer.ack`."""
        return await asyncio.to_thread(self.sync.ack, what)

    async def nack(
        self,
        delivery: ReceiptLike,
        retry_in_ms: Optional[int] = None,
        dead: bool = False,
        error: Optional[str] = None,
    ) -> None:
        """As :meth:`Consumer.nack`."""
        await asyncio.to_thread(self.sync.nack, delivery, retry_in_ms, dead, error)

    async def extend(
        self, what: Union[ReceiptLike, Iterable[ReceiptLike]], lease_ms: Optional[int] = None
    ) -> List[Optional[str]]:
        """As :meth:`Consumer.extend`."""
        return await asyncio.to_thread(self.sync.extend, what, lease_ms)

    async def handle(self, handler: Callable[[Delivery], Any], d: Delivery) -> str:
        """As :meth:`Consumer.handle`; ``handler`` may be a coroutine function."""
        try:
            r = handler(d)
            if inspect.isawaitable(r):
                await r
        except Exception as e:
            return await asyncio.to_thread(self.sync._settle, d, e)
        return await asyncio.to_thread(self.sync._settle, d, None)

    async def run(
        self,
        handler: Callable[[Delivery], Any],
        concurrency: int = 1,
        stop: Optional[asyncio.Event] = None,
        wait_ms: int = DEFAULT_WAIT_MS,
        grace: float = DEFAULT_GRACE,
    ) -> RunReport:
        """As :meth:`Consumer.run` (long polls of ``wait_ms``, leases of running handlers
        extended at half their lease, ``grace`` after ``stop``), with up to ``concurrency``
        handlers running as tasks (``handler`` may be a coroutine function). Handlers still
        running after the grace are cancelled and their leases left to run out."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInput("invalid_option", f"concurrency: {concurrency!r} is not a positive integer")
        stop = stop or asyncio.Event()
        counts = {"acked": 0, "nacked": 0, "lease_lost": 0}
        slots = asyncio.Semaphore(concurrency)
        running: "set[asyncio.Task[None]]" = set()
        held: "Dict[int, Tuple[Delivery, asyncio.Lock, List[float]]]" = {}
        lease_ms = self.sync.lease_ms
        half = lease_ms / 2000.0
        tick = min(max(lease_ms / 8000.0, 0.01), 1.0)
        loop = asyncio.get_running_loop()
        failure_pause = IDLE_MIN

        async def extender() -> None:
            while True:
                await asyncio.sleep(tick)
                now = loop.time()
                due = [(k, d, lk, at) for k, (d, lk, at) in list(held.items()) if at[0] <= now and not lk.locked()]
                if not due:
                    continue
                for _, _, lk, _ in due:
                    await lk.acquire()
                try:
                    try:
                        news = await self.extend([d for _, d, _, _ in due])
                    except LeaseLost:
                        news = [None] * len(due)
                    for (k, _, _, at), new in zip(due, news):
                        if new is None:
                            held.pop(k, None)
                            at[0] = float("inf")
                        else:
                            at[0] = loop.time() + half
                except Exception as e:  # tried again next tick
                    log.warning("extending %d leases failed: %s", len(due), e)
                finally:
                    for _, _, lk, _ in due:
                        lk.release()

        async def one(d: Delivery) -> None:
            lk = asyncio.Lock()
            at = [loop.time() + half]
            held[id(d)] = (d, lk, at)
            try:
                failure: Optional[BaseException] = None
                try:
                    r = handler(d)
                    if inspect.isawaitable(r):
                        await r
                except Exception as e:
                    failure = e
                async with lk:
                    held.pop(id(d), None)
                    if at[0] == float("inf"):
                        counts["lease_lost"] += 1
                        return
                    try:
                        counts[await asyncio.to_thread(self.sync._settle, d, failure)] += 1
                    except Exception as e:
                        log.warning("settling %s failed, its lease will run out: %s", d.id, e)
            finally:
                held.pop(id(d), None)
                slots.release()

        ext = asyncio.ensure_future(extender())
        try:
            while not stop.is_set():
                await slots.acquire()
                free = 1
                while free < concurrency and not slots.locked():
                    await slots.acquire()
                    free += 1
                try:
                    got = [] if stop.is_set() else await self.receive(max=free, wait_ms=wait_ms)
                except (ApiError, ApiUnreachable) as e:
                    if _fatal(e):
                        for _ in range(free):
                            slots.release()
                        raise
                    log.warning("receive failed, asking again in %.2f s: %s", failure_pause, e)
                    for _ in range(free):
                        slots.release()
                    try:
                        await asyncio.wait_for(stop.wait(), failure_pause)
                    except asyncio.TimeoutError:
                        pass
                    failure_pause = min(failure_pause * 2, FAILURE_MAX)
                    continue
                failure_pause = IDLE_MIN
                for _ in range(free - len(got)):
                    slots.release()
                for d in got:
                    t = asyncio.ensure_future(one(d))
                    running.add(t)
                    t.add_done_callback(running.discard)
        finally:
            if running:
                _, late = await asyncio.wait(set(running), timeout=grace)
                for t in late:
                    t.cancel()
                if late:
                    await asyncio.gather(*late, return_exceptions=True)
            ext.cancel()
            await asyncio.gather(ext, return_exceptions=True)
        return RunReport(counts["acked"], counts["nacked"], counts["lease_lost"])
