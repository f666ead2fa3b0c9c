//! Issue 43: a cancelled order's history tells the cancellation. Cancelled by id
//! (`cancel.lua`), by tag (`tag_bulk.lua`) or by an event (`tag_bulk.lua` with a match
//! token), the order answers `cancelled` with the reason and the time, on the library, HTTP
//! (`GET /v1/queues/{q}/messages/{id}`) and `delayq get`; the stats' history count follows;
//! with history off nothing is written.
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use delayq::service::http::{AppState, app};
use delayq::{CancelRule, CancelledBy, Event, NewOrder, OrderState, When};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;
use support::start;
use tower::ServiceExt;

const BIN: &str = env!("CARGO_BIN_EXE_delayq");
const Q: &str = "order-close";

async fn lookup(router: &axum::Router, id: &str) -> (StatusCode, Value) {
    let req = Request::builder()
        .uri(format!("/v1/queues/{Q}/messages/{id}"))
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn cli_get(url: &str, id: &str) -> (i32, Value) {
    let o = Command::new(BIN)
        .args(["--redis-url", url, "get", Q, id])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v)
}

/// The records in shard 0's history buckets around now (`HLEN` of each).
async fn bucket_records(client: &delayq::Client) -> u64 {
    let h = delayq::engine::history::HISTORY_BUCKET_MS;
    let now = client.now_ms();
    let mut total = 0;
    for b in (now / h - 2)..=(now / h + 1) {
        let n: u64 =
            support::raw(client, &["HLEN", &format!("{{dq:{Q}:0}}:history:{h}:{b}")]).await;
        total += n;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_order_answers_cancelled_with_its_reason_and_time() {
    let (server, client) = start().await;
    let admin = client.admin();
    admin
        .set_cancel_on(
            Q,
            &[CancelRule::new("order.paid", vec!["order_id".into()], None).unwrap()],
        )
        .await
        .unwrap();
    for (id, order_id) in [("by-id", 1), ("by-tag", 2), ("by-event", 3), ("kept", 4)] {
        let o = NewOrder::new(id, When::in_ms(600_000), json!({"order_id": order_id}));
        let o = if id == "by-tag" {
            o.with_tags(["customer:7"])
        } else {
            o
        };
        client
            .schedule_with(Q, o, delayq::Mode::Upsert)
            .await
            .unwrap();
    }
    let mut dues = std::collections::HashMap::new();
    for id in ["by-id", "by-tag", "by-event"] {
        dues.insert(id, admin.history(Q, id).await.unwrap().unwrap().due_at_ms);
    }
    assert_eq!(admin.stats(Q).await.unwrap().history, 0);
    let before = client.now_ms();
    assert_eq!(
        client.cancel(Q, "by-id").await.unwrap(),
        delayq::CancelOutcome::Cancelled
    );
    assert_eq!(
        client
            .tag_cancel(Some(Q), "customer:7")
            .await
            .unwrap()
            .total,
        1
    );
    let posted = client
        .post_event(&Event::new("order.paid", json!({"order_id": 3})).with_id("pay-3"))
        .await
        .unwrap();
    assert_eq!(posted.cancelled, 1);
    let after = client.now_ms();

    let expect = [
        ("by-id", CancelledBy::Id),
        (
            "by-tag",
            CancelledBy::Tag {
                tag: "customer:7".into(),
            },
        ),
        (
            "by-event",
            CancelledBy::Event {
                event: "order.paid".into(),
                event_id: Some("pay-3".into()),
            },
        ),
    ];
    for (id, by) in &expect {
        let h = admin.history(Q, id).await.unwrap().expect(id);
        assert_eq!(h.state, OrderState::Cancelled, "{id}");
        let c = h.cancelled.as_ref().expect(id);
        assert_eq!(&c.by, by, "{id}");
        assert!(
            (before..=after).contains(&c.at_ms),
            "{id}: {} not in {before}..={after}",
            c.at_ms
        );
        assert_eq!(h.due_at_ms, dues[id], "{id}: the due time it had");
        assert!(h.groups.is_empty() && h.entry_id.is_none());
    }
    let kept = admin.history(Q, "kept").await.unwrap().unwrap();
    assert_eq!(kept.state, OrderState::Scheduled);
    assert!(kept.cancelled.is_none());
    // The stats count the three records, as a full count of the buckets does.
    assert_eq!(bucket_records(&client).await, 3);
    assert_eq!(admin.stats(Q).await.unwrap().history, 3);

    // HTTP: one JSON shape.
    let router = app(AppState::new(client.clone(), vec![]));
    let (status, v) = lookup(&router, "by-event").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "cancelled");
    assert_eq!(v["cancelled"]["reason"], "event");
    assert_eq!(v["cancelled"]["event"], "order.paid");
    assert_eq!(v["cancelled"]["event_id"], "pay-3");
    assert!(v["cancelled"]["at_ms"].as_i64().is_some());
    let (_, v) = lookup(&router, "by-tag").await;
    assert_eq!(
        v["cancelled"],
        json!({"reason": "tag", "tag": "customer:7", "at_ms": v["cancelled"]["at_ms"]})
    );
    let (_, v) = lookup(&router, "kept").await;
    assert!(v.get("cancelled").is_none(), "{v}");
    // The command line prints the same answer.
    let (code, v) = cli_get(&server.url(), "by-id");
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["state"], "cancelled");
    assert_eq!(v["cancelled"]["reason"], "id");

    // Scheduled again under the same id: scheduled wins over the record.
    client
        .schedule(Q, "by-id", When::in_ms(600_000), json!({"order_id": 1}))
        .await
        .unwrap();
    let h = admin.history(Q, "by-id").await.unwrap().unwrap();
    assert_eq!(h.state, OrderState::Scheduled);
    // A cancel of nothing writes nothing.
    client.cancel(Q, "never").await.unwrap();
    assert!(admin.history(Q, "never").await.unwrap().is_none());
    assert_eq!(bucket_records(&client).await, 3);
}

