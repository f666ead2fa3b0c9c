"""Orders scheduled by the SDK are dispatched, delivered, looked up and cancelled by the Rust
engine exactly like the Rust client's, and the reverse: ``delayq serve`` with a webhook
handler, and the ``delayq`` command line."""

from __future__ import annotations

import json

import pytest
import redis

import delayq
from conftest import Serve, Webhook, create_queue, poll, run_bin

PAYLOADS = [
    '{"n":123456789012345678901234567890,"d":0.1000000000000000055511151231257827}',
    '{"name":"заказ ✓ 🎉","esc":"\\u00e9\\n\\"q\\"","zw":"a\u200bb"}',
    '[1,{"a":[]},null,true,-0,1E+2]',
    '"a string"',
    "123456789012345678901234567890",
]


@pytest.fixture
def serve(redis_server, ns):
    hook = Webhook()
    create_queue(redis_server.url, ns, "hooked", shards=4)
    s = Serve(redis_server.url, ns, "hooked", hook.url, shards=4)
    yield s, hook
    s.stop()
    hook.stop()


def _deliveries(hook: Webhook, n: int):
    got = {}
    while len(got) < n:
        call = hook.next()
        got[call["json"]["id"]] = call
    return got


def test_scheduled_by_the_sdk_delivered_by_serve_byte_for_byte(serve, redis_server, ns, make_client):
    s, hook = serve
    c = make_client(redis_server.url, namespace=ns)
    ids = [f"sdk-{make_client.kind}-{i}-заказ" for i in range(len(PAYLOADS))]
    scheduled = c.schedule_many(
        "hooked", [delayq.Order(i, delay_ms=50, payload=delayq.RawJson(p)) for i, p in zip(ids, PAYLOADS)]
    )
    assert len({delayq.shard_of(i, 4) for i in ids}) > 1  # several shards, found by the engine
    got = _deliveries(hook, len(ids))
    assert set(got) == set(ids)
    for i, p, sch in zip(ids, PAYLOADS, scheduled):
        body = got[i]["body"].decode("utf-8")
        assert f'"payload":{p}' in body, body  # embedded byte for byte
        assert got[i]["json"]["queue"] == "hooked" and got[i]["json"]["group"] == "hook"
        assert got[i]["json"]["due_at_ms"] == sch.due_at_ms
    # The engine's history knows them as dispatched.
    out = json.loads(run_bin("get", "hooked", ids[0], url=redis_server.url, namespace=ns).stdout)
    assert out["state"] == "dispatched" and out["due_at_ms"] == scheduled[0].due_at_ms


def test_cancelled_before_due_is_never_delivered(serve, redis_server, ns, make_client):
    s, hook = serve
    c = make_client(redis_server.url, namespace=ns)
    a = c.schedule("hooked", "cancel-me", delay_ms=2000, payload={"which": "a"})
    # CANCELLED (not NOT_FOUND) means cancel.lua removed it while it was still scheduled:
    # it was never dispatched, and can no longer be.
    assert c.cancel("hooked", "cancel-me") == delayq.CancelOutcome.CANCELLED
    # A later order, due after the cancelled one: once it is delivered, the cancelled
    # one's due time has passed on the dispatcher's clock.
    b = c.schedule("hooked", "later", due_ms=a.due_at_ms + 1, payload={"which": "b"})
    call = hook.next()
    assert call["json"]["id"] == "later" and call["json"]["due_at_ms"] == b.due_at_ms
    assert hook.calls.empty()
    # The Rust side answers cancelled (by id; issue 43), on the command line and over HTTP.
    out = json.loads(run_bin("get", "hooked", "cancel-me", url=redis_server.url, namespace=ns).stdout)
    assert (out["state"], out["cancelled"]["reason"]) == ("cancelled", "id")
    status, body = s.http("GET", "/v1/queues/hooked/messages/cancel-me")
    assert status == 200, body
    assert json.loads(body)["state"] == "cancelled"


def test_the_engine_reads_and_cancels_what_the_sdk_wrote(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "both", shards=4)
    c = make_client(redis_server.url, namespace=ns)
    ids = [f"o-{i}" for i in range(8)]
    res = c.schedule_many("both", [delayq.Order(i, delay_ms=3_600_000, payload=delayq.RawJson(PAYLOADS[0])) for i in ids])
    for i, r in zip(ids, res):
        out = json.loads(run_bin("get", "both", i, url=redis_server.url, namespace=ns).stdout)
        assert out["state"] == "scheduled" and out["due_at_ms"] == r.due_at_ms
        assert out["payload"]["n"] == 123456789012345678901234567890
    run_bin("cancel", "both", ids[3], url=redis_server.url, namespace=ns)
    assert c.get("both", ids[3]) is None
    assert c.get("both", ids[4]) is not None


