"""Input rules: the same checks, in the same order, as the Rust client.

src/engine/keys.rs (names, ids, the shard function), src/engine/message.rs (payloads, due
times, delays), src/engine/priority.rs (priority levels) and src/service/surface.rs (batch
size); the cases every producer must agree on are tests/conformance/inputs.json.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import unicodedata
from typing import Any, List, Optional, Sequence, Tuple, Union

from .errors import InvalidInput

#: Longest queue name or namespace, bytes.
MAX_NAME_LEN = 64
#: Longest order id, bytes of UTF-8.
MAX_ID_LEN = 256
#: The furthest ahead an order may be due: 3,653 days, in ms.
MAX_AHEAD_MS = 3653 * 24 * 3600 * 1000
#: Unix ms of 2000-01-01T00:00:00Z: a ``due_ms`` below it is seconds by mistake (refused,
#: as the Rust ``When`` rules, HTTP and the CLI refuse it); a ``datetime`` may be earlier.
YEAR_2000_MS = 946_684_800_000
#: Deepest nesting of arrays and objects in a payload.
MAX_PAYLOAD_DEPTH = 64
#: Default payload limit: 64 KiB of JSON text.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
#: Most orders in one ``schedule_many`` call.
MAX_BATCH = 10_000
#: Most orders per enqueue.lua call.
ENQUEUE_CALL_ORDERS = 500
#: Most payload bytes per enqueue.lua call.
ENQUEUE_CALL_BYTES = 1 << 20
#: Most shards a queue may have.
MAX_SHARDS = 1024
#: Longest durable WAIT, ms.
MAX_WAIT_MS = 60_000
#: The priority levels, most urgent first (``normal`` is the default).
PRIORITIES = ("high", "normal", "low")

_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*")
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")
# Unicode category Cc: what Rust's char::is_control matches.
_CONTROL = re.compile("[\u0000-\u001f\u007f-\u009f]")


def _check_name(name: Any) -> Optional[str]:
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if name == "":
        return "must not be empty"
    if name in (".", ".."):
        return f"{name!r} is reserved"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_LEN:
        return f"must be at most {MAX_NAME_LEN} bytes, got {size}"
    bad = _NAME_BAD.search(name)
    if bad:
        return f"character {bad.group()!r} is not allowed (use A-Z a-z 0-9 . _ -)"
    return None


def check_queue(name: Any) -> str:
    """Validates a queue name: ``[A-Za-z0-9._-]{1,64}``, not ``.`` or ``..``."""
    reason = _check_name(name)
    if reason:
        raise InvalidInput("invalid_queue", f"invalid queue name {name!r}: {reason}")
    return name


def check_namespace(name: Any) -> str:
    """Validates a key namespace (the queue-name rule)."""
    reason = _check_name(name)
    if reason:
        raise InvalidInput("invalid_namespace", f"invalid namespace {name!r}: {reason}")
    return name


def check_id(id: Any) -> bytes:
    """Validates an order id (1..=256 bytes of UTF-8, no control character); returns its
    UTF-8 bytes."""
    if not isinstance(id, str):
        raise InvalidInput("invalid_id", f"invalid id: must be a string, got {type(id).__name__}")
    try:
        raw = id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("invalid_id", "invalid id: not valid Unicode (a lone surrogate)") from None
    if not raw:
        raise InvalidInput("invalid_id", "invalid id: must not be empty")
    if len(raw) > MAX_ID_LEN:
        raise InvalidInput("invalid_id", f"invalid id: must be at most {MAX_ID_LEN} bytes, got {len(raw)}")
    m = _CONTROL.search(id)
    if m:
        raise InvalidInput("invalid_id", f"invalid id: control character at position {m.start()}")
    return raw


#: Longest order key, in bytes (src/engine/order_key.rs).
MAX_KEY_LEN = 128


def check_key(key: Any) -> bytes:
    """Validates an order's key (issue 42; the id rule: 1..=128 bytes of UTF-8, no control
    character), refused with ``invalid_option`` naming ``key``; returns its UTF-8 bytes."""
    if not isinstance(key, str):
        raise InvalidInput("invalid_option", f"invalid option key: must be a string, got {type(key).__name__}")
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("invalid_option", "invalid option key: not valid Unicode (a lone surrogate)") from None
    if not raw:
        raise InvalidInput("invalid_option", "invalid option key: must not be empty")
    if len(raw) > MAX_KEY_LEN:
        raise InvalidInput("invalid_option", f"invalid option key: must be at most {MAX_KEY_LEN} bytes, got {len(raw)}")
    m = _CONTROL.search(key)
    if m:
        raise InvalidInput("invalid_option", f"invalid option key: control character at position {m.start()}")
    return raw


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit of ``data``."""
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def shard_of(id: Union[str, bytes], shards: int) -> int:
    """The shard of an order id: FNV-1a 64 of its UTF-8 bytes modulo the shard count."""
    if shards <= 1:
        return 0
    data = id.encode("utf-8") if isinstance(id, str) else id
    return fnv1a64(data) % shards


