"""Tags (issue 43) through the sync and the asyncio client: stored the way the Rust client
stores them (``"<ms>:[!<expires>!]\\x1d<t1>\\x1f<t2>\\x1d<json>"``, src/engine/tags.rs), read
back by ``get``, kept in the shard's tag index by enqueue.lua and cancel.lua; a refusal
names the field and writes nothing."""

from __future__ import annotations

import json

import pytest

import delayq
from conftest import create_queue, run_bin

NOW = 1_800_000_000_000


def _index(redis_server, ns):
    return sorted(redis_server.client.zrange("{%s:tg:0}:tags" % ns, 0, -1))


def test_tags_are_stored_indexed_and_leave_the_index_on_cancel(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "tg", shards=1)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    c.schedule("tg", "a", delay_ms=60_000, payload=[1], tags=["order:1", "customer:42"], expires_after_ms=1500)
    c.schedule_many("tg", [delayq.Order("b", delay_ms=60_000, tags=["customer:42"]), delayq.Order("c", delay_ms=0)])
    raw = redis_server.client.hgetall("{%s:tg:0}:payload" % ns)
    assert raw[b"a"] == b"%d:!1500!\x1dorder:1\x1fcustomer:42\x1d[1]" % NOW
    assert raw[b"c"] == b"%d:null" % NOW, "no tags: the bytes every order always had"
    got = c.get("tg", "a")
    assert (got.payload, got.tags) == ([1], ("order:1", "customer:42"))
    assert c.get("tg", "c").tags == ()
    assert _index(redis_server, ns) == [b"customer:42\x1fa", b"customer:42\x1fb", b"order:1\x1fa"]
    assert c.cancel("tg", "a") == delayq.CancelOutcome.CANCELLED
    assert _index(redis_server, ns) == [b"customer:42\x1fb"]
    c.schedule("tg", "b", delay_ms=60_000, tags=["x"])
    assert _index(redis_server, ns) == [b"x\x1fb"]


def test_cancel_tag_cancels_exactly_the_tagged_orders(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "tg", shards=3)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    c.schedule_many("tg", [delayq.Order(f"c-{i}", delay_ms=60_000, tags=["customer:7"] if i % 2 == 0 else [f"order:{i}"]) for i in range(700)])
    assert c.cancel_tag("tg", "customer:7") == 350
    assert c.cancel_tag("tg", "customer:7") == 0
    assert [c.get("tg", f"c-{i}") is None for i in range(4)] == [True, False, True, False]
    with pytest.raises(delayq.InvalidInput):
        c.cancel_tag("tg", "")


@pytest.mark.parametrize("tags", [[""], ["a", "a"], ["x" * 129], ["a\x07"], [f"t{i}" for i in range(11)], "abc", [1]])
def test_refusals_name_the_field_and_write_nothing(redis_server, ns, make_client, tags):
    create_queue(redis_server.url, ns, "tg", shards=1)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    before = redis_server.client.dbsize()
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("tg", "x", delay_ms=0, tags=tags)
    assert e.value.code == "invalid_option"
    assert "tags" in str(e.value)
    assert redis_server.client.dbsize() == before


def test_cancellations_are_recorded_in_the_order_history(redis_server, ns, make_client):
    """By id, by tag and by event, the SDK's cancels pass cancel.lua / tag_bulk.lua the
    history bucket of now: ``delayq get`` then answers ``cancelled`` with the reason, as for
    the Rust client's (src/engine/history.rs); with history off nothing is written."""
    run_bin("queue", "create", "hq", "--cancel-on", "order.paid:order_id", url=redis_server.url, namespace=ns)
    c = make_client(redis_server.url, namespace=ns)
    c.schedule("hq", "by-id", delay_ms=600_000, payload={"order_id": 1})
    c.schedule("hq", "by-tag", delay_ms=600_000, payload={"order_id": 2}, tags=["customer:7"])
    c.schedule("hq", "by-event", delay_ms=600_000, payload={"order_id": 3})
    before = c.now_ms()
    assert c.cancel("hq", "by-id") == delayq.CancelOutcome.CANCELLED
    assert c.cancel_tag("hq", "customer:7") == 1
    assert c.post_event("order.paid", {"order_id": 3}, id="pay-3")["cancelled"] == 1
    expect = {
        "by-id": {"reason": "id"},
        "by-tag": {"reason": "tag", "tag": "customer:7"},
        "by-event": {"reason": "event", "event": "order.paid", "event_id": "pay-3"},
    }
    for id, reason in expect.items():
        got = json.loads(run_bin("get", "hq", id, url=redis_server.url, namespace=ns).stdout)
        assert got["state"] == "cancelled", got
        at = got["cancelled"].pop("at_ms")
        assert at >= before - 1000, (at, before)
        assert got["cancelled"] == reason
    # History off: cancelled without a record.
    run_bin("queue", "create", "off", "--history-retention", "0s", url=redis_server.url, namespace=ns)
    c.schedule("off", "x", delay_ms=600_000, tags=["t"])
    c.schedule("off", "y", delay_ms=600_000)
    assert c.cancel_tag("off", "t") == 1
    assert c.cancel("off", "y") == delayq.CancelOutcome.CANCELLED
    assert redis_server.client.keys("{%s:off:*}:history*" % ns) == []
