//! Cancel-on-event (issue 43 items 4-5) against a real `delayq serve` and on the command
//! line: rules from the configuration, events posted over HTTP from 4 threads (some twice
//! with the same id), an event that arrives first, bad rules and events refused naming the
//! field with nothing written.
#![allow(clippy::unwrap_used)]

use crate::cli::run;
use crate::http::{TOKEN, call};
use crate::pull_wait::{http, post};
use crate::support;
use crate::support::serve::Serve;
use crate::support::wait_for;

use axum::http::StatusCode;
use delayq::LocalRedis;
use delayq::service::http::{AppState, app};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::time::Duration;
use support::{raw, start};

const WAIT: Duration = Duration::from_secs(60);

/// Each order's id in a queue's shard-0 stream.
async fn streamed(client: &delayq::Client, queue: &str) -> HashSet<String> {
    let key = format!("{{dq:{queue}:0}}:stream");
    let entries: Vec<(String, Vec<(String, String)>)> =
        raw(client, &["XRANGE", &key, "-", "+"]).await;
    entries
        .into_iter()
        .filter_map(|(_, f)| f.into_iter().find(|(k, _)| k == "id").map(|(_, v)| v))
        .collect()
}

/// The issue's test: `cancel_on = [{event = "order.paid", match = "order_id"}]` on
/// `order-close` and `reminder`; 500 orders in each; `order.paid` for 200 of them posted
/// over HTTP from 4 threads, 50 posted twice with the same id: exactly those 200 are never
/// delivered, the other 300 are, and the answers' counts add up to 200 per queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_posted_over_http_from_four_threads_cancel_exactly_their_orders() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            r#"
redis_url = "{}"
queues = ["order-close", "reminder"]
cancel_on = [{{ event = "order.paid", match = "order_id" }}]
[http]
listen = "127.0.0.1:{{port}}"
tokens = ["{TOKEN}"]
"#,
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let base = serve.base();
    let h = http();
    for q in ["order-close", "reminder"] {
        let messages: Vec<Value> = (0..500)
            .map(|i| json!({"id": format!("o-{i}"), "delay_ms": 3_600_000, "payload": {"order_id": i}, "tags": ["batch"]}))
            .collect();
        let (st, v) = post(
            &h,
            &base,
            &format!("/v1/queues/{q}/messages:batch"),
            json!({"messages": messages}),
        )
        .await;
        assert_eq!(st, 200, "{v}");
    }
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let base = base.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let h = http();
                    let mut answers = Vec::new();
                    for i in (t..200).step_by(4) {
                        let e = json!({"name": "order.paid", "data": {"order_id": i}, "id": format!("pay-{i}")});
                        let times = if i % 4 == 0 { 2 } else { 1 };
                        for _ in 0..times {
                            let (st, v) = post(&h, &base, "/v1/events", e.clone()).await;
                            assert_eq!(st, 200, "{v}");
                            answers.push(v);
                        }
                    }
                    answers
                })
            })
        })
        .collect();
    let (mut close, mut remind, mut dups) = (0, 0, 0);
    for t in threads {
        for a in t.join().unwrap() {
            close += a["queues"]["order-close"].as_u64().unwrap_or(0);
            remind += a["queues"]["reminder"].as_u64().unwrap_or(0);
            dups += u64::from(a["duplicate"] == json!(true));
        }
    }
    assert_eq!((close, remind, dups), (200, 200, 50));
    // Everything left becomes due now; the service dispatches it.
    let (st, v) = post(
        &h,
        &base,
        "/v1/tags/batch:reschedule",
        json!({"delay_ms": 0}),
    )
    .await;
    assert_eq!((st, v["total"].clone()), (200, json!(600)), "{v}");
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    for q in ["order-close", "reminder"] {
        let c = client.clone();
        wait_for(&format!("300 orders of {q} dispatched"), WAIT, move || {
            let c = c.clone();
            async move { streamed(&c, q).await.len() >= 300 }
        })
        .await;
        let want: HashSet<String> = (200..500).map(|i| format!("o-{i}")).collect();
        assert_eq!(streamed(&client, q).await, want, "{q}");
    }
    let m = h
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains(r#"delayq_cancelled_total{queue="order-close",reason="event"} 200"#),
        "{m}"
    );
    assert!(
        m.contains(r#"delayq_events_received_total{outcome="duplicate"} 50"#),
        "{m}"
    );
    assert!(
        m.contains(r#"delayq_events_received_total{outcome="matched"} 200"#),
        "{m}"
    );
}

/// Rules through `PUT /v1/queues/{q}`; an event first, then the order inside the window:
/// 200 `cancelled_by_event`, nothing written; bad rules and events: 400 naming the field.
#[tokio::test]
async fn http_rules_event_first_and_bad_input() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close",
        Some(json!({"cancel_on": [{"event": "order.paid", "match": ["order_id"], "remember": "15m"}]})),
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
    assert_eq!(
        serde_json::to_value(&info.cancel_on).unwrap(),
        json!([{"event": "order.paid", "match": ["order_id"], "remember_ms": 900000}])
    );
    let (st, v) = call(
        &r,
        "POST",
        "/v1/events",
        Some(json!({"name": "order.paid", "data": {"order_id": 9}, "id": "e-9"})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (v["cancelled"].clone(), v["duplicate"].clone()),
        (json!(0), json!(false))
    );
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close/messages/o-9",
        Some(json!({"delay_ms": 60000, "payload": {"order_id": 9}})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "cancelled_by_event", "{v}");
    assert_eq!(v["event"], "order.paid", "{v}");
    let (st, _) = call(&r, "GET", "/v1/queues/order-close/messages/o-9", None, t).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // A batch of events: each answered.
    let (st, v) = call(
        &r,
        "POST",
        "/v1/events",
        Some(json!([{"name": "order.paid", "data": {"order_id": 1}}, {"name": "other"}])),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 2, "{v}");

    let before = support::snapshot(&client).await;
    for (body, field) in [
        (json!({"cancel_on": [{"event": "order.paid"}]}), "cancel_on"),
        (
            json!({"cancel_on": [{"event": "order.paid", "match": "$.x"}]}),
            "cancel_on",
        ),
        (
            json!({"cancel_on": [{"event": "", "match": "x"}]}),
            "cancel_on",
        ),
        (json!({"cancel_on": "order.paid"}), "cancel_on"),
    ] {
        let (st, v) = call(&r, "PUT", "/v1/queues/order-close", Some(body.clone()), t).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{v}"
        );
    }
    for (body, field) in [
        (json!({"data": {"order_id": 1}}), "name"),
        (json!({"name": ""}), "name"),
        (json!({"name": "a\u{7}"}), "name"),
        (json!({"name": "order.paid", "data": [1]}), "data"),
        (json!({"name": "order.paid", "id": ""}), "id"),
        (json!({"name": "order.paid", "extra": 1}), "event"),
        (json!([{"name": "order.paid"}, {"name": ""}]), "name"),
    ] {
        let (st, v) = call(&r, "POST", "/v1/events", Some(body.clone()), t).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{field}: {v}"
        );
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}

