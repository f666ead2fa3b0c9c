"""What the sync and asyncio clients share: options, types, scripts, key names, batch
planning and the reading of replies. No I/O here."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import hashlib
import json
import re
import secrets
import time
from importlib import resources
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import unquote, urlsplit

import redis

from . import rules
from .errors import (
    NOT_APPLIED,
    UNKNOWN,
    DelayqError,
    InvalidInput,
    NotReplicated,
    PartialBatch,
    QueueNotFound,
    RedisFailure,
)

# ---------------------------------------------------------------- scripts


class Script:
    """One vendored copy of a script of the repo's ``lua/`` (byte for byte)."""

    def __init__(self, name: str):
        self.name = name
        self.text: bytes = resources.files("delayq").joinpath("lua", f"{name}.lua").read_bytes()
        self.sha = hashlib.sha1(self.text).hexdigest()


ENQUEUE = Script("enqueue")
CANCEL = Script("cancel")
RESCHEDULE = Script("reschedule")
GET = Script("get")
CREATE_QUEUE = Script("create_queue")
#: Every vendored script, by name.
TAG_BULK = Script("tag_bulk")
ORDER_RULES = Script("order_rules")
SCRIPTS: Dict[str, Script] = {s.name: s for s in (ENQUEUE, CANCEL, RESCHEDULE, GET, CREATE_QUEUE, TAG_BULK, ORDER_RULES)}


def order_rule_fields(prepared: Sequence[Any]) -> List[str]:
    """The record fields of the rules a batch's orders declare (sorted, each once): what
    order_rules.lua registers before the batch is written (src/engine/client/events.rs
    ``register_order_rules``)."""
    return sorted({rules.order_rule_field(r) for p in prepared for r in p.own_rules})

#: Orders per tag_bulk.lua call (src/engine/client/tags.rs ``TAG_BATCH``).
TAG_BATCH = 200

# ---------------------------------------------------------------- public types


class Mode(str, enum.Enum):
    """How ``schedule`` treats an id that is already scheduled."""

    #: Replace its due time and payload (reschedule). The default.
    UPSERT = "upsert"
    #: Leave it untouched.
    IF_ABSENT = "if_absent"


def parse_mode(mode: Any) -> Mode:
    try:
        return Mode(mode)
    except ValueError:
        raise InvalidInput("invalid_option", f"invalid option mode: {mode!r} is not upsert or if_absent") from None


class Priority(str, enum.Enum):
    """An order's priority level (src/engine/priority.rs). A due order goes into its
    level's stream; consumers take ``high`` before ``normal`` before ``low``. Plain strings
    (``"high"``, ``"normal"``, ``"low"``) are accepted wherever a level is."""

    HIGH = "high"
    #: The default.
    NORMAL = "normal"
    LOW = "low"


class Outcome(str, enum.Enum):
    """What scheduling one order did."""

    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    #: Not waiting and dispatched within the queue's dedup window: nothing written.
    DUPLICATE = "duplicate"
    #: An event matching one of the queue's ``cancel_on`` rules arrived first, within the
    #: rule's remember window: nothing written, the order never fires (``Scheduled.event``).
    CANCELLED_BY_EVENT = "cancelled_by_event"


class CancelOutcome(str, enum.Enum):
    CANCELLED = "cancelled"
    #: Never scheduled, already cancelled, or already dispatched.
    NOT_FOUND = "not_found"


class RescheduleOutcome(str, enum.Enum):
    RESCHEDULED = "rescheduled"
    NOT_FOUND = "not_found"


@dataclasses.dataclass(frozen=True)
class Leader:
    """Acknowledge a schedule as soon as the master has run the enqueue script."""


@dataclasses.dataclass(frozen=True)
class Replicated:
    """Acknowledge only once ``replicas`` replicas confirm (``WAIT``) within ``timeout_ms``;
    otherwise :class:`~delayq.NotReplicated` (the order may still fire; retrying is safe)."""

    replicas: int = 1
    timeout_ms: int = 1000


Durability = Union[Leader, Replicated]


