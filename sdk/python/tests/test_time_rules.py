"""Issue 44's dedup window and debounce through the SDK, sync and asyncio: a dispatched id
is a duplicate within the window (with and without if_absent) until ``repeat``; a
debounce is capped at its first call + max_wait and read back by ``get``. Dispatch runs
the engine's own dequeue.lua (``delayq scripts export``)."""

from __future__ import annotations

from pathlib import Path

import delayq
from conftest import run_bin


def _dispatch(r, ns: str, queue: str, scripts: Path) -> int:
    """One call of the engine's dequeue.lua on shard 0 at the server's time (history off)."""
    tag = "{%s:%s:0}" % (ns, queue)
    keys = [f"{tag}:{k}" for k in ("due", "payload", "stream", "history:0:0", "meta", "levels", "high:stream", "low:stream", "dispatched", "debounce", "tags", "keyed", "key_ring")]
    sec, usec = r.time()
    now = sec * 1000 + usec // 1000
    return int(r.eval((scripts / "dequeue.lua").read_text(), len(keys), *keys, now, 1000, 0, 0)[0])


def test_dedup_window_repeat_and_debounce(redis_server, ns, make_client, tmp_path):
    run_bin("scripts", "export", str(tmp_path))
    run_bin("queue", "create", "dd", "--dedup-window", "1h", url=redis_server.url, namespace=ns)
    c = make_client(redis_server.url, namespace=ns)
    assert c.schedule("dd", "o", delay_ms=0).outcome == delayq.Outcome.CREATED
    assert _dispatch(redis_server.client, ns, "dd", tmp_path) == 1
    dup = c.schedule("dd", "o", delay_ms=0, payload=2)
    assert dup.outcome == delayq.Outcome.DUPLICATE and dup.dispatched_at_ms is not None
    assert c.schedule("dd", "o", delay_ms=0, mode="if_absent").outcome == delayq.Outcome.DUPLICATE
    assert c.get("dd", "o") is None, "a duplicate wrote something"
    res = c.schedule_many("dd", [delayq.Order("o", delay_ms=0), delayq.Order("p", delay_ms=0)])
    assert [r.outcome for r in res] == [delayq.Outcome.DUPLICATE, delayq.Outcome.CREATED]
    assert c.schedule("dd", "o", delay_ms=0, repeat=True).outcome == delayq.Outcome.CREATED
    assert _dispatch(redis_server.client, ns, "dd", tmp_path) == 2

    # delay = max_wait: the second call is capped at the first one's due time.
    a = c.schedule("dd", "cart", debounce={"delay_ms": 3_600_000, "max_wait_ms": 3_600_000}, payload=1)
    b = c.schedule("dd", "cart", debounce=delayq.Debounce(3_600_000, 3_600_000), payload=2)
    assert (a.outcome, b.outcome) == (delayq.Outcome.CREATED, delayq.Outcome.UPDATED)
    assert b.due_at_ms == a.due_at_ms
    got = c.get("dd", "cart")
    assert got.payload == 2 and got.debounce == (a.due_at_ms - 3_600_000, a.due_at_ms)
    try:
        c.schedule("dd", "cart", debounce={"delay_ms": 500, "max_wait_ms": 2000}, mode="if_absent")
        raise AssertionError("debounce with if_absent was accepted")
    except delayq.InvalidInput as e:
        assert e.code == "invalid_option" and "debounce" in str(e)