/// `delayq queue create --cancel-on` and `delayq event`: the event cancels the order and
/// says how many; a repeated id answers duplicate; bad input exits 2 naming the field.
#[tokio::test]
async fn the_cli_sets_rules_and_posts_events() {
    let (s, client) = start().await;
    let url = s.url();
    let o = run(
        &url,
        &[
            "queue",
            "create",
            "reminder",
            "--cancel-on",
            "order.paid:order_id@30m",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(
        &url,
        &[
            "schedule",
            "reminder",
            "r-1",
            "--in",
            "1h",
            "--payload",
            r#"{"order_id":"A-1"}"#,
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(
        &url,
        &[
            "event",
            "order.paid",
            "--data",
            r#"{"order_id":"A-1"}"#,
            "--id",
            "p-1",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["cancelled"], 1, "{}", o.stdout);
    assert!(client.get("reminder", "r-1").await.unwrap().is_none());
    let o = run(
        &url,
        &[
            "event",
            "order.paid",
            "--data",
            r#"{"order_id":"A-1"}"#,
            "--id",
            "p-1",
        ],
    );
    assert_eq!(
        (o.json()["cancelled"].clone(), o.json()["duplicate"].clone()),
        (json!(0), json!(true))
    );
    // Scheduled after the event, inside its window: exit 0, the outcome says so.
    let o = run(
        &url,
        &[
            "schedule",
            "reminder",
            "r-1",
            "--in",
            "1h",
            "--payload",
            r#"{"order_id":"A-1"}"#,
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.json()["outcome"], "cancelled_by_event", "{}", o.stdout);

    let before = support::snapshot(&client).await;
    for (args, field) in [
        (
            &["queue", "create", "reminder", "--cancel-on", "order.paid"][..],
            "cancel_on",
        ),
        (
            &[
                "queue",
                "create",
                "reminder",
                "--cancel-on",
                "order.paid:a[0]",
            ][..],
            "cancel_on",
        ),
        (&["event", ""][..], "name"),
        (&["event", "order.paid", "--data", "[1]"][..], "data"),
        (&["event", "order.paid", "--data", "{"][..], "data"),
    ] {
        let o = run(&url, args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains(field), "{args:?}: {}", o.stderr);
    }
    assert_eq!(support::snapshot(&client).await, before, "nothing written");
}