@dataclasses.dataclass
class Order:
    """One order of a batch: an id, exactly one of ``delay_ms`` / ``due_ms`` / ``delay`` /
    ``at`` / ``at_local`` (with ``timezone``), a payload (any JSON-serializable value, or :class:`RawJson` text) and a priority
    level (``"high"``, ``"normal"``, the default, or ``"low"``; None is the default too)."""

    id: str
    delay_ms: Optional[int] = None
    due_ms: Optional[int] = None
    payload: Any = None
    delay: Optional[_dt.timedelta] = None
    at: Optional[_dt.datetime] = None
    priority: Union[str, Priority, None] = Priority.NORMAL
    #: A local wall-clock due time (``"2027-03-28T09:00"``, no offset) in ``timezone``
    #: (an IANA name), instead of the fields above; resolved once, when scheduled.
    at_local: Optional[str] = None
    timezone: Optional[str] = None
    #: Not handed to a consumer group later than this many ms past the due time (that
    #: group dead-letters it with reason ``expired``); None: the queue's default, if any.
    expires_after_ms: Optional[int] = None
    #: A debounce instead of a due time (:class:`Debounce` or ``{"delay_ms", "max_wait_ms"}``):
    #: due ``delay_ms`` after each call, never later than ``max_wait_ms`` after the first.
    debounce: Any = None
    #: Schedule it even if it was dispatched within the queue's dedup window.
    repeat: bool = False
    #: Its tags (at most 10, each 1..=128 bytes without control characters): list, count,
    #: cancel or reschedule every order with a tag at once. An upsert replaces the set.
    tags: Optional[Sequence[str]] = None
    #: The order's key (issue 42): due orders are dispatched round robin between keys. An
    #: upsert without a key removes the one the order had.
    key: Optional[str] = None
    #: The order's own cancel-on-event rules (``[{"event": "order.paid", "match":
    #: "order_id", "remember_ms": 900000}]``, checked as a queue's): an event a rule names
    #: whose data matches the payload on its match paths cancels the order.
    cancel_on: Optional[Sequence[Dict[str, Any]]] = None


@dataclasses.dataclass(frozen=True)
class Debounce:
    """An order's debounce (see the Rust ``delayq::Debounce``): each call moves it to now +
    ``delay_ms``, payload replaced, never later than the first call + ``max_wait_ms``."""

    delay_ms: int
    max_wait_ms: int


@dataclasses.dataclass(frozen=True)
class Scheduled:
    """The result of scheduling one order. With ``unchanged`` the stored due time may
    differ from ``due_at_ms`` (see ``get``)."""

    id: str
    due_at_ms: int
    outcome: Outcome
    #: With ``duplicate``: when the id was last dispatched, unix ms.
    dispatched_at_ms: Optional[int] = None
    #: With ``cancelled_by_event``: the name of the event that arrived first.
    event: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ScheduledOrder:
    """A scheduled order as read back by ``get``."""

    id: str
    due_at_ms: int
    #: When it was (last) scheduled, unix ms; None when stored without the encoding.
    enqueued_at_ms: Optional[int]
    #: The payload, parsed (None when the payload entry is missing).
    payload: Any
    #: The payload's exact JSON text as stored (None when missing).
    payload_json: Optional[str]
    #: Its priority level (``normal`` for an order scheduled without one).
    priority: Priority = Priority.NORMAL
    #: A debounced order's ``(first_call_ms, max_due_ms)``, else None.
    debounce: Optional[Tuple[int, int]] = None
    #: Its tags (empty when it has none).
    tags: Tuple[str, ...] = ()
    #: Its key (issue 42), else None.
    key: Optional[str] = None


# ---------------------------------------------------------------- options


@dataclasses.dataclass
class Options:
    namespace: str = "dq"
    max_payload_bytes: int = rules.DEFAULT_MAX_PAYLOAD_BYTES
    durability: Durability = dataclasses.field(default_factory=Leader)
    #: How long a command may wait for its reply, seconds.
    response_timeout: float = 10.0
    #: How long connecting may take, seconds.
    connect_timeout: float = 5.0
    #: Most queues a namespace may have (only used when a record of an older version is
    #: given its epoch, as the Rust client does).
    max_queues: int = 1000
    #: "Now" in unix ms; default: the Redis server's clock (TIME, re-read every 30 s).
    clock: Optional[Callable[[], int]] = None

    def validate(self) -> None:
        rules.check_namespace(self.namespace)
        if isinstance(self.max_payload_bytes, bool) or not isinstance(self.max_payload_bytes, int) or self.max_payload_bytes < 1:
            raise InvalidInput("invalid_option", "invalid option max_payload_bytes: must be at least 1")
        check_durability(self.durability)
        if not (self.response_timeout > 0 and self.connect_timeout > 0):
            raise InvalidInput("invalid_option", "invalid option timeout: response and connect timeouts must be more than zero")
        if not (1 <= self.max_queues <= 1_000_000):
            raise InvalidInput("invalid_option", "invalid option max_queues: must be 1..=1000000")


