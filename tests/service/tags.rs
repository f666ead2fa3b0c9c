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

/// The HTTP bulk routes: count, list (paged), reschedule and cancel by tag, per queue and
/// across every queue; a repeated cancel answers 0; bad input is a 400 naming the field.
#[tokio::test]
async fn http_counts_lists_reschedules_and_cancels_by_tag() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let due = client.now_ms() + 3_600_000;
    for q in ["order-close", "notify"] {
        let messages: Vec<_> = (0..40)
            .map(|i| {
                let tags = if i % 4 == 0 {
                    json!(["customer:7", format!("o:{i}")])
                } else {
                    json!([format!("o:{i}")])
                };
                json!({"id": format!("{q}-{i:02}"), "due_at": due, "tags": tags})
            })
            .collect();
        let (st, v) = call(
            &r,
            "POST",
            &format!("/v1/queues/{q}/messages:batch"),
            Some(json!({"messages": messages})),
            t,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    let (st, v) = call(&r, "GET", "/v1/tags/customer:7", None, t).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"total": 20, "queues": {"notify": 10, "order-close": 10}})
    );
    let (_, v) = call(&r, "GET", "/v1/queues/notify/tags/customer:7", None, t).await;
    assert_eq!(v["total"], 10, "{v}");
    let mut ids = Vec::new();
    let mut uri = "/v1/tags/customer:7/messages?limit=6".to_owned();
    loop {
        let (st, v) = call(&r, "GET", &uri, None, t).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        for o in v["orders"].as_array().unwrap() {
            assert_eq!(o["due_at_ms"], due, "{o}");
            ids.push(o["id"].as_str().unwrap().to_owned());
        }
        match v["next"].as_str() {
            Some(n) => {
                uri = format!(
                    "/v1/tags/customer:7/messages?limit=6&after={}",
                    urlencode(n)
                )
            }
            None => break,
        }
    }
    assert_eq!(ids.len(), 20, "{ids:?}");
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/notify/tags/customer:7:reschedule",
        Some(json!({"shift_ms": 1000})),
        t,
    )
    .await;
    assert_eq!((st, v["total"].clone()), (StatusCode::OK, json!(10)), "{v}");
    let got = client.get("notify", "notify-04").await.unwrap().unwrap();
    assert_eq!(got.due_at_ms, due + 1000);
    let got = client.get("notify", "notify-05").await.unwrap().unwrap();
    assert_eq!(got.due_at_ms, due);
    let (st, v) = call(&r, "POST", "/v1/tags/customer:7:cancel", None, t).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        json!({"total": 20, "queues": {"notify": 10, "order-close": 10}})
    );
    let (_, v) = call(&r, "POST", "/v1/tags/customer:7:cancel", None, t).await;
    assert_eq!(v["total"], 0, "{v}");
    assert!(client.get("notify", "notify-04").await.unwrap().is_none());
    assert!(client.get("notify", "notify-05").await.unwrap().is_some());
    for (uri, body) in [
        ("/v1/tags/customer:7:reschedule", json!({})),
        (
            "/v1/tags/customer:7:reschedule",
            json!({"shift_ms": 1, "delay_ms": 1}),
        ),
        ("/v1/tags/customer:7:cancel", json!({"shift_ms": 1})),
    ] {
        let (st, v) = call(&r, "POST", uri, Some(body), t).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{uri}: {v}");
    }
    let (st, _) = call(&r, "POST", "/v1/tags/customer:7:explode", None, t).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = call(&r, "GET", "/v1/queues/nope/tags/customer:7", None, t).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The CLI verbs by tag: `delayq list --tag` (paged), `delayq reschedule --tag --shift`,
/// `delayq cancel --tag [--queue]` (answers the count, 0 when repeated); `delayq cancel
/// QUEUE ID` still cancels one order; a bad tag exits 2.
#[tokio::test]
async fn the_cli_lists_reschedules_and_cancels_by_tag() {
    let (s, client) = start().await;
    let url = s.url();
    let due = client.now_ms() + 3_600_000;
    for q in ["order-close", "notify"] {
        let orders: Vec<delayq::NewOrder> = (0..30)
            .map(|i| {
                let o = delayq::NewOrder::new(
                    format!("{q}-{i:02}"),
                    delayq::When::at_ms(due),
                    json!(i),
                );
                if i % 3 == 0 {
                    o.with_tags(["customer:9"])
                } else {
                    o
                }
            })
            .collect();
        client
            .schedule_many(q, &orders, delayq::Mode::Upsert)
            .await
            .unwrap();
    }
    let o = run(&url, &["list", "--tag", "customer:9", "--limit", "15"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<serde_json::Value> = o
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 16, "{}", o.stdout);
    let next = lines[15]["next"].as_str().unwrap().to_owned();
    let o = run(
        &url,
        &[
            "list",
            "--tag",
            "customer:9",
            "--limit",
            "15",
            "--after",
            &next,
        ],
    );
    assert_eq!(o.stdout.lines().count(), 5, "{}", o.stdout);
    let o = run(
        &url,
        &[
            "reschedule",
            "--tag",
            "customer:9",
            "--queue",
            "notify",
            "--shift",
            "-10m",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["total"], 10, "{}", o.stdout);
    let got = client.get("notify", "notify-03").await.unwrap().unwrap();
    assert_eq!(got.due_at_ms, due - 600_000);
    let o = run(
        &url,
        &["cancel", "--tag", "customer:9", "--queue", "order-close"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["total"], 10, "{}", o.stdout);
    let o = run(&url, &["cancel", "--tag", "customer:9"]);
    assert_eq!(o.json()["total"], 10, "{}", o.stdout);
    let o = run(&url, &["cancel", "--tag", "customer:9"]);
    assert_eq!(o.json()["total"], 0, "{}", o.stdout);
    let o = run(&url, &["cancel", "notify", "notify-01"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(client.get("notify", "notify-01").await.unwrap().is_none());
    assert!(client.get("notify", "notify-02").await.unwrap().is_some());
    let o = run(&url, &["cancel", "--tag", ""]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("tag"), "{}", o.stderr);
}
