"""Durable writes on a real master and replica: ``WAIT`` in the same pipeline as the
enqueue calls; fewer acks than asked, or a connection lost before WAIT answered, is
``NotReplicated``, never success."""

from __future__ import annotations

import os
import signal
import threading

import pytest

import delayq
from conftest import RedisServer, create_queue, poll


@pytest.fixture(scope="module")
def pair():
    master = RedisServer()
    replica = RedisServer("--replicaof", "127.0.0.1", str(master.port))

    def linked() -> bool:
        info = replica.client.info("replication")
        return info.get("master_link_status") == "up" and master.client.info("replication").get("connected_slaves", 0) >= 1

    poll("the replica to sync with the master", linked)
    yield master, replica
    replica.stop()
    master.stop()


class Stopped:
    """The replica frozen with SIGSTOP (it keeps its connection, acknowledges nothing)."""

    def __init__(self, server: RedisServer):
        self.pid = server.proc.pid

    def __enter__(self):
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGCONT)


def test_replicated_schedule_is_acknowledged_by_the_replica(pair, ns, make_client):
    master, replica = pair
    create_queue(master.url, ns, "dur", shards=2)
    c = make_client(master.url, namespace=ns, durability=delayq.Replicated(replicas=1, timeout_ms=5000))
    res = c.schedule_many("dur", [delayq.Order(f"d-{i}", delay_ms=60_000, payload={"i": i}) for i in range(1200)])
    assert all(r.outcome == delayq.Outcome.CREATED for r in res)
    # Acknowledged means the replica has it.
    assert sum(replica.client.zcard("{%s:dur:%d}:due" % (ns, s)) for s in range(2)) == 1200


def test_a_stopped_replica_makes_it_not_replicated(pair, ns, make_client):
    master, replica = pair
    create_queue(master.url, ns, "dur2")
    c = make_client(master.url, namespace=ns)
    c.schedule("dur2", "warm", delay_ms=60_000)  # registry read, scripts loaded
    durable = c.with_durability(delayq.Replicated(replicas=1, timeout_ms=300))
    with Stopped(replica):
        with pytest.raises(delayq.NotReplicated) as e:
            durable.schedule("dur2", "o-1", delay_ms=60_000, payload={"x": 1})
        assert e.value.acked == 0 and e.value.wanted == 1 and e.value.code == "not_replicated"
        assert e.value.write_outcome == "unknown"
        # The order is on the master and may still fire; repeating is safe.
        assert master.client.zscore("{%s:dur2:0}:due" % ns, "o-1") is not None
        with pytest.raises(delayq.NotReplicated):
            durable.schedule_many("dur2", [delayq.Order(f"b-{i}", delay_ms=1000) for i in range(700)])
        # Two replicas asked, one exists: not replicated either.
    two = c.with_durability(delayq.Replicated(replicas=2, timeout_ms=200))
    with pytest.raises(delayq.NotReplicated) as e:
        two.schedule("dur2", "o-2", delay_ms=60_000)
    assert e.value.acked == 1
    # Once the replica is back, durable schedules succeed again.
    ok = c.with_durability(delayq.Replicated(replicas=1, timeout_ms=5000))
    assert ok.schedule("dur2", "o-1", delay_ms=60_000, payload={"x": 1}).outcome == delayq.Outcome.UPDATED


def test_a_connection_killed_while_wait_blocks_is_not_replicated(pair, ns, make_client):
    master, replica = pair
    create_queue(master.url, ns, "dur3")
    c = make_client(master.url, namespace=ns)
    c.schedule("dur3", "warm", delay_ms=60_000)
    durable = c.with_durability(delayq.Replicated(replicas=1, timeout_ms=30_000))
    outcome = {}

    def run():
        try:
            outcome["ok"] = durable.schedule("dur3", "k-1", delay_ms=60_000)
        except Exception as e:  # noqa: BLE001
            outcome["err"] = e

    with Stopped(replica):
        t = threading.Thread(target=run)
        t.start()

        def blocked_in_wait():
            # "b": blocked right now (cmd alone is only the last command of a connection).
            return [cl for cl in master.client.client_list() if cl.get("cmd") == "wait" and "b" in cl.get("flags", "")]

        waiting = poll("the durable pipeline to block in WAIT", blocked_in_wait)

        master.client.client_kill_filter(_id=waiting[0]["id"])
        t.join(20)
        assert not t.is_alive()
    assert isinstance(outcome.get("err"), delayq.NotReplicated), outcome
    # It was not re-sent on a fresh connection: the order was written once, by the call
    # whose connection was killed.
    assert master.client.zscore("{%s:dur3:0}:due" % ns, "k-1") is not None