def check_durability(d: Any) -> None:
    if isinstance(d, Leader):
        return
    if isinstance(d, Replicated):
        ok = (
            isinstance(d.replicas, int) and d.replicas >= 1
            and isinstance(d.timeout_ms, int) and 1 <= d.timeout_ms <= rules.MAX_WAIT_MS
        )
        if ok:
            return
    raise InvalidInput(
        "invalid_option",
        "invalid option durability: replicated durability needs at least one replica and a timeout of 1 ms..=60 s",
    )


# ---------------------------------------------------------------- connections


@dataclasses.dataclass
class Target:
    """A parsed Redis URL: one server, or a cluster's seed nodes."""

    url: Optional[str]
    nodes: List[Tuple[str, int]]
    username: Optional[str]
    password: Optional[str]
    ssl: bool

    @property
    def is_cluster(self) -> bool:
        return self.url is None


def parse_url(url: str) -> Target:
    """``redis://`` / ``rediss://`` (one server) or ``redis+cluster://[user:pass@]h1:p1,h2:p2``
    (``rediss+cluster://`` for TLS), as the Rust client takes them. Error messages never
    repeat the URL (it may hold a password)."""
    if not isinstance(url, str):
        raise InvalidInput("invalid_redis_url", "invalid redis url: must be a string")
    for scheme, ssl in (("redis+cluster://", False), ("rediss+cluster://", True)):
        if url.startswith(scheme):
            rest = url[len(scheme):]
            auth, _, hosts = rest.rpartition("@")
            username = password = None
            if auth:
                u, sep, p = auth.partition(":")
                if sep:
                    username, password = unquote(u) or None, unquote(p)
                else:
                    password = unquote(u)
            nodes = []
            for h in hosts.strip("/").split(","):
                h = h.strip()
                if not h:
                    continue
                host, sep, port = h.rpartition(":")
                if not sep or not port.isdigit():
                    raise InvalidInput("invalid_redis_url", "invalid redis url: a cluster node needs host:port")
                nodes.append((host.strip("[]"), int(port)))
            if not nodes:
                raise InvalidInput("invalid_redis_url", "invalid redis url: a cluster URL needs at least one host:port")
            return Target(None, nodes, username, password, ssl)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise InvalidInput("invalid_redis_url", "invalid redis url: it does not parse") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise InvalidInput("invalid_redis_url", "invalid redis url: the scheme must be redis://, rediss://, redis+cluster:// or rediss+cluster://")
    return Target(url, [], None, None, parts.scheme == "rediss")


def no_retry() -> Any:
    """A redis-py retry policy that never re-sends a command: a write re-sent after a lost
    connection would report another outcome, and a WAIT re-sent on a fresh connection would
    wait for nothing."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


# ---------------------------------------------------------------- keys


class Keys:
    """Key names (src/engine/keys.rs)."""

    def __init__(self, ns: str):
        self.ns = ns

    def tag(self, queue: str, shard: int) -> str:
        return "{%s:%s:%d}" % (self.ns, queue, shard)

    def due(self, queue: str, shard: int) -> str:
        return self.tag(queue, shard) + ":due"

    def payload(self, queue: str, shard: int) -> str:
        return self.tag(queue, shard) + ":payload"

    def meta(self, queue: str, shard: int) -> str:
        return self.tag(queue, shard) + ":meta"

    def levels(self, queue: str, shard: int) -> str:
        """HASH: order id -> ``high`` or ``low``, for the scheduled orders that are not
        normal."""
        return self.tag(queue, shard) + ":levels"

    def queues(self) -> str:
        return "{%s}:queues" % self.ns

    def record(self, queue: str) -> str:
        return "{%s}:queue:%s" % (self.ns, queue)

    def registry_version(self) -> str:
        return "{%s}:registry:version" % self.ns


@dataclasses.dataclass(frozen=True)
class QueueRef:
    shards: int
    epoch: str
    #: The record's ``cancel_on`` field (JSON ``{"v": version, "rules": [...]}``), or None.
    cancel_on: Optional[str] = None

    def rules(self) -> List[Any]:
        """The queue's cancel-on-event rules (a value this version cannot read: none, as
        the Rust client reads it)."""
        return _stored_rules(self.cancel_on)[1]

    def epoch_arg(self) -> str:
        """enqueue.lua's ARGV[3]: ``<epoch>\x1f<rules version>`` ("" for no rules), as the
        Rust client sends it (a producer that computes match tokens)."""
        return self.epoch + "\x1f" + _stored_rules(self.cancel_on)[0]


def _stored_rules(text: Optional[str]) -> Tuple[str, List[Any]]:
    if text is None:
        return "", []
    try:
        stored = json.loads(text)
        v, rs = stored["v"], stored["rules"]
    except (ValueError, TypeError, KeyError):
        return "", []
    if not isinstance(v, str) or not isinstance(rs, list):
        return "", []
    return v, rs


def new_epoch(now_ms: int) -> str:
    """A new epoch token, in the Rust client's form."""
    return f"{now_ms:x}-{secrets.randbits(64):016x}"


