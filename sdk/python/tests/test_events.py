"""Cancel-on-event (issue 43 item 4) through the Python client: ``post_event`` computes the
Rust client's match tokens byte for byte, cancels the orders the Rust producer scheduled on
a queue with ``cancel_on`` rules, deduplicates by event id, remembers the event for an order
scheduled later, and refuses bad events naming the field with nothing written."""

from __future__ import annotations

import json

import pytest

import delayq
from conftest import run_bin


def test_post_event_cancels_the_matching_orders_once(redis_server, ns, make_client):
    url = redis_server.url
    run_bin("queue", "create", "ev", "--cancel-on", "order.paid:order_id", url=url, namespace=ns)
    for i in range(3):
        run_bin("schedule", "ev", f"o-{i}", "--in", "1h", "--payload", json.dumps({"order_id": i}), url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    a = c.post_event("order.paid", {"order_id": 1, "amount": 5}, id="pay-1")
    assert (a["cancelled"], a["queues"], a["duplicate"], a["matched_rules"]) == (1, {"ev": 1}, False, 1)
    again = c.post_event("order.paid", {"order_id": 1}, id="pay-1")
    assert (again["cancelled"], again["duplicate"]) == (0, True)
    assert [c.get("ev", f"o-{i}") is None for i in range(3)] == [False, True, False]
    assert c.get("ev", "o-0").tags == (), "the match token is not shown as a tag"
    # Event first: the Rust producer's order inside the window is cancelled_by_event.
    assert c.post_event("order.paid", {"order_id": 7})["cancelled"] == 0
    out = run_bin("schedule", "ev", "o-7", "--in", "1h", "--payload", '{"order_id":7}', url=url, namespace=ns)
    assert json.loads(out.stdout)["outcome"] == "cancelled_by_event"
    assert c.get("ev", "o-7") is None


def test_post_event_honours_the_rules_orders_declared_for_themselves(redis_server, ns, make_client):
    """Orders scheduled with their own rule (``delayq schedule --cancel-on``) on a queue
    without rules: the Python client's event cancels them (their tokens carry the rule's
    window, src/engine/events.rs "Order rules"), leaves their neighbours, and is remembered
    for the rule."""
    url = redis_server.url
    run_bin("queue", "create", "own", url=url, namespace=ns)
    for id, extra in [("with", ["--cancel-on", "order.paid:order_id@1m"]), ("without", [])]:
        run_bin("schedule", "own", id, "--in", "1h", "--payload", '{"order_id":9}', *extra, url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    a = c.post_event("order.paid", {"order_id": 9})
    assert (a["cancelled"], a["queues"], a["matched_rules"]) == (1, {"own": 1}, 1)
    assert c.get("own", "with") is None and c.get("own", "without") is not None
    assert c.post_event("order.paid", {"order_id": 10})["cancelled"] == 0
    out = run_bin("schedule", "own", "o-10", "--in", "1h", "--payload", '{"order_id":10}', "--cancel-on", "order.paid:order_id@1m", url=url, namespace=ns)
    assert json.loads(out.stdout)["outcome"] == "cancelled_by_event"


def test_tokens_are_the_rust_clients():
    assert delayq.rules.event_token("order.paid", ["order_id", "customer.id"], {"order_id": 1234, "customer": {"id": "42"}}) == '\x01order.paid {"order_id":1234,"customer.id":"42"}'
    assert delayq.rules.event_token("order.paid", ["order_id"], {"order_id": None}) is None
    assert delayq.rules.event_token("order.paid", ["order_id"], {"x": 1}) is None


@pytest.mark.parametrize("name,data,id,field", [("", {}, None, "name"), ("a\x07", {}, None, "name"), ("x" * 129, {}, None, "name"),
                                                ("order.paid", [1], None, "data"), ("order.paid", {}, "", "id")])
def test_bad_events_name_the_field_and_write_nothing(redis_server, ns, make_client, name, data, id, field):
    c = make_client(redis_server.url, namespace=ns)
    before = redis_server.client.dbsize()
    with pytest.raises(delayq.InvalidInput) as e:
        c.post_event(name, data, id=id)
    assert e.value.code == "invalid_option"
    assert field in str(e.value)
    assert redis_server.client.dbsize() == before


def test_schedule_into_a_queue_with_rules_carries_the_match_tokens(redis_server, ns, make_client):
    # The Python producer schedules into a queue with cancel_on rules (refused before it
    # computed the tokens): an event then cancels exactly the matching order.
    url = redis_server.url
    run_bin("queue", "create", "evp", "--cancel-on", "order.paid:order_id", url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    res = c.schedule_many("evp", [delayq.Order(f"p-{i}", delay_ms=3_600_000, payload={"order_id": i}, tags=["customer:7"]) for i in range(3)])
    assert [r.outcome for r in res] == [delayq.Outcome.CREATED] * 3
    out = run_bin("event", "order.paid", "--data", '{"order_id":1}', url=url, namespace=ns)
    assert json.loads(out.stdout)["cancelled"] == 1
    assert [c.get("evp", f"p-{i}") is None for i in range(3)] == [False, True, False]
    assert c.get("evp", "p-0").tags == ("customer:7",), "the match token is not shown as a tag"
    # The SDK's own post_event finds the SDK's tokens too.
    assert c.post_event("order.paid", {"order_id": 2})["cancelled"] == 1
    assert c.get("evp", "p-2") is None and c.get("evp", "p-0") is not None


def test_event_first_then_schedule_answers_cancelled_by_event(redis_server, ns, make_client):
    url = redis_server.url
    run_bin("queue", "create", "evf", "--cancel-on", "order.paid:order_id", url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    run_bin("event", "order.paid", "--data", '{"order_id":9}', url=url, namespace=ns)
    r = c.schedule("evf", "o-9", delay_ms=3_600_000, payload={"order_id": 9})
    assert (r.outcome, r.event) == (delayq.Outcome.CANCELLED_BY_EVENT, "order.paid")
    assert c.get("evf", "o-9") is None
    # Another order is not touched by the remembered event.
    assert c.schedule("evf", "o-10", delay_ms=3_600_000, payload={"order_id": 10}).outcome == delayq.Outcome.CREATED


def test_changed_rules_are_read_again(redis_server, ns, make_client):
    # The client read the record before the rules changed (stale_epoch): it re-reads it
    # and schedules with the new rules' tokens.
    url = redis_server.url
    run_bin("queue", "create", "evc", url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    assert c.schedule("evc", "a", delay_ms=3_600_000, payload={"order_id": 1}).outcome == delayq.Outcome.CREATED
    run_bin("queue", "create", "evc", "--cancel-on", "order.paid:order_id", url=url, namespace=ns)
    assert c.schedule("evc", "b", delay_ms=3_600_000, payload={"order_id": 2}).outcome == delayq.Outcome.CREATED
    assert c.post_event("order.paid", {"order_id": 2})["cancelled"] == 1
    assert c.get("evc", "b") is None


def test_an_overlong_match_value_is_refused_naming_cancel_on(redis_server, ns, make_client):
    url = redis_server.url
    run_bin("queue", "create", "evl", "--cancel-on", "order.paid:order_id", url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("evl", "x", delay_ms=1000, payload={"order_id": "x" * 300})
    assert "cancel_on" in str(e.value)
    assert c.get("evl", "x") is None


def test_an_order_declares_its_own_rules(redis_server, ns, make_client):
    """``cancel_on`` on schedule (src/engine/events.rs "Order rules"): the order carries
    the Rust client's tokens and registers the same record field, so an event (posted by
    the Rust side here) cancels it and not its neighbour, and is remembered for the rule."""
    url = redis_server.url
    run_bin("queue", "create", "mine", url=url, namespace=ns)
    c = make_client(url, namespace=ns)
    rule = [{"event": "order.paid", "match": "order_id", "remember_ms": 60_000}]
    c.schedule("mine", "with", delay_ms=3_600_000, payload={"order_id": 9}, cancel_on=rule)
    c.schedule("mine", "without", delay_ms=3_600_000, payload={"order_id": 9})
    fields = [f for f in redis_server.client.hkeys("{%s}:queue:mine" % ns) if f.startswith(b"order_rule:")]
    assert fields == [b'order_rule:{"event":"order.paid","match":["order_id"],"remember_ms":60000}']
    out = json.loads(run_bin("event", "order.paid", "--data", '{"order_id":9}', url=url, namespace=ns).stdout)
    assert (out["cancelled"], out["queues"]) == (1, {"mine": 1})
    assert c.get("mine", "with") is None and c.get("mine", "without") is not None
    # The Rust side's event was remembered for the rule: the SDK's order inside it is refused.
    run_bin("event", "order.paid", "--data", '{"order_id":10}', url=url, namespace=ns)
    s = c.schedule("mine", "o-10", delay_ms=3_600_000, payload={"order_id": 10}, cancel_on=rule)
    assert (s.outcome, s.event) == (delayq.Outcome.CANCELLED_BY_EVENT, "order.paid")


@pytest.mark.parametrize("rule", [
    [{"event": "order.paid"}],
    [{"event": "order.paid", "match": []}],
    [{"event": "order.paid", "match": "$.a"}],
    [{"event": "order.paid", "match": "items[0]"}],
    [{"event": "", "match": "a"}],
    [{"event": "a\nb", "match": "a"}],
    [{"event": "a", "match": "a", "remember_ms": 0}],
    [{"event": "a", "match": "a", "other": 1}],
    [{"event": "a", "match": "a"}, {"event": "a", "match": ["a"]}],
    {"event": "a", "match": "a"},
])
def test_bad_order_rules_name_cancel_on_and_write_nothing(redis_server, ns, make_client, rule):
    run_bin("queue", "create", "mine", url=redis_server.url, namespace=ns)
    c = make_client(redis_server.url, namespace=ns)
    before = redis_server.client.dbsize()
    with pytest.raises(delayq.InvalidInput) as e:
        c.schedule("mine", "x", delay_ms=1000, payload={"a": 1}, cancel_on=rule)
    assert e.value.code == "invalid_option" and "cancel_on" in str(e.value)
    assert redis_server.client.dbsize() == before
    assert not [f for f in redis_server.client.hkeys("{%s}:queue:mine" % ns) if f.startswith(b"order_rule:")]