#[tokio::test]
async fn with_history_off_a_cancel_writes_no_record() {
    let (_server, client) = start().await;
    client
        .admin()
        .set_history_retention(Q, Duration::ZERO)
        .await
        .unwrap();
    client
        .schedule_with(
            Q,
            NewOrder::new("a", When::in_ms(600_000), json!(1)).with_tags(["t"]),
            delayq::Mode::Upsert,
        )
        .await
        .unwrap();
    client
        .schedule(Q, "b", When::in_ms(600_000), json!(1))
        .await
        .unwrap();
    client.tag_cancel(Some(Q), "t").await.unwrap();
    client.cancel(Q, "b").await.unwrap();
    assert!(client.admin().history(Q, "a").await.unwrap().is_none());
    assert!(client.admin().history(Q, "b").await.unwrap().is_none());
    let keys: Vec<String> = support::raw(&client, &["KEYS", "*history*"]).await;
    assert!(keys.is_empty(), "{keys:?}");
}

/// A reconciliation that sends a cancelled order to a group (its source of truth says it
/// is due) treats the cancellation's record as no delivery: the order is sent, and its
/// history then follows the new entry (`dispatched`, the group waiting), not `cancelled`.
#[tokio::test]
async fn a_reconciliation_of_a_cancelled_order_is_followed_by_its_history() {
    let (_server, client) = start().await;
    delayq::Worker::new(
        &client,
        Q,
        "close",
        |_d: delayq::Delivery| async { Ok(()) },
        delayq::WorkerOptions::default(),
    )
    .unwrap()
    .ensure_groups()
    .await
    .unwrap();
    let o = NewOrder::new("c-1", When::in_ms(600_000), json!({"n": 1}));
    client
        .schedule_with(Q, o.clone(), delayq::Mode::Upsert)
        .await
        .unwrap();
    client.cancel(Q, "c-1").await.unwrap();
    assert_eq!(
        client
            .admin()
            .history(Q, "c-1")
            .await
            .unwrap()
            .unwrap()
            .state,
        OrderState::Cancelled
    );
    let sent = client.admin().redeliver(Q, "close", &[o]).await.unwrap();
    assert_eq!(
        sent,
        vec![delayq::engine::admin::history::Redelivered::Sent]
    );
    let h = client.admin().history(Q, "c-1").await.unwrap().unwrap();
    assert_eq!(h.state, OrderState::Dispatched);
    assert!(h.cancelled.is_none());
    assert_eq!(h.groups.len(), 1, "{h:?}");
    assert_eq!(h.groups[0].group, "close");
}
