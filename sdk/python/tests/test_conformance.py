"""Every case of tests/conformance/inputs.json, through the sync and the asyncio client."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

import delayq
from conftest import REPO, RedisServer, create_queue

DOC = json.loads((REPO / "tests" / "conformance" / "inputs.json").read_text(encoding="utf-8"))
CASES: List[Dict[str, Any]] = DOC["cases"]
OPS = {"schedule", "schedule_many", "cancel", "get", "reschedule", "connect", "post_event"}


CASE_KEYS = {
    "name", "op", "queue", "id", "delay_ms", "due_ms", "payload", "mode", "orders", "generate",
    "namespace", "fixed_clock", "expect", "index", "priority", "expect_priority",
    "at_local", "timezone", "expect_due_ms", "expires_after_ms", "debounce", "repeat", "tags",
    "key", "event", "data", "cancel_on",
}


def test_the_file_is_well_formed():
    assert DOC["format"] == 6, "a conformance format this reader does not know"
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    for c in CASES:
        assert c["op"] in OPS, c["name"]
        assert c["expect"] is None or c["expect"] in DOC["codes"], c["name"]
        assert set(c) <= CASE_KEYS, (c["name"], set(c) - CASE_KEYS)
    assert "invalid_priority" in DOC["codes"]


def test_limits_are_the_sdks():
    lim = DOC["limits"]
    r = delayq.rules
    assert lim["max_id_bytes"] == r.MAX_ID_LEN
    assert lim["max_name_bytes"] == r.MAX_NAME_LEN
    assert lim["max_payload_bytes"] == r.DEFAULT_MAX_PAYLOAD_BYTES
    assert lim["max_payload_depth"] == r.MAX_PAYLOAD_DEPTH
    assert lim["max_ahead_ms"] == r.MAX_AHEAD_MS
    assert lim["max_batch"] == r.MAX_BATCH
    assert lim["enqueue_call_orders"] == r.ENQUEUE_CALL_ORDERS
    assert lim["enqueue_call_bytes"] == r.ENQUEUE_CALL_BYTES


@pytest.fixture(scope="module")
def server():
    s = RedisServer()
    for q in DOC["queues"]:
        create_queue(s.url, DOC["namespace"], q["name"], q["shards"])
    yield s
    s.stop()


def _when(d: Dict[str, Any]) -> Dict[str, Any]:
    """The case's due-time fields as given (a local time's combination cases give several)."""
    keys = ("delay_ms", "due_ms", "at_local", "timezone", "debounce", "repeat")
    return {k: d[k] for k in keys if k in d}


def _scheduled_count(server: RedisServer) -> int:
    r = server.client
    return sum(r.zcard(k) for k in r.scan_iter(match="{%s:*}:due" % DOC["namespace"]))


def _expiry(d: Dict[str, Any]) -> Dict[str, Any]:
    """The order's own ``expires_after_ms``, ``tags`` and ``cancel_on`` exactly as the file
    has them (absent: none)."""
    return {k: d[k] for k in ("expires_after_ms", "tags", "cancel_on") if k in d}


def _key(d: Dict[str, Any]) -> Dict[str, Any]:
    """The order's ``key`` exactly as the file has it (absent: none)."""
    return {"key": d["key"]} if "key" in d else {}


def _level(d: Dict[str, Any]) -> Dict[str, Any]:
    """The ``priority`` given to the SDK exactly as the file has it (absent: normal)."""
    return {"priority": d["priority"]} if "priority" in d else {}


