//! Pull consumption over HTTP (`POST /v1/queues/{queue}/groups/{group}:receive|:ack|:nack|
//! :extend`), driven in-process: receipts, `lease_lost` as 409, dead letters with the
//! consumer's error text, and bad input as 400/404 that changes nothing.
#![allow(clippy::unwrap_used)]

use crate::http::{TOKEN, call, code};
use crate::support;

use axum::http::StatusCode;
use delayq::service::http::{AppState, app};
use delayq::{Client, Dispatcher, DispatcherOptions, When};
use serde_json::{Value, json};
use std::time::Duration;
use support::{pending, poll, snapshot, start};

const BASE: &str = "/v1/queues/order-close/groups/close";
const STREAM: &str = "{dq:order-close:0}:stream";

async fn due_now(client: &Client, ids: &[&str]) {
    for (i, id) in ids.iter().enumerate() {
        client
            .schedule(
                "order-close",
                id,
                When::in_ms(0),
                json!({"n": i, "note": "x  y"}),
            )
            .await
            .unwrap();
    }
    Dispatcher::new(client, "order-close", DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
}

async fn post(r: &axum::Router, action: &str, body: Value) -> (StatusCode, Value) {
    call(
        r,
        "POST",
        &format!("{BASE}:{action}"),
        Some(body),
        Some(TOKEN),
    )
    .await
}

#[tokio::test]
async fn receive_ack_nack_and_a_lost_lease_over_http() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    // Joining the group on the first receive, before anything is due.
    let (st, v) = post(&r, "receive", json!({"max": 10})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["deliveries"], json!([]));
    due_now(&client, &["a", "b"]).await;

    let (st, v) = post(&r, "receive", json!({"max": 10, "lease_ms": 200})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let ds = v["deliveries"].as_array().unwrap().clone();
    assert_eq!(ds.len(), 2, "{v}");
    let by_id = |id: &str| ds.iter().find(|d| d["id"] == id).unwrap().clone();
    let (a, b) = (by_id("a"), by_id("b"));
    assert_eq!(a["payload"], json!({"n": 0, "note": "x  y"}));
    assert_eq!(a["attempt"], 1);
    assert_eq!(a["priority"], "normal");

    // a: acknowledged.
    let (st, v) = post(&r, "ack", json!({"receipts": [a["receipt"]]})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["results"], json!([{"status": "acked"}]));
    // b: its lease runs out and a later receive takes it over, at attempt 2.
    let again = poll(Duration::from_secs(10), || {
        let r = r.clone();
        async move {
            let (_, v) = post(&r, "receive", json!({"max": 1, "lease_ms": 60000})).await;
            v["deliveries"].as_array().and_then(|d| d.first().cloned())
        }
    })
    .await
    .expect("b delivered again");
    assert_eq!(again["id"], "b");
    assert_eq!(again["attempt"], 2);
    let (st, v) = post(&r, "ack", json!({"receipts": [b["receipt"]]})).await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert_eq!(code(&v), "lease_lost");
    let (st, v) = post(
        &r,
        "extend",
        json!({"receipts": [b["receipt"]], "lease_ms": 60000}),
    )
    .await;
    assert_eq!((st, code(&v)), (StatusCode::CONFLICT, "lease_lost"));
    // The new receipt extends, then dead-letters it with the consumer's text.
    let (st, v) = post(
        &r,
        "extend",
        json!({"receipts": [again["receipt"]], "lease_ms": 60000}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["results"][0]["status"], "extended");
    let newer = v["results"][0]["receipt"].clone();
    let (st, v) = post(
        &r,
        "nack",
        json!({"receipt": newer, "dead": true, "error": "no such order in the shop"}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let dead = client
        .admin()
        .dead_list("order-close", Some("close"), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].id.as_str(), dead[0].last_error.as_str()),
        ("b", "no such order in the shop")
    );
    assert_eq!(pending(&client, STREAM, "close").await, 0);
}

#[tokio::test]
async fn bad_pull_requests_are_refused_naming_the_field_and_change_nothing() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    due_now(&client, &["a"]).await;
    let (st, v) = post(&r, "receive", json!({"max": 1})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let receipt = v["deliveries"][0]["receipt"].as_str().unwrap().to_owned();
    let before = snapshot(&client).await;
    let cases = [
        (
            "receive",
            json!({"max": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "max",
        ),
        (
            "receive",
            json!({"max": 101}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "max",
        ),
        (
            "receive",
            json!({"wait_ms": 20001}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "wait_ms",
        ),
        (
            "receive",
            json!({"lease_ms": 1}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "lease_ms",
        ),
        (
            "receive",
            json!({"maxx": 1}),
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "maxx",
        ),
        (
            "ack",
            json!({"receipts": ["junk"]}),
            StatusCode::BAD_REQUEST,
            "invalid_receipt",
            "receipt",
        ),
        (
            "ack",
            json!({"receipts": []}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "receipts",
        ),
        (
            "nack",
            json!({"receipt": format!("{receipt}0")}),
            StatusCode::BAD_REQUEST,
            "invalid_receipt",
            "receipt",
        ),
        (
            "nack",
            json!({"receipt": receipt, "dead": true, "retry_in_ms": 5}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "retry_in_ms",
        ),
        (
            "extend",
            json!({"receipts": [receipt], "lease_ms": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_option",
            "lease_ms",
        ),
        (
            "frob",
            json!({}),
            StatusCode::NOT_FOUND,
            "not_found",
            "receive",
        ),
    ];
    for (action, body, status, want, names) in cases {
        let (st, v) = post(&r, action, body.clone()).await;
        assert_eq!((st, code(&v)), (status, want), "{action} {body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(names), "{action} {body}: {msg}");
    }
    // Another group's receipt is not this group's.
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/groups/other:ack",
        Some(json!({"receipts": [receipt]})),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_receipt"),
        "{v}"
    );
    // A queue that is not registered.
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/nope/groups/close:receive",
        Some(json!({})),
        Some(TOKEN),
    )
    .await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::NOT_FOUND, "queue_not_found"),
        "{v}"
    );
    // No token.
    let (st, _) = call(
        &r,
        "POST",
        &format!("{BASE}:receive"),
        Some(json!({})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(snapshot(&client).await, before, "nothing changed");
    let (st, v) = post(&r, "ack", json!({"receipts": [receipt]})).await;
    assert_eq!(
        (st, v["results"][0]["status"].as_str()),
        (StatusCode::OK, Some("acked"))
    );
}

#[tokio::test]
async fn a_deleted_queue_or_group_is_404_and_never_created_again_by_a_receive() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let (st, v) = post(&r, "receive", json!({})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // The group deleted on purpose: not created again over its entries.
    client
        .admin()
        .delete_group("order-close", "close", true)
        .await
        .unwrap();
    let (st, v) = post(&r, "receive", json!({})).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::NOT_FOUND, "group_not_found"),
        "{v}"
    );
    // And stays so: a receive does not create it again from the start of the stream.
    let (st, v) = post(&r, "receive", json!({})).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::NOT_FOUND, "group_not_found"),
        "{v}"
    );
    let groups: redis::Value = support::raw(&client, &["XINFO", "GROUPS", STREAM]).await;
    assert_eq!(groups, redis::Value::Array(vec![]), "no group made again");
    // The queue deleted: 404, and the receive does not register it again.
    client
        .admin()
        .delete_queue("order-close", true)
        .await
        .unwrap();
    let (st, v) = post(&r, "receive", json!({})).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::NOT_FOUND, "queue_not_found"),
        "{v}"
    );
    let (st, v) = post(&r, "receive", json!({})).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::NOT_FOUND, "queue_not_found"),
        "{v}"
    );
    assert!(
        client
            .admin()
            .queue_info("order-close")
            .await
            .unwrap()
            .is_none()
    );
}

/// A received payload is the scheduled text byte for byte (key order, spacing, `1.50`),
/// never a re-printed value.
#[tokio::test]
async fn a_received_payload_is_byte_for_byte_what_was_scheduled() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let text = r#"{"user": 42,  "items": [1.50,"é"]}"#;
    client
        .schedule(
            "order-close",
            "exact",
            When::in_ms(0),
            delayq::Payload::from_json(text).unwrap(),
        )
        .await
        .unwrap();
    let (st, v) = post(&r, "receive", json!({"max": 1})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    Dispatcher::new(&client, "order-close", DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let req = axum::http::Request::builder()
        .method("POST")
        .uri(format!("{BASE}:receive"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Body::from(json!({"max": 1}).to_string()))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(
        body.contains(&format!(r#""payload":{text}"#)),
        "the payload was re-printed: {body}"
    );
}
