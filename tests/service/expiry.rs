//! Expiry of stale work (issue 44 item 3) on the HTTP API and the command line: the per
//! order `expires_after` (PUT, batch items, `delayq schedule --expires-after`), the queue's
//! default (`PUT /v1/queues/{q}`, `delayq queue create --expires-after`), what a group's
//! history and the dead list say of an expired order, and every refusal (naming the field,
//! writing nothing).
#![allow(clippy::unwrap_used)]

use crate::cli::run;
use crate::http::{TOKEN, call, code};
use crate::support;

use axum::http::StatusCode;
use delayq::service::http::{AppState, app};
use delayq::{Dispatcher, DispatcherOptions, Worker, WorkerOptions};
use serde_json::{Value, json};
use std::time::Duration;
use support::{Recorder, raw, start, wait_for};
use tokio_util::sync::CancellationToken;

const PAYLOADS: &str = "{dq:order-close:0}:payload";

/// An order due 5 s ago with `expires_after` 1 s, scheduled over HTTP: the group never
/// gets it, its history says `expired` with at least 4 s of lateness, the dead list says
/// reason `expired`; an order of its batch with a long limit is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_past_its_limit_is_expired_in_the_history_and_the_dead_list() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let rec = Recorder::default();
    let w = Worker::new(
        &client,
        "order-close",
        "close",
        rec.handler(),
        WorkerOptions::default().block(Duration::from_millis(50)),
    )
    .unwrap();
    w.ensure_groups().await.unwrap();
    let stop = CancellationToken::new();
    let hw = tokio::spawn(w.run(stop.clone()));
    let hd = tokio::spawn(
        Dispatcher::new(&client, "order-close", DispatcherOptions::default())
            .unwrap()
            .run(stop.clone()),
    );
    let past = client.now_ms() - 5000;
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close/messages/stale",
        Some(json!({"due_at": past, "expires_after": "1s", "payload": {"a": 1}})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/messages:batch",
        Some(json!({"messages": [
            {"id": "fresh", "due_at": past, "expires_after": 3_600_000},
            {"id": "stale-2", "due_at": past, "expires_after": "1s"},
        ]})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let r2 = r.clone();
    wait_for(
        "both expired orders in the dead list",
        Duration::from_secs(20),
        move || {
            let r = r2.clone();
            async move {
                let (_, v) =
                    call(&r, "GET", "/v1/queues/order-close/dead", None, Some(TOKEN)).await;
                v["dead_letters"].as_array().is_some_and(|d| d.len() == 2)
            }
        },
    )
    .await;
    rec.wait_len(1, Duration::from_secs(20)).await;
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/dead", None, t).await;
    for d in v["dead_letters"].as_array().unwrap() {
        assert_eq!(d["reason"], json!("expired"), "{d}");
        assert!(d["late_ms"].as_i64().unwrap() >= 4000, "{d}");
        assert!(
            d["last_error"].as_str().unwrap().starts_with("expired: "),
            "{d}"
        );
    }
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/messages/stale", None, t).await;
    assert_eq!(
        v["payload"],
        json!({"a": 1}),
        "the payload reads back as sent: {v}"
    );
    let g = &v["groups"][0];
    assert_eq!(
        (g["group"].as_str(), g["state"].as_str()),
        (Some("close"), Some("expired")),
        "{v}"
    );
    assert!(g["late_ms"].as_i64().unwrap() >= 4000, "{v}");
    assert_eq!(rec.deliveries()[0].id, "fresh");
    assert_eq!(rec.deliveries()[0].payload, Value::Null);
    stop.cancel();
    hw.await.unwrap().unwrap();
    hd.await.unwrap();
}

/// Every refusal names `expires_after` and writes nothing: PUT, a batch item (with its
/// index), the queue's default.
#[tokio::test]
async fn bad_limits_are_refused_over_http_and_write_nothing() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let before = support::snapshot(&client).await;
    for bad in [
        json!("0s"),
        json!("-1s"),
        json!("3654d"),
        json!("soon"),
        json!(0),
        json!(-5),
        json!(1.5),
        json!(true),
    ] {
        let body = json!({"delay_ms": 0, "expires_after": bad});
        let (st, v) = call(
            &r,
            "PUT",
            "/v1/queues/order-close/messages/x",
            Some(body),
            t,
        )
        .await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_option"),
            "{bad}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("expires_after"), "{bad}: {msg}");
        let batch = json!({"messages": [
            {"id": "a", "delay_ms": 0},
            {"id": "b", "delay_ms": 0, "expires_after": bad},
        ]});
        let (st, v) = call(
            &r,
            "POST",
            "/v1/queues/order-close/messages:batch",
            Some(batch),
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
            msg.contains("message 1") && msg.contains("expires_after"),
            "{bad}: {msg}"
        );
    }
    for bad in ["-1s", "3654d", "soon"] {
        let (st, v) = call(
            &r,
            "PUT",
            "/v1/queues/order-close",
            Some(json!({"expires_after": bad})),
            t,
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("expires_after"),
            "{v}"
        );
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close",
        Some(json!({"expires_after": "30m"})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let info = client
        .admin()
        .queue_info("order-close")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.expires_after_ms, Some(1_800_000));
    let (st, _) = call(
        &r,
        "PUT",
        "/v1/queues/order-close",
        Some(json!({"expires_after": "0s"})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let info = client
        .admin()
        .queue_info("order-close")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.expires_after_ms, None, "0s clears the default");
}

/// `delayq schedule --expires-after` stores the limit with the order; `delayq queue create
/// --expires-after` sets the queue's default (listed by `delayq queue list`); refusals exit
/// 2, name the option and write nothing.
#[tokio::test]
async fn the_cli_sets_and_refuses_limits() {
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
            "--expires-after",
            "1m",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let stored: String = raw(&client, &["HGET", PAYLOADS, "c1"]).await;
    assert!(stored.contains(":!60000!null"), "{stored}");
    let o = run(&url, &["get", "order-close", "c1"]);
    assert_eq!(o.json()["payload"], Value::Null, "{}", o.stdout);
    let o = run(
        &url,
        &["queue", "create", "order-close", "--expires-after", "2s"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(&url, &["queue", "list"]);
    let listed: Vec<Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let q = listed.iter().find(|q| q["queue"] == "order-close").unwrap();
    assert_eq!(q["expires_after_ms"], json!(2000), "{q}");

    let before = support::snapshot(&client).await;
    for args in [
        &[
            "schedule",
            "order-close",
            "x",
            "--in",
            "0s",
            "--expires-after",
            "0s",
        ][..],
        &[
            "schedule",
            "order-close",
            "x",
            "--in",
            "0s",
            "--expires-after",
            "-1s",
        ],
        &[
            "schedule",
            "order-close",
            "x",
            "--in",
            "0s",
            "--expires-after",
            "3654d",
        ],
        &["queue", "create", "order-close", "--expires-after", "-5m"],
        &["queue", "create", "order-close", "--expires-after", "3654d"],
    ] {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("expires-after") || o.stderr.contains("expires_after"),
            "{args:?}: {}",
            o.stderr
        );
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}
