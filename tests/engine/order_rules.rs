//! Issue 43 item 4, per order: an order declares its own cancel-on-event rules on schedule
//! (`NewOrder::with_cancel_on`, HTTP `cancel_on`, `delayq schedule --cancel-on`), checked as
//! the queue-level rules are; a matching event cancels it while an order of the same queue
//! without the rule is delivered; an event that arrives first is remembered for the rule.
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use delayq::service::http::{AppState, app};
use delayq::{
    CancelRule, CancelledBy, Dispatcher, DispatcherOptions, Event, ManualClock, Mode, NewOrder,
    ScheduleOutcome, When,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use support::{raw, start, start_with_clock};
use tower::ServiceExt;

const BIN: &str = env!("CARGO_BIN_EXE_delayq");
const Q: &str = "order-close";
const T0: i64 = 1_800_000_000_000;

fn paid() -> Vec<CancelRule> {
    vec![CancelRule::new("order.paid", vec!["order_id".into()], None).unwrap()]
}

async fn dispatched_ids(client: &delayq::Client) -> HashSet<String> {
    let key = format!("{{dq:{Q}:0}}:stream");
    let entries: Vec<(String, Vec<(String, String)>)> =
        raw(client, &["XRANGE", &key, "-", "+"]).await;
    entries
        .into_iter()
        .filter_map(|(_, f)| f.into_iter().find(|(k, _)| k == "id").map(|(_, v)| v))
        .collect()
}

/// The queue has no rules; one order declares `order.paid` on `order_id`, its neighbour
/// with the same payload does not: the event cancels the first (its history says so), the
/// second is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_with_its_own_rule_is_cancelled_and_its_neighbour_delivered() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    let with =
        NewOrder::new("with", When::in_ms(1000), json!({"order_id": 9})).with_cancel_on(paid());
    let without = NewOrder::new("without", When::in_ms(1000), json!({"order_id": 9}));
    for o in [with, without] {
        let s = client.schedule_with(Q, o, Mode::Upsert).await.unwrap();
        assert_eq!(s.outcome, ScheduleOutcome::Created);
    }
    // The rule's token is hidden from readers.
    assert!(
        client
            .get(Q, "with")
            .await
            .unwrap()
            .unwrap()
            .tags
            .is_empty()
    );
    let posted = client
        .post_event(&Event::new("order.paid", json!({"order_id": 9})).with_id("pay-9"))
        .await
        .unwrap();
    assert_eq!(posted.cancelled, 1);
    assert_eq!(posted.queues.get(Q), Some(&1));
    let h = client.admin().history(Q, "with").await.unwrap().unwrap();
    assert_eq!(
        h.cancelled.unwrap().by,
        CancelledBy::Event {
            event: "order.paid".into(),
            event_id: Some("pay-9".into())
        }
    );
    clock.advance(Duration::from_secs(2));
    Dispatcher::new(&client, Q, DispatcherOptions::default())
        .unwrap()
        .pass()
        .await
        .unwrap();
    let ids = dispatched_ids(&client).await;
    assert_eq!(ids, HashSet::from(["without".to_owned()]));
}

/// Event first: an event for order 9 arrives, then order 9 is scheduled with its own rule
/// inside the rule's `remember` (1 min here): answered `cancelled_by_event`, never written;
/// scheduled again after the window: created. The order without the rule: created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_that_arrives_first_is_remembered_for_an_order_rule() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_s, client) = start_with_clock(clock.clone()).await;
    let rule = vec![CancelRule::new("order.paid", vec!["order_id".into()], Some(60_000)).unwrap()];
    // An earlier order with the rule (the rule is known to the queue from then on).
    client
        .schedule_with(
            Q,
            NewOrder::new("first", When::in_ms(600_000), json!({"order_id": 1}))
                .with_cancel_on(rule.clone()),
            Mode::Upsert,
        )
        .await
        .unwrap();
    let posted = client
        .post_event(&Event::new("order.paid", json!({"order_id": 9})))
        .await
        .unwrap();
    assert_eq!((posted.cancelled, posted.matched_rules), (0, 1));
    clock.advance(Duration::from_secs(2));
    let o = NewOrder::new("o-9", When::in_ms(1000), json!({"order_id": 9}))
        .with_cancel_on(rule.clone());
    let s = client
        .schedule_with(Q, o.clone(), Mode::Upsert)
        .await
        .unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::CancelledByEvent);
    assert_eq!(s.event.as_deref(), Some("order.paid"));
    assert!(client.get(Q, "o-9").await.unwrap().is_none());
    let plain = NewOrder::new("plain-9", When::in_ms(1000), json!({"order_id": 9}));
    let s = client.schedule_with(Q, plain, Mode::Upsert).await.unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::Created);
    clock.advance(Duration::from_secs(60));
    let s = client.schedule_with(Q, o, Mode::Upsert).await.unwrap();
    assert_eq!(s.outcome, ScheduleOutcome::Created);
}

