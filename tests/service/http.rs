//! The HTTP API driven in-process (no socket) against a private redis-server: every status
//! code, the error envelope, bearer tokens, body limits, Redis down.
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use delayq::service::http::{AppState, HttpLimits, app};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use support::{raw, start};
use tower::ServiceExt;

pub(crate) const TOKEN: &str = "change-me-please";

pub(crate) async fn call(
    router: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    raw_call(router, req.body(body).unwrap()).await
}

async fn raw_call(router: &axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, v)
}

pub(crate) fn code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error envelope: {v}"))
}

#[tokio::test]
async fn messages_put_get_delete() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let uri = "/v1/queues/order-close/messages/o1";
    let (st, v) = call(
        &r,
        "PUT",
        uri,
        Some(json!({"delay_ms": 60000, "payload": {"user": 7}})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(
        (v["queue"].clone(), v["id"].clone(), v["outcome"].clone()),
        (json!("order-close"), json!("o1"), json!("created"))
    );
    let (st, v) = call(
        &r,
        "PUT",
        uri,
        Some(json!({"due_at": "2030-01-01T00:00:00Z", "payload": 1})),
        t,
    )
    .await;
    assert_eq!(
        (st, v["outcome"].clone(), v["due_at_ms"].clone()),
        (
            StatusCode::OK,
            json!("updated"),
            json!(1_893_456_000_000_i64)
        )
    );
    let (st, v) = call(
        &r,
        "PUT",
        uri,
        Some(json!({"due_at": 1_893_456_000_001_i64, "if_absent": true})),
        t,
    )
    .await;
    assert_eq!(
        (st, v["outcome"].clone()),
        (StatusCode::OK, json!("unchanged"))
    );
    let (st, v) = call(&r, "GET", uri, None, t).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"queue": "order-close", "id": "o1", "state": "scheduled",
               "due_at_ms": 1_893_456_000_000_i64, "payload": 1, "dispatched_at_ms": null,
               "entry_id": null, "groups": [], "priority": "normal"})
    );
    let (st, v) = call(&r, "DELETE", uri, None, t).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"outcome": "cancelled"})));
    let (st, v) = call(&r, "DELETE", uri, None, t).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    // Its history tells the cancellation (issue 43).
    let (st, v) = call(&r, "GET", uri, None, t).await;
    assert_eq!(
        (st, v["state"].clone(), v["cancelled"]["reason"].clone()),
        (StatusCode::OK, json!("cancelled"), json!("id"))
    );
    let (st, v) = call(&r, "GET", "/v1/queues/order-close/messages/never", None, t).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (st, v) = call(&r, "GET", "/v1/queues", None, t).await;
    assert_eq!(
        (st, v),
        (StatusCode::OK, json!({"queues": support::QUEUES_SORTED}))
    );
    let (st, v) = call(&r, "GET", "/v1/queues/order-close/stats", None, t).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["queues"][0]["queue"], json!("order-close"));
}

#[tokio::test]
async fn bad_input_is_400_with_a_code_and_writes_nothing() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let big = "x".repeat(70 * 1024);
    let cases: Vec<(&str, &str, Option<Value>, &str)> = vec![
        (
            "PUT",
            "/v1/queues/bad:queue/messages/o",
            Some(json!({"delay_ms": 1})),
            "invalid_queue",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"delay_ms": -1})),
            "invalid_delay",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({})),
            "invalid_due_time",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"delay_ms": 1, "due_at": 5})),
            "invalid_due_time",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"due_at": "2030-01-01T00:00:00"})),
            "invalid_due_time",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"due_at": 1_795_000_000})),
            "invalid_due_time",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"delay_ms": 1, "colour": "red"})),
            "invalid_json",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"delay_ms": 1, "payload": big})),
            "payload_too_large",
        ),
        (
            "PUT",
            "/v1/queues/q/messages/%01",
            Some(json!({"delay_ms": 1})),
            "invalid_id",
        ),
        (
            "POST",
            "/v1/queues/q/messages:batch",
            Some(json!({"messages": [{"id": "a", "delay_ms": 1}, {"id": "", "delay_ms": 1}]})),
            "invalid_id",
        ),
        (
            "POST",
            "/v1/queues/q/messages:batch",
            Some(json!({"messages": [{"id": "a", "delay_ms": 1}, {"id": "b"}]})),
            "invalid_due_time",
        ),
        (
            "POST",
            "/v1/queues/q/dead/replay",
            Some(json!({})),
            "invalid_body",
        ),
        ("GET", "/v1/queues/q/dead?limit=x", None, "invalid_query"),
    ];
    for (m, uri, body, want) in cases {
        let (st, v) = call(&r, m, uri, body, None).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, want),
            "{m} {uri}: {v}"
        );
    }
    // Not JSON at all.
    let req = Request::builder()
        .method("PUT")
        .uri("/v1/queues/q/messages/o")
        .body(Body::from("{nope"))
        .unwrap();
    let (st, v) = raw_call(&r, req).await;
    assert_eq!((st, code(&v)), (StatusCode::BAD_REQUEST, "invalid_json"));
    // A batch names the index of the bad message.
    let (_, v) = call(
        &r,
        "POST",
        "/v1/queues/q/messages:batch",
        Some(json!({"messages": [{"id": "a", "delay_ms": 1}, {"id": "b", "delay_ms": -5}]})),
        None,
    )
    .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("message 1:"),
        "{v}"
    );
    // Over 10,000 messages.
    let many: Vec<Value> = (0..10_001)
        .map(|i| json!({"id": format!("m{i}"), "delay_ms": 1}))
        .collect();
    let r_big = app(AppState::new(client.clone(), vec![])
        .with_limits(HttpLimits::default().max_body_bytes(4 << 20)));
    let (st, v) = call(
        &r_big,
        "POST",
        "/v1/queues/q/messages:batch",
        Some(json!({"messages": many})),
        None,
    )
    .await;
    assert_eq!((st, code(&v)), (StatusCode::BAD_REQUEST, "batch_too_large"));
    assert_eq!(
        support::data_keys(&client).await,
        0,
        "a rejected request wrote something"
    );
}

