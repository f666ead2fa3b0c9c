"""Priority levels (issue 26) through the sync and the asyncio client: schedule, batches,
reschedule, get and cancel keep the shard's levels HASH as the Rust client does, an invalid
level is refused before anything is sent, and ``delayq serve`` dispatches what the SDK
scheduled at ``high`` / ``low`` into that level's stream."""

from __future__ import annotations

import pytest

import delayq
from conftest import Serve, Webhook, create_queue

NOW = 1_800_000_000_000


def _levels(r, ns: str, queue: str, shards: int):
    """Every entry of the queue's levels HASHes, as {id: level}."""
    out = {}
    for s in range(shards):
        for k, v in r.hgetall("{%s:%s:%d}:levels" % (ns, queue, s)).items():
            out[k.decode()] = v.decode()
    return out


def test_schedule_high_and_get_shows_it(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "prio", shards=3)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    vip = c.schedule("prio", "vip", delay_ms=60_000, payload={"v": 1}, priority="high")
    assert vip.outcome == delayq.Outcome.CREATED
    c.schedule("prio", "plain", delay_ms=60_000, payload={"v": 2})
    c.schedule("prio", "slow", delay_ms=60_000, priority=delayq.Priority.LOW)
    got = c.get("prio", "vip")
    assert got.priority is delayq.Priority.HIGH and got.priority == "high"
    assert got.due_at_ms == NOW + 60_000 and got.payload == {"v": 1}
    assert c.get("prio", "plain").priority is delayq.Priority.NORMAL
    assert c.get("prio", "slow").priority is delayq.Priority.LOW
    # The engine's layout: only the orders that are not normal are in the levels HASH,
    # each in its own shard's.
    r = redis_server.client
    assert _levels(r, ns, "prio", 3) == {"vip": "high", "slow": "low"}
    assert r.hget("{%s:prio:%d}:levels" % (ns, delayq.shard_of("vip", 3)), "vip") == b"high"


def test_reschedule_changes_or_keeps_the_level(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "move", shards=2)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    c.schedule("move", "a", delay_ms=60_000, payload={"x": 1}, priority="high")
    assert c.reschedule("move", "a", delay_ms=90_000, priority="low") == delayq.RescheduleOutcome.RESCHEDULED
    got = c.get("move", "a")
    assert (got.priority, got.due_at_ms, got.payload) == (delayq.Priority.LOW, NOW + 90_000, {"x": 1})
    # Without a priority the level is kept.
    assert c.reschedule("move", "a", delay_ms=5_000) == delayq.RescheduleOutcome.RESCHEDULED
    got = c.get("move", "a")
    assert (got.priority, got.due_at_ms) == (delayq.Priority.LOW, NOW + 5_000)
    # Back to normal: the HASH entry goes.
    assert c.reschedule("move", "a", delay_ms=5_000, priority=delayq.Priority.NORMAL) == delayq.RescheduleOutcome.RESCHEDULED
    assert c.get("move", "a").priority is delayq.Priority.NORMAL
    assert _levels(redis_server.client, ns, "move", 2) == {}
    # An order that is not scheduled: not found, and no level is written for it.
    assert c.reschedule("move", "ghost", delay_ms=1, priority="high") == delayq.RescheduleOutcome.NOT_FOUND
    assert _levels(redis_server.client, ns, "move", 2) == {}


def test_batches_upserts_and_cancel_keep_the_levels_hash_right(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "mix", shards=4)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    levels = ["high", "normal", "low", None, delayq.Priority.HIGH]
    ids = [f"m-{i}" for i in range(len(levels))]
    res = c.schedule_many("mix", [delayq.Order(i, delay_ms=60_000, priority=p) for i, p in zip(ids, levels)])
    assert all(x.outcome == delayq.Outcome.CREATED for x in res)
    assert [c.get("mix", i).priority.value for i in ids] == ["high", "normal", "low", "normal", "high"]
    r = redis_server.client
    assert _levels(r, ns, "mix", 4) == {"m-0": "high", "m-2": "low", "m-4": "high"}
    # An upsert sets the level again (absent: normal), as the Rust client's does;
    # if_absent leaves a known order's level alone.
    assert c.schedule("mix", "m-2", delay_ms=1_000, priority="high", mode="if_absent").outcome == delayq.Outcome.UNCHANGED
    assert c.get("mix", "m-2").priority is delayq.Priority.LOW
    assert c.schedule("mix", "m-0", delay_ms=1_000).outcome == delayq.Outcome.UPDATED
    assert c.get("mix", "m-0").priority is delayq.Priority.NORMAL
    assert c.schedule_many("mix", [{"id": "m-1", "delay_ms": 1_000, "priority": "low"}])[0].outcome == delayq.Outcome.UPDATED
    assert c.get("mix", "m-1").priority is delayq.Priority.LOW
    # Cancel removes the level with the order.
    assert c.cancel("mix", "m-4") == delayq.CancelOutcome.CANCELLED
    assert _levels(r, ns, "mix", 4) == {"m-1": "low", "m-2": "low"}
    # A level the engine does not know (written by someone else) reads as normal.
    r.hset("{%s:mix:%d}:levels" % (ns, delayq.shard_of("m-3", 4)), "m-3", "urgent")
    assert c.get("mix", "m-3").priority is delayq.Priority.NORMAL


