//! The hardened edge, tried as an attacker or an unlucky operator would: redirecting
//! receivers, slow and idle connections, SIGTERM with a half-sent request, payloads that must
//! survive byte for byte, Redis out of memory or frozen, a refused database login, secrets
//! in URLs, and the error envelope for whatever the framework refuses.
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use delayq::service::handlers::{Builtin, Webhook};
use delayq::service::http::{AppState, app};
use delayq::{
    Backoff, Client, ClientOptions, Dispatcher, DispatcherOptions, LocalRedis, When, Worker,
    WorkerOptions,
};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::serve::{BIN, Serve, free_port};
use support::wait_for;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

const WAIT: Duration = Duration::from_secs(30);

/// An HTTP client (TLS through rustls with the ring provider, as the service's own).
fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// The body of a GET of `url`, as text.
async fn get_text(http: &reqwest::Client, url: String) -> String {
    let r = http.get(url).send().await.unwrap();
    r.text().await.unwrap()
}

/// Raw bodies received by a webhook endpoint.
#[derive(Clone, Default)]
struct Received {
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// An endpoint on a free port: `/ok` records and answers 200; `/302` and `/307` redirect to
/// `/elsewhere?token=...`, which records what reaches it.
async fn receiver() -> (u16, Received, Received) {
    let (ok, elsewhere) = (Received::default(), Received::default());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let target = format!("http://127.0.0.1:{port}/elsewhere?token=REDIRECT-SECRET");
    let record = |State(r): State<Received>, body: axum::body::Bytes| async move {
        r.bodies.lock().unwrap().push(body.to_vec());
        StatusCode::OK
    };
    let (t1, t2) = (target.clone(), target);
    let app = axum::Router::new()
        .route("/ok", axum::routing::post(record).with_state(ok.clone()))
        .route(
            "/elsewhere",
            axum::routing::post(record)
                .get(|State(r): State<Received>| async move {
                    r.bodies.lock().unwrap().push(b"GET".to_vec());
                    StatusCode::OK
                })
                .with_state(elsewhere.clone()),
        )
        .route(
            "/302",
            axum::routing::post(move || {
                let t = t1.clone();
                async move { (StatusCode::FOUND, [("location", t)]) }
            }),
        )
        .route(
            "/307",
            axum::routing::post(move || {
                let t = t2.clone();
                async move { (StatusCode::TEMPORARY_REDIRECT, [("location", t)]) }
            }),
        );
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (port, ok, elsewhere)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirecting_receivers_never_acknowledge_and_their_target_receives_nothing() {
    let (_redis, client) = support::start().await;
    let (port, _ok, elsewhere) = receiver().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut handles = Vec::new();
    for (group, path) in [("r302", "302"), ("r307", "307")] {
        let hook = Webhook::new(
            &format!("http://127.0.0.1:{port}/{path}"),
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()],
            Duration::from_secs(5),
            client.clock().clone(),
        )
        .unwrap();
        let w = Worker::new(
            &client,
            "order-close",
            group,
            Builtin::Webhook(hook),
            WorkerOptions::default()
                .max_attempts(2)
                .backoff(Backoff::Fixed(Duration::from_millis(100)))
                .block(Duration::from_millis(50))
                .reclaim_every(Duration::from_millis(50)),
        )
        .unwrap();
        w.ensure_groups().await.unwrap();
        handles.push(tokio::spawn(w.run(stop.clone())));
    }
    for i in 0..10 {
        client
            .schedule(
                "order-close",
                &format!("o{i}"),
                When::in_ms(0),
                json!({"i": i}),
            )
            .await
            .unwrap();
    }
    Dispatcher::new(&client, "order-close", DispatcherOptions::default())
        .unwrap()
        .drain()
        .await
        .unwrap();
    // Each group: every order retried once, then dead-lettered, the cause named.
    wait_for("20 dead letters", WAIT, || {
        let c = client.clone();
        async move { c.admin().stats("order-close").await.unwrap().dead == 20 }
    })
    .await;
    let dead = client
        .admin()
        .dead_list("order-close", None, 100)
        .await
        .unwrap();
    assert_eq!(dead.len(), 20);
    for d in &dead {
        assert_eq!(d.attempts, 2, "{d:?}");
        assert!(d.last_error.contains("not followed"), "{}", d.last_error);
        assert!(
            d.last_error.contains("302") || d.last_error.contains("307"),
            "{}",
            d.last_error
        );
        assert!(
            !d.last_error.contains("REDIRECT-SECRET"),
            "{}",
            d.last_error
        );
    }
    assert!(
        elsewhere.bodies.lock().unwrap().is_empty(),
        "the redirect target received something"
    );
    stop.cancel();
    for h in handles {
        h.await.unwrap().unwrap();
    }
}

/// Raises this test process's own open-files limit (it holds thousands of connections).
fn raise_own_fd_limit(at_least: u64) {
    let (_, hard) = rlimit::Resource::NOFILE.get().unwrap();
    assert!(
        hard >= at_least,
        "this machine's hard open-files limit is {hard}; the test needs {at_least}"
    );
    rlimit::increase_nofile_limit(at_least).unwrap();
}

fn webhook_config(redis: &LocalRedis, hook: &str, extra: &str) -> String {
    format!(
        r#"
redis_url = "{}"
shutdown_grace = "2s"
{extra}
[http]
listen = "127.0.0.1:{{port}}"
header_timeout = "1s"
[[handlers]]
queue = "order-close"
group = "webhook"
kind = "webhook"
url = "{hook}"
max_attempts = 3
backoff = "fixed:200ms"
"#,
        redis.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_and_deliveries_go_on_under_2000_idle_connections() {
    raise_own_fd_limit(4096);
    let redis = LocalRedis::start().unwrap();
    let (hport, ok, _) = receiver().await;
    // The service starts with a soft limit of 1,024 open files (as many distributions give
    // a service) and raises it to the hard limit itself.
    let mut serve = Serve::start(
        &webhook_config(&redis, &format!("http://127.0.0.1:{hport}/ok"), ""),
        Some("ulimit -S -n 1024;"),
    );
    serve.wait_ready(WAIT).await;

    // A request head sent one byte at a time, slower than the 1 s header timeout: the
    // server closes the connection (it used to wait forever).
    let mut slow = tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
        .await
        .unwrap();
    let head = b"GET /healthz HTTP/1.1\r\nhost: x\r\n";
    let closed = tokio::time::timeout(WAIT, async {
        for b in head.iter().cycle() {
            if slow.write_all(&[*b]).await.is_err() {
                return true;
            }
            let mut buf = [0u8; 64];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(300), slow.read(&mut buf)).await
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(closed, Ok(true), "a slowloris head was kept open");

    // 2,000 idle connections held open (within the 60 s idle timeout).
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(
            tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
                .await
                .unwrap(),
        );
    }
    let http = http_client();
    let r = http
        .get(format!("{}/healthz", serve.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Deliveries go on: outbound webhook calls still get file descriptors.
    for i in 0..30 {
        let r = http
            .put(format!(
                "{}/v1/queues/order-close/messages/o{i}",
                serve.base()
            ))
            .header("content-type", "application/json")
            .body(r#"{"delay_ms": 0, "payload": {"n": 1}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    wait_for("30 webhook deliveries", WAIT, || {
        let n = ok.bodies.lock().unwrap().len();
        async move { n >= 30 }
    })
    .await;
    let stats: Value = http
        .get(format!("{}/v1/queues/order-close/stats", serve.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap();
    assert_eq!(stats["queues"][0]["dead"], 0, "{stats}");
    drop(idle);
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_half_sent_request_exits_within_the_grace() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(&webhook_config(&redis, "http://127.0.0.1:9/ok", ""), None);
    serve.wait_ready(WAIT).await;
    // Headers but never the body, and a head never finished; then SIGTERM.
    let mut no_body = tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
        .await
        .unwrap();
    no_body
        .write_all(b"PUT /v1/queues/order-close/messages/x HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"de")
        .await
        .unwrap();
    let mut half_head = tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
        .await
        .unwrap();
    half_head
        .write_all(b"GET /healthz HTTP/1.1\r\nho")
        .await
        .unwrap();
    serve.sigterm();
    // shutdown_grace is 2 s.
    let code = serve.wait_exit(Duration::from_secs(2 + 3)).await;
    assert_eq!(code, Some(0), "serve did not exit within the grace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_arrive_byte_for_byte_at_the_webhook_in_get_and_through_the_cli() {
    let redis = LocalRedis::start().unwrap();
    let (hport, ok, _) = receiver().await;
    let mut serve = Serve::start(
        &webhook_config(&redis, &format!("http://127.0.0.1:{hport}/ok"), ""),
        None,
    );
    serve.wait_ready(WAIT).await;
    let payload = r#"{"n":123456789012345678901234567890,"u":18446744073709551616,"d":0.1000000000000000055511151231257827,"s":"é\u00e9"}"#;
    let http = http_client();
    let put = |id: &str, delay: i64| {
        http.put(format!(
            "{}/v1/queues/order-close/messages/{id}",
            serve.base()
        ))
        .header("content-type", "application/json")
        .body(format!(r#"{{"delay_ms": {delay}, "payload": {payload}}}"#))
        .send()
    };
    assert_eq!(put("later", 3_600_000).await.unwrap().status(), 201);
    // GET of a scheduled order: the payload text exactly as sent.
    let text = get_text(
        &http,
        format!("{}/v1/queues/order-close/messages/later", serve.base()),
    )
    .await;
    assert!(text.contains(&format!(r#""payload":{payload}"#)), "{text}");
    // The webhook receives it byte for byte.
    assert_eq!(put("now", 0).await.unwrap().status(), 201);
    wait_for("the webhook call", WAIT, || {
        let n = ok.bodies.lock().unwrap().len();
        async move { n >= 1 }
    })
    .await;
    let body = String::from_utf8(ok.bodies.lock().unwrap()[0].clone()).unwrap();
    assert!(body.contains(&format!(r#""payload":{payload}"#)), "{body}");
    // The command line too.
    let o = std::process::Command::new(BIN)
        .args([
            "--redis-url",
            &redis.url(),
            "schedule",
            "order-close",
            "cli",
            "--in",
            "1h",
            "--payload",
            payload,
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = std::process::Command::new(BIN)
        .args(["--redis-url", &redis.url(), "get", "order-close", "cli"])
        .output()
        .unwrap();
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains(&format!(r#""payload":{payload}"#)), "{out}");
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// `GET/PUT/...` through the in-process router: status and the JSON body.
async fn call(
    r: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<String>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, Body::from))
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("not JSON ({status}): {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

#[tokio::test]
async fn deep_payloads_are_refused_alike_on_every_surface() {
    let (redis, client) = support::start().await;
    let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    let r = app(AppState::new(client.clone(), vec![]));
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/q/messages/deep",
        Some(format!(r#"{{"delay_ms": 0, "payload": {deep}}}"#)),
    )
    .await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (StatusCode::BAD_REQUEST, json!("invalid_payload")),
        "{v}"
    );
    let o = std::process::Command::new(BIN)
        .args([
            "--redis-url",
            &redis.url(),
            "schedule",
            "q",
            "deep",
            "--in",
            "1s",
            "--payload",
            &deep,
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("nested"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let e = client
        .schedule(
            "q",
            "deep",
            When::in_ms(0),
            delayq::Payload::from_json(&deep).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("nested"), "{e}");
    assert!(client.get("q", "deep").await.unwrap().is_none());
}

#[tokio::test]
async fn framework_rejections_and_limits_answer_in_the_envelope() {
    let (_redis, client) = support::start().await;
    let r = app(AppState::new(client.clone(), vec![]));
    let long = format!("/v1/queues/q/messages/{}", "x".repeat(9000));
    let many: Vec<(String, String)> = (0..150).map(|i| (format!("x-h{i}"), "v".into())).collect();
    for (method, uri, status, code) in [
        (
            "PATCH",
            "/v1/queues/q/messages/o",
            405,
            "method_not_allowed",
        ),
        ("GET", long.as_str(), 414, "uri_too_long"),
        (
            "GET",
            "/v1/queues/q/messages/%FF%FE",
            400,
            "invalid_request",
        ),
        ("GET", "/nowhere", 404, "not_found"),
    ] {
        let (st, v) = call(&r, method, uri, None).await;
        assert_eq!(
            (st.as_u16(), v["error"]["code"].as_str()),
            (status, Some(code)),
            "{method} {uri}: {v}"
        );
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let mut req = Request::builder().uri("/healthz");
    for (k, v) in &many {
        req = req.header(k.as_str(), v.as_str());
    }
    let resp = r
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 431);
    let v: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["code"], "headers_too_large");
    // A bad field of a batch item is named by its index, not a line and column.
    let (st, v) = call(
        &r,
        "POST",
        "/v1/queues/q/messages:batch",
        Some(
            r#"{"messages": [{"id": "a", "delay_ms": 0}, {"id": "b", "delay_ms": "soon"}]}"#.into(),
        ),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.starts_with("message 1:"), "{m}");
    assert!(!m.contains("line"), "{m}");
    assert_eq!(support::data_keys(&client).await, 0);
}

#[tokio::test]
async fn a_batch_under_maxmemory_writes_all_or_reports_each_order() {
    let server =
        LocalRedis::start_with(&["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"])
            .unwrap();
    let client = Client::connect(&server.url()).await.unwrap();
    support::declare_queues(&client).await;
    let r = app(AppState::new(client.clone(), vec![])
        .with_limits(delayq::service::http::HttpLimits::default().max_body_bytes(16 << 20)));
    let pad = "x".repeat(400);
    let messages: Vec<Value> = (0..10_000)
        .map(|i| json!({"id": format!("m{i}"), "delay_ms": 3_600_000, "payload": {"pad": pad}}))
        .collect();
    let body = json!({ "messages": messages }).to_string();
    let (st, v) = call(&r, "POST", "/v1/queues/q/messages:batch", Some(body)).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    let scheduled: u64 = support::raw(&client, &["ZCARD", "{dq:q:0}:due"]).await;
    match v["error"]["code"].as_str() {
        // Nothing went through: nothing was written.
        Some("redis_oom") => assert_eq!(scheduled, 0),
        // Part went through: each order's fate, and it matches Redis.
        Some("partial_write") => {
            let results = v["results"].as_array().unwrap();
            assert_eq!(results.len(), 10_000);
            let mut written = 0;
            for (i, item) in results.iter().enumerate() {
                assert_eq!(item["id"], format!("m{i}"));
                let score: Option<f64> =
                    support::raw(&client, &["ZSCORE", "{dq:q:0}:due", &format!("m{i}")]).await;
                match item["outcome"].as_str().unwrap() {
                    "created" => {
                        written += 1;
                        assert!(score.is_some(), "m{i} reported written, not in Redis");
                    }
                    "not_written" => {
                        assert!(score.is_none(), "m{i} reported not written, in Redis")
                    }
                    other => panic!("m{i}: {other}"),
                }
            }
            assert!(written > 0 && written < 10_000, "{written}");
            assert_eq!(scheduled, written);
        }
        other => panic!("unexpected {other:?}: {v}"),
    }
}

#[tokio::test]
async fn a_frozen_redis_answers_outcome_unknown_and_the_write_is_safe_to_repeat() {
    let server = LocalRedis::start().unwrap();
    let mut opts = ClientOptions::default();
    opts.response_timeout = Duration::from_millis(500);
    let client = Client::connect_with(&server.url(), opts).await.unwrap();
    support::declare_queues(&client).await;
    let r = app(AppState::new(client.clone(), vec![]));
    server.suspend().unwrap();
    let (st, v) = call(
        &r,
        "PUT",
        "/v1/queues/q/messages/o1",
        Some(r#"{"delay_ms": 0}"#.into()),
    )
    .await;
    server.resume().unwrap();
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("outcome_unknown")),
        "{v}"
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("safe"),
        "{v}"
    );
    // Repeating it is safe: it ends scheduled once.
    wait_for("the repeat to go through", WAIT, || {
        let r = r.clone();
        async move {
            let (st, _) = call(
                &r,
                "PUT",
                "/v1/queues/q/messages/o1",
                Some(r#"{"delay_ms": 0}"#.into()),
            )
            .await;
            st.is_success()
        }
    })
    .await;
    let n: u64 = support::raw(&client, &["ZCARD", "{dq:q:0}:due"]).await;
    assert_eq!(n, 1);
}

/// A serve with one `order-close` handler on `database_url`.
fn order_close_config(redis: &LocalRedis, database_url: &str) -> String {
    format!(
        r#"
redis_url = "{}"
[http]
listen = "127.0.0.1:{{port}}"
[[handlers]]
queue = "order-close"
group = "close"
kind = "order-close"
database_url = "{database_url}"
"#,
        redis.url()
    )
}

#[tokio::test]
async fn a_refused_database_login_exits_3_at_start_up() {
    let redis = LocalRedis::start().unwrap();
    let pg = std::env::var("DELAYQ_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    // A role that does not exist, with a password that must never be printed.
    let rest = pg
        .split_once('@')
        .map_or("127.0.0.1:5432/postgres", |(_, r)| r);
    let url = format!("postgres://no_such_role_delayq:DBPASSWORD@{rest}");
    let mut serve = Serve::start(&order_close_config(&redis, &url), None);
    assert_eq!(serve.wait_exit(WAIT).await, Some(3), "{}", serve.log());
    let log = serve.log();
    assert!(log.contains("database"), "{log}");
    assert!(!log.contains("DBPASSWORD"), "{log}");

    // A database that does not exist: waiting will not create it, so exit 3 at once too.
    let (base, _) = pg.rsplit_once('/').unwrap_or((pg.as_str(), ""));
    let missing = format!("{base}/no_such_database_delayq");
    let mut serve = Serve::start(&order_close_config(&redis, &missing), None);
    assert_eq!(serve.wait_exit(WAIT).await, Some(3), "{}", serve.log());
    assert!(serve.log().contains("no such database"), "{}", serve.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_token_never_reaches_logs_or_dead_letters() {
    let redis = LocalRedis::start().unwrap();
    let closed = free_port(); // nobody listens: connection refused
    let mut serve = Serve::start(
        &webhook_config(
            &redis,
            &format!("http://user:URLPASSWORD@127.0.0.1:{closed}/hook?token=TOPSECRET"),
            "",
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let http = http_client();
    let base = serve.base();
    let r = http
        .put(format!("{base}/v1/queues/order-close/messages/o1"))
        .header("content-type", "application/json")
        .body(r#"{"delay_ms": 0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    wait_for("a dead letter", WAIT, || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let body = get_text(&http, format!("{base}/v1/queues/order-close/dead")).await;
            let v: Value = serde_json::from_str(&body).unwrap();
            v["dead_letters"].as_array().is_some_and(|d| !d.is_empty())
        }
    })
    .await;
    let dead = get_text(&http, format!("{base}/v1/queues/order-close/dead")).await;
    assert!(dead.contains("connection refused"), "{dead}");
    let history = get_text(&http, format!("{base}/v1/queues/order-close/messages/o1")).await;
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
    let log = serve.log();
    assert!(log.contains("dead-lettered"), "{log}");
    for text in [&dead, &history, &log] {
        assert!(
            !text.contains("TOPSECRET") && !text.contains("URLPASSWORD"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn other_delayq_variables_in_the_environment_are_not_config_keys() {
    // The CLI's DELAYQ_DATABASE_URL and unrelated DELAYQ_* variables leave serve alone;
    // nested overrides of its own keys still apply.
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start_with_env(
        &format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n",
            redis.url()
        ),
        None,
        &[
            ("DELAYQ_DATABASE_URL", "postgres://someone@db/shop"),
            ("DELAYQ_SOMETHING_ELSE", "1"),
            ("DELAYQ_HTTP__TOKENS", "[\"an-env-token-123\"]"),
        ],
    );
    serve.wait_ready(WAIT).await;
    let r = http_client()
        .get(format!("{}/v1/queues", serve.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the token from the environment applies");
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test]
async fn absurd_durations_are_refused_naming_the_key() {
    let redis = LocalRedis::start().unwrap();
    for (line, key) in [
        ("shutdown_grace = \"200000000000d\"", "shutdown_grace"),
        ("[http]\nidle_timeout = \"0s\"", "http.idle_timeout"),
    ] {
        let mut serve = Serve::start(&format!("redis_url = \"{}\"\n{line}\n", redis.url()), None);
        assert_eq!(serve.wait_exit(WAIT).await, Some(2), "{line}");
        assert!(serve.log().contains(key), "{line}: {}", serve.log());
    }
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\n[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\nbackoff = \"fixed:0s\"\n",
            redis.url()
        ),
        None,
    );
    assert_eq!(serve.wait_exit(WAIT).await, Some(2));
    assert!(
        serve.log().contains("handlers[0].backoff"),
        "{}",
        serve.log()
    );
}

/// A request through the router as a real connection from `peer` would arrive.
fn from_peer(peer: &str, req: axum::http::request::Builder, body: Body) -> Request<Body> {
    let addr: std::net::SocketAddr = format!("{peer}:40000").parse().unwrap();
    req.extension(axum::extract::ConnectInfo(addr))
        .body(body)
        .unwrap()
}

#[tokio::test]
async fn a_host_that_is_not_allowed_is_refused_before_routing() {
    let (_s, client) = support::start().await;
    // An open API (no tokens), as on a laptop: a page rebinding its own name to
    // 127.0.0.1 sends Host = Origin = its name.
    let router = app(AppState::new(client.clone(), vec![]));
    let req = Request::builder()
        .method("DELETE")
        .uri("/v1/queues/q?force=true")
        .header("host", "evil.example:7070")
        .header("origin", "http://evil.example:7070")
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::MISDIRECTED_REQUEST);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], json!("host_not_allowed"));
    assert!(
        client.admin().queue_info("q").await.unwrap().is_some(),
        "nothing deleted"
    );
    // Probes answer whatever the host; a local name is served.
    for (uri, host) in [
        ("/healthz", "10.1.2.3:7070"),
        ("/v1/queues", "localhost:7070"),
    ] {
        let req = Request::builder()
            .uri(uri)
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            router.clone().oneshot(req).await.unwrap().status(),
            200,
            "{uri}"
        );
    }
}

#[tokio::test]
async fn failed_sign_ins_lock_out_their_client_only() {
    let (_s, client) = support::start().await;
    let token = "the-right-token";
    let router = app(AppState::new(client, vec![token.to_owned()]));
    let login = |peer: &str, t: &str| {
        from_peer(
            peer,
            Request::builder()
                .method("POST")
                .uri("/ui/login")
                .header("host", "127.0.0.1:7070")
                .header("content-type", "application/json"),
            Body::from(json!({ "token": t }).to_string()),
        )
    };
    let mut statuses = Vec::new();
    for _ in 0..25 {
        let r = router
            .clone()
            .oneshot(login("10.0.0.1", "wrong-token"))
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        19,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        6,
        "{statuses:?}"
    );
    // Locked: even the right token, from that client.
    let r = router
        .clone()
        .oneshot(login("10.0.0.1", token))
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    // Another client is not affected.
    let r = router
        .clone()
        .oneshot(login("10.0.0.2", token))
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // Bearer tokens on /v1 share the limit: 300 wrong ones from one client end in 429s.
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..300 {
        let req = from_peer(
            "10.0.0.3",
            Request::builder()
                .uri("/v1/queues")
                .header("host", "127.0.0.1:7070")
                .header("authorization", "Bearer guess"),
            Body::empty(),
        );
        let r = router.clone().oneshot(req).await.unwrap();
        *codes.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    assert_eq!(codes.get(&401), Some(&19), "{codes:?}");
    assert_eq!(codes.get(&429), Some(&281), "{codes:?}");
}

#[tokio::test]
async fn a_sign_in_body_that_never_arrives_is_refused_at_the_body_deadline() {
    let (_s, client) = support::start().await;
    let limits =
        delayq::service::http::HttpLimits::default().body_timeout(Duration::from_millis(300));
    let router = app(AppState::new(client, vec!["the-right-token".into()]).with_limits(limits));
    use futures_util::StreamExt as _;
    // The head and one byte, then nothing.
    let stalled = futures_util::stream::once(async {
        Ok::<_, std::io::Error>(axum::body::Bytes::from_static(b"{"))
    })
    .chain(futures_util::stream::pending());
    let req = Request::builder()
        .method("POST")
        .uri("/ui/login")
        .header("host", "127.0.0.1:7070")
        .header("content-type", "application/json")
        .body(Body::from_stream(stalled))
        .unwrap();
    let r = tokio::time::timeout(WAIT, router.clone().oneshot(req))
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(r.status(), StatusCode::REQUEST_TIMEOUT);
    // A large body is refused early (4 KiB is plenty for a token).
    let req = Request::builder()
        .method("POST")
        .uri("/ui/login")
        .header("host", "127.0.0.1:7070")
        .body(Body::from(vec![b' '; 1 << 20]))
        .unwrap();
    assert_eq!(router.oneshot(req).await.unwrap().status(), 413);
}

#[tokio::test]
async fn an_empty_config_names_redis_url_and_ids_are_quoted_in_logs() {
    let mut serve = Serve::start("[http]\nlisten = \"127.0.0.1:{port}\"\n", None);
    assert_eq!(serve.wait_exit(WAIT).await, Some(2));
    assert!(serve.log().contains("redis_url"), "{}", serve.log());

    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    assert!(
        serve.log().contains("connected to redis"),
        "{}",
        serve.log()
    );
    let http = http_client();
    let id = "x group=wh error=none";
    let r = http
        .put(format!(
            "{}/v1/queues/q/messages/x%20group%3Dwh%20error%3Dnone",
            serve.base()
        ))
        .header("content-type", "application/json")
        .body(json!({"delay_ms": 0}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let quoted = format!("id=\"{id}\"");
    let s = &serve;
    wait_for("the delivery logged", WAIT, || {
        let log = s.log();
        let q = quoted.clone();
        async move { log.contains(&q) }
    })
    .await;
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test]
async fn a_signed_out_session_is_revoked_even_in_a_copied_cookie() {
    let (_s, client) = support::start().await;
    let router = app(AppState::new(client, vec!["the-right-token".into()]));
    let send = |req: Request<Body>| {
        let r = router.clone();
        async move { r.oneshot(req).await.unwrap() }
    };
    let resp = send(
        Request::builder()
            .method("POST")
            .uri("/ui/login")
            .header("content-type", "application/json")
            .body(Body::from(json!({"token": "the-right-token"}).to_string()))
            .unwrap(),
    )
    .await;
    assert_eq!(resp.status(), 204);
    let set = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
    let cookie = set.split(';').next().unwrap().to_owned();
    let session: Value = {
        let r = send(
            Request::builder()
                .uri("/ui/session")
                .header("cookie", &cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap()
    };
    let csrf = session["csrf"].as_str().unwrap().to_owned();
    let read = |c: String| {
        Request::builder()
            .uri("/v1/queues")
            .header("cookie", c)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(read(cookie.clone())).await.status(), 200);
    let out = send(
        Request::builder()
            .method("POST")
            .uri("/ui/logout")
            .header("cookie", &cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(out.status(), 204);
    // The copy kept from before the sign-out: refused for reads and writes.
    assert_eq!(send(read(cookie.clone())).await.status(), 401);
    let write = Request::builder()
        .method("PUT")
        .uri("/v1/queues/q/messages/x")
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .header("content-type", "application/json")
        .body(Body::from(json!({"delay_ms": 1000}).to_string()))
        .unwrap();
    assert_eq!(send(write).await.status(), 401);
}

#[tokio::test]
async fn an_unreachable_redis_is_awaited_for_startup_timeout_with_healthz_up_and_readyz_down() {
    let closed = free_port(); // nobody listens
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"redis://127.0.0.1:{closed}\"\nstartup_timeout = \"4s\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n"
        ),
        None,
    );
    serve.wait_alive(WAIT).await; // /healthz answers 200 while Redis is awaited
    let http = http_client();
    let r = http
        .get(format!("{}/readyz", serve.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap_or(Value::Null);
    assert_eq!(v["error"]["code"], json!("starting"), "{v}");
    assert_eq!(serve.wait_exit(WAIT).await, Some(3), "{}", serve.log());
    assert!(serve.log().contains("startup_timeout"), "{}", serve.log());
}

/// Over a real connection: a 60 KB request target and 400 headers reach the router and are
/// answered in the error envelope (not by the HTTP library's bare page; hyper itself refuses
/// targets over 64 KiB with a bare 414).
#[tokio::test]
async fn a_huge_target_and_too_many_headers_answer_in_the_envelope_over_the_wire() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let raw_request = |head: String| {
        let port = serve.port;
        async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
            String::from_utf8_lossy(&buf).into_owned()
        }
    };
    let long = format!(
        "GET /v1/queues/q/messages/{} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n",
        "x".repeat(100_000)
    );
    let answer = raw_request(long).await;
    assert!(
        answer.starts_with("HTTP/1.1 414"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert!(answer.contains("\"uri_too_long\""), "{answer}");
    let mut many =
        String::from("GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n");
    for i in 0..400 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let answer = raw_request(many).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(answer.contains("\"headers_too_large\""), "{answer}");
    // A head larger than the HTTP library's buffer (one 200 KB header): still the envelope.
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: {}\r\n\r\n",
        "y".repeat(200_000)
    );
    let answer = raw_request(huge).await;
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "{}",
        &answer[..answer.len().min(200)]
    );
    assert!(answer.contains("\"headers_too_large\""), "{answer}");
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// Resident memory of a process, bytes (Linux `/proc`).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// A connection whose receive window stays small (the server's writes block once it and the
/// server's send buffer are full).
async fn small_window_connection(port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .unwrap()
}

/// The value of a counter series in a `/metrics` text (0 when absent).
fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_the_client_never_drains_is_cut_at_the_write_deadline() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\nmax_payload_bytes = 9000000\nqueues = [\"big\"]\n[http]\nlisten = \"127.0.0.1:{{port}}\"\nmax_body_bytes = 10000000\nwrite_timeout = \"1s\"\nidle_timeout = \"1h\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let http = http_client();
    // Larger than the kernel's largest send buffer (4 MB here) and the client's window, so
    // the server's writes block.
    let payload = serde_json::to_string(&json!({"blob": "x".repeat(8_000_000)})).unwrap();
    let r = http
        .put(format!("{}/v1/queues/big/messages/o1", serve.base()))
        .header("content-type", "application/json")
        .body(format!(r#"{{"delay_ms": 3600000, "payload": {payload}}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());

    // Ask for the 8 MB order and take only its first bytes.
    let mut slow = small_window_connection(serve.port).await;
    slow.write_all(b"GET /v1/queues/big/messages/o1 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 64];
    let n = slow.read(&mut head).await.unwrap();
    assert!(head[..n].starts_with(b"HTTP/1.1 200"));
    // The server cuts the connection once its writes have been stuck for write_timeout
    // (the idle timeout is an hour).
    let cut = r#"delayq_http_connections_cut_total{deadline="write"}"#;
    wait_for("the write deadline to cut the connection", WAIT, || {
        let http = http.clone();
        let url = format!("{}/metrics", serve.base());
        async move { metric_value(&get_text(&http, url).await, cut) >= 1.0 }
    })
    .await;
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(WAIT, slow.read_to_end(&mut rest))
        .await
        .expect("the connection was closed");
    assert!(
        n + rest.len() < payload.len(),
        "the whole response arrived ({} bytes): the connection was not cut",
        n + rest.len()
    );
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_sign_ins_beyond_the_connection_cap_leave_healthz_answering() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\ntokens = [\"the-right-token\"]\nmax_connections = 8\nbody_timeout = \"1s\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    // Cap + 1 sign-ins whose body never arrives (the head and one byte).
    let mut stalled = Vec::new();
    for _ in 0..9 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
            .await
            .unwrap();
        s.write_all(
            b"POST /ui/login HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
        stalled.push(s);
    }
    // /healthz still answers: the stalled ones are refused at the body deadline and their
    // places freed.
    let http = http_client();
    let r = tokio::time::timeout(WAIT, http.get(format!("{}/healthz", serve.base())).send())
        .await
        .expect("/healthz answered")
        .unwrap();
    assert_eq!(r.status(), 200);
    for mut s in stalled {
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
        let text = String::from_utf8_lossy(&buf);
        assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        assert!(text.contains("\"body_timeout\""), "{text}");
    }
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_bodies_of_a_megabyte_are_refused_early_and_memory_stays_flat() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\ntokens = [\"the-right-token\"]\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let pid = serve.child.id();
    let before = rss_bytes(pid);
    let body = Arc::new(vec![b' '; 1 << 20]);
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let body = body.clone();
        let port = serve.port;
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let head = format!(
                "POST /ui/login HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            // The server may answer and close before taking the whole body.
            let _ = s.write_all(&body).await;
            let mut buf = Vec::new();
            let _ = tokio::time::timeout(WAIT, s.read_to_end(&mut buf)).await;
            String::from_utf8_lossy(&buf).into_owned()
        }));
    }
    let mut refused = 0;
    for t in tasks {
        let answer = t.await.unwrap();
        if answer.starts_with("HTTP/1.1 413") {
            refused += 1;
        }
    }
    let after = rss_bytes(pid);
    let grown = after.saturating_sub(before);
    println!(
        "200 sign-ins of 1 MB: {refused} answered 413; resident memory {} -> {} MB (+{:.1} MB)",
        before >> 20,
        after >> 20,
        grown as f64 / 1048576.0
    );
    assert_eq!(refused, 200, "every 1 MB sign-in is refused with 413");
    assert!(
        grown < 20 << 20,
        "memory grew by {grown} bytes for 200 refused sign-ins"
    );
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// p50 and p99 of `n` sequential `PUT`s, ms.
async fn put_latencies(http: &reqwest::Client, base: &str, tag: &str, n: usize) -> (f64, f64) {
    let mut ms = Vec::with_capacity(n);
    for i in 0..n {
        let t = std::time::Instant::now();
        let r = http
            .put(format!("{base}/v1/queues/q-0000/messages/{tag}{i}"))
            .header("content-type", "application/json")
            .body(r#"{"delay_ms": 3600000, "payload": {"n": 1}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    (ms[n / 2], ms[(n * 99 / 100).min(n - 1)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_clients_that_never_read_do_not_pin_memory_on_5000_queues() {
    raise_own_fd_limit(2048);
    let redis = LocalRedis::start().unwrap();
    let client = Client::connect_with(&redis.url(), ClientOptions::default().max_queues(6000))
        .await
        .unwrap();
    for i in 0..5000 {
        client
            .admin()
            .create_queue(&format!("q-{i:04}"), 1)
            .await
            .unwrap();
    }
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\nmax_queues = 6000\ndispatch = \"none\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let http = http_client();
    let base = serve.base();
    let read = std::time::Instant::now();
    let text = get_text(&http, format!("{base}/metrics")).await;
    let first_render = read.elapsed();
    assert!(
        text.len() > 500_000,
        "metrics of 5,000 queues: {} bytes",
        text.len()
    );
    let stats: Value =
        serde_json::from_str(&get_text(&http, format!("{base}/v1/stats")).await).unwrap();
    assert_eq!(stats["summary"]["queues"], 5000);
    assert_eq!(stats["queues"].as_array().unwrap().len(), 200, "one page");
    let idle = put_latencies(&http, &base, "idle-", 300).await;

    // 300 clients ask for /metrics and never read past its first bytes.
    let pid = serve.child.id();
    let before = rss_bytes(pid);
    let mut hold = Vec::new();
    for _ in 0..300 {
        let mut s = small_window_connection(serve.port).await;
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0u8; 32];
        let n = s.read(&mut first).await.unwrap();
        assert!(first[..n].starts_with(b"HTTP/1.1 200"));
        hold.push(s);
    }
    let after = rss_bytes(pid);
    let grown = after.saturating_sub(before);

    // Three scrapers reading /metrics in a loop while PUTs are timed.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut scrapers = Vec::new();
    for _ in 0..3 {
        let (http, url, stop) = (http.clone(), format!("{base}/metrics"), stop.clone());
        scrapers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                assert!(get_text(&http, url.clone()).await.len() > 500_000);
                n += 1;
            }
            n
        }));
    }
    let scraped = put_latencies(&http, &base, "scraped-", 300).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut scrapes = 0;
    for s in scrapers {
        scrapes += s.await.unwrap();
    }
    println!(
        "5,000 queues, /metrics {} KB (first render {:?}): 300 never-reading clients: resident memory {} -> {} MB (+{:.1} MB); \
         PUT p50/p99 idle {:.2}/{:.2} ms, under 3 scrapers ({scrapes} scrapes) {:.2}/{:.2} ms",
        text.len() / 1024,
        first_render,
        before >> 20,
        after >> 20,
        grown as f64 / 1048576.0,
        idle.0,
        idle.1,
        scraped.0,
        scraped.1
    );
    assert!(
        grown < 50 << 20,
        "300 never-reading /metrics clients grew memory by {grown} bytes"
    );
    drop(hold);
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test]
async fn an_open_api_issues_and_trusts_no_session_cookie() {
    let (_s, client) = support::start().await;
    let router = app(AppState::new(client.clone(), Vec::new()));
    let login = Request::builder()
        .method("POST")
        .uri("/ui/login")
        .header("host", "127.0.0.1:7070")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"token": "anything"}"#))
        .unwrap();
    let r = router.clone().oneshot(login).await.unwrap();
    assert_eq!(r.status(), 204);
    assert!(
        r.headers().get("set-cookie").is_none(),
        "no cookie on an open API"
    );
    // A cookie signed with the open API's key is not a session either.
    let signed = delayq::service::ui::session::Sessions::new(&[]).issue(client.now_ms());
    let info = Request::builder()
        .uri("/ui/session")
        .header("host", "127.0.0.1:7070")
        .header("cookie", format!("delayq_session={signed}"))
        .body(Body::empty())
        .unwrap();
    let r = router.oneshot(info).await.unwrap();
    let body: Value =
        serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["open"], true);
    assert_eq!(body["signed_in"], false, "{body}");
    assert_eq!(body["csrf"], Value::Null, "{body}");
}

/// A client whose connections come from `source` (any 127.x.y.z is loopback).
fn client_from(source: std::net::IpAddr) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .local_address(source)
        .build()
        .unwrap()
}

/// One failed authentication of each kind in turn (a bearer token on `/v1`, a sign-in, the
/// metrics token), from `http`; the status.
async fn fail_once(http: &reqwest::Client, base: &str, i: usize) -> u16 {
    let r = match i % 3 {
        0 => http
            .get(format!("{base}/v1/queues"))
            .bearer_auth("a-wrong-token")
            .send(),
        1 => http
            .post(format!("{base}/ui/login"))
            .header("content-type", "application/json")
            .body(json!({"token": "a-wrong-token"}).to_string())
            .send(),
        _ => http
            .get(format!("{base}/metrics"))
            .bearer_auth("a-wrong-token")
            .send(),
    };
    r.await.unwrap().status().as_u16()
}

/// The worst case of strangers: 100 source addresses with 20 wrong tokens each (2,000
/// failures in well under a minute, the whole global ceiling) never keep the right token from
/// a fresh address out of `/v1`, the sign-in or `/metrics`; the offenders themselves stay
/// refused, and the rule is exact: a client's 20th failure is its first 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_failing_from_100_addresses_never_lock_out_a_valid_token() {
    let redis = LocalRedis::start().unwrap();
    let (token, metrics_token) = ("the-right-token-0123456789", "the-metrics-token-0123456789");
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\ntokens = [\"{token}\"]\nmetrics_token = \"{metrics_token}\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let base = serve.base();
    let mut tasks = tokio::task::JoinSet::new();
    for a in 2..102u8 {
        let base = base.clone();
        tasks.spawn(async move {
            let http = client_from(std::net::IpAddr::from([127, 0, 0, a]));
            let mut statuses = Vec::new();
            for i in 0..20 {
                statuses.push(fail_once(&http, &base, i + usize::from(a)).await);
            }
            statuses
        });
    }
    let mut all = Vec::new();
    while let Some(s) = tasks.join_next().await {
        all.push(s.unwrap());
    }
    assert_eq!(all.len(), 100);
    for statuses in &all {
        // The rule of the docs: 19 answered 401, the 20th is 429 (or 429 earlier, once the
        // 2,000 failures of everyone together are reached).
        assert_eq!(statuses[19], 429, "{statuses:?}");
        let first = statuses.iter().position(|s| *s == 429).unwrap();
        assert!(
            statuses[..first].iter().all(|s| *s == 401)
                && statuses[first..].iter().all(|s| *s == 429),
            "{statuses:?}"
        );
    }
    // The right token from a fresh address works everywhere.
    let fresh = client_from(std::net::IpAddr::from([127, 0, 0, 200]));
    let r = fresh
        .get(format!("{base}/v1/queues"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = fresh
        .post(format!("{base}/ui/login"))
        .header("content-type", "application/json")
        .body(json!({ "token": token }).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
    let r = fresh
        .get(format!("{base}/metrics"))
        .bearer_auth(metrics_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // An offender stays refused, even with the right token.
    let offender = client_from(std::net::IpAddr::from([127, 0, 0, 2]));
    let r = offender
        .get(format!("{base}/v1/queues"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// SIGTERM with a stalled sign-in (its head and part of its body sent, then nothing) and a
/// stalled upload on `/v1`: both are closed at once, and serve exits long before its
/// shutdown_grace (ten minutes here) would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_stalled_bodies_exits_at_once_not_at_the_grace() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\nshutdown_grace = \"10m\"\nqueues = [\"q\"]\n[http]\nlisten = \"127.0.0.1:{{port}}\"\ntokens = [\"the-right-token-0123456789\"]\nbody_timeout = \"1h\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let login = stalled_body(
        serve.port,
        "POST /ui/login HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 40\r\n",
        "{\"tok",
    )
    .await;
    let upload = stalled_body(
        serve.port,
        "PUT /v1/queues/q/messages/x HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer the-right-token-0123456789\r\ncontent-type: application/json\r\ncontent-length: 100\r\n",
        "{\"de",
    )
    .await;
    serve.sigterm();
    // Well within the grace: WAIT is 30 s, the grace 10 minutes.
    assert_eq!(
        serve.wait_exit(WAIT).await,
        Some(0),
        "serve did not exit: it waits for the stalled bodies"
    );
    drop((login, upload));
}

/// A request whose handler is reading its body, which stalls: its head (asking for `100
/// Continue`) is sent, the `100 Continue` the server sends once the handler reads the body
/// is awaited, then `part` of the body is sent and nothing more.
async fn stalled_body(port: u16, head: &str, part: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("{head}expect: 100-continue\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !got.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .expect("100 Continue")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    s.write_all(part.as_bytes()).await.unwrap();
    s
}

/// A client asks for a response that fits in the kernel's buffers (1 MB: the server's
/// writes all succeed at once) and never reads: it is cut at write_timeout, not at
/// idle_timeout (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_response_the_client_never_reads_is_cut_at_the_write_deadline() {
    let redis = LocalRedis::start().unwrap();
    let mut serve = Serve::start(
        &format!(
            "redis_url = \"{}\"\nmax_payload_bytes = 2000000\nqueues = [\"big\"]\n[http]\nlisten = \"127.0.0.1:{{port}}\"\nmax_body_bytes = 3000000\nwrite_timeout = \"1s\"\nidle_timeout = \"1h\"\n",
            redis.url()
        ),
        None,
    );
    serve.wait_ready(WAIT).await;
    let http = http_client();
    let payload = serde_json::to_string(&json!({"blob": "x".repeat(1_000_000)})).unwrap();
    let r = http
        .put(format!("{}/v1/queues/big/messages/o1", serve.base()))
        .header("content-type", "application/json")
        .body(format!(r#"{{"delay_ms": 3600000, "payload": {payload}}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    // A plain connection (default buffers) that asks and never reads.
    let mut never = tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
        .await
        .unwrap();
    never
        .write_all(b"GET /v1/queues/big/messages/o1 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let cut = r#"delayq_http_connections_cut_total{deadline="write"}"#;
    wait_for("the write deadline to cut the connection", WAIT, || {
        let http = http.clone();
        let url = format!("{}/metrics", serve.base());
        async move { metric_value(&get_text(&http, url).await, cut) >= 1.0 }
    })
    .await;
    // The client finds its connection ended (reset or closed) before the whole response.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 65536];
    loop {
        match tokio::time::timeout(WAIT, never.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the connection was not closed"),
        }
    }
    assert!(
        got.len() < payload.len(),
        "the whole response arrived ({} bytes): the connection was not cut",
        got.len()
    );
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// With Redis frozen (SIGSTOP), a signed-out cookie is never taken for a session: the
/// dashboard's session answer is 503 (no CSRF token), and `/v1` refuses it with 503 (not
/// counted as a failed authentication). Once Redis answers again it is signed out.
#[tokio::test]
async fn a_frozen_redis_never_turns_a_revoked_cookie_into_a_session() {
    let server = LocalRedis::start().unwrap();
    let mut opts = ClientOptions::default();
    opts.response_timeout = Duration::from_millis(500);
    let client = Client::connect_with(&server.url(), opts).await.unwrap();
    let router = app(AppState::new(client, vec!["the-right-token".into()]));
    let send = |req: Request<Body>| {
        let r = router.clone();
        async move {
            let resp = r.oneshot(req).await.unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
            )
        }
    };
    let resp = router
        .clone()
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/ui/login")
                .header("content-type", "application/json")
                .body(Body::from(json!({"token": "the-right-token"}).to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let set = resp.headers()["set-cookie"].to_str().unwrap().to_owned();
    let cookie = set.split(';').next().unwrap().to_owned();
    let session = |c: &str| {
        Request::builder()
            .uri("/ui/session")
            .header("cookie", c)
            .body(Body::empty())
            .unwrap()
    };
    let read = |c: &str| {
        Request::builder()
            .uri("/v1/queues")
            .header("cookie", c)
            .body(Body::empty())
            .unwrap()
    };
    let (st, v) = send(session(&cookie)).await;
    assert_eq!((st, v["signed_in"].as_bool()), (StatusCode::OK, Some(true)));
    let (st, _) = send(
        Request::builder()
            .method("POST")
            .uri("/ui/logout")
            .header("cookie", &cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, 204);
    server.suspend().unwrap();
    let frozen_session = send(session(&cookie)).await;
    let frozen_read = send(read(&cookie)).await;
    server.resume().unwrap();
    let (st, v) = frozen_session;
    assert_ne!(v["signed_in"], json!(true), "{v}");
    assert!(v["csrf"].is_null(), "no CSRF token for it: {v}");
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("redis_unavailable")),
        "{v}"
    );
    let (st, v) = frozen_read;
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("redis_unavailable")),
        "{v}"
    );
    // Redis back: signed out, as it was.
    wait_for("redis to answer again", WAIT, || {
        let req = session(&cookie);
        async move {
            let (st, v) = send(req).await;
            st == StatusCode::OK && v["signed_in"] == json!(false) && v["csrf"].is_null()
        }
    })
    .await;
    assert_eq!(send(read(&cookie)).await.0, 401);
}