# ---------------------------------------------------------------- priorities

_DEBUG_ESCAPES = {"\0": "\\0", "\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"'}
# What Rust's `{:?}` of a str writes as \u{..}: characters that are not printable (Unicode
# categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs but for the space) and grapheme extenders
# (Mn, Me and the Other_Grapheme_Extend code points).
_UNPRINTABLE = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs", "Mn", "Me"))
_OTHER_GRAPHEME_EXTEND = frozenset(
    [0x09BE, 0x09D7, 0x0B3E, 0x0B57, 0x0BBE, 0x0BD7, 0x0CC2, 0x0CD5, 0x0CD6, 0x0D3E, 0x0D57,
     0x0DCF, 0x0DDF, 0x1B35, 0x200C, 0x302E, 0x302F, 0xFF9E, 0xFF9F, 0x1133E, 0x11357,
     0x114B0, 0x114BD, 0x115AF, 0x11930, 0x1D165, *range(0x1D16E, 0x1D173), *range(0xE0020, 0xE0080)]
)


def rust_debug(text: str) -> str:
    """``text`` quoted as Rust's ``format!("{text:?}")`` writes it (the error messages of
    the Rust client quote what they refuse this way)."""
    out = ['"']
    for ch in text:
        esc = _DEBUG_ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch != " " and (unicodedata.category(ch) in _UNPRINTABLE or ord(ch) in _OTHER_GRAPHEME_EXTEND):
            out.append("\\u{%x}" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def check_priority(level: Any) -> str:
    """Validates a priority level, as ``Priority::parse``: exactly ``high``, ``normal`` or
    ``low`` (no other spelling, case or whitespace); returns its name."""
    if isinstance(level, str):
        for name in PRIORITIES:
            if level == name:
                return name
        raise InvalidInput("invalid_priority", f"invalid priority: {rust_debug(level)} is not high, normal or low")
    raise InvalidInput(
        "invalid_priority",
        f"invalid priority: must be a string (high, normal or low), got {type(level).__name__}",
    )


def lane_arg(level: str) -> bytes:
    """A checked level as enqueue.lua takes it: ``b""`` for normal (the cheapest
    argument), else its name."""
    return b"" if level == "normal" else level.encode("ascii")


# ---------------------------------------------------------------- payloads


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _ignore_number(text: str) -> int:
    return 0


_TOKEN = re.compile(
    r'[ \t\n\r]*(?:(?P<s>"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*")'
    r"|(?P<n>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
    r"|(?P<l>true|false|null)|(?P<p>[\[\]{}:,]))"
)
_WS = re.compile(r"[ \t\n\r]*")


def _valid_json_iterative(text: str) -> bool:
    """RFC 8259 validity without recursion (for payloads nested too deep for ``json``)."""
    pos, n = 0, len(text)
    stack = []  # '[' or '{'
    # states: 'value' (a value is expected), 'after' (a value just ended), 'key' (an object
    # key or '}' expected), 'key_only' (a key expected after ','), 'colon'
    state = "value"
    first_in_container = False
    while True:
        m = _TOKEN.match(text, pos)
        if not m:
            return _WS.match(text, pos).end() == n and state == "after" and not stack
        pos = m.end()
        kind = m.lastgroup
        tok = m.group(kind)
        if state == "value":
            if kind in ("s", "n", "l"):
                state = "after"
            elif tok in "[{":
                stack.append(tok)
                state = "value" if tok == "[" else "key"
                first_in_container = True
                continue
            elif tok == "]" and first_in_container and stack and stack[-1] == "[":
                stack.pop()
                state = "after"
            else:
                return False
            first_in_container = False
        elif state in ("key", "key_only"):
            if kind == "s":
                state = "colon"
            elif tok == "}" and state == "key" and first_in_container:
                stack.pop()
                state = "after"
            else:
                return False
            first_in_container = False
        elif state == "colon":
            if tok != ":":
                return False
            state = "value"
        else:  # after
            if not stack:
                return False  # a second value
            if tok == ",":
                state = "value" if stack[-1] == "[" else "key_only"
            elif (tok == "]" and stack[-1] == "[") or (tok == "}" and stack[-1] == "{"):
                stack.pop()
            else:
                return False


def _is_valid_json(text: str) -> bool:
    try:
        json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_ignore_number,
            parse_float=_ignore_number,
        )
        return True
    except RecursionError:
        return _valid_json_iterative(text)
    except ValueError:
        return False


_STR_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON text (brackets inside strings do not
    count); the same scan as the Rust client's."""
    depth = best = 0
    for m in _STR_OR_BRACKET.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > best:
                best = depth
        elif c in "]}":
            depth = depth - 1 if depth else 0
    return best


class RawJson:
    """A payload given as its exact JSON text, stored and delivered byte for byte.

    Refused (``invalid_payload``) unless it is exactly one valid JSON value, like the Rust
    client's ``Payload::from_json``.
    """

    __slots__ = ("text", "data")

    def __init__(self, text: Union[str, bytes]):
        if isinstance(text, (bytes, bytearray, memoryview)):
            try:
                text = bytes(text).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput("invalid_payload", "invalid payload: not valid UTF-8") from None
        if not isinstance(text, str):
            raise InvalidInput("invalid_payload", f"invalid payload: RawJson takes text, got {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput("invalid_payload", "invalid payload: not valid Unicode (a lone surrogate)") from None
        if not _is_valid_json(text):
            raise InvalidInput("invalid_payload", "invalid payload: not valid JSON (exactly one JSON value)")
        self.text = text
        self.data = data

    def __repr__(self) -> str:
        short = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"RawJson({short!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawJson) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def to_payload(payload: Any) -> RawJson:
    """A payload: ``RawJson`` as is; any other value serialized compactly as JSON (like
    ``serde_json::to_string``: no spaces, non-ASCII kept, NaN refused)."""
    if isinstance(payload, RawJson):
        return payload
    try:
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise InvalidInput("invalid_payload", f"invalid payload: cannot be serialized as JSON ({e})") from None
    out = RawJson.__new__(RawJson)
    out.text = text
    try:
        out.data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("invalid_payload", "invalid payload: not valid Unicode (a lone surrogate)") from None
    return out


def check_payload(p: RawJson, max_bytes: int) -> None:
    """Size, then depth (the JSON text was checked when the payload was built)."""
    if len(p.data) > max_bytes:
        raise InvalidInput(
            "payload_too_large",
            f"payload too large: {len(p.data)} bytes, the limit is {max_bytes} bytes",
        )
    # Cheap first: the depth is at most the number of opening brackets.
    if p.text.count("[") + p.text.count("{") <= MAX_PAYLOAD_DEPTH:
        return
    depth = json_depth(p.text)
    if depth > MAX_PAYLOAD_DEPTH:
        raise InvalidInput(
            "invalid_payload",
            f"invalid payload: nested {depth} levels deep; at most {MAX_PAYLOAD_DEPTH} levels of arrays and objects",
        )


# ---------------------------------------------------------------- due times

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MS = _dt.timedelta(milliseconds=1)


def _int(v: Any, code: str, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidInput(code, f"{what}: must be an integer number of milliseconds, got {type(v).__name__}")
    return v


_LOCAL = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?")
_WITH_OFFSET = re.compile(r"(.*)(?:[Zz]|[+-]..:..)", re.S)
_ZONES: Optional[dict] = None


def _bad_local(reason: str) -> InvalidInput:
    return InvalidInput("invalid_local_time", f"invalid at_local: {reason}")


def parse_local(at_local: Any) -> _dt.datetime:
    """``at_local`` as a naive datetime, as ``When::parse_local`` reads it:
    ``YYYY-MM-DDTHH:MM``, optionally ``:SS`` and a fraction (cut to milliseconds), no
    offset."""
    if not isinstance(at_local, str):
        raise _bad_local(f"must be a string, got {type(at_local).__name__}")
    m = _LOCAL.fullmatch(at_local)
    if m is None:
        o = _WITH_OFFSET.fullmatch(at_local)
        if o is not None and _LOCAL.fullmatch(o.group(1)):
            raise _bad_local(
                f"{rust_debug(at_local)} has a UTC offset: at_local is a wall-clock time in `timezone`, "
                "without one (or give due_at instead)"
            )
        raise _bad_local(f"{rust_debug(at_local)} is not a local date-time YYYY-MM-DDTHH:MM[:SS[.fff]]")
    y, mo, d, h, mi, sec, frac = m.groups()
    try:
        ms = int((frac or "0")[:3].ljust(3, "0"))
        return _dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec or 0), ms * 1000)
    except ValueError:
        raise _bad_local(f"{rust_debug(at_local)} is not a valid date and time") from None


def lookup_timezone(name: Any) -> Any:
    """The IANA time zone ``name`` (case-insensitive, surrounding whitespace ignored), as
    the Rust client looks it up; ``invalid_timezone`` otherwise."""
    import zoneinfo

    global _ZONES
    if isinstance(name, str):
        key = name.strip()
        if _ZONES is None:
            _ZONES = {z.lower(): z for z in zoneinfo.available_timezones()}
            _ZONES.setdefault("utc", "UTC")
        canonical = _ZONES.get(key.lower())
        if canonical is not None:
            return zoneinfo.ZoneInfo(canonical)
    shown = rust_debug(name.strip()) if isinstance(name, str) else repr(name)
    raise InvalidInput(
        "invalid_timezone",
        f"invalid timezone: unknown time zone {shown} (use an IANA name such as Europe/Berlin, "
        "America/New_York or UTC)",
    )


def local_to_ms(local: _dt.datetime, zone: Any) -> int:
    """The instant of the wall time ``local`` in ``zone``, by the recurring schedules'
    rules: itself when it exists once, its first occurrence when it happens twice (fall
    back), the first instant after the gap when it does not exist (spring forward)."""
    first = local.replace(tzinfo=zone, fold=0)
    utc = first.astimezone(_dt.timezone.utc)
    if utc.astimezone(zone).replace(tzinfo=None) == local:
        return (utc - _EPOCH) // _MS
    # In a gap: the transition lies between the wall time read with the offset after it
    # and with the one before it; find its second.
    naive_s = (local.replace(tzinfo=_dt.timezone.utc) - _EPOCH) // _dt.timedelta(seconds=1)
    before = first.utcoffset() // _dt.timedelta(seconds=1)
    after = local.replace(tzinfo=zone, fold=1).utcoffset() // _dt.timedelta(seconds=1)
    lo, hi = naive_s - max(before, after), naive_s - min(before, after)
    off_lo = _dt.datetime.fromtimestamp(lo, zone).utcoffset()
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _dt.datetime.fromtimestamp(mid, zone).utcoffset() == off_lo:
            lo = mid
        else:
            hi = mid
    return hi * 1000


#: Most tags per order, and the longest tag in bytes (src/engine/tags.rs).
MAX_TAGS = 10
MAX_TAG_LEN = 128


def check_tags(tags: Any) -> List[bytes]:
    """An order's tags, as ``engine::tags::validate``: at most 10 strings, each 1..=128
    bytes of UTF-8 without a control character, none twice; anything else is refused with
    ``invalid_option`` naming ``tags``. Returns them as UTF-8 bytes."""
    def bad(reason: str) -> InvalidInput:
        return InvalidInput("invalid_option", f"invalid option tags: {reason}")

    if tags is None:
        return []
    if isinstance(tags, (str, bytes)) or not isinstance(tags, (list, tuple)):
        raise bad("must be a list of strings")
    if len(tags) > MAX_TAGS:
        raise bad(f"at most {MAX_TAGS} tags per order, got {len(tags)}")
    out: List[bytes] = []
    for i, t in enumerate(tags):
        if not isinstance(t, str):
            raise bad("must be a list of strings")
        try:
            raw = t.encode("utf-8")
        except UnicodeEncodeError:
            raise bad(f"tag {i}: not valid Unicode (a lone surrogate)") from None
        if not raw:
            raise bad(f"tag {i}: must not be empty")
        if len(raw) > MAX_TAG_LEN:
            raise bad(f"tag {i}: must be at most {MAX_TAG_LEN} bytes, got {len(raw)}")
        m = _CONTROL.search(t)
        if m:
            raise bad(f"tag {i}: control character at position {m.start()}")
        if raw in out:
            raise bad(f"tag {i} ({t!r}) is given twice")
        out.append(raw)
    return out


def encode_tags(tags: Sequence[bytes]) -> bytes:
    """The stored tag prefix ``\\x1d<t1>\\x1f<t2>\\x1d`` (no tags: empty)."""
    return b"\x1d" + b"\x1f".join(tags) + b"\x1d" if tags else b""


def check_expires_after(ms: Any) -> int:
    """An order's ``expires_after`` in ms, as ``engine::expiry::check_ms``: a whole number
    1 ..= 10 years (``MAX_AHEAD_MS``); zero, negative and anything else are refused with
    ``invalid_option`` naming the field. See src/engine/expiry.rs for what it does."""
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise InvalidInput("invalid_option", f"invalid option expires_after: must be whole milliseconds, got {ms!r}")
    if ms < 1 or ms > MAX_AHEAD_MS:
        hint = " (leave it out for no expiry)" if ms == 0 else ""
        raise InvalidInput("invalid_option", f"invalid option expires_after: must be 1ms..=10 years (3653d), got {ms} ms{hint}")
    return ms


def resolve_due(
    now_ms: int,
    delay_ms: Optional[int] = None,
    due_ms: Optional[int] = None,
    delay: Optional[_dt.timedelta] = None,
    at: Optional[_dt.datetime] = None,
    at_local: Optional[str] = None,
    timezone: Optional[str] = None,
) -> int:
    """The due time in unix ms from exactly one of ``delay_ms``, ``due_ms``, ``delay``
    (a ``timedelta``), ``at`` (an aware ``datetime``) or ``at_local`` with ``timezone``
    (a local wall-clock time and its IANA zone), as ``When::resolve`` does:
    delays 0..=3,653 days; due times from 1970 to now + 3,653 days (the past is allowed),
    ``due_ms`` from the year 2000 (a smaller number is seconds by mistake)."""
    given = [x is not None for x in (delay_ms, due_ms, delay, at)]
    if at_local is not None and any(given):
        raise _bad_local("at_local is a due time of its own: give it without delay_ms or due_at")
    if at_local is not None and timezone is None:
        raise InvalidInput(
            "invalid_timezone",
            "invalid timezone: missing: at_local needs the IANA time zone it is in (e.g. Europe/Berlin)",
        )
    if timezone is not None and at_local is None:
        raise InvalidInput(
            "invalid_timezone", "invalid timezone: given without at_local (a due_at carries its own offset)"
        )
    if at_local is not None:
        due = local_to_ms(parse_local(at_local), lookup_timezone(timezone))
    elif sum(given) != 1:
        raise InvalidInput(
            "invalid_due_time", "invalid due time: give exactly one of delay_ms, due_ms, delay, at or at_local"
        )
    elif delay is not None or delay_ms is not None:
        if delay is not None:
            if not isinstance(delay, _dt.timedelta):
                raise InvalidInput("invalid_delay", f"invalid delay: must be a timedelta, got {type(delay).__name__}")
            us = (delay.days * 86400 + delay.seconds) * 1_000_000 + delay.microseconds
            ms = abs(us) // 1000 * (1 if us >= 0 else -1)  # toward zero, as TimeDelta does
        else:
            ms = _int(delay_ms, "invalid_delay", "invalid delay")
        if ms < 0:
            raise InvalidInput("invalid_delay", f"invalid delay: must not be negative, got {ms} ms")
        if ms > MAX_AHEAD_MS:
            raise InvalidInput("invalid_delay", f"invalid delay: {ms} ms is more than 10 years")
        due = now_ms + ms
    elif at is not None:
        if not isinstance(at, _dt.datetime):
            raise InvalidInput("invalid_due_time", f"invalid due time: must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
            raise InvalidInput("invalid_due_time", "invalid due time: a datetime without a UTC offset is ambiguous")
        due = (at - _EPOCH) // _MS
    else:
        due = _int(due_ms, "invalid_due_time", "invalid due time")
        if 0 <= due < YEAR_2000_MS:
            raise InvalidInput(
                "invalid_due_time",
                f"invalid due time: {due} is before the year 2000: it looks like seconds, not milliseconds",
            )
    if due < 0:
        raise InvalidInput("invalid_due_time", f"invalid due time: {due} is before 1970")
    if due > now_ms + MAX_AHEAD_MS:
        raise InvalidInput("invalid_due_time", f"invalid due time: {due} is more than 10 years ahead")
    return due


def check_debounce(debounce: Any) -> "tuple[int, int]":
    """A debounce's ``(delay_ms, max_wait_ms)``, checked as ``Debounce::from_ms`` does in
    Rust (src/engine/time_rules.rs): both at least 1 ms and at most 3,653 days, and
    ``max_wait_ms >= delay_ms``; ``invalid_option`` naming ``debounce.delay`` or
    ``debounce.max_wait`` otherwise. Takes a ``Debounce`` or a dict with those two keys."""
    if isinstance(debounce, dict):
        delay, max_wait = debounce.get("delay_ms"), debounce.get("max_wait_ms")
    else:
        delay, max_wait = getattr(debounce, "delay_ms", None), getattr(debounce, "max_wait_ms", None)
    out = []
    for name, v in (("debounce.delay", delay), ("debounce.max_wait", max_wait)):
        ms = _int(v, "invalid_option", f"invalid option {name}")
        if ms < 0:
            raise InvalidInput("invalid_option", f"invalid option {name}: must not be negative, got {ms} ms")
        if ms < 1:
            raise InvalidInput("invalid_option", f"invalid option {name}: must be at least 1ms")
        if ms > MAX_AHEAD_MS:
            raise InvalidInput("invalid_option", f"invalid option {name}: {ms} ms is more than 10 years")
        out.append(ms)
    if out[1] < out[0]:
        raise InvalidInput(
            "invalid_option", f"invalid option debounce.max_wait: {out[1]} ms is shorter than the delay {out[0]} ms"
        )
    return out[0], out[1]


def rules_arg(repeat: bool, max_wait_ms: Optional[int]) -> bytes:
    """The per-order time-rules argument of enqueue.lua: ``r`` for repeat, then the
    debounce's max wait in ms (empty: neither)."""
    return (b"r" if repeat else b"") + (b"%d" % max_wait_ms if max_wait_ms is not None else b"")


# ---------------------------------------------------------------- events (src/engine/events.rs)

#: Longest event name or event id, bytes.
MAX_EVENT_LEN = 128
_EVENT_NAME = re.compile(r"^[A-Za-z0-9._:/-]+$")


def check_event(name: Any, data: Any, id: Any) -> None:
    """An event's name (field ``name``: 1..=128 bytes of ``A-Z a-z 0-9 . _ - : /``), data
    (field ``data``: a JSON object) and id (field ``id``: the rule of order ids, at most 128
    bytes), as Client::post_event checks them."""
    if not isinstance(name, str) or name == "":
        raise InvalidInput("invalid_option", "invalid option name: the event name must not be empty")
    raw = name.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_EVENT_LEN:
        raise InvalidInput("invalid_option", f"invalid option name: the event name must be at most {MAX_EVENT_LEN} bytes, got {len(raw)}")
    if not _EVENT_NAME.match(name):
        raise InvalidInput("invalid_option", "invalid option name: the event name holds a character outside A-Z a-z 0-9 . _ - : /")
    if id is not None:
        if not isinstance(id, str) or id == "" or len(id.encode("utf-8", "surrogatepass")) > MAX_EVENT_LEN or any(unicodedata.category(ch) == "Cc" for ch in id):
            raise InvalidInput("invalid_option", "invalid option id: must be 1..=128 bytes without control characters")
    if not isinstance(data, dict):
        raise InvalidInput("invalid_option", "invalid option data: must be a JSON object")


def event_token(event: str, paths: Sequence[str], data: Any, strict: bool = False) -> Optional[str]:
    """The match token of ``data`` under a rule (``None`` when a path holds no scalar):
    ``"\\x01<event> {"<path>":<value JSON>,...}"``, byte for byte the Rust client's. A
    value longer than 256 bytes gives ``None``, or with ``strict`` (an order's payload, as
    ``CancelRule::token``) is refused naming ``cancel_on``."""
    parts = []
    for p in paths:
        v = data
        for seg in p.split("."):
            if not isinstance(v, dict) or seg not in v:
                return None
            v = v[seg]
        if v is None or isinstance(v, (dict, list)):
            return None
        text = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode("utf-8")) > 256:
            if strict:
                raise InvalidInput("invalid_option", f"invalid option cancel_on: the value at {p} is longer than 256 bytes")
            return None
        parts.append(json.dumps(p) + ":" + text)
    return "\x01" + event + " {" + ",".join(parts) + "}"


#: The default ``remember`` window of a rule, ms (15 min).
DEFAULT_REMEMBER_MS = 900_000
#: Most remembered tokens per shard.
MAX_REMEMBERED = 100_000


def order_tokens(rule_list: Sequence[Any], payload: bytes) -> List[str]:
    """The match tokens of an order's payload (JSON text) under its queue's rules (the
    record's ``cancel_on`` list), stored among its tags, as the Rust client computes them."""
    if not rule_list:
        return []
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return []
    out = []
    for r in rule_list:
        if not isinstance(r, dict) or not isinstance(r.get("event"), str):
            continue
        token = event_token(r["event"], r.get("match", []), doc, strict=True)
        if token is not None:
            out.append(token)
    return out


#: The prefix of a queue record's fields holding the rules its orders declared.
ORDER_RULE_PREFIX = "order_rule:"
#: Most rules per order (or queue), match paths per rule, the longest path and ``remember``
#: (src/engine/events.rs ``MAX_RULES``, ``MAX_MATCH``, ``MAX_PATH_LEN``, ``MAX_REMEMBER_MS``).
MAX_RULES = 8
MAX_MATCH = 4
MAX_PATH_LEN = 128
MAX_REMEMBER_MS = 7 * 24 * 3600 * 1000
#: Most distinct rules a queue's orders may declare (``MAX_ORDER_RULES``).
MAX_ORDER_RULES = 64
_PATH = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


def check_cancel_on(rule_list: Any) -> List[Tuple[str, List[str], int]]:
    """An order's own cancel-on-event rules (src/engine/events.rs ``validate_rules``, the
    same checks as a queue's): a list of ``{"event": name, "match": path or [paths],
    "remember_ms": ms}`` (remember 15 min by default); anything else is refused with
    ``invalid_option`` naming ``cancel_on``. Returns them as (event, paths, remember_ms)."""
    def bad(reason: str) -> InvalidInput:
        return InvalidInput("invalid_option", f"invalid option cancel_on: {reason}")

    if rule_list is None:
        return []
    if isinstance(rule_list, (str, bytes, dict)) or not isinstance(rule_list, (list, tuple)):
        raise bad("must be an array of rules {event, match, remember_ms}")
    if len(rule_list) > MAX_RULES:
        raise bad(f"at most {MAX_RULES} rules per queue, got {len(rule_list)}")
    out: List[Tuple[str, List[str], int]] = []
    for r in rule_list:
        if not isinstance(r, dict):
            raise bad("each rule must be an object {event, match, remember_ms}")
        unknown = [k for k in r if k not in ("event", "match", "remember_ms")]
        if unknown:
            raise bad(f"unknown rule field {unknown[0]!r} (event, match, remember_ms)")
        event = r.get("event")
        if not isinstance(event, str):
            raise bad("a rule needs an event name (a string)")
        if event == "":
            raise bad("the event name must not be empty")
        if len(event.encode("utf-8", "surrogatepass")) > MAX_EVENT_LEN:
            raise bad(f"the event name must be at most {MAX_EVENT_LEN} bytes")
        if not _EVENT_NAME.fullmatch(event):
            raise bad("the event name holds a character outside A-Z a-z 0-9 . _ - : /")
        m = r.get("match", [])
        paths = [m] if isinstance(m, str) else m
        if not isinstance(paths, (list, tuple)) or not all(isinstance(x, str) for x in paths):
            raise bad("match must be a field path or an array of them")
        if not paths:
            raise bad(f"the rule for {event} has no match field (it would cancel every order)")
        if len(paths) > MAX_MATCH:
            raise bad(f"at most {MAX_MATCH} match fields per rule")
        for i, x in enumerate(paths):
            if not x or len(x) > MAX_PATH_LEN:
                raise bad(f"match path {x!r} must be 1..={MAX_PATH_LEN} bytes")
            if not _PATH.fullmatch(x):
                raise bad(f"match path {x!r} is not a JSON field path (dotted names of A-Z a-z 0-9 _ -, such as order_id or customer.id)")
            if x in paths[:i]:
                raise bad(f"match path {x!r} is given twice")
        remember = r.get("remember_ms", DEFAULT_REMEMBER_MS)
        if isinstance(remember, bool) or not isinstance(remember, int) or not 1 <= remember <= MAX_REMEMBER_MS:
            raise bad("remember must be 1 ms..=7 days")
        if any(e == event and p == list(paths) for e, p, _ in out):
            raise bad(f"the rule for {event} is given twice")
        out.append((event, list(paths), remember))
    return out


def order_rule_field(rule: Tuple[str, List[str], int]) -> str:
    """A rule an order declares, as the queue's record keeps it: ``order_rule:<rule JSON>``,
    byte for byte the Rust client's (serde: event, match, remember_ms; compact)."""
    event, paths, remember = rule
    return ORDER_RULE_PREFIX + json.dumps({"event": event, "match": paths, "remember_ms": remember}, separators=(",", ":"))


def own_tokens(own: Sequence[Tuple[str, List[str], int]], payload: bytes) -> List[str]:
    """The match tokens of an order's payload under its own rules: the event part carries
    the rule's window, ``<event>@<remember ms>`` (``CancelRule::order_token``)."""
    return order_tokens([{"event": "%s@%d" % (e, r), "match": p} for e, p, r in own], payload)


def event_hits(name: str, data: Any, queues: Sequence[str], records: Sequence[Any], fields: Optional[Sequence[Any]] = None) -> List[Any]:
    """The (queue, token, remember_ms) of every rule of ``queues`` (their records' ``cancel_on``
    fields, JSON text or ``None``) that names the event and whose paths ``data`` holds; with
    ``fields`` (each record's field names, HKEYS), also of the rules the queues' orders
    declared for themselves (fields ``order_rule:<rule JSON>``, src/engine/events.rs
    "Order rules"), whose tokens carry their window: ``\\x01<event>@<remember ms> {...}``."""
    hits = []
    for i, (q, rec) in enumerate(zip(queues, records)):
        stored: Any = {}
        if rec is not None:
            try:
                stored = json.loads(rec.decode() if isinstance(rec, bytes) else rec)
            except ValueError:
                stored = {}
        for r in stored.get("rules", []):
            if r.get("event") != name:
                continue
            token = event_token(name, r.get("match", []), data)
            if token is not None:
                hits.append((q, token, int(r.get("remember_ms", DEFAULT_REMEMBER_MS))))
        for f in (fields[i] if fields is not None else []) or []:
            text = f.decode() if isinstance(f, bytes) else f
            if not text.startswith(ORDER_RULE_PREFIX):
                continue
            try:
                r = json.loads(text[len(ORDER_RULE_PREFIX):])
                remember = int(r["remember_ms"])
            except (ValueError, KeyError, TypeError):
                continue
            if r.get("event") != name:
                continue
            token = event_token("%s@%d" % (name, remember), r.get("match", []), data)
            if token is not None:
                hits.append((q, token, remember))
    return hits
