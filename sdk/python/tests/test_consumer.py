"""The pull consumers (issue 45): ``delayq.Consumer`` and ``delayq.AsyncConsumer`` against
a ``delayq serve`` of the test's own (with an API token) over the HTTP pull API: receive and
ack empty the group, a failing handler is nacked and the order comes back at attempt 2, an
explicit dead nack keeps the error text, a receipt whose lease ran out is ``LeaseLost``,
and the token appears in no error or repr."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request

import pytest

import delayq
from conftest import Serve, create_queue, poll

TOKEN = "py-consumer-secret-token-3f9c"
QUEUE = "pulled"
GROUP = "close"


@pytest.fixture
def serve(redis_server, ns):
    create_queue(redis_server.url, ns, QUEUE)
    s = Serve(redis_server.url, ns, QUEUE, None, tokens=(TOKEN,))
    poll("delayq serve to answer /readyz", lambda: s.http("GET", "/readyz")[0] == 200)
    yield s
    s.stop()


def _pending(redis_server, ns: str) -> int:
    """The group's pending entries (XPENDING) over the queue's one shard's three lanes."""
    n = 0
    for lane in (":high:stream", ":stream", ":low:stream"):
        key = "{%s:%s:0}%s" % (ns, QUEUE, lane)
        if redis_server.client.exists(key):
            n += redis_server.client.xpending(key, GROUP)["pending"]
    return n


def _joined(c: delayq.Consumer) -> None:
    """Joins the group (its first receive) before anything is due."""
    assert c.receive() == []


def _receive_all(c: delayq.Consumer, n: int, **kw):
    got = []
    poll(f"{n} deliveries", lambda: got.extend(c.receive(**kw)) or len(got) >= n)
    return got


def test_receive_and_ack_empty_the_group(serve, redis_server, ns):
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    _joined(c)
    producer = delayq.Client(redis_server.url, namespace=ns)
    raw = '{"user": 42,  "items": [1.50, "é"]}'
    producer.schedule(QUEUE, "raw", delay_ms=0, payload=delayq.RawJson(raw))
    for i in range(4):
        producer.schedule(QUEUE, f"o{i}", delay_ms=0, payload={"n": i}, priority="high" if i == 0 else None)
    producer.close()
    got = _receive_all(c, 5)
    assert sorted(d.id for d in got) == ["o0", "o1", "o2", "o3", "raw"]
    by_id = {d.id: d for d in got}
    assert json.loads(by_id["raw"].payload_json) == by_id["raw"].payload
    assert by_id["raw"].payload == {"user": 42, "items": [1.5, "é"]}
    assert by_id["o2"].payload == {"n": 2} and by_id["o0"].priority == "high"
    assert all(d.attempt == 1 and d.dispatched_at_ms >= d.due_at_ms > 0 for d in got)
    assert _pending(redis_server, ns) == 5
    assert c.ack(got) == ["acked"] * 5
    assert _pending(redis_server, ns) == 0
    assert c.receive() == []


def test_run_long_polls_instead_of_pausing_and_stops_when_asked(serve, redis_server, ns):
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    _joined(c)
    waits = []
    receive = c.receive

    def recording(max=10, lease_ms=None, wait_ms=0):  # noqa: A002
        waits.append(wait_ms)
        return receive(max=max, lease_ms=lease_ms, wait_ms=wait_ms)

    c.receive = recording  # type: ignore[method-assign]

    class Stop(threading.Event):
        """Records each pause the loop asks for (it should ask none)."""

        def __init__(self) -> None:
            super().__init__()
            self.pauses = []

        def wait(self, timeout=None):
            self.pauses.append(timeout)
            return super().wait(timeout)

    stop = Stop()
    handled = threading.Event()
    report = {}
    t = threading.Thread(target=lambda: report.update(r=c.run(lambda d: handled.set(), concurrency=3, stop=stop, wait_ms=2000)))
    t.start()
    try:
        # Scheduled while the loop's receive waits on the server: handled at once.
        poll("the first long poll", lambda: len(waits) >= 1)
        with delayq.Client(redis_server.url, namespace=ns) as producer:
            producer.schedule(QUEUE, "o1", delay_ms=0, payload={})
        poll("the order to be handled", handled.is_set)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert report["r"] == delayq.RunReport(1, 0, 0)
    assert set(waits) == {2000}, waits
    assert stop.pauses == []


