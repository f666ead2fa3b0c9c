"""Enqueue rate of the SDK on a redis-server of its own (never a shared one).

    python bench.py [--orders 100000] [--batch 500] [--payload-bytes 150]

Starts redis-server on a free port in a temp dir, registers the queue with the delayq binary
($DELAYQ_BIN, default <repo>/target/debug/delayq), schedules the orders with the sync and the
asyncio client in schedule_many calls of --batch orders, and prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "src"))
import delayq  # noqa: E402
import redis  # noqa: E402

BIN = os.environ.get("DELAYQ_BIN") or str(HERE.parents[1] / "target" / "debug" / "delayq")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--orders", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--payload-bytes", type=int, default=150)
    ap.add_argument("--shards", type=int, default=1)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="delayq-py-bench-")
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", d],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        url = f"redis://127.0.0.1:{port}"
        pad = "x" * max(0, a.payload_bytes - 40)
        for kind in ("sync", "asyncio"):
            ns = f"bench-{kind}"
            subprocess.run([BIN, "--redis-url", url, "--namespace", ns, "queue", "create", "b", "--shards", str(a.shards)],
                           check=True, capture_output=True)
            batches = [
                [delayq.Order(f"o-{i}", delay_ms=3_600_000, payload=delayq.RawJson('{"order":%d,"pad":"%s"}' % (i, pad)))
                 for i in range(s, min(s + a.batch, a.orders))]
                for s in range(0, a.orders, a.batch)
            ]
            if kind == "sync":
                c = delayq.Client(url, namespace=ns)
                c.schedule("b", "warm", delay_ms=1)
                t0 = time.perf_counter()
                for b in batches:
                    c.schedule_many("b", b)
                dt = time.perf_counter() - t0
                c.close()
            else:
                async def run() -> float:
                    c = await delayq.AsyncClient.connect(url, namespace=ns)
                    await c.schedule("b", "warm", delay_ms=1)
                    t0 = time.perf_counter()
                    for b in batches:
                        await c.schedule_many("b", b)
                    t = time.perf_counter() - t0
                    await c.close()
                    return t

                dt = asyncio.run(run())
            n = sum(r.zcard("{%s:b:%d}:due" % (ns, s)) for s in range(a.shards)) - 1
            assert n == a.orders, n
            print(json.dumps({"client": f"python-{kind}", "orders": a.orders, "batch": a.batch,
                              "payload_bytes": a.payload_bytes, "seconds": round(dt, 3),
                              "orders_per_s": round(a.orders / dt)}))
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
