"""The producer API against a real redis-server, through the sync and the asyncio client
(``make_client``): outcomes, batches, the registry and its epochs, script reloading."""

from __future__ import annotations

import json

import pytest

import delayq
from delayq import _core
from conftest import create_queue


def test_upsert_and_if_absent_outcomes(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "orders")
    c = make_client(redis_server.url, namespace=ns)
    first = c.schedule("orders", "o-1", delay_ms=60_000, payload={"v": 1})
    assert first.outcome == delayq.Outcome.CREATED and first.id == "o-1"
    # if-absent leaves a known id alone: its due time and payload stay.
    kept = c.schedule("orders", "o-1", delay_ms=120_000, payload={"v": 2}, mode="if_absent")
    assert kept.outcome == delayq.Outcome.UNCHANGED
    got = c.get("orders", "o-1")
    assert got.payload == {"v": 1} and got.due_at_ms == first.due_at_ms
    # upsert replaces both.
    upd = c.schedule("orders", "o-1", delay_ms=120_000, payload={"v": 3})
    assert upd.outcome == delayq.Outcome.UPDATED
    got = c.get("orders", "o-1")
    assert got.payload == {"v": 3} and got.due_at_ms == upd.due_at_ms
    # if-absent of a new id creates it.
    assert c.schedule("orders", "o-2", delay_ms=1, mode=delayq.Mode.IF_ABSENT).outcome == delayq.Outcome.CREATED
    # An id twice in one batch reads as two schedules in order.
    res = c.schedule_many("orders", [delayq.Order("o-3", delay_ms=5), delayq.Order("o-3", delay_ms=6, payload=[2])])
    assert [r.outcome for r in res] == [delayq.Outcome.CREATED, delayq.Outcome.UPDATED]
    res = c.schedule_many("orders", [{"id": "o-3", "delay_ms": 5}, {"id": "o-4", "delay_ms": 5}], mode="if_absent")
    assert [r.outcome for r in res] == [delayq.Outcome.UNCHANGED, delayq.Outcome.CREATED]
    assert c.get("orders", "o-3").payload == [2]


def test_stored_value_and_keys_are_the_rust_layout(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "layout", shards=4)
    now = 1_800_000_000_000
    c = make_client(redis_server.url, namespace=ns, clock=lambda: now)
    text = '{"n":123456789012345678901234567890, "s":"заказ ✓"}'
    ids = [f"order-{i}" for i in range(40)]
    c.schedule_many("layout", [delayq.Order(i, delay_ms=1000, payload=delayq.RawJson(text)) for i in ids])
    r = redis_server.client
    for i in ids:
        shard = delayq.shard_of(i, 4)
        tag = "{%s:layout:%d}" % (ns, shard)
        assert r.zscore(tag + ":due", i) == now + 1000
        assert r.hget(tag + ":payload", i) == f"{now}:{text}".encode()
    assert len({delayq.shard_of(i, 4) for i in ids}) == 4


def test_cancel_reschedule_get(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "q", shards=3)
    c = make_client(redis_server.url, namespace=ns)
    s = c.schedule("q", "a", delay_ms=60_000, payload={"x": 1})
    got = c.get("q", "a")
    assert got.id == "a" and got.due_at_ms == s.due_at_ms and got.payload_json == '{"x":1}'
    assert got.enqueued_at_ms is not None and abs(got.enqueued_at_ms + 60_000 - s.due_at_ms) <= 5
    assert c.reschedule("q", "a", due_ms=s.due_at_ms + 5) == delayq.RescheduleOutcome.RESCHEDULED
    assert c.get("q", "a").due_at_ms == s.due_at_ms + 5
    assert c.get("q", "a").payload == {"x": 1}
    assert c.reschedule("q", "nope", delay_ms=5) == delayq.RescheduleOutcome.NOT_FOUND
    assert c.cancel("q", "a") == delayq.CancelOutcome.CANCELLED
    assert c.cancel("q", "a") == delayq.CancelOutcome.NOT_FOUND
    assert c.get("q", "a") is None


