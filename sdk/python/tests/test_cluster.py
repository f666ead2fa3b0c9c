"""A Redis Cluster (3 masters, 3 replicas) reached with a ``redis+cluster://`` URL: every
key of one call shares one hash tag, calls go to their shard's node, durable pipelines run
per node."""

from __future__ import annotations

import json
import subprocess

import pytest
from redis.cluster import RedisCluster

import delayq
from conftest import WAIT, RedisServer, create_queue, free_port, poll, run_bin


@pytest.fixture(scope="module")
def cluster():
    nodes = []
    try:
        for _ in range(6):
            bus = free_port()
            nodes.append(RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                     "--cluster-node-timeout", "2000", "--cluster-port", str(bus)))
        out = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr

        def healthy() -> bool:
            for n in nodes:
                info = n.client.cluster("info")
                if str(info.get("cluster_state")) != "ok":
                    return False
                rep = n.client.info("replication")
                if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                    return False
            return True

        poll("the cluster to be ok with its replicas linked", healthy, within=WAIT)
        yield nodes, "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    finally:
        for n in nodes:
            n.stop()


def test_schedule_cancel_get_on_a_cluster(cluster, ns, make_client):
    nodes, url = cluster
    create_queue(url, ns, "cq", shards=8)
    c = make_client(url, namespace=ns)
    ids = [f"c-{i}" for i in range(1200)]
    res = c.schedule_many("cq", [delayq.Order(i, delay_ms=3_600_000, payload={"i": i}) for i in ids])
    assert all(r.outcome == delayq.Outcome.CREATED for r in res)
    rc = RedisCluster(host="127.0.0.1", port=nodes[0].port)
    try:
        assert sum(rc.zcard("{%s:cq:%d}:due" % (ns, s)) for s in range(8)) == 1200
        # The shards are spread over the masters.
        owners = {rc.get_node_from_key("{%s:cq:%d}:due" % (ns, s)).port for s in range(8)}
        assert len(owners) > 1
    finally:
        rc.close()
    assert c.get("cq", "c-17").payload == {"i": "c-17"}
    assert c.cancel("cq", "c-17") == delayq.CancelOutcome.CANCELLED
    assert c.get("cq", "c-17") is None
    assert c.reschedule("cq", "c-18", delay_ms=10) == delayq.RescheduleOutcome.RESCHEDULED
    # The engine finds what the SDK wrote, on the cluster too.
    out = json.loads(run_bin("get", "cq", "c-999", url=url, namespace=ns).stdout)
    assert out["state"] == "scheduled" and out["payload"] == {"i": "c-999"}


def test_durable_writes_on_a_cluster(cluster, ns, make_client):
    nodes, url = cluster
    create_queue(url, ns, "cd", shards=6)
    c = make_client(url, namespace=ns, durability=delayq.Replicated(replicas=1, timeout_ms=5000))
    res = c.schedule_many("cd", [delayq.Order(f"d-{i}", delay_ms=60_000) for i in range(600)])
    assert all(r.outcome == delayq.Outcome.CREATED for r in res)
    # Three replicas asked, one per master exists: not replicated.
    with pytest.raises(delayq.NotReplicated):
        c.with_durability(delayq.Replicated(replicas=3, timeout_ms=100)).schedule("cd", "x", delay_ms=1)