def run_case(client: Any, case: Dict[str, Any]) -> Any:
    op, q = case["op"], case.get("queue")
    mode = "if_absent" if case.get("mode") == "if_absent" else "upsert"
    if op == "schedule":
        payload = delayq.RawJson(case["payload"])
        return client.schedule(q, case["id"], payload=payload, mode=mode, **_when(case), **_level(case), **_expiry(case), **_key(case))
    if op == "schedule_many":
        if "generate" in case:
            g = case["generate"]
            p = delayq.RawJson(g["payload"])
            orders = [delayq.Order(f"{g['id_prefix']}{i}", delay_ms=g["delay_ms"], payload=p) for i in range(g["count"])]
        else:
            orders = []
            for i, o in enumerate(case["orders"]):
                try:
                    payload = delayq.RawJson(o["payload"])  # the text is checked when built
                    # The level too, order by order, as the Rust runner parses it (README,
                    # "The order of checks", 1); the SDK checks it again in schedule_many.
                    if "priority" in o:
                        delayq.rules.check_priority(o["priority"])
                except delayq.InvalidInput as e:
                    raise e.in_batch(i) from None
                orders.append(delayq.Order(o["id"], payload=payload, **_when(o), **_level(o), **_expiry(o), **_key(o)))
        return client.schedule_many(q, orders, mode=mode)
    if op == "cancel":
        return client.cancel(q, case["id"])
    if op == "post_event":
        return client.post_event(case["event"], case.get("data"), id=case.get("id"))
    if op == "get":
        return client.get(q, case["id"])
    if op == "reschedule":
        return client.reschedule(q, case["id"], **_when(case), **_level(case))
    raise AssertionError(f"unknown op {op}")


def _check_levels(client: Any, case: Dict[str, Any], out: Any) -> None:
    """After an accepted call: what ``get`` reads back has the level the case gave (or
    states with ``expect_priority``)."""
    op, q = case["op"], case.get("queue")
    if op == "get":
        if "expect_priority" in case:
            assert out is not None, f"{case['name']}: not found, expected priority {case['expect_priority']}"
            assert out.priority == case["expect_priority"], f"{case['name']}: priority {out.priority.value}"
    elif op == "schedule" and out.outcome != delayq.Outcome.UNCHANGED:
        got = client.get(q, case["id"])
        assert got.priority == case.get("priority", "normal"), f"{case['name']}: stored {got.priority.value}"
        assert list(got.tags) == case.get("tags", []), f"{case['name']}: stored tags {got.tags}"
        assert got.key == case.get("key"), f"{case['name']}: stored key {got.key!r}"
    elif op == "schedule_many" and "orders" in case:
        # An id repeated in the batch: its last write.
        last = {}
        for o, r in zip(case["orders"], out):
            if r.outcome != delayq.Outcome.UNCHANGED:
                last[o["id"]] = o.get("priority", "normal")
        for i, level in last.items():
            assert client.get(q, i).priority == level, f"{case['name']}: {i!r} stored at another level"
    elif op == "reschedule" and "priority" in case and out == delayq.RescheduleOutcome.RESCHEDULED:
        assert client.get(q, case["id"]).priority == case["priority"], f"{case['name']}: level not changed"


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(server, case, kind):
    from conftest import AsyncFacade

    opts = {"clock": lambda: DOC["now_ms"]}
    expect = case["expect"]
    if case["op"] == "connect":
        try:
            c = delayq.Client(server.url, namespace=case["namespace"], **opts) if kind == "sync" else AsyncFacade(server.url, namespace=case["namespace"], **opts)
        except delayq.InvalidInput as e:
            assert e.code == expect, f"{case['name']}: got {e.code}, expected {expect}"
            return
        c.close()
        assert expect is None, f"{case['name']}: accepted, expected {expect}"
        return
    client = delayq.Client(server.url, namespace=DOC["namespace"], **opts) if kind == "sync" else AsyncFacade(server.url, namespace=DOC["namespace"], **opts)
    try:
        before = _scheduled_count(server)
        dbsize = server.client.dbsize()
        try:
            out = run_case(client, case)
        except delayq.InvalidInput as e:
            assert e.code == expect, f"{case['name']}: got {e.code} ({e}), expected {expect}"
            if "index" in case:
                assert e.index == case["index"], f"{case['name']}: index {e.index}, expected {case['index']}"
            elif case["op"] != "schedule_many":
                assert e.index is None
        except delayq.QueueNotFound as e:
            assert e.code == expect, f"{case['name']}: queue_not_found, expected {expect}"
        else:
            assert expect is None, f"{case['name']}: succeeded ({out!r:.200}), expected {expect}"
            _check_levels(client, case, out)
            if "expect_due_ms" in case:
                got = client.get(case["queue"], case["id"]).due_at_ms
                assert (out.due_at_ms, got) == (case["expect_due_ms"],) * 2, f"{case['name']}: due {out.due_at_ms}, stored {got}"
            return
        # A refused call wrote nothing.
        assert _scheduled_count(server) == before
        assert server.client.dbsize() == dbsize
    finally:
        client.close()