#[tokio::test]
async fn batches_return_one_result_per_message_in_order() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    client
        .schedule("q", "b", delayq::When::in_ms(60_000), json!(0))
        .await
        .unwrap();
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/q/messages:batch",
        Some(json!({"messages": [
            {"id": "a", "delay_ms": 1000, "payload": {"n": 1}},
            {"id": "b", "due_at": "2030-01-01T00:00:00Z"},
            {"id": "c", "due_at": 1_893_456_000_000_i64}
        ]})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let outcomes: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    let ids: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        (ids, outcomes),
        (vec!["a", "b", "c"], vec!["created", "updated", "created"])
    );
    assert_eq!(
        client.get("q", "a").await.unwrap().unwrap().payload,
        json!({"n": 1})
    );
}

#[tokio::test]
async fn tokens_bodies_routes_and_probes() {
    // As serve does: the recorder first, so every metric from here on is kept.
    assert!(delayq::service::metrics::handle().is_some());
    let (mut s, client) = start().await;
    let r = app(
        AppState::new(client.clone(), vec![TOKEN.into(), "second-token".into()])
            .with_limits(HttpLimits::default().max_body_bytes(2048)),
    );
    let body = Some(json!({"delay_ms": 1}));
    for token in [None, Some("wrong-token"), Some("change-me-pleasE")] {
        let (st, v) = call(&r, "PUT", "/v1/queues/q/messages/o", body.clone(), token).await;
        assert_eq!((st, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    }
    let (st, _) = call(
        &r,
        "PUT",
        "/v1/queues/q/messages/o",
        body.clone(),
        Some("second-token"),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    // Probes and docs need no token.
    let (st, v) = call(&r, "GET", "/healthz", None, None).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"status": "ok"})));
    let (st, _) = call(&r, "GET", "/readyz", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = call(&r, "GET", "/openapi.json", None, None).await;
    assert_eq!((st, v["openapi"].clone()), (StatusCode::OK, json!("3.0.3")));
    assert!(v["paths"]["/v1/queues/{queue}/messages:batch"]["post"].is_object());
    let (st, v) = call(&r, "GET", "/metrics", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let text = v.as_str().unwrap();
    assert!(
        text.contains("delayq_scheduled_total") && text.contains("delayq_scheduled{"),
        "{text}"
    );
    // Unknown route.
    let (st, v) = call(&r, "GET", "/v2/nothing", None, Some(TOKEN)).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    // Body over max_body_bytes.
    let big = json!({"delay_ms": 1, "payload": "y".repeat(4096)});
    let (st, v) = call(&r, "PUT", "/v1/queues/q/messages/o", Some(big), Some(TOKEN)).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
    );
    // Redis down: 503, with nothing internal in the body.
    s.kill();
    let (st, v) = call(&r, "GET", "/readyz", None, None).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable")
    );
    let (st, v) = call(&r, "PUT", "/v1/queues/q/messages/o2", body, Some(TOKEN)).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable"),
        "{v}"
    );
    let text = v.to_string();
    assert!(
        !text.contains("127.0.0.1") && !text.contains("redis://") && !text.contains("os error"),
        "{text}"
    );
}