/// Bad per-order rules are refused naming `cancel_on`, and nothing is written: library,
/// HTTP (schedule and batch), command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_order_rules_are_refused_naming_the_field_with_nothing_written() {
    let (server, client) = start().await;
    let before = support::snapshot(&client).await;
    let no_match = CancelRule {
        event: "order.paid".into(),
        match_paths: vec![],
        remember_ms: 1000,
    };
    let bad_path = CancelRule {
        event: "order.paid".into(),
        match_paths: vec!["items[0]".into()],
        remember_ms: 1000,
    };
    for r in [no_match, bad_path] {
        let o =
            NewOrder::new("x", When::in_ms(1000), json!({"order_id": 1})).with_cancel_on(vec![r]);
        let e = client.schedule_with(Q, o, Mode::Upsert).await.unwrap_err();
        assert!(e.to_string().contains("cancel_on"), "{e}");
    }
    let router = app(AppState::new(client.clone(), vec![]));
    for (uri, body) in [
        (
            format!("/v1/queues/{Q}/messages/x"),
            json!({"delay_ms": 1000, "payload": {"order_id": 1}, "cancel_on": [{"event": "order.paid"}]}),
        ),
        (
            format!("/v1/queues/{Q}/messages/x"),
            json!({"delay_ms": 1000, "payload": {}, "cancel_on": {"event": "order.paid", "match": "a"}}),
        ),
        (
            format!("/v1/queues/{Q}/messages:batch"),
            json!({"messages": [{"id": "x", "delay_ms": 1000, "payload": {}, "cancel_on": [{"event": "order.paid", "match": "$.a"}]}]}),
        ),
    ] {
        let method = if uri.ends_with(":batch") {
            "POST"
        } else {
            "PUT"
        };
        let req = Request::builder()
            .method(method)
            .uri(&uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let resp = router.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}: {v}");
        assert!(v.to_string().contains("cancel_on"), "{v}");
    }
    for spec in ["order.paid", "order.paid:", "order.paid:a[0]"] {
        let o = Command::new(BIN)
            .args([
                "--redis-url",
                &server.url(),
                "schedule",
                Q,
                "x",
                "--in",
                "1m",
                "--payload",
                "{\"order_id\":1}",
                "--cancel-on",
                spec,
            ])
            .env_remove("DELAYQ_REDIS_URL")
            .env_remove("DELAYQ_NAMESPACE")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{spec}: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("cancel_on"),
            "{spec}: {o:?}"
        );
    }
    assert_eq!(support::snapshot(&client).await, before);
}

/// HTTP and the command line schedule orders with their own rules; an event cancels them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_cli_orders_carry_their_rules() {
    let (server, client) = start().await;
    let router = app(AppState::new(client.clone(), vec![]));
    let req = Request::builder()
        .method("PUT")
        .uri(format!("/v1/queues/{Q}/messages/h-1"))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"delay_ms": 600_000, "payload": {"order_id": 5},
                   "cancel_on": [{"event": "order.paid", "match": "order_id", "remember": "5m"}]})
            .to_string(),
        ))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.status());
    let req = Request::builder()
        .method("POST")
        .uri(format!("/v1/queues/{Q}/messages:batch"))
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"messages": [{"id": "h-2", "delay_ms": 600_000, "payload": {"order_id": 5},
                   "cancel_on": [{"event": "order.paid", "match": ["order_id"]}]}]})
            .to_string(),
        ))
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.status());
    let o = Command::new(BIN)
        .args([
            "--redis-url",
            &server.url(),
            "schedule",
            Q,
            "c-1",
            "--in",
            "10m",
            "--payload",
            "{\"order_id\":5}",
            "--cancel-on",
            "order.paid:order_id",
        ])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    client
        .schedule(Q, "plain", When::in_ms(600_000), json!({"order_id": 5}))
        .await
        .unwrap();
    let posted = client
        .post_event(&Event::new("order.paid", json!({"order_id": 5})))
        .await
        .unwrap();
    assert_eq!(posted.cancelled, 3);
    for id in ["h-1", "h-2", "c-1"] {
        assert!(client.get(Q, id).await.unwrap().is_none(), "{id}");
    }
    assert!(client.get(Q, "plain").await.unwrap().is_some());
}