#: The registry record's fields a producer reads (``read_record``).
RECORD_FIELDS = ["shards", "epoch", "cancel_on"]


def read_record(reply: Sequence[Any]) -> Tuple[Optional[int], Optional[str], Optional[str]]:
    """HMGET of ``RECORD_FIELDS``: (shards, epoch, cancel_on), each None when absent."""
    shards, epoch, cancel_on = reply
    return (
        int(shards) if shards is not None else None,
        _text(epoch) if epoch is not None else None,
        _text(cancel_on) if cancel_on is not None else None,
    )


def _text(v: Any) -> str:
    return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v)


# ---------------------------------------------------------------- clock


class RedisClock:
    """The Redis server's clock: anchored on TIME, advanced with the monotonic clock,
    re-anchored every 30 s (src/engine/clock.rs)."""

    RESYNC_NS = 30 * 1_000_000_000

    def __init__(self) -> None:
        self.anchor_ms: Optional[int] = None
        self.anchor_mono = 0

    def set(self, time_reply: Sequence[Any]) -> None:
        secs, micros = int(time_reply[0]), int(time_reply[1])
        self.anchor_ms = secs * 1000 + micros // 1000
        self.anchor_mono = time.monotonic_ns()

    def stale(self) -> bool:
        return self.anchor_ms is None or time.monotonic_ns() - self.anchor_mono > self.RESYNC_NS

    def now_ms(self) -> int:
        assert self.anchor_ms is not None
        return self.anchor_ms + (time.monotonic_ns() - self.anchor_mono) // 1_000_000


# ---------------------------------------------------------------- validation


@dataclasses.dataclass
class Prepared:
    id: str
    id_bytes: bytes
    due: int
    payload: rules.RawJson
    #: The level as enqueue.lua takes it (b"" for normal).
    level: bytes = b""
    #: The order's own expires_after, ms (stored in front of the payload).
    expires_after_ms: Optional[int] = None
    #: The time rules as enqueue.lua takes them (``rules.rules_arg``).
    rules: bytes = b""
    #: The stored tag prefix (``rules.encode_tags``; b"" without tags).
    tags: bytes = b""
    #: The order's key, UTF-8 (None: no key).
    key: Optional[bytes] = None
    #: The order's own cancel-on-event rules, checked: (event, paths, remember_ms).
    own_rules: Tuple[Any, ...] = ()


def to_order(o: Any) -> Order:
    if isinstance(o, Order):
        return o
    if isinstance(o, dict):
        return Order(**o)
    raise TypeError(f"an order is a delayq.Order or a dict, got {type(o).__name__}")


def level_of(priority: Any) -> bytes:
    """A checked priority level (None: normal) as enqueue.lua takes it."""
    return rules.lane_arg("normal" if priority is None else rules.check_priority(priority))