def test_a_batch_of_5000(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "bulk", shards=4)
    c = make_client(redis_server.url, namespace=ns)
    orders = [delayq.Order(f"b-{i}", delay_ms=3_600_000 + i, payload={"i": i, "pad": "x" * 100}) for i in range(5000)]
    res = c.schedule_many("bulk", orders)
    assert len(res) == 5000 and all(r.outcome == delayq.Outcome.CREATED for r in res)
    assert [r.id for r in res] == [o.id for o in orders]
    r = redis_server.client
    assert sum(r.zcard("{%s:bulk:%d}:due" % (ns, s)) for s in range(4)) == 5000
    assert c.get("bulk", "b-4321").payload == {"i": 4321, "pad": "x" * 100}
    # Again, if absent: all unchanged.
    assert all(x.outcome == delayq.Outcome.UNCHANGED for x in c.schedule_many("bulk", orders, mode="if_absent"))


def test_batches_are_cut_by_count_and_bytes():
    big = delayq.RawJson('"' + "x" * 400_000 + '"')
    prepared = _core.prepare_batch("q", [delayq.Order(f"o{i}", delay_ms=0, payload=big) for i in range(7)], 0, 1 << 20)
    calls = _core.plan(1, prepared)
    assert [len(c.idxs) for c in calls] == [2, 2, 2, 1]
    small = _core.prepare_batch("q", [delayq.Order(f"o{i}", delay_ms=0) for i in range(1201)], 0, 1 << 20)
    assert [len(c.idxs) for c in _core.plan(1, small)] == [500, 500, 201]
    by_shard = _core.plan(3, small)
    for call in by_shard:
        assert {delayq.shard_of(small[i].id, 3) for i in call.idxs} == {call.shard}
        assert call.idxs == sorted(call.idxs)
    # A single order above 1 MiB of payload goes alone.
    huge = _core.prepare_batch("q", [delayq.Order("h", delay_ms=0, payload=delayq.RawJson('"' + "y" * (1 << 20) + '"'))], 0, 2 << 20)
    assert [len(c.idxs) for c in _core.plan(1, huge)] == [1]


def test_an_undeclared_queue_is_refused_and_nothing_is_written(redis_server, ns, make_client):
    c = make_client(redis_server.url, namespace=ns)
    with pytest.raises(delayq.QueueNotFound) as e:
        c.schedule("never-created", "o-1", delay_ms=10, payload={})
    assert e.value.code == "queue_not_found" and e.value.queue == "never-created"
    with pytest.raises(delayq.QueueNotFound):
        c.schedule_many("never-created", [delayq.Order("o-2", delay_ms=1)])
    for call in (lambda: c.cancel("never-created", "o-1"), lambda: c.get("never-created", "o-1"),
                 lambda: c.reschedule("never-created", "o-1", delay_ms=1)):
        with pytest.raises(delayq.QueueNotFound):
            call()
    assert list(redis_server.client.scan_iter(match="*%s*" % ns)) == []


def test_invalid_input_raises_before_any_redis_call(ns, make_client, redis_server):
    c = make_client(redis_server.url, namespace=ns)
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule_many("q", [delayq.Order("ok", delay_ms=1), delayq.Order("", delay_ms=1)])
    assert e.value.code == "invalid_id" and e.value.index == 1
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("q", "x", delay_ms=1, payload=float("nan"))
    assert e.value.code == "invalid_payload" and e.value.index is None
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("q", "x", delay_ms=1.5)
    assert e.value.code == "invalid_delay"
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("q", "x")
    assert e.value.code == "invalid_due_time"
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("q", "\ud800", delay_ms=1)
    assert e.value.code == "invalid_id"