def _commands(r) -> int:
    return int(r.info("stats")["total_commands_processed"])


@pytest.mark.parametrize("bad", ["urgent", "", "HIGH", " high", "high\n", 1, b"high"])
def test_an_invalid_level_is_refused_before_anything_is_sent(redis_server, ns, make_client, bad):
    create_queue(redis_server.url, ns, "bad", shards=2)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    c.schedule("bad", "known", delay_ms=60_000, priority="low")
    r = redis_server.client
    keys = sorted(r.scan_iter(match="{%s:*" % ns))
    before = _commands(r)
    calls = [
        (lambda: c.schedule("bad", "o-1", delay_ms=1_000, priority=bad), None),
        (lambda: c.schedule_many("bad", [delayq.Order("o-2", delay_ms=1_000), delayq.Order("o-3", delay_ms=1_000, priority=bad)]), 1),
        (lambda: c.schedule_many("bad", [{"id": "o-4", "delay_ms": 1_000, "priority": bad}]), 0),
        (lambda: c.reschedule("bad", "known", delay_ms=1_000, priority=bad), None),
    ]
    for call, index in calls:
        with pytest.raises(delayq.InvalidInput) as e:
            call()
        assert e.value.code == "invalid_priority" and e.value.index == index
        if isinstance(bad, str):
            reason = f'invalid priority: {delayq.rules.rust_debug(bad)} is not high, normal or low'
        else:
            reason = f"invalid priority: must be a string (high, normal or low), got {type(bad).__name__}"
        assert e.value.reason == reason
        assert str(e.value) == (reason if index is None else f"message {index}: {reason}")
    # Not one command reached Redis (the INFO above and the one below only), nothing changed.
    assert _commands(r) == before + 1
    assert sorted(r.scan_iter(match="{%s:*" % ns)) == keys
    assert c.get("bad", "known").priority is delayq.Priority.LOW
    assert c.get("bad", "o-1") is None and c.get("bad", "o-2") is None


def test_the_level_is_checked_before_the_batch_size_and_the_queue_name(redis_server, ns, make_client):
    """tests/conformance/README.md, "The order of checks": the level (parsed before the call,
    as by the Rust side) comes first."""
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    too_many = [delayq.Order(f"o{i}", delay_ms=1) for i in range(delayq.rules.MAX_BATCH)]
    too_many.append(delayq.Order("last", delay_ms=1, priority="urgent"))
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule_many("q", too_many)
    assert (e.value.code, e.value.index) == ("invalid_priority", delayq.rules.MAX_BATCH)
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("a b", "", delay_ms=-1, priority="HIGH")
    assert (e.value.code, e.value.index) == ("invalid_priority", None)
    with pytest.raises(delayq.InvalidInput) as e:
        c.reschedule("a b", "", delay_ms=-1, priority="")
    assert e.value.code == "invalid_priority"


@pytest.fixture
def serve(redis_server, ns):
    hook = Webhook()
    create_queue(redis_server.url, ns, "lanes", shards=2)
    s = Serve(redis_server.url, ns, "lanes", hook.url, shards=2)
    yield s, hook
    s.stop()
    hook.stop()


def test_the_engine_dispatches_each_order_into_its_levels_stream(serve, redis_server, ns, make_client):
    _, hook = serve
    c = make_client(redis_server.url, namespace=ns)
    want = {"vip": "high", "plain": "normal", "slow": "low", "vip-2": "high"}
    c.schedule_many("lanes", [delayq.Order(i, delay_ms=50, payload={"id": i}, priority=p) for i, p in want.items()])
    got = set()
    while len(got) < len(want):
        got.add(hook.next()["json"]["id"])
    assert got == set(want)
    # Each order went into its shard's stream of its level ({tag}:high:stream,
    # {tag}:stream, {tag}:low:stream), carrying priority=<level> when it is not normal.
    r = redis_server.client
    for i, level in want.items():
        tag = "{%s:lanes:%d}" % (ns, delayq.shard_of(i, 2))
        lanes = {"high": tag + ":high:stream", "normal": tag + ":stream", "low": tag + ":low:stream"}
        found = {}
        for lv, key in lanes.items():
            for _, fields in r.xrange(key):
                if fields.get(b"id") == i.encode():
                    found[lv] = fields
        assert list(found) == [level], (i, found)
        assert found[level].get(b"priority") == (None if level == "normal" else level.encode())
    # Dispatched: nothing is left in the levels HASHes.
    assert _levels(r, ns, "lanes", 2) == {}