#[tokio::test]
async fn an_id_that_was_already_dispatched_is_created_anew() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let uri = "/v1/queues/q/messages/o1";
    let (st, _) = call(&r, "PUT", uri, Some(json!({"delay_ms": 0})), None).await;
    assert_eq!(st, StatusCode::CREATED);
    let moved = delayq::Dispatcher::new(&client, "q", delayq::DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap()
        .moved;
    assert_eq!(moved, 1);
    let (st, v) = call(&r, "PUT", uri, Some(json!({"delay_ms": 0})), None).await;
    assert_eq!(
        (st, v["outcome"].clone()),
        (StatusCode::CREATED, json!("created"))
    );
}

#[tokio::test]
async fn queues_are_declared_objects() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    // Nothing goes into a queue nobody declared: 404 queue_not_found, nothing written.
    let before = support::snapshot(&client).await;
    let typo = "/v1/queues/typo-queue";
    for (m, uri, body) in [
        (
            "PUT",
            format!("{typo}/messages/o1"),
            Some(json!({"delay_ms": 1})),
        ),
        ("GET", format!("{typo}/messages/o1"), None),
        ("DELETE", format!("{typo}/messages/o1"), None),
        (
            "POST",
            format!("{typo}/messages:batch"),
            Some(json!({"messages": [{"id": "a", "delay_ms": 1}]})),
        ),
        ("GET", format!("{typo}/stats"), None),
        ("GET", format!("{typo}/dead"), None),
        (
            "POST",
            format!("{typo}/dead/replay"),
            Some(json!({"all": true})),
        ),
        ("DELETE", typo.to_owned(), None),
    ] {
        let (st, v) = call(&r, m, &uri, body, None).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::NOT_FOUND, "queue_not_found"),
            "{m} {uri}: {v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("typo-queue"),
            "{v}"
        );
    }
    assert_eq!(support::snapshot(&client).await, before);

    // Create: 201, then 200 with the same count, 409 with another.
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/fresh",
        Some(json!({"shards": 2})),
        None,
    )
    .await;
    assert_eq!(
        (st, v),
        (
            StatusCode::CREATED,
            json!({"queue": "fresh", "shards": 2, "created": true})
        )
    );
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/fresh",
        Some(json!({"shards": 2})),
        None,
    )
    .await;
    assert_eq!((st, v["created"].clone()), (StatusCode::OK, json!(false)));
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/fresh",
        Some(json!({"shards": 3})),
        None,
    )
    .await;
    assert_eq!((st, code(&v)), (StatusCode::CONFLICT, "shard_mismatch"));
    let (st, v) = call(&r, "PUT", "/v1/queues/a..b", Some(json!({})), None).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let (_, v) = call(&r, "GET", "/v1/queues", None, None).await;
    assert!(
        v["queues"].as_array().unwrap().contains(&json!("fresh")),
        "{v}"
    );

    // Every shard is seen: orders spread over both shards are all counted.
    for i in 0..20 {
        let uri = format!("/v1/queues/fresh/messages/o{i}");
        let (st, _) = call(&r, "PUT", &uri, Some(json!({"delay_ms": 600_000})), None).await;
        assert_eq!(st, StatusCode::CREATED);
    }
    let (_, v) = call(&r, "GET", "/v1/queues/fresh/stats", None, None).await;
    assert_eq!(v["queues"][0]["scheduled"], json!(20));

    // Delete: refused while it holds work, then forced.
    let (st, v) = call(&r, "DELETE", "/v1/queues/fresh", None, None).await;
    assert_eq!((st, code(&v)), (StatusCode::CONFLICT, "queue_not_empty"));
    let (st, v) = call(&r, "DELETE", "/v1/queues/fresh?force=true", None, None).await;
    assert_eq!((st, v["scheduled"].clone()), (StatusCode::OK, json!(20)));
    let (_, v) = call(&r, "GET", "/v1/queues", None, None).await;
    assert!(
        !v["queues"].as_array().unwrap().contains(&json!("fresh")),
        "{v}"
    );
    let keys: Vec<String> = raw(&client, &["KEYS", "*fresh*"]).await;
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test]
async fn extreme_delays_are_refused_not_a_panic() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let ten_years_ms: i64 = 3653 * 24 * 3600 * 1000;
    let before = support::snapshot(&client).await;
    for delay in [i64::MIN, i64::MAX, -1, ten_years_ms + 1] {
        let (st, v) = call(
            &r,
            "PUT",
            "/v1/queues/q/messages/o",
            Some(json!({"delay_ms": delay})),
            None,
        )
        .await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_delay"),
            "{delay}"
        );
    }
    assert_eq!(support::snapshot(&client).await, before);
    let (st, _) = call(
        &r,
        "PUT",
        "/v1/queues/q/messages/o",
        Some(json!({"delay_ms": ten_years_ms})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
}

#[tokio::test]
async fn pause_and_resume_over_http() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let (st, v) = call(&r, "POST", "/v1/queues/order-close:pause", None, None).await;
    assert_eq!(
        (st, v),
        (
            StatusCode::OK,
            json!({"queue": "order-close", "group": null, "paused": true})
        )
    );
    let (_, v) = call(&r, "GET", "/v1/queues/order-close/stats", None, None).await;
    assert_eq!(v["queues"][0]["paused"], json!(true));
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close:resume",
        Some(json!({})),
        None,
    )
    .await;
    assert_eq!((st, v["paused"].clone()), (StatusCode::OK, json!(false)));
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close:pause",
        Some(json!({"group": "nope"})),
        None,
    )
    .await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "group_not_found"));
    let (st, v) = call(&r, "POST", "/v1/queues/typo:pause", None, None).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "queue_not_found"));
    let (st, v) = call(&r, "POST", "/v1/queues/order-close:explode", None, None).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
}

