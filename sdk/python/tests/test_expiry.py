"""Expiry of stale work (issue 44): an order's own ``expires_after_ms`` through the sync and
the asyncio client, stored the way the Rust client stores it (``"<ms>:!<expires>!<json>"``,
src/engine/expiry.rs) so Rust workers judge it, the payload read back byte for byte; a
refusal names the field and writes nothing."""

from __future__ import annotations

import pytest

import delayq
from conftest import create_queue

NOW = 1_800_000_000_000


def test_expires_after_is_stored_in_front_of_the_payload(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "exp", shards=1)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    c.schedule("exp", "a", delay_ms=60_000, payload=delayq.RawJson(' {"n": 1} '), expires_after_ms=1500)
    c.schedule_many("exp", [delayq.Order("b", delay_ms=60_000, payload=[2], expires_after_ms=60_000), delayq.Order("c", delay_ms=0)])
    raw = redis_server.client.hgetall("{%s:exp:0}:payload" % ns)
    assert raw[b"a"] == b'%d:!1500! {"n": 1} ' % NOW
    assert raw[b"b"] == b"%d:!60000![2]" % NOW
    assert raw[b"c"] == b"%d:null" % NOW, "no expiry: the bytes every order always had"
    got = c.get("exp", "a")
    assert (got.payload, got.payload_json) == ({"n": 1}, ' {"n": 1} ')
    assert c.get("exp", "b").payload == [2]


@pytest.mark.parametrize("ms", [0, -1, 3653 * 86_400_000 + 1, 1.5, True, "1s"])
def test_refusals_name_the_field_and_write_nothing(redis_server, ns, make_client, ms):
    create_queue(redis_server.url, ns, "exp", shards=1)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    before = redis_server.client.dbsize()
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("exp", "x", delay_ms=0, expires_after_ms=ms)
    assert e.value.code == "invalid_option"
    assert "expires_after" in str(e.value)
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule_many("exp", [delayq.Order("y", delay_ms=0), delayq.Order("z", delay_ms=0, expires_after_ms=ms)])
    assert (e.value.code, e.value.index) == ("invalid_option", 1)
    assert redis_server.client.dbsize() == before
