//! Order keys (issue 42) on the HTTP API and the command line: `key` on a message and on
//! batch items, shown by the order's history; `delayq schedule --key`, shown by `delayq
//! get`; every refusal names `key` and writes nothing.
#![allow(clippy::unwrap_used)]

use crate::cli::run;
use crate::http::{TOKEN, call, code};
use crate::support;

use axum::http::StatusCode;
use delayq::service::http::{AppState, app};
use delayq::{Dispatcher, DispatcherOptions, Mode, NewOrder, When};
use serde_json::json;
use support::start;

/// A message's and a batch item's key are stored and shown by the history; an upsert
/// without one removes it; bad keys are 400 `invalid_option` naming `key`, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_api_takes_shows_and_checks_keys() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close/messages/o1",
        Some(json!({"delay_ms": 60000, "key": "merchant:17", "payload": {"a": 1}})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/messages:batch",
        Some(json!({"messages": [
            {"id": "b1", "delay_ms": 60000, "key": "merchant:18"},
            {"id": "b2", "delay_ms": 60000},
        ]})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    for (id, key) in [
        ("o1", json!("merchant:17")),
        ("b1", json!("merchant:18")),
        ("b2", serde_json::Value::Null),
    ] {
        let (st, v) = call(
            &r,
            "GET",
            &format!("/v1/queues/order-close/messages/{id}"),
            None,
            t,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["key"], key, "{id}: {v}");
    }
    assert_eq!(
        client
            .get("order-close", "o1")
            .await
            .unwrap()
            .unwrap()
            .payload,
        json!({"a": 1})
    );
    // An upsert without a key removes it.
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close/messages/o1",
        Some(json!({"delay_ms": 60000})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/messages/o1", None, t).await;
    assert_eq!(v["key"], serde_json::Value::Null, "{v}");

    let before = support::snapshot(&client).await;
    for bad in [
        json!(""),
        json!("k".repeat(129)),
        json!("a\u{1}b"),
        json!(17),
    ] {
        let (st, v) = call(
            &r,
            "PUT",
            "/v1/queues/order-close/messages/x",
            Some(json!({"delay_ms": 0, "key": bad})),
            t,
        )
        .await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_option"),
            "{bad}: {v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains("key"),
            "{bad}: {v}"
        );
        let (st, v) = call(
            &r,
            "POST",
            "/v1/queues/order-close/messages:batch",
            Some(json!({"messages": [{"id": "y0", "delay_ms": 0}, {"id": "y1", "delay_ms": 0, "key": bad}]})),
            t,
        )
        .await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_option"),
            "{bad}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("message 1") && msg.contains("key"),
            "{bad}: {msg}"
        );
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}

/// `delayq schedule --key` stores the key, `delayq get` shows it; a bad key exits 2 naming
/// `key` and writes nothing.
#[tokio::test]
async fn the_cli_takes_and_checks_keys() {
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
            "--key",
            "merchant:17",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&url, &["get", "order-close", "c1"]);
    assert_eq!(o.json()["key"], json!("merchant:17"), "{}", o.stdout);
    let before = support::snapshot(&client).await;
    for bad in ["", "a\tb"] {
        let o = run(
            &url,
            &["schedule", "order-close", "c2", "--in", "0s", "--key", bad],
        );
        assert_eq!(o.code, 2, "{bad:?}: {}", o.stderr);
        assert!(o.stderr.contains("key"), "{bad:?}: {}", o.stderr);
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}

/// A pull consumer's `:receive` hands out the key of a keyed order (and none for another).
#[tokio::test]
async fn a_pulled_delivery_carries_its_key() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let base = "/v1/queues/order-close/groups/close";
    let (st, v) = call(
        &r,
        "POST",
        &format!("{base}:receive"),
        Some(json!({"max": 10})),
        Some(TOKEN),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    client
        .schedule_with(
            "order-close",
            NewOrder::new("k1", When::in_ms(0), json!(1)).with_key("merchant:17"),
            Mode::Upsert,
        )
        .await
        .unwrap();
    client
        .schedule("order-close", "p1", When::in_ms(0), json!(2))
        .await
        .unwrap();
    Dispatcher::new(&client, "order-close", DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    let (st, v) = call(
        &r,
        "POST",
        &format!("{base}:receive"),
        Some(json!({"max": 10})),
        Some(TOKEN),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let d = v["deliveries"].as_array().unwrap();
    assert_eq!(d.len(), 2, "{v}");
    for one in d {
        let want = if one["id"] == "k1" {
            json!("merchant:17")
        } else {
            serde_json::Value::Null
        };
        assert_eq!(one["key"], want, "{one}");
    }
}