/// Calls of EVALSHA so far (stats.lua runs through it).
async fn evalsha_calls(client: &delayq::Client) -> u64 {
    let info: String = raw(client, &["INFO", "commandstats"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn scrapes_do_not_multiply_redis_work() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let (st, _) = call(&r, "GET", "/metrics", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let after_first = evalsha_calls(&client).await;
    assert!(
        after_first >= support::QUEUES.len() as u64,
        "the first scrape reads the stats"
    );
    // Scrapes right after it are served from the refreshed gauges.
    for _ in 0..20 {
        let (st, _) = call(&r, "GET", "/metrics", None, None).await;
        assert_eq!(st, StatusCode::OK);
    }
    assert_eq!(evalsha_calls(&client).await, after_first);
    // An unregistered name in a request never becomes a label value.
    let (st, _) = call(&r, "GET", "/v1/queues/made-up/stats", None, None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, text) = call(&r, "GET", "/metrics", None, None).await;
    assert!(!text.as_str().unwrap_or_default().contains("made-up"));
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_405_is_in_the_envelope() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let req = Request::builder()
            .method("GET")
            .uri("/v1/queues")
            .header("authorization", format!("{scheme} {TOKEN}"))
            .body(Body::empty())
            .unwrap();
        let (st, _) = raw_call(&r, req).await;
        assert_eq!(st, StatusCode::OK, "{scheme}");
    }
    let req = Request::builder()
        .method("GET")
        .uri("/v1/queues")
        .header("authorization", format!("Basic {TOKEN}"))
        .body(Body::empty())
        .unwrap();
    let (st, v) = raw_call(&r, req).await;
    assert_eq!((st, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let (st, v) = call(&r, "DELETE", "/healthz", None, None).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
}

#[test]
fn tokens_of_spaces_are_refused() {
    for tokens in [r#"["        "]"#, r#"["has a space"]"#, r#"["short"]"#] {
        let e = delayq::service::config::load_str(
            &format!("redis_url = \"redis://127.0.0.1:6379\"\n[http]\ntokens = {tokens}\n"),
            figment::providers::Env::prefixed("DELAYQ_TEST_NONE_"),
        )
        .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("http.tokens"), "{tokens}: {e}");
    }
}

#[tokio::test]
async fn every_queues_statistics_come_in_pages_with_totals_over_all_of_them() {
    let (_s, client) = start().await;
    for q in ["p-a", "p-b", "p-c", "p-d", "p-e"] {
        client.admin().create_queue(q, 1).await.unwrap();
    }
    let router = app(AppState::new(client.clone(), Vec::new()));
    let (status, all) = call(&router, "GET", "/v1/stats", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let total = all["summary"]["queues"].as_u64().unwrap();
    assert_eq!(total, all["queues"].as_array().unwrap().len() as u64);
    assert_eq!(all["next"], Value::Null, "one page holds them all");
    // Two at a time, following `next`, gives every queue once, in name order.
    let mut seen = Vec::new();
    let mut uri = "/v1/stats?limit=2".to_owned();
    loop {
        let (status, page) = call(&router, "GET", &uri, None, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page["queues"].as_array().unwrap().len() <= 2);
        assert_eq!(
            page["summary"], all["summary"],
            "totals over every queue on each page"
        );
        seen.extend(
            page["queues"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| q["queue"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(after) => uri = format!("/v1/stats?limit=2&after={after}"),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted);
    assert_eq!(seen.len() as u64, total);
    let (status, body) = call(&router, "GET", "/v1/stats?limit=0", None, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("limit"),
        "{body}"
    );
}

#[tokio::test]
async fn a_stats_page_over_the_documented_bound_is_refused_naming_limit() {
    let (_s, client) = start().await;
    let router = app(AppState::new(client.clone(), Vec::new()));
    let max = delayq::service::surface::MAX_STATS_LIMIT;
    assert_eq!(max, 1000, "the README documents at most 1,000");
    let (status, _) = call(
        &router,
        "GET",
        &format!("/v1/stats?limit={max}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for over in [max + 1, 1_000_000] {
        let (status, body) = call(
            &router,
            "GET",
            &format!("/v1/stats?limit={over}"),
            None,
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{over}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("limit") && message.contains(&max.to_string()),
            "{body}"
        );
    }
}

#[tokio::test]
async fn schedules_are_declared_replaced_shown_listed_and_removed() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let uri = "/v1/queues/order-close/schedules/nightly";
    // Behind the same tokens as every /v1 route.
    let (st, v) = call(&r, "GET", uri, None, None).await;
    assert_eq!((st, code(&v)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let (st, v) = call(
        &r,
        "PUT",
        uri,
        Some(json!({"every": "1h", "payload": {"kind": "report"}})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(
        (v["queue"].clone(), v["id"].clone(), v["created"].clone()),
        (json!("order-close"), json!("nightly"), json!(true))
    );
    let first = v["next_ms"].as_i64().unwrap();
    assert_eq!(first % 3_600_000, 0, "aligned to the hour: {v}");
    // Replaced by a cron: 200, and the new next tick is an ordinary order.
    let (st, v) = call(
        &r,
        "PUT",
        uri,
        Some(
            json!({"cron": "0 0 * * * *", "timezone": "Europe/Berlin", "missed": "fire_once",
                    "payload": {"kind": "report", "v": 2}}),
        ),
        t,
    )
    .await;
    assert_eq!(
        (st, v["created"].clone()),
        (StatusCode::OK, json!(false)),
        "{v}"
    );
    let next = v["next_ms"].as_i64().unwrap();
    let (st, v) = call(&r, "GET", uri, None, t).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["cron"], json!("0 0 * * * *"));
    assert_eq!(v["every"], Value::Null);
    assert_eq!(v["timezone"], json!("Europe/Berlin"));
    assert_eq!(v["missed"], json!("fire_once"));
    assert_eq!(v["payload"], json!({"kind": "report", "v": 2}));
    assert_eq!(v["next_ms"], json!(next));
    assert_eq!(v["next_id"], json!(format!("nightly@{next}")));
    assert_eq!(v["upcoming_ms"].as_array().unwrap().len(), 5, "{v}");
    assert_eq!(v["ticks"], json!(0));
    let tick = client
        .get("order-close", &format!("nightly@{next}"))
        .await
        .unwrap()
        .expect("the next tick is scheduled as an order");
    assert_eq!(tick.due_at_ms, next);
    let (st, v) = call(&r, "GET", "/v1/queues/order-close/schedules", None, t).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let list = v["schedules"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    assert_eq!(list[0]["id"], json!("nightly"));
    let (st, v) = call(&r, "GET", "/v1/queues/q/schedules", None, t).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"schedules": []})));
    // Removed: its pending tick is taken back; a second removal finds nothing.
    let (st, v) = call(&r, "DELETE", uri, None, t).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"removed": true})));
    assert!(
        client
            .get("order-close", &format!("nightly@{next}"))
            .await
            .unwrap()
            .is_none()
    );
    let (st, v) = call(&r, "GET", uri, None, t).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (st, v) = call(&r, "DELETE", uri, None, t).await;
    assert_eq!((st, code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (st, v) = call(&r, "GET", "/v1/queues/order-close/schedules", None, t).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"schedules": []})));
}

#[tokio::test]
async fn bad_schedules_are_400_naming_the_field_and_write_nothing() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), Vec::new()));
    let uri = "/v1/queues/order-close/schedules/s1";
    for (body, code_want, field) in [
        (json!({"cron": "61 * * * * *"}), "invalid_option", "cron"),
        (
            json!({"cron": "0 0 * * * *", "timezone": "Mars/Olympus"}),
            "invalid_option",
            "timezone",
        ),
        (json!({"every": "10ms"}), "invalid_option", "every"),
        (
            json!({"cron": "0 0 * * * *", "every": "1h"}),
            "invalid_option",
            "cron",
        ),
        (json!({}), "invalid_option", "cron"),
        (
            json!({"every": "1h", "missed": "often"}),
            "invalid_option",
            "missed",
        ),
        (
            json!({"every": "1h", "start_ms": 2_000, "end_ms": 1_000}),
            "invalid_option",
            "end",
        ),
        (
            json!({"every": "1h", "start_ms": 9_007_199_254_740_992_i64}),
            "invalid_option",
            "start_ms",
        ),
        (
            json!({"every": "1h", "color": "blue"}),
            "invalid_json",
            "color",
        ),
    ] {
        let (st, v) = call(&r, "PUT", uri, Some(body.clone()), None).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, code_want),
            "{body}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    // A bad id names the id.
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/order-close/schedules/a@b",
        Some(json!({"every": "1h"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("id"),
        "{v}"
    );
    // A queue that is not registered: 400 (not 404), saying to create it first.
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/not-registered/schedules/s1",
        Some(json!({"every": "1h"})),
        None,
    )
    .await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::BAD_REQUEST, "unknown_queue"),
        "{v}"
    );
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("queue") && message.contains("not-registered"),
        "{message}"
    );
    assert!(message.contains("create it first"), "{message}");
    assert!(
        delayq::Schedules::new(&client)
            .list(None)
            .await
            .unwrap()
            .is_empty(),
        "nothing was written"
    );
    let (st, v) = call(&r, "GET", "/v1/queues/order-close/schedules", None, None).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"schedules": []})));
}