def test_a_long_handler_gets_its_lease_extended_and_is_acked_once(serve, redis_server, ns):
    # A 600 ms lease; the handler runs until its lease was extended three times, far past
    # the first lease: without the extensions the order would be taken over.
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP, lease_ms=600)
    _joined(c)
    seen = []

    def handler(d: delayq.Delivery) -> None:
        receipts = {d.receipt}
        seen.append((d.id, d.attempt))
        poll("three extensions", lambda: receipts.add(d.receipt) or len(receipts) >= 4)

    stop = threading.Event()
    report = {}
    t = threading.Thread(target=lambda: report.update(r=c.run(handler, concurrency=2, stop=stop, wait_ms=500)))
    t.start()
    try:
        with delayq.Client(redis_server.url, namespace=ns) as producer:
            producer.schedule(QUEUE, "long", delay_ms=0, payload={})
        poll("the long handler to be acked", lambda: _pending(redis_server, ns) == 0 and seen)
    finally:
        stop.set()
        t.join(timeout=30)
    assert report["r"] == delayq.RunReport(acked=1, nacked=0, lease_lost=0)
    assert seen == [("long", 1)]


def test_stop_lets_running_handlers_finish_within_the_grace(serve, redis_server, ns):
    async def scenario():
        c = delayq.AsyncConsumer(serve.base_url, TOKEN, QUEUE, GROUP, lease_ms=60_000)
        assert await c.receive() == []
        with delayq.Client(redis_server.url, namespace=ns) as producer:
            producer.schedule(QUEUE, "finishes", delay_ms=0, payload={})
            producer.schedule(QUEUE, "hangs", delay_ms=0, payload={})
        started, stop, release = set(), asyncio.Event(), asyncio.Event()

        async def handler(d: delayq.Delivery) -> None:
            started.add(d.id)
            if d.id == "hangs":
                await asyncio.Event().wait()  # never returns: cancelled after the grace
            await release.wait()

        async def stopper():
            while len(started) < 2:
                await asyncio.sleep(0.02)
            stop.set()
            release.set()

        report, _ = await asyncio.wait_for(
            asyncio.gather(c.run(handler, concurrency=2, stop=stop, wait_ms=500, grace=0.5), stopper()), 30)
        return report

    report = asyncio.run(scenario())
    # The finished one is acked; the hanging one's lease is left to run out (not nacked).
    assert report == delayq.RunReport(acked=1, nacked=0, lease_lost=0)
    assert _pending(redis_server, ns) == 1