def _delete_queue(r, ns: str, queue: str, shards: int) -> None:
    """A delete as issue 22 orders it: each shard's epoch goes first, then the keys and the
    record (what ``delayq queue delete`` does)."""
    for s in range(shards):
        r.delete("{%s:%s:%d}:meta" % (ns, queue, s))
    for s in range(shards):
        r.delete(*("{%s:%s:%d}:%s" % (ns, queue, s, k) for k in ("due", "payload", "levels")))
    r.delete("{%s}:queue:%s" % (ns, queue))
    r.srem("{%s}:queues" % ns, queue)


def test_a_deleted_queue_is_never_written_by_a_producer_with_a_stale_view(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "gone", shards=2)
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("gone", "before", delay_ms=60_000)  # the client now caches the record
    _delete_queue(redis_server.client, ns, "gone", 2)
    with pytest.raises(delayq.QueueNotFound):
        c.schedule_many("gone", [delayq.Order(f"after-{i}", delay_ms=60_000) for i in range(20)])
    assert list(redis_server.client.scan_iter(match="{%s:gone:*" % ns)) == []


def test_stale_epoch_rereads_the_registry_and_retries(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "again", shards=2)
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("again", "before", delay_ms=60_000)
    _delete_queue(redis_server.client, ns, "again", 2)
    # Created again, with another shard count and so another epoch.
    create_queue(redis_server.url, ns, "again", shards=5)
    ids = [f"after-{i}" for i in range(30)]
    res = c.schedule_many("again", [delayq.Order(i, delay_ms=60_000) for i in ids])
    assert all(r.outcome == delayq.Outcome.CREATED for r in res)
    r = redis_server.client
    for i in ids:
        assert r.zscore("{%s:again:%d}:due" % (ns, delayq.shard_of(i, 5)), i) is not None
    assert c.get("again", ids[7]) is not None
    # A shard count of 2 would have put some of them elsewhere: nothing went to old shards only.
    assert r.zcard("{%s:again:0}:due" % ns) + r.zcard("{%s:again:1}:due" % ns) < 30


def test_a_record_without_epoch_gets_one(redis_server, ns, make_client):
    """A queue registered by an earlier version (``shards`` only) is given an epoch and its
    shards their markers, as the Rust client does."""
    r = redis_server.client
    r.hset("{%s}:queue:old" % ns, "shards", 2)
    r.sadd("{%s}:queues" % ns, "old")
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("old", "o", delay_ms=1000)
    epoch = r.hget("{%s}:queue:old" % ns, "epoch")
    assert epoch
    assert [r.hget("{%s:old:%d}:meta" % (ns, s), "epoch") for s in range(2)] == [epoch, epoch]


def test_scripts_are_loaded_again_after_script_flush(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "flush")
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("flush", "a", delay_ms=1000)
    redis_server.client.script_flush()
    assert c.schedule_many("flush", [delayq.Order("b", delay_ms=1), delayq.Order("c", delay_ms=1)])[0].outcome == delayq.Outcome.CREATED
    redis_server.client.script_flush()
    assert c.get("flush", "a") is not None
    redis_server.client.script_flush()
    assert c.cancel("flush", "a") == delayq.CancelOutcome.CANCELLED
    redis_server.client.script_flush()
    assert c.reschedule("flush", "b", delay_ms=5) == delayq.RescheduleOutcome.RESCHEDULED


def test_the_clock_is_the_redis_servers(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "clock")
    c = make_client(redis_server.url, namespace=ns)
    secs, micros = redis_server.client.time()
    server_ms = secs * 1000 + micros // 1000
    assert abs(c.now_ms() - server_ms) < 1000
    s = c.schedule("clock", "a", delay_ms=0)
    enq = int(redis_server.client.hget("{%s:clock:0}:payload" % ns, "a").split(b":", 1)[0])
    assert enq == s.due_at_ms