#[tokio::test]
async fn a_schedule_is_paused_and_resumed_over_http() {
    let (_s, client) = start().await;
    let router = app(AppState::new(client.clone(), Vec::new()));
    let (status, _) = call(
        &router,
        "PUT",
        "/v1/queues/q/schedules/beat",
        Some(json!({"every": "1h"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = call(
        &router,
        "POST",
        "/v1/queues/q/schedules/beat:pause",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["paused"], true);
    assert_eq!(body["next_ms"], Value::Null);
    let (status, body) = call(
        &router,
        "POST",
        "/v1/queues/q/schedules/beat:resume",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["paused"], false);
    assert!(body["next_ms"].as_i64().is_some(), "{body}");
    let (status, _) = call(
        &router,
        "POST",
        "/v1/queues/q/schedules/nope:pause",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(
        &router,
        "POST",
        "/v1/queues/q/schedules/beat:explode",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn priorities_over_http_are_stored_shown_and_checked() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let uri = "/v1/queues/order-close/messages/vip";
    let (st, _) = call(
        &r,
        "PUT",
        uri,
        Some(json!({"delay_ms": 60_000, "priority": "high"})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, v) = call(&r, "GET", uri, None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["priority"], json!("high"), "{v}");
    // Upserted without a level: normal again.
    call(&r, "PUT", uri, Some(json!({"delay_ms": 60_000})), None).await;
    let (_, v) = call(&r, "GET", uri, None, None).await;
    assert_eq!(v["priority"], json!("normal"), "{v}");

    let before = support::snapshot(&client).await;
    for (body, uri) in [
        (
            json!({"delay_ms": 1, "priority": 7}),
            "/v1/queues/order-close/messages/p7",
        ),
        (
            json!({"delay_ms": 1, "priority": "urgent"}),
            "/v1/queues/order-close/messages/pu",
        ),
    ] {
        let (st, v) = call(&r, "PUT", uri, Some(body.clone()), None).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(code(&v), "invalid_priority", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("priority"),
            "{v}"
        );
    }
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/messages:batch",
        Some(json!({"messages": [
            {"id": "b0", "delay_ms": 1, "priority": "low"},
            {"id": "b1", "delay_ms": 1, "priority": 7}
        ]})),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(code(&v), "invalid_priority");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("message 1"),
        "{v}"
    );
    assert_eq!(
        support::snapshot(&client).await,
        before,
        "a refused call wrote something"
    );

    // The stats show each level's backlog.
    let (st, v) = call(&r, "GET", "/v1/stats", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let levels: Vec<&str> = v["queues"][0]["priorities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["priority"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["high", "normal", "low"], "{v}");
    // ...and so do the gauges, one series per level (once the shared statistics are read
    // again with the recorder installed by the first scrape).
    let r2 = r.clone();
    support::wait_for(
        "the per-level gauges on /metrics",
        std::time::Duration::from_secs(30),
        move || {
            let r = r2.clone();
            async move {
                let (_, text) = call(&r, "GET", "/metrics", None, None).await;
                let text = text.as_str().unwrap_or_default().to_owned();
                ["high", "normal", "low"].iter().all(|level| {
                    text.contains(&format!(
                        "delayq_stream_length{{queue=\"order-close\",priority=\"{level}\"}}"
                    ))
                })
            }
        },
    )
    .await;
}

/// Issue 39 item 5: `history_retention = "0s"` on one queue keeps every overview working:
/// `/v1/stats` (the dashboard's overview), the queue's own stats, `delayq stats`, and the
/// gauges of every queue in `/metrics`.
#[tokio::test]
async fn a_queue_without_history_keeps_every_overview_and_every_gauge() {
    assert!(delayq::service::metrics::handle().is_some());
    let (s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    for (q, body) in [
        ("zero-history", json!({"history_retention": "0s"})),
        ("kept-history", json!({})),
    ] {
        let (st, v) = call(&r, "PUT", &format!("/v1/queues/{q}"), Some(body), t).await;
        assert!(st.is_success(), "{v}");
        let (st, v) = call(
            &r,
            "PUT",
            &format!("/v1/queues/{q}/messages/o1"),
            Some(json!({"delay_ms": 600000, "payload": 1})),
            t,
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    // A third queue that cannot be read at all (its schedule is not a ZSET) is left out of
    // the overviews; it hides no other queue.
    let (st, v) = call(&r, "PUT", "/v1/queues/broken", Some(json!({})), t).await;
    assert!(st.is_success(), "{v}");
    let _: () = raw(&client, &["SET", "{dq:broken:0}:due", "not-a-zset"]).await;
    let (st, v) = call(&r, "GET", "/v1/stats", None, t).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let names: Vec<&str> = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"kept-history")
            && names.contains(&"zero-history")
            && !names.contains(&"broken"),
        "{v}"
    );
    for q in ["zero-history", "kept-history"] {
        let (st, v) = call(&r, "GET", &format!("/v1/queues/{q}/stats"), None, t).await;
        assert_eq!(st, StatusCode::OK, "{v}");
        assert_eq!(v["queues"][0]["scheduled"], json!(1), "{v}");
    }
    let (st, v) = call(&r, "GET", "/metrics", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let text = v.as_str().unwrap();
    for q in ["zero-history", "kept-history"] {
        assert!(
            text.contains(&format!("delayq_scheduled{{queue=\"{q}\"}} 1")),
            "{q}: {text}"
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_delayq"))
        .args(["--redis-url", &s.url(), "stats", "--json"])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A master that refuses writes for want of replicas (`min-replicas-to-write`, as during a
/// failover) answers a write 503 `redis_unavailable` with `Retry-After`, never 500
/// `internal`, and `/readyz` is 503 meanwhile (a `PING` would still answer); both recover
/// once writes are taken again.
#[tokio::test]
async fn a_master_refusing_writes_answers_503_with_retry_after_and_is_not_ready() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let put = |id: &str| {
        Request::builder()
            .method("PUT")
            .uri(format!("/v1/queues/q/messages/{id}"))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"delay_ms": 60000, "payload": 1}).to_string(),
            ))
            .unwrap()
    };
    let _: String = raw(&client, &["CONFIG", "SET", "min-replicas-to-write", "1"]).await;
    let resp = r.clone().oneshot(put("refused")).await.unwrap();
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        (status, code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable"),
        "{v}"
    );
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(client.get("q", "refused").await.unwrap(), None);
    let (st, v) = call(&r, "GET", "/readyz", None, None).await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable")
    );
    // Writes taken again: ready, and the same write is acknowledged.
    let _: String = raw(&client, &["CONFIG", "SET", "min-replicas-to-write", "0"]).await;
    let (st, _) = call(&r, "GET", "/readyz", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let resp = r.clone().oneshot(put("refused")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::CREATED);
}

/// Issue 39 item 8: a schedule that can never fire is 400 naming the field (nothing
/// written); a paused one stays in the list.
#[tokio::test]
async fn never_firing_schedules_are_400_and_paused_ones_are_listed() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), Vec::new()));
    let uri = "/v1/queues/q/schedules/s1";
    for (body, field) in [
        (json!({"cron": "0 0 0 30 2 *"}), "cron"),
        (json!({"every": "1h", "end_ms": 1_000}), "end"),
        (json!({"cron": "0 0 12 * * ? 2286"}), "cron"),
        (
            json!({"cron": format!("0 0 0 * * {}1", "1,".repeat(200))}),
            "cron",
        ),
    ] {
        let (st, v) = call(&r, "PUT", uri, Some(body.clone()), None).await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_option"),
            "{body}: {v}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("option {field}")),
            "{body}: {message}"
        );
    }
    let (st, v) = call(&r, "GET", "/v1/queues/q/schedules", None, None).await;
    assert_eq!((st, v), (StatusCode::OK, json!({"schedules": []})));
    let (st, _) = call(&r, "PUT", uri, Some(json!({"every": "1h"})), None).await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, _) = call(&r, "POST", "/v1/queues/q/schedules/s1:pause", None, None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = call(&r, "GET", "/v1/queues/q/schedules", None, None).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["schedules"][0]["id"], json!("s1"), "{v}");
    assert_eq!(v["schedules"][0]["paused"], json!(true), "{v}");
}

/// Issue 44: `at_local` + `timezone` (PUT and batch) resolve once, with the recurring
/// schedules' daylight-saving rules, and the answer carries the resolved instant; every
/// refusal names its field and writes nothing.
#[tokio::test]
async fn local_wall_clock_times_resolve_and_refusals_write_nothing() {
    let (_s, client) = start().await;
    let r = app(AppState::new(client.clone(), vec![TOKEN.into()]));
    let t = Some(TOKEN);
    let uri = "/v1/queues/order-close/messages/l1";
    // 02:30 on 2027-03-28 does not exist in Berlin: the end of the gap, 03:00 CEST = 01:00Z.
    let body = json!({"at_local": "2027-03-28T02:30", "timezone": "Europe/Berlin"});
    let (st, v) = call(&r, "PUT", uri, Some(body), t).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["due_at_ms"], json!(1_806_195_600_000_i64), "{v}");
    let (_, v) = call(&r, "GET", uri, None, t).await;
    assert_eq!(v["due_at_ms"], json!(1_806_195_600_000_i64), "{v}");
    // 02:30 on 2027-10-31 happens twice: the first occurrence (CEST), 00:30Z.
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/messages:batch",
        Some(json!({"messages": [
            {"id": "l2", "at_local": "2027-10-31T02:30", "timezone": "Europe/Berlin"},
        ]})),
        t,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v["results"][0]["due_at_ms"],
        json!(1_824_942_600_000_i64),
        "{v}"
    );

    let before = support::snapshot(&client).await;
    let bad = |b: Value, want: &'static str, field: &'static str| (b, want, field);
    for (body, want, field) in [
        bad(
            json!({"at_local": "2027-03-28T09:00", "timezone": "Mars/Olympus"}),
            "invalid_timezone",
            "timezone",
        ),
        bad(
            json!({"at_local": "2027-03-28T09:00Z", "timezone": "Europe/Berlin"}),
            "invalid_local_time",
            "at_local",
        ),
        bad(
            json!({"at_local": "2027-03-28T09:00+01:00", "timezone": "Europe/Berlin"}),
            "invalid_local_time",
            "at_local",
        ),
        bad(
            json!({"at_local": "2027-03-28T09:00"}),
            "invalid_timezone",
            "timezone",
        ),
        bad(
            json!({"delay_ms": 5, "timezone": "Europe/Berlin"}),
            "invalid_timezone",
            "timezone",
        ),
        bad(
            json!({"at_local": "2027-03-28T09:00", "timezone": "UTC", "delay_ms": 5}),
            "invalid_local_time",
            "at_local",
        ),
        bad(
            json!({"at_local": "28.03.2027 09:00", "timezone": "UTC"}),
            "invalid_local_time",
            "at_local",
        ),
    ] {
        let (st, v) = call(
            &r,
            "PUT",
            "/v1/queues/order-close/messages/l3",
            Some(body.clone()),
            t,
        )
        .await;
        assert_eq!(
            (st, code(&v)),
            (StatusCode::BAD_REQUEST, want),
            "{body}: {v}"
        );
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(field), "{body}: {msg}");
    }
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/order-close/messages:batch",
        Some(json!({"messages": [
            {"id": "l4", "delay_ms": 5},
            {"id": "l5", "at_local": "2027-03-28T09:00", "timezone": "Nowhere/Else"},
        ]})),
        t,
    )
    .await;
    assert_eq!(
        (st, code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_timezone"),
        "{v}"
    );
    assert_eq!(
        support::snapshot(&client).await,
        before,
        "a refusal wrote something"
    );
}