def test_the_sdk_reads_and_cancels_what_the_engine_wrote(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "rev", shards=4)
    text = PAYLOADS[1]
    ids = [f"rust-{i}" for i in range(6)]
    dues = {}
    for i in ids:
        out = json.loads(run_bin("schedule", "rev", i, "--in", "1h", "--payload", text, url=redis_server.url, namespace=ns).stdout)
        dues[i] = out["due_at_ms"]
    c = make_client(redis_server.url, namespace=ns)
    for i in ids:
        got = c.get("rev", i)
        assert got.payload_json == text and got.due_at_ms == dues[i]
        assert got.payload["name"] == "заказ ✓ 🎉"
    assert c.cancel("rev", ids[0]) == delayq.CancelOutcome.CANCELLED
    # Gone from the schedule; the engine's history tells the SDK's cancellation (issue 43).
    assert c.get("rev", ids[0]) is None
    out = json.loads(run_bin("get", "rev", ids[0], url=redis_server.url, namespace=ns).stdout)
    assert (out["state"], out["cancelled"]["reason"]) == ("cancelled", "id")
    # An if-absent schedule from the SDK leaves the engine's order as it was.
    assert c.schedule("rev", ids[1], delay_ms=5, payload={}, mode="if_absent").outcome == delayq.Outcome.UNCHANGED
    assert c.get("rev", ids[1]).payload_json == text


def test_same_keys_and_values_as_the_rust_client(redis_server, make_client):
    """The same orders scheduled by the engine (``delayq schedule``) in one namespace and by
    the SDK in another leave the same keys and values, but for the namespace and the
    enqueue time."""
    import uuid

    r = redis_server.client
    rust_ns, py_ns = "r" + uuid.uuid4().hex[:8], "p" + uuid.uuid4().hex[:8]
    for ns in (rust_ns, py_ns):
        create_queue(redis_server.url, ns, "same", shards=4)
    due = 1_900_000_000_000
    orders = [(f"id-{i}-✓", PAYLOADS[i % len(PAYLOADS)]) for i in range(12)]
    for i, p in orders:
        run_bin("schedule", "same", i, "--at", str(due), "--payload", p, url=redis_server.url, namespace=rust_ns)
    c = make_client(redis_server.url, namespace=py_ns)
    c.schedule_many("same", [delayq.Order(i, due_ms=due, payload=delayq.RawJson(p)) for i, p in orders])

    def dump(ns: str):
        out = {}
        for key in r.scan_iter(match="{%s:same:*" % ns):
            k = key.decode().replace(ns, "NS", 1)
            t = r.type(key).decode()
            if t == "zset":
                out[k] = sorted(r.zrange(key, 0, -1, withscores=True))
            elif t == "hash" and k.endswith(":payload"):
                out[k] = {f: v.split(b":", 1)[1] for f, v in r.hgetall(key).items()}
            elif t == "hash" and k.endswith(":meta"):
                out[k] = sorted(r.hkeys(key))
        return out

    rust, py = dump(rust_ns), dump(py_ns)
    assert py == rust
    assert sum(len(v) for k, v in py.items() if k.endswith(":due")) == len(orders)


def test_an_order_scheduled_in_a_trace_context_reads_back_byte_for_byte(serve, redis_server, ns, make_client):
    """``delayq serve`` stores a request's W3C trace context in front of the payload
    (``<ms>:~<traceparent>;<tracestate>~<json>``); ``get`` leaves it out."""
    import http.client

    s, _hook = serve
    poll("delayq serve to be ready", lambda: s.http("GET", "/readyz")[0] == 200)
    text = PAYLOADS[0]
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request(
        "PUT",
        "/v1/queues/hooked/messages/traced-1",
        body=f'{{"delay_ms": 3600000, "payload": {text}}}',
        headers={"content-type": "application/json", "traceparent": tp, "tracestate": "shop=1"},
    )
    r = conn.getresponse()
    assert r.status == 201, r.read()
    conn.close()
    c = make_client(redis_server.url, namespace=ns)
    key = f"{{{ns}:hooked:{delayq.shard_of('traced-1', 4)}}}:payload"
    raw = redis.Redis.from_url(redis_server.url).hget(key, "traced-1").decode()
    assert raw.split(":", 1)[1].startswith("~00-4bf92f3577b34da6a3ce929d0e0e4736-"), raw
    assert raw.endswith(f";shop=1~{text}"), raw
    got = c.get("hooked", "traced-1")
    assert got.payload_json == text
    assert got.payload == json.loads(text)
    assert c.cancel("hooked", "traced-1") == delayq.CancelOutcome.CANCELLED


def test_a_key_set_by_the_sdk_reaches_the_webhook_and_the_history(serve, redis_server, ns, make_client):
    # Issue 42: the SDK stores the key as the engine does; serve hands it to the webhook
    # (the body's "key"), the engine's history shows it; an unkeyed order's body has none.
    s, hook = serve
    c = make_client(redis_server.url, namespace=ns)
    k = c.schedule("hooked", "keyed-1", delay_ms=50, payload={"a": 1}, key="merchant:17", expires_after_ms=3_600_000)
    assert c.get("hooked", "keyed-1") is None or c.get("hooked", "keyed-1").key == "merchant:17"
    c.schedule("hooked", "plain-1", delay_ms=50, payload={"a": 2})
    got = _deliveries(hook, 2)
    assert got["keyed-1"]["json"]["key"] == "merchant:17"
    assert got["keyed-1"]["json"]["payload"] == {"a": 1}
    assert "key" not in got["plain-1"]["json"]
    out = json.loads(run_bin("get", "hooked", "keyed-1", url=redis_server.url, namespace=ns).stdout)
    assert out["key"] == "merchant:17" and out["due_at_ms"] == k.due_at_ms