def prepare_batch(queue: str, orders: Sequence[Any], now_ms: int, max_payload: int, if_absent: bool = False) -> List[Prepared]:
    """Validates a batch the way ``Client::schedule_many`` does (tests/conformance/README.md,
    "The order of checks"): each order's priority level (as the Rust side parses it before
    the call), the size, the queue name, then each order (id, payload size and depth, due
    time). One invalid order refuses the batch."""
    orders = [to_order(o) for o in orders]
    levels = []
    for i, o in enumerate(orders):
        try:
            levels.append(level_of(o.priority))
        except InvalidInput as e:
            raise e.in_batch(i) from None
    if len(orders) > rules.MAX_BATCH:
        raise InvalidInput("batch_too_large", f"{len(orders)} messages; at most {rules.MAX_BATCH} per call")
    rules.check_queue(queue)
    out = []
    for i, o in enumerate(orders):
        try:
            idb = rules.check_id(o.id)
            p = rules.to_payload(o.payload)
            rules.check_payload(p, max_payload)
            max_wait = None
            if o.debounce is not None:
                delay, max_wait = rules.check_debounce(o.debounce)
                if any(x is not None for x in (o.delay_ms, o.due_ms, o.delay, o.at, o.at_local, o.timezone)):
                    raise InvalidInput(
                        "invalid_option",
                        "invalid option debounce: a debounced order is due its delay after each call: give no other due time",
                    )
                due = rules.resolve_due(now_ms, delay_ms=delay)
            else:
                due = rules.resolve_due(now_ms, o.delay_ms, o.due_ms, o.delay, o.at, o.at_local, o.timezone)
            expires = None if o.expires_after_ms is None else rules.check_expires_after(o.expires_after_ms)
            tags = rules.encode_tags(rules.check_tags(o.tags))
            key = None if o.key is None else rules.check_key(o.key)
            own = tuple(rules.check_cancel_on(o.cancel_on))
        except InvalidInput as e:
            raise e.in_batch(i) from None
        out.append(Prepared(o.id, idb, due, p, levels[i], expires, rules.rules_arg(bool(o.repeat), max_wait), tags, key, own))
    if if_absent:
        for i, o in enumerate(orders):
            if o.debounce is not None:
                raise InvalidInput(
                    "invalid_option",
                    "invalid option debounce: cannot go with if_absent (a debounce moves a waiting order)",
                ).in_batch(i)
    return out


def with_tokens(prepared: List[Prepared], ref: QueueRef) -> List[Prepared]:
    """The orders with their match tokens under the queue's ``cancel_on`` rules stored
    among their tags (after them; src/engine/client/schedule.rs ``stored_texts``); a queue
    without rules: the orders as they are. Recomputed whenever the record is re-read."""
    rule_list = ref.rules()
    if not rule_list and not any(p.own_rules for p in prepared):
        return prepared
    out = []
    for i, p in enumerate(prepared):
        try:
            # The queue's rules, then the order's own (their tokens carry their window).
            tokens = rules.order_tokens(rule_list, p.payload.data) + rules.own_tokens(p.own_rules, p.payload.data)
        except InvalidInput as e:
            raise e.in_batch(i) from None
        if tokens:
            mine = p.tags[1:-1].split(b"\x1f") if p.tags else []
            p = dataclasses.replace(p, tags=rules.encode_tags(mine + [t.encode("utf-8") for t in tokens]))
        out.append(p)
    return out


def single(e: InvalidInput) -> InvalidInput:
    """A single order's error names no batch index."""
    return InvalidInput(e.code, e.reason) if e.index is not None else e


# ---------------------------------------------------------------- enqueue calls


@dataclasses.dataclass
class Call:
    shard: int
    idxs: List[int]


def plan(shards: int, prepared: Sequence[Prepared]) -> List[Call]:
    """Groups a batch by shard (batch order within a shard) and cuts it into calls of at
    most 500 orders and 1 MiB of payload (a single larger order goes alone)."""
    by_shard: List[List[int]] = [[] for _ in range(shards)]
    for i, p in enumerate(prepared):
        by_shard[rules.shard_of(p.id_bytes, shards)].append(i)
    calls = []
    for shard, idxs in enumerate(by_shard):
        start = 0
        while start < len(idxs):
            end, size = start, 0
            while end < len(idxs) and end - start < rules.ENQUEUE_CALL_ORDERS:
                n = len(prepared[idxs[end]].payload.data)
                if end > start and size + n > rules.ENQUEUE_CALL_BYTES:
                    break
                size += n
                end += 1
            calls.append(Call(shard, idxs[start:end]))
            start = end
    return calls


