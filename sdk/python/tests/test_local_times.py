"""Local wall-clock due times (issue 44) through the sync and the asyncio client: resolved
once with the recurring schedules' rules (the spring-forward gap's end, the fall-back
overlap's first occurrence), the resolved instant returned; a refusal writes nothing."""

from __future__ import annotations

import pytest

import delayq
from conftest import create_queue

NOW = 1_800_000_000_000
GAP_END = 1_806_195_600_000  # 2027-03-28T01:00:00Z: 02:30 Berlin does not exist
FIRST = 1_824_942_600_000  # 2027-10-31T00:30:00Z: 02:30 Berlin, first occurrence


def test_schedule_batch_and_reschedule_at_local_times(redis_server, ns, make_client):
    create_queue(redis_server.url, ns, "local", shards=2)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    s = c.schedule("local", "gap", at_local="2027-03-28T02:30", timezone="Europe/Berlin")
    assert (s.outcome, s.due_at_ms) == (delayq.Outcome.CREATED, GAP_END)
    assert c.get("local", "gap").due_at_ms == GAP_END
    [b] = c.schedule_many("local", [delayq.Order("twice", at_local="2027-10-31T02:30", timezone="Europe/Berlin")])
    assert b.due_at_ms == FIRST
    assert c.reschedule("local", "gap", at_local="2027-10-31T02:30", timezone="Europe/Berlin") == "rescheduled"
    assert c.get("local", "gap").due_at_ms == FIRST


@pytest.mark.parametrize(
    "kw, code",
    [
        ({"at_local": "2027-03-28T09:00", "timezone": "Mars/Olympus"}, "invalid_timezone"),
        ({"at_local": "2027-03-28T09:00Z", "timezone": "Europe/Berlin"}, "invalid_local_time"),
        ({"at_local": "2027-03-28T09:00"}, "invalid_timezone"),
        ({"delay_ms": 5, "timezone": "Europe/Berlin"}, "invalid_timezone"),
        ({"delay_ms": 5, "at_local": "2027-03-28T09:00", "timezone": "UTC"}, "invalid_local_time"),
    ],
)
def test_refusals_name_the_field_and_write_nothing(redis_server, ns, make_client, kw, code):
    create_queue(redis_server.url, ns, "local", shards=2)
    c = make_client(redis_server.url, namespace=ns, clock=lambda: NOW)
    before = redis_server.client.dbsize()
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("local", "x", **kw)
    assert e.value.code == code
    assert ("timezone" if code == "invalid_timezone" else "at_local") in str(e.value)
    assert redis_server.client.dbsize() == before
