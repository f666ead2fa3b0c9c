"""The rules without a server: the shard function, payload text, due times, URLs."""

from __future__ import annotations

import datetime as dt

import pytest

import delayq
from delayq import _core, rules


def test_shard_function_is_fnv1a_64():
    # FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector, as keys.rs checks).
    assert rules.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert rules.fnv1a64(b"") == 0xCBF29CE484222325
    assert delayq.shard_of("a", 1000) == 0xAF63DC4C8601EC8C % 1000
    assert delayq.shard_of("anything", 1) == 0
    assert delayq.shard_of("заказ", 7) == rules.fnv1a64("заказ".encode()) % 7
    counts = [0] * 8
    for i in range(8000):
        counts[delayq.shard_of(f"order-{i}", 8)] += 1
    assert all(c > 800 for c in counts), counts


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, '{"a":' * 3000 + "1" + "}" * 3000, "[" * 3000 + "[],{}" + "]" * 3000])
def test_deep_payload_text_is_valid_without_recursion(text):
    assert delayq.RawJson(text).text == text


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 4999, "[" * 3000 + "1,]" + "]" * 2999, '{"a":' * 3000 + "}" * 3000, "[" * 2000 + "NaN" + "]" * 2000])
def test_deep_invalid_payload_text(text):
    with pytest.raises(delayq.InvalidInput) as e:
        delayq.RawJson(text)
    assert e.value.code == "invalid_payload"


def test_raw_json_from_bytes_and_bad_unicode():
    assert delayq.RawJson('{"a":"é"}'.encode()).data == '{"a":"é"}'.encode()
    for bad in (b'"\xff"', '"\ud800"'):
        with pytest.raises(delayq.InvalidInput) as e:
            delayq.RawJson(bad)
        assert e.value.code == "invalid_payload"


def test_depth_scan_matches_the_rust_one():
    assert rules.json_depth("1") == 0
    assert rules.json_depth('{"a":[1,{"b":"]]]]{{"}]}') == 3
    assert rules.json_depth('["\\"[[["]') == 1


def test_due_times_from_timedelta_and_datetime():
    now = 1_800_000_000_000
    assert rules.resolve_due(now, delay=dt.timedelta(seconds=1.5)) == now + 1500
    # Toward zero, as chrono's num_milliseconds: -0.5 ms is a zero delay.
    assert rules.resolve_due(now, delay=dt.timedelta(microseconds=-500)) == now
    with pytest.raises(delayq.InvalidInput) as e:
        rules.resolve_due(now, delay=dt.timedelta(milliseconds=-1))
    assert e.value.code == "invalid_delay"
    at = dt.datetime(2027, 1, 15, 8, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert rules.resolve_due(now, at=at) == int(at.timestamp() * 1000)
    with pytest.raises(delayq.InvalidInput) as e:
        rules.resolve_due(now, at=dt.datetime(2027, 1, 15, 8, 0))
    assert e.value.code == "invalid_due_time"
    with pytest.raises(delayq.InvalidInput):
        rules.resolve_due(now, delay_ms=1, due_ms=now)
    with pytest.raises(delayq.InvalidInput) as e:
        rules.resolve_due(now, delay_ms=True)
    assert e.value.code == "invalid_delay"


def test_urls():
    t = _core.parse_url("redis+cluster://user:p%40ss@h1:7000,h2:7001/")
    assert t.is_cluster and t.nodes == [("h1", 7000), ("h2", 7001)]
    assert (t.username, t.password) == ("user", "p@ss")
    assert _core.parse_url("rediss+cluster://:pw@h:1").ssl
    assert not _core.parse_url("redis://h:1/2").is_cluster
    for bad in ("http://h", "redis+cluster://", "redis+cluster://h"):
        with pytest.raises(delayq.InvalidInput) as e:
            _core.parse_url(bad)
        assert e.value.code == "invalid_redis_url"


def test_options_are_checked():
    for opts in ({"namespace": "a:b"}, {"max_payload_bytes": 0}, {"durability": delayq.Replicated(0, 100)},
                 {"durability": delayq.Replicated(1, 60_001)}, {"response_timeout": 0}):
        with pytest.raises(delayq.InvalidInput):
            delayq.Client("redis://127.0.0.1:1", **opts)


# What Rust's format!("{:?}", s) writes (checked with rustc), which the invalid_priority
# message quotes the refused text with.
RUST_DEBUG = [
    ("bogus", '"bogus"'),
    ("", '""'),
    ('a"b\\c\n\t\r\0', '"a\\"b\\\\c\\n\\t\\r\\0"'),
    ("\u0301x", '"\\u{301}x"'),
    ("x\u0301", '"x\\u{301}"'),
    ("\u00a0", '"\\u{a0}"'),
    ("\u200b", '"\\u{200b}"'),
    ("é", '"é"'),
    ("\x7f", '"\\u{7f}"'),
    ("\x85", '"\\u{85}"'),
    ("\U0001F600", '"\U0001F600"'),
    ("\ue000", '"\\u{e000}"'),
    ("\u0378", '"\\u{378}"'),
    ("\u2028", '"\\u{2028}"'),
    ("'", '"\'"'),
    ("\u00ad", '"\\u{ad}"'),
    ("\x1b", '"\\u{1b}"'),
    ("\u3000", '"\\u{3000}"'),
    ("\ufe0f", '"\\u{fe0f}"'),
    ("\U0001F3FB", '"\U0001F3FB"'),
    ("\u200d", '"\\u{200d}"'),
    ("\u0903", '"\u0903"'),
]


@pytest.mark.parametrize("text,quoted", RUST_DEBUG)
def test_refused_text_is_quoted_as_rust_quotes_it(text, quoted):
    assert rules.rust_debug(text) == quoted


def test_priority_levels():
    assert rules.PRIORITIES == ("high", "normal", "low")
    for name in rules.PRIORITIES:
        assert rules.check_priority(name) == name
        assert rules.check_priority(delayq.Priority(name)) == name
    assert [rules.lane_arg(p) for p in rules.PRIORITIES] == [b"high", b"", b"low"]
    for bad, reason in [
        ("bogus", 'invalid priority: "bogus" is not high, normal or low'),
        ("", 'invalid priority: "" is not high, normal or low'),
        ("Normal", 'invalid priority: "Normal" is not high, normal or low'),
        ("low\n", 'invalid priority: "low\\n" is not high, normal or low'),
        (None, "invalid priority: must be a string (high, normal or low), got NoneType"),
        (0, "invalid priority: must be a string (high, normal or low), got int"),
    ]:
        with pytest.raises(delayq.InvalidInput) as e:
            rules.check_priority(bad)
        assert (e.value.code, str(e.value), e.value.index) == ("invalid_priority", reason, None)


def test_stored_values_decode_with_or_without_a_trace_context():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert _core.decode_stored('12:{"a":1}') == (12, '{"a":1}')
    assert _core.decode_stored(f'12:~{tp};k=v;w~{{"a":"~"}}') == (12, '{"a":"~"}')
    assert _core.decode_stored(f"12:~{tp}~[1]") == (12, "[1]")
    # Only after the "<ms>:" prefix; an unterminated "~" is left as it is (not JSON).
    assert _core.decode_stored("~x~1") == (None, "~x~1")
    assert _core.decode_stored("12:~x") == (12, "~x")
    got = _core.decode_get("o", [b"5", f"12:~{tp}~[1]".encode(), None])
    assert (got.payload_json, got.payload, got.enqueued_at_ms) == ("[1]", [1], 12)