def test_payload_values_are_serialized_compactly(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "ser")
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("ser", "a", delay_ms=1000, payload={"user": 42, "name": "é\n", "l": [1, None, True]})
    assert c.get("ser", "a").payload_json == '{"user":42,"name":"é\\n","l":[1,null,true]}'
    c.schedule("ser", "b", delay_ms=1000)
    assert c.get("ser", "b").payload_json == "null"


def test_errors_never_show_the_password(redis_server):
    with pytest.raises(delayq.DelayqError) as e:
        delayq.Client("redis://:s3cret-pass@127.0.0.1:1", connect_timeout=0.5)
    assert "s3cret-pass" not in str(e.value) and "s3cret-pass" not in repr(e.value)
    with pytest.raises(delayq.InvalidInput) as e:
        delayq.Client("http://user:s3cret-pass@x")
    assert e.value.code == "invalid_redis_url" and "s3cret-pass" not in str(e.value)


def test_delete_and_create_again_with_the_engine(redis_server, ns, make_client):
    """The same as the two tests above, with the engine's own ``delayq queue delete`` and
    ``queue create`` (issue 22's fence)."""
    from conftest import run_bin

    r = redis_server.client
    create_queue(redis_server.url, ns, "eng", shards=2)
    if r.hget("{%s}:queue:eng" % ns, "epoch") is None:
        pytest.skip("this delayq binary predates queue epochs (issue 22)")
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("eng", "before", delay_ms=60_000)
    run_bin("queue", "delete", "eng", "--force", url=redis_server.url, namespace=ns)
    with pytest.raises(delayq.QueueNotFound):
        c.schedule_many("eng", [delayq.Order(f"x-{i}", delay_ms=60_000) for i in range(10)])
    assert list(r.scan_iter(match="{%s:eng:*" % ns)) == []
    create_queue(redis_server.url, ns, "eng", shards=3)
    res = c.schedule_many("eng", [delayq.Order(f"y-{i}", delay_ms=60_000) for i in range(10)])
    assert all(x.outcome == delayq.Outcome.CREATED for x in res)
    for i in range(10):
        assert r.zscore("{%s:eng:%d}:due" % (ns, delayq.shard_of(f"y-{i}", 3)), f"y-{i}") is not None


def test_a_batch_failing_part_way_says_what_was_written(redis_server, ns, make_client):
    """A delete in progress has fenced shard 1 only: its call is refused (nothing written),
    shard 0's went through: PartialBatch, each order's fate named."""
    create_queue(redis_server.url, ns, "part", shards=2)
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("part", "warm", delay_ms=60_000)
    redis_server.client.delete("{%s:part:1}:meta" % ns)
    ids = [f"p-{i}" for i in range(20)]
    with pytest.raises(delayq.PartialBatch) as e:
        c.schedule_many("part", [delayq.Order(i, delay_ms=60_000) for i in ids])
    assert e.value.code == "partial_write" and e.value.write_outcome == "unknown"
    assert isinstance(e.value.cause, delayq.QueueNotFound)
    assert [i for i, _ in e.value.results] == ids
    for i, outcome in e.value.results:
        assert outcome == ("created" if delayq.shard_of(i, 2) == 0 else "not_written"), (i, outcome)
    assert redis_server.client.zcard("{%s:part:1}:due" % ns) == 0


def test_out_of_memory_is_refused_and_says_nothing_was_written(ns, make_client):
    from conftest import RedisServer

    s = RedisServer()
    try:
        create_queue(s.url, ns, "oom")
        c = make_client(s.url, namespace=ns)
        c.schedule("oom", "warm", delay_ms=60_000)
        s.client.config_set("maxmemory", 1)
        with pytest.raises(delayq.RedisFailure) as e:
            c.schedule("oom", "big", delay_ms=60_000, payload={"x": "y" * 1000})
        assert e.value.code == "redis_oom" and e.value.write_outcome == "not_applied"
        s.client.config_set("maxmemory", 0)
        assert c.get("oom", "big") is None
    finally:
        s.stop()
