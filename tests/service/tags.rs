//! Tags on orders (issue 43) on the HTTP API and the command line: `tags` on a message and
//! on batch items, `delayq schedule --tag` (repeatable), read back by `GET` and `delayq
//! get`; bad tags are refused naming the field, with nothing written.
#![allow(clippy::unwrap_used)]

use crate::cli::run;
use crate::http::{TOKEN, call};
use crate::support;

use axum::http::StatusCode;
use delayq::service::http::{AppState, app};
use serde_json::json;
use support::start;

#[tokio::test]
async fn http_schedules_tagged_orders_and_refuses_bad_tags() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close/messages/o-1",
        Some(json!({"delay_ms": 60000, "payload": {"a": 1}, "tags": ["order:1", "customer:42"]})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/messages:batch",
        Some(json!({"messages": [
            {"id": "b-1", "delay_ms": 60000, "tags": ["customer:42"]},
            {"id": "b-2", "delay_ms": 60000}]})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/messages/o-1", None, t).await;
    assert_eq!(v["tags"], json!(["order:1", "customer:42"]), "{v}");
    assert_eq!(v["payload"], json!({"a": 1}), "{v}");
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/messages/b-1", None, t).await;
    assert_eq!(v["tags"], json!(["customer:42"]), "{v}");
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/messages/b-2", None, t).await;
    assert!(v.get("tags").is_none(), "{v}");

    let before = support::snapshot(&client).await;
    let eleven: Vec<String> = (0..11).map(|i| format!("t{i}")).collect();
    for tags in [
        json!(eleven),
        json!([""]),
        json!(["x".repeat(129)]),
        json!(["a\u{7}"]),
        json!(["a", "a"]),
        json!("customer:42"),
        json!([1]),
    ] {
        let (st, v) = call(
            &r,
            "PUT",
            "/v1/queues/order-close/messages/bad",
            Some(json!({"delay_ms": 0, "tags": tags})),
            t,
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{tags}: {v}");
        assert_eq!(v["error"]["code"], "invalid_option", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("tags"),
            "{v}"
        );
        let (st, v) = call(
            &r,
            "POST",
            "/v1/queues/order-close/messages:batch",
            Some(json!({"messages": [{"id": "ok", "delay_ms": 0}, {"id": "bad", "delay_ms": 0, "tags": tags}]})),
            t,
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{tags}: {v}");
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}

#[tokio::test]
async fn the_cli_schedules_with_repeated_tags_and_refuses_bad_ones() {
    let (s, client) = start().await;
    let url = s.url();
    let o = run(
        &url,
        &[
            "schedule",
            "order-close",
            "c1",
            "--in",
            "1h",
            "--tag",
            "order:1234",
            "--tag",
            "customer:42",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&url, &["get", "order-close", "c1"]);
    assert_eq!(
        o.json()["tags"],
        json!(["order:1234", "customer:42"]),
        "{}",
        o.stdout
    );
    let before = support::snapshot(&client).await;
    for args in [
        &["schedule", "order-close", "x", "--in", "0s", "--tag", ""][..],
        &[
            "schedule",
            "order-close",
            "x",
            "--in",
            "0s",
            "--tag",
            "a",
            "--tag",
            "a",
        ],
    ] {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains("tags"), "{args:?}: {}", o.stderr);
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}