def tag_bulk_step(reply: Any) -> Tuple[int, Optional[bytes], bool]:
    """tag_bulk.lua's ``{affected, last id or false, more}``."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 3:
        raise RedisFailure("cancelling the orders of a tag (tag_bulk.lua)", ValueError("unexpected reply"), NOT_APPLIED, False, False)
    return int(reply[0]), reply[1], int(reply[2]) == 1 and reply[1] is not None


#: The order history (src/engine/history.rs): the record field of a queue's retention (ms),
#: the retention when it says nothing (24 h), the longest (90 days), the bucket length (1 h).
RETENTION_FIELD = "history_ms"
DEFAULT_HISTORY_MS = 24 * 3600 * 1000
MAX_HISTORY_MS = 90 * 24 * 3600 * 1000
HISTORY_BUCKET_MS = 3_600_000


def cancel_record(shard_tag: str, retention: Any, now: int) -> Tuple[str, int]:
    """Where cancel.lua / tag_bulk.lua record a cancellation at ``now`` (src/engine/history.rs
    ``HistoryPolicy::cancel_target``): the shard's history bucket of ``now``
    (``{tag}:history:<bucket ms>:<bucket>``) and its expiry, 0 when the queue keeps no
    history (``retention``: the record's ``history_ms`` as read, None for the default)."""
    try:
        r = DEFAULT_HISTORY_MS if retention is None else int(retention)
    except (TypeError, ValueError):
        r = DEFAULT_HISTORY_MS
    r = min(max(r, 0), MAX_HISTORY_MS)
    b = now // HISTORY_BUCKET_MS
    key = "%s:history:%d:%d" % (shard_tag, HISTORY_BUCKET_MS, b)
    return key, ((b + 1) * HISTORY_BUCKET_MS + r) if r > 0 else 0


def cancel_reason(kind: str, *parts: str) -> str:
    """A cancel record's reason (src/engine/history.rs ``CancelledBy``): ``id``,
    ``tag<US><tag>`` or ``event<US><name><US><event id or empty>``."""
    return "\x1f".join((kind,) + parts)


def tags_key(due: str) -> str:
    """The shard's tag index ZSET (src/engine/keys.rs ``ShardKeys::tags``) beside its due
    ZSET ``{tag}:due``."""
    return due[: -len("due")] + "tags"


def enqueue_args(keys: Keys, queue: str, call: Call, prepared: Sequence[Prepared], epoch: str, if_absent: bool, now_ms: int) -> List[Any]:
    """``EVALSHA <sha> 10 due payload meta levels dispatched tags debounce keyed key_ring
    remembered <mode>[+tags]:<columns> now epoch id due json level ...``: one quadruple per order (level
    ``""`` for normal), then the rules column (``r``, when an order of the call carries
    time rules) and the key column (``k``, when one has a key; ``""`` for none); mode
    ``upsert+tags`` / ``nx+tags`` when one carries tags, as the Rust client sends them."""
    tag = keys.tag(queue, call.shard)
    with_rules = any(prepared[i].rules for i in call.idxs)
    with_keys = any(prepared[i].key is not None for i in call.idxs)
    # The tag index is KEYS[6]; a call with tagged orders says so in its mode.
    tagged = any(prepared[i].tags for i in call.idxs)
    args: List[Any] = [
        "EVALSHA", ENQUEUE.sha, 10,
        keys.due(queue, call.shard), keys.payload(queue, call.shard), keys.meta(queue, call.shard),
        keys.levels(queue, call.shard), tag + ":dispatched", tag + ":tags", tag + ":debounce",
        tag + ":keyed", tag + ":key_ring", tag + ":remembered",
    ]
    mode = ("nx" if if_absent else "upsert") + ("+tags" if tagged else "") + ":" + ("r" if with_rules else "") + ("k" if with_keys else "")
    args += [mode, now_ms, epoch]
    # Bytes all the way (canonical decimal integers), so the encoder passes them through.
    for i in call.idxs:
        p = prepared[i]
        data = stored_body(p)
        args += (p.id_bytes, b"%d" % p.due, data, p.level)
        if with_rules:
            args.append(p.rules)
        if with_keys:
            args.append(p.key or b"")
    return args


def stored_body(p: Prepared) -> bytes:
    """What an order stores after ``<enqueued_ms>:``: ``!<expires_after_ms>!`` (its own
    expiry), then ``\x1e<key>\x1e`` (its key), then ``\x1d<t1>\x1f<t2>\x1d`` (its tags),
    then the payload; an order with none of them stores the payload alone
    (src/engine/message.rs)."""
    data = p.tags + p.payload.data if p.tags else p.payload.data
    if p.key is not None:
        data = b"\x1e" + p.key + b"\x1e" + data
    if p.expires_after_ms is not None:
        data = b"!%d!" % p.expires_after_ms + data
    return data


_CODES = {1: Outcome.CREATED, 2: Outcome.UPDATED, 0: Outcome.UNCHANGED, 3: Outcome.DUPLICATE, 4: Outcome.CANCELLED_BY_EVENT}


def _outcome(c: Any) -> Tuple[Outcome, Any]:
    if not isinstance(c, list):
        return _CODES[int(c)], None
    o = _CODES[int(c[0])]
    if o == Outcome.CANCELLED_BY_EVENT:
        # { 4, token }: the event's name is the token's, up to the space.
        # An order rule's token carries its window: "<event>@<remember ms>".
        return o, _text(c[1]).lstrip("\x01").split(" ", 1)[0].split("@", 1)[0]
    return o, int(c[1])


def outcomes(reply: Any, n: int) -> List[Tuple[Outcome, Any]]:
    """One ``(outcome, extra)`` per order: ``extra`` is a duplicate's last dispatch or a
    debounced order's due time in ms (enqueue.lua answers ``{code, ms}`` for those), the
    event's name for ``cancelled_by_event`` (``{4, token}``), else None."""
    if not isinstance(reply, list) or len(reply) != n:
        raise RedisFailure("scheduling orders (enqueue.lua)", ValueError(f"unexpected reply for {n} orders"), NOT_APPLIED, False, False)
    try:
        return [_outcome(c) for c in reply]
    except (KeyError, ValueError, TypeError, IndexError, UnicodeDecodeError):
        raise RedisFailure("scheduling orders (enqueue.lua)", ValueError("unknown outcome code"), NOT_APPLIED, False, False) from None


def refusal(e: BaseException) -> Optional[str]:
    """``queue_not_found`` / ``stale_epoch`` when enqueue.lua refused the call (nothing
    written), else None."""
    if isinstance(e, redis.ResponseError):
        text = str(e)
        for r in ("queue_not_found", "stale_epoch"):
            if f"delayq {r}" in text:
                return r
    return None


def is_noscript(e: Any) -> bool:
    return isinstance(e, redis.exceptions.NoScriptError) or (
        isinstance(e, redis.ResponseError) and str(e).startswith("NOSCRIPT")
    )


_TRANSIENT_CODES = ("LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "UNBLOCKED", "READONLY")


def wrap(context: str, e: BaseException) -> DelayqError:
    """A redis-py exception as a :class:`RedisFailure` saying whether the write may have
    been applied."""
    if isinstance(e, DelayqError):
        return e
    text = str(e)
    refused = isinstance(e, redis.ConnectionError) and (
        "connecting to" in text or "Connection refused" in text
    )
    if isinstance(e, (redis.TimeoutError, redis.ConnectionError)) and not refused:
        outcome = UNKNOWN
    else:
        outcome = NOT_APPLIED
    # redis-py turns some error codes into classes (and drops the code from the message).
    transient = isinstance(e, (redis.TimeoutError, redis.ConnectionError)) or (
        isinstance(e, redis.ResponseError) and text.split(" ", 1)[0] in _TRANSIENT_CODES
    ) or type(e).__name__ in (
        "ClusterDownError", "TryAgainError", "MovedError", "AskError", "BusyLoadingError",
        "ReadOnlyError", "MasterDownError",
    )
    oom = type(e).__name__ == "OutOfMemoryError" or (
        isinstance(e, redis.ResponseError) and text.startswith("OOM")
    )
    return RedisFailure(context, e, outcome, transient, oom)


def assemble(
    queue: str,
    calls: Sequence[Call],
    results: Sequence[Union[List[Tuple[Outcome, Any]], DelayqError]],
    prepared: Sequence[Prepared],
) -> List[Scheduled]:
    """Per-order results from per-call results; the error the Rust client raises when a call
    failed: the error itself when none succeeded, else :class:`PartialBatch`."""
    per: List[Optional[str]] = [None] * len(prepared)
    extra: List[Any] = [None] * len(prepared)
    failed: Optional[DelayqError] = None
    succeeded = False
    for call, r in zip(calls, results):
        if isinstance(r, DelayqError):
            o = "not_written" if r.write_outcome == NOT_APPLIED else "unknown"
            for i in call.idxs:
                per[i] = o
            # Keep the error that says the least: "may have been written" over "not written".
            if failed is None or failed.write_outcome == NOT_APPLIED:
                failed = r
        else:
            succeeded = True
            for i, (o, ms) in zip(call.idxs, r):
                per[i] = o.value
                extra[i] = ms
    if failed is not None:
        if not succeeded:
            raise failed
        raise PartialBatch([(p.id, o or "unknown") for p, o in zip(prepared, per)], failed)
    out = []
    for p, o, ms in zip(prepared, per, extra):
        if o == Outcome.DUPLICATE.value:
            out.append(Scheduled(p.id, p.due, Outcome(o), ms))
        elif o == Outcome.CANCELLED_BY_EVENT.value:
            out.append(Scheduled(p.id, p.due, Outcome(o), event=ms))
        else:
            out.append(Scheduled(p.id, p.due if ms is None else ms, Outcome(o)))
    return out


def stored_level(v: Any) -> Priority:
    """A level as stored in the levels HASH: absent, or anything but ``high`` / ``low`` (a
    foreign writer's), is normal, as the Rust client reads it."""
    if v is None:
        return Priority.NORMAL
    try:
        return Priority(_text(v))
    except (ValueError, UnicodeDecodeError):
        return Priority.NORMAL


def decode_stored(text: str) -> Tuple[Optional[int], str]:
    """:func:`decode_stored_keyed` without the key."""
    enq, _, body = decode_stored_keyed(text)
    return enq, body


def decode_stored_keyed(text: str) -> Tuple[Optional[int], Optional[str], str]:
    """A stored payload value ``"<enqueued_ms>:<json>"`` as (enqueued ms, JSON text). An order
    scheduled in a trace context (a Rust producer or ``delayq serve`` with ``traceparent``)
    stores ``"<enqueued_ms>:~<traceparent>[;<tracestate>]~<json>"``: the context is left
    out, so the payload reads back byte for byte (``~`` never starts a JSON text)."""
    head, sep, rest = text.partition(":")
    if not sep:
        return None, None, text
    try:
        enq = int(head)
    except ValueError:
        return None, None, text
    if rest.startswith("!"):
        # An order's expires_after ("!<ms>!", src/engine/expiry.rs) comes first.
        m = re.match(r"!([1-9][0-9]*)!", rest)
        if m:
            rest = rest[m.end():]
    key = None
    if rest.startswith("\x1e"):
        # Then its key ("\x1e<key>\x1e", src/engine/order_key.rs).
        end = rest.find("\x1e", 1)
        if end > 1:
            key, rest = rest[1:end], rest[end + 1:]
    if rest.startswith("\x1d"):
        # The order's tags ("\x1d<t1>\x1f<t2>\x1d", src/engine/tags.rs) come next.
        end = rest.find("\x1d", 1)
        if end > 0:
            rest = rest[end + 1:]
    if rest.startswith("~"):
        end = rest.find("~", 1)
        if end > 0:
            rest = rest[end + 1:]
    return enq, key, rest


def decode_get(id: str, reply: Sequence[Any]) -> Optional[ScheduledOrder]:
    """get.lua's ``{score or false, stored or false, level or false, debounce or false}``
    as an order (None: not scheduled)."""
    if not isinstance(reply, (list, tuple)) or len(reply) not in (3, 4):
        raise RedisFailure("reading an order (get.lua)", ValueError("unexpected reply"), NOT_APPLIED, False, False)
    score, raw, level = reply[:3]
    if score is None:
        return None
    due = round(float(score))
    priority = stored_level(level)
    deb = None
    if len(reply) == 4 and reply[3] is not None:
        rec = reply[3].decode() if isinstance(reply[3], (bytes, bytearray)) else str(reply[3])
        first, _, cap = rec.partition(":")
        if first.isdigit() and cap.isdigit():
            deb = (int(first), int(cap))
    if raw is None:
        return ScheduledOrder(id, due, None, None, None, priority, deb)
    text = raw.decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray)) else str(raw)
    enq, key, body = decode_stored_keyed(text)
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        value = body
    return ScheduledOrder(id, due, enq, value, body, priority, deb, stored_tags(text), key)


def stored_tags(text: str) -> Tuple[str, ...]:
    """The tags of a stored value: the list between its first two GS (none: empty; a key
    prefix before them holds no control character), without the cancel-on-event match
    tokens stored among them (they start with \x01; src/engine/events.rs)."""
    start = text.find("\x1d")
    if start < 0:
        return ()
    end = text.find("\x1d", start + 1)
    if end < 0:
        return ()
    inner = text[start + 1:end]
    return tuple(t for t in inner.split("\x1f") if not t.startswith("\x01")) if inner else ()