def test_the_trace_context_of_a_traced_order_comes_with_it(serve):
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    _joined(c)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    req = urllib.request.Request(
        f"{serve.base_url}/v1/queues/{QUEUE}/messages/traced", method="PUT",
        data=json.dumps({"delay_ms": 0, "payload": {"user": 42}}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                 "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01", "tracestate": "shop=eu"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status in (200, 201)
    [d] = _receive_all(c, 1)
    assert d.id == "traced" and d.payload == {"user": 42}
    assert d.traceparent is not None and d.traceparent.split("-")[1] == trace_id, d
    assert d.tracestate == "shop=eu"
    assert c.ack(d) == ["acked"]


def test_the_payload_arrives_byte_for_byte(serve, redis_server, ns):
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    _joined(c)
    raw = '{"user": 42,  "items": [1.50, "é"]}'
    with delayq.Client(redis_server.url, namespace=ns) as producer:
        producer.schedule(QUEUE, "raw", delay_ms=0, payload=delayq.RawJson(raw))
    [d] = _receive_all(c, 1)
    c.ack(d)
    assert d.payload_json == raw


def test_a_failing_handler_is_nacked_and_comes_back_at_attempt_2(serve, redis_server, ns):
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    _joined(c)
    seen = []
    done = threading.Event()

    def handler(d: delayq.Delivery) -> None:
        seen.append((d.id, d.attempt))
        if d.attempt == 1:
            raise RuntimeError("the shop is closed")
        done.set()

    stop = threading.Event()
    report = {}
    t = threading.Thread(target=lambda: report.update(r=c.run(handler, concurrency=2, stop=stop, wait_ms=500)))
    t.start()
    try:
        with delayq.Client(redis_server.url, namespace=ns) as producer:
            producer.schedule(QUEUE, "flaky", delay_ms=0, payload={"x": 1})
        poll("the retry to be handled", done.is_set)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert seen == [("flaky", 1), ("flaky", 2)]
    assert report["r"] == delayq.RunReport(acked=1, nacked=1, lease_lost=0)
    assert _pending(redis_server, ns) == 0


def test_the_async_consumer_runs_a_coroutine_handler_and_dead_letters_with_the_text(serve, redis_server, ns):
    async def scenario():
        c = delayq.AsyncConsumer(serve.base_url, TOKEN, QUEUE, GROUP)
        assert await c.receive() == []
        with delayq.Client(redis_server.url, namespace=ns) as producer:
            producer.schedule(QUEUE, "ok", delay_ms=0, payload={"v": 1})
            producer.schedule(QUEUE, "bad", delay_ms=0, payload={"v": 2})
        handled = []
        stop = asyncio.Event()

        async def handler(d: delayq.Delivery) -> None:
            if d.id == "bad":
                # Straight to the dead letters, then the loop's ack finds the lease gone.
                await c.nack(d, dead=True, error="no such order in the shop")
                return
            handled.append(d.id)

        async def stopper():
            while _pending(redis_server, ns) or not handled:
                await asyncio.sleep(0.02)
            stop.set()

        report, _ = await asyncio.wait_for(asyncio.gather(c.run(handler, concurrency=4, stop=stop, wait_ms=500), stopper()), 30)
        return handled, report

    handled, report = asyncio.run(scenario())
    assert handled == ["ok"]
    assert report == delayq.RunReport(acked=1, nacked=0, lease_lost=1)
    req = urllib.request.Request(f"{serve.base_url}/v1/queues/{QUEUE}/dead?group={GROUP}",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        dead = json.loads(r.read())["dead_letters"]
    assert [(d["id"], d["last_error"]) for d in dead] == [("bad", "no such order in the shop")]


def test_a_receipt_whose_lease_ran_out_is_lease_lost(serve, redis_server, ns):
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP, lease_ms=200)
    _joined(c)
    with delayq.Client(redis_server.url, namespace=ns) as producer:
        producer.schedule(QUEUE, "slow", delay_ms=0, payload={})
    [first] = _receive_all(c, 1)
    old_receipt = first.receipt
    # Another receive takes it over once the lease ran out: attempt 2.
    [again] = _receive_all(c, 1, lease_ms=60_000)
    assert (again.id, again.attempt) == ("slow", 2)
    for settle in (lambda: c.ack(first), lambda: c.nack(first, retry_in_ms=0), lambda: c.extend(first)):
        with pytest.raises(delayq.LeaseLost) as e:
            settle()
        assert (e.value.status, e.value.code) == (409, "lease_lost")
    assert first.receipt == old_receipt
    # The live one extends (a new receipt, set on the delivery) and acks.
    [new] = c.extend(again, lease_ms=60_000)
    assert new is not None and again.receipt == new
    # Several at once: one result each, in order (409 only when every lease was lost).
    assert c.ack([first, again]) == ["lease_lost", "acked"]
    assert _pending(redis_server, ns) == 0


def test_errors_carry_the_api_code_and_never_the_token(serve, redis_server, ns):
    wrong = "wrong-token-never-shown-7b1e"
    bad = delayq.Consumer(serve.base_url, wrong, QUEUE, GROUP)
    with pytest.raises(delayq.ApiError) as e:
        bad.receive()
    assert e.value.status == 401 and e.value.code and e.value.write_outcome == "not_applied"
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    with pytest.raises(delayq.ApiError) as e2:
        c.receive(max=0)
    assert (e2.value.status, e2.value.code) == (400, "invalid_option") and "max" in str(e2.value)
    with pytest.raises(delayq.ApiError) as e3:
        delayq.Consumer(serve.base_url, TOKEN, "no-such-queue", GROUP).receive()
    assert (e3.value.status, e3.value.code) == (404, "queue_not_found")
    with pytest.raises(delayq.ApiError) as e4:
        c.ack("not-a-receipt")
    assert e4.value.status == 400
    # The run loop raises what asking again will not cure (a refused token).
    with pytest.raises(delayq.ApiError) as e6:
        bad.run(lambda d: None, stop=threading.Event())
    assert e6.value.status == 401
    gone = delayq.Consumer(f"http://127.0.0.1:{serve.port}", TOKEN, QUEUE, GROUP, timeout=5)
    serve.stop()
    with pytest.raises(delayq.ApiUnreachable) as e5:
        gone.receive()
    for err in (e, e2, e3, e4, e5):
        for text in (str(err.value), repr(err.value)):
            assert TOKEN not in text and wrong not in text, text
    for obj in (bad, c, delayq.AsyncConsumer(serve.base_url, TOKEN, QUEUE, GROUP)):
        assert TOKEN not in repr(obj) and wrong not in repr(obj)


def test_calls_reuse_one_kept_alive_connection_per_thread(serve, redis_server, ns, monkeypatch):
    """A connection per call costs a handshake each and leaves a socket in TIME_WAIT behind
    it (a busy consumer runs out of local ports): 20 calls from one thread open one
    connection, another thread opens its own, and a connection the server closed is
    replaced, never written into."""
    import socket

    opened = []
    real = socket.create_connection

    def counting(*a, **kw):
        s = real(*a, **kw)
        opened.append(s)
        return s

    monkeypatch.setattr(socket, "create_connection", counting)
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    for _ in range(20):
        assert c.receive() == []
    assert len(opened) == 1, f"{len(opened)} connections for 20 calls"
    t = threading.Thread(target=c.receive)
    t.start()
    t.join()
    assert len(opened) == 2, "another thread has its own connection"
    # The server's side goes away (as an idle timeout closes it): the next call opens a
    # new connection and succeeds.
    opened[0].shutdown(socket.SHUT_RDWR)
    assert c.receive() == []
    assert len(opened) == 3
    c.close()


def test_handlers_that_finish_while_an_ack_is_in_flight_share_the_next_ack(serve, redis_server, ns, monkeypatch):
    """run() acks the deliveries of handlers that returned while an :ack call was in flight
    with one next call, instead of one call each: the first ack is held until the three
    other handlers' acks are queued, then those three go in one call."""
    import delayq._acks as acks_mod
    import delayq.consumer as consumer_mod

    batches = []

    class Spy(acks_mod.AckBatch):
        def __init__(self, consumer):
            super().__init__(consumer)
            batches.append(self)

    monkeypatch.setattr(consumer_mod, "AckBatch", Spy)
    c = delayq.Consumer(serve.base_url, TOKEN, QUEUE, GROUP)
    _joined(c)
    sizes = []
    first_may_go = threading.Event()
    real_ack = c.ack

    def ack(what):
        sizes.append(len(what))
        if len(sizes) == 1:
            first_may_go.wait(60)
        return real_ack(what)

    c.ack = ack  # type: ignore[method-assign]
    with delayq.Client(redis_server.url, namespace=ns) as producer:
        for i in range(4):
            producer.schedule(QUEUE, f"s{i}", delay_ms=0, payload={})
    stop = threading.Event()
    report = {}
    t = threading.Thread(target=lambda: report.update(r=c.run(lambda d: None, concurrency=4, stop=stop, wait_ms=500)))
    t.start()
    try:
        poll("three acks queued behind the first", lambda: len(batches) == 1 and len(batches[0]._queued) == 3)
        first_may_go.set()
        poll("every order acked", lambda: _pending(redis_server, ns) == 0 and sum(sizes) == 4)
    finally:
        first_may_go.set()
        stop.set()
        t.join(timeout=30)
    assert not t.is_alive()
    assert sizes == [1, 3], sizes
    assert report["r"] == delayq.RunReport(4, 0, 0)
