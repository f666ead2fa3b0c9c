//! `delayq serve` as a real process: schedule over HTTP, receive signed webhooks on a local
//! test server, a retry after a 500, cancel before due and receive nothing, SIGTERM stops it
//! cleanly; config errors exit 2 naming the key.
#![allow(clippy::unwrap_used)]

use crate::support;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use delayq::service::handlers::Webhook;
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::wait_for;

const BIN: &str = env!("CARGO_BIN_EXE_delayq");
const TOKEN: &str = "serve-test-token";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One webhook call: its headers and body.
type Call = (HeaderMap, Vec<u8>);

#[derive(Clone, Default)]
struct Received {
    calls: Arc<Mutex<Vec<Call>>>,
}

async fn receive(
    State(r): State<Received>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut calls = r.calls.lock().unwrap();
    calls.push((headers, body.to_vec()));
    // The flaky partner fails the first attempt.
    if v["id"] == "flaky" && v["attempt"] == 1 {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

use support::serve::free_port;

#[tokio::test]
async fn serve_end_to_end_with_webhooks() {
    let redis = delayq::LocalRedis::start().unwrap();
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_port = listener.local_addr().unwrap().port();
    let app = axum::Router::new()
        .route("/orders/close", post(receive))
        .with_state(received.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let api_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("delayq.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
redis_url = "{}"
namespace = "dq"
[http]
listen = "127.0.0.1:{api_port}"
tokens = ["{TOKEN}"]
[[handlers]]
queue = "order-close"
group = "close-order"
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/orders/close"
secret = "{SECRET}"
concurrency = 4
timeout = "5s"
max_attempts = 5
backoff = "fixed:200ms"
visibility_timeout = "5s"
[[handlers]]
queue = "order-close"
group = "audit"
kind = "log"
"#,
            redis.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap())
        .spawn()
        .unwrap();

    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{api_port}");
    wait_for("serve to answer /readyz", Duration::from_secs(60), || {
        let (http, base) = (http.clone(), base.clone());
        async move {
            matches!(http.get(format!("{base}/readyz")).send().await, Ok(r) if r.status() == 200)
        }
    })
    .await;
    let put = |id: &str, body: Value| {
        http.put(format!("{base}/v1/queues/order-close/messages/{id}"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let r = put(
        "o1",
        json!({"delay_ms": 100, "payload": {"order": "o1", "amount_cents": 1999}}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(
        put("flaky", json!({"delay_ms": 100}))
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(
        put("paid", json!({"delay_ms": 1500}))
            .await
            .unwrap()
            .status(),
        201
    );
    let r = http
        .delete(format!("{base}/v1/queues/order-close/messages/paid"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Due after "paid" would have been: once it arrives, "paid" would have too.
    assert_eq!(
        put("sentinel", json!({"delay_ms": 2000}))
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(
        put("o2", json!({"delay_ms": 100})).await.unwrap().status(),
        201
    );

    let rc = received.clone();
    wait_for(
        "o1, o2, flaky twice and the sentinel",
        Duration::from_secs(60),
        move || {
            let ids: Vec<String> = rc
                .calls
                .lock()
                .unwrap()
                .iter()
                .map(|(_, b)| {
                    serde_json::from_slice::<Value>(b).unwrap()["id"]
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect();
            let done = ids.iter().filter(|i| *i == "flaky").count() == 2
                && ids.contains(&"sentinel".to_string());
            async move { done }
        },
    )
    .await;

    let calls = received.calls.lock().unwrap().clone();
    let bodies: Vec<Value> = calls
        .iter()
        .map(|(_, b)| serde_json::from_slice(b).unwrap())
        .collect();
    assert!(
        !bodies.iter().any(|b| b["id"] == "paid"),
        "a cancelled order was delivered"
    );
    for (headers, raw) in &calls {
        let h = |k: &str| headers[k].to_str().unwrap().to_owned();
        assert!(
            Webhook::verify(
                SECRET,
                &h("webhook-id"),
                &h("webhook-timestamp"),
                &h("webhook-signature"),
                raw
            ),
            "bad signature"
        );
        assert!(!Webhook::verify(
            "whsec_AAAAAAAAAAAAAAAAAAAAAAAA",
            &h("webhook-id"),
            &h("webhook-timestamp"),
            &h("webhook-signature"),
            raw
        ));
        assert_eq!(h("webhook-id"), h("idempotency-key"));
        let ts: i64 = h("webhook-timestamp").parse().unwrap();
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!(
            (ts - now_s).abs() < 300,
            "timestamp {ts} far from now {now_s}"
        );
        let b: Value = serde_json::from_slice(raw).unwrap();
        for k in ["queue", "id", "group", "due_at_ms", "payload", "attempt"] {
            assert!(b.get(k).is_some(), "{k} missing: {b}");
        }
        assert_eq!(
            (b["queue"].clone(), b["group"].clone()),
            (json!("order-close"), json!("close-order"))
        );
        assert_eq!(
            headers["x-delayq-attempt"].to_str().unwrap(),
            b["attempt"].to_string()
        );
        assert_eq!(headers["idempotency-key"].to_str().unwrap().len(), 64);
    }
    let o1 = bodies.iter().find(|b| b["id"] == "o1").unwrap();
    assert_eq!(
        o1["payload"],
        json!({"order": "o1", "amount_cents": 1999}),
        "payload is JSON, not a string"
    );
    let flaky: Vec<&Call> = calls
        .iter()
        .filter(|(_, b)| serde_json::from_slice::<Value>(b).unwrap()["id"] == "flaky")
        .collect();
    let attempts: Vec<String> = flaky
        .iter()
        .map(|(h, _)| h["x-delayq-attempt"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(attempts, vec!["1", "2"], "retried after the 500");
    assert_eq!(
        flaky[0].0["idempotency-key"], flaky[1].0["idempotency-key"],
        "stable across attempts"
    );

    // SIGTERM: a clean, graceful exit.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "exit status {status}: {}",
        std::fs::read_to_string(dir.path().join("serve.log")).unwrap()
    );
}

#[tokio::test]
async fn config_errors_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("namespace = \"dq\"\nnamespaec = \"x\"\n", "namespaec"),
        ("[http]\nlisten = \"nowhere\"\n", "http.listen"),
        (
            "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"webhook\"\n",
            "handlers[0].url",
        ),
        (
            "[[handlers]]\nqueue = \"q\"\ngroup = \"g\"\nkind = \"log\"\nbackoff = \"sometimes\"\n",
            "handlers[0].backoff",
        ),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{i}.toml"));
        // redis_url is required; each case breaks one other key (nothing is connected to).
        std::fs::write(&p, format!("redis_url = \"redis://127.0.0.1:1\"\n{text}")).unwrap();
        let o = Command::new(BIN)
            .args(["serve", "--config", p.to_str().unwrap()])
            .env_remove("DELAYQ_REDIS_URL")
            .env_remove("DELAYQ_NAMESPACE")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{key}: {stderr}");
        assert!(stderr.contains(key), "{key}: {stderr}");
    }
    let o = Command::new(BIN)
        .args(["serve", "--config", "/nonexistent/delayq.toml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot read"));
}

/// The library's option types in the file (`[dispatcher]`, `[housekeeping]`, `[dead]`,
/// and beside other keys the top level's client keys, `[http]`'s limits, `[reconciliation]`,
/// a handler's worker keys) take `DELAYQ_<KEY>` overrides like every other key, checked by
/// the library and named by their key.
#[tokio::test]
async fn option_tables_take_environment_overrides_checked_under_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(
        &p,
        "redis_url = \"redis://127.0.0.1:1\"\n[dispatcher]\nbatch = 10\n",
    )
    .unwrap();
    for (var, value, key) in [
        ("DELAYQ_DISPATCHER__MAX_CALL", "2s", "dispatcher.max_call"),
        ("DELAYQ_DISPATCHER__BATCH", "0", "dispatcher.batch"),
        (
            "DELAYQ_HOUSEKEEPING__SWEEP_CRON",
            "* *",
            "housekeeping.sweep_cron",
        ),
        ("DELAYQ_DEAD__RETENTION", "soon", "dead.retention"),
        ("DELAYQ_SHARDS", "0", "shards"),
        ("DELAYQ_DURABILITY", "always", "durability"),
        ("DELAYQ_HTTP__MAX_BODY_BYTES", "0", "http.max_body_bytes"),
        (
            "DELAYQ_HTTP__TRUSTED_PROXIES",
            "[\"x\"]",
            "http.trusted_proxies[0]",
        ),
        (
            "DELAYQ_RECONCILIATION__GRACE",
            "soon",
            "reconciliation.grace",
        ),
        (
            "DELAYQ_HANDLERS",
            "[{queue=\"q\",group=\"g\",kind=\"log\",timeout=\"x\"}]",
            "handlers[0].timeout",
        ),
        (
            "DELAYQ_HANDLERS",
            "[{queue=\"q\",group=\"g\",kind=\"pull\",concurrency=16}]",
            "handlers[0].concurrency",
        ),
    ] {
        let o = Command::new(BIN)
            .args(["serve", "--config", p.to_str().unwrap()])
            .env_remove("DELAYQ_REDIS_URL")
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{var}: {stderr}");
        assert!(stderr.contains(key), "{var}: {stderr}");
    }
}

#[tokio::test]
async fn serve_closes_orders_in_the_database_and_reconciles_lost_events() {
    let redis = delayq::LocalRedis::start().unwrap();
    let t = support::db::TestDb::sqlite();
    let orders = delayq::Orders::new(t.migrated().await);
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    client.admin().create_queue("order-close", 1).await.unwrap();
    let now = client.now_ms();
    // due: an unpaid order whose close event is scheduled; paid: paid, but its cancel was
    // lost; orphan: committed, expired, and its event never scheduled.
    orders.create("due", 100, now, now + 300).await.unwrap();
    orders.create("paid", 100, now, now + 300).await.unwrap();
    orders
        .create("orphan", 100, now - 60_000, now - 5_000)
        .await
        .unwrap();
    assert_eq!(
        orders.pay("paid", now).await.unwrap(),
        delayq::PayOutcome::Paid
    );
    for id in ["due", "paid"] {
        client
            .schedule("order-close", id, delayq::When::AtMs(now + 300), json!({}))
            .await
            .unwrap();
    }

    let api_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("delayq.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
redis_url = "{}"
[http]
listen = "127.0.0.1:{api_port}"
[[handlers]]
queue = "order-close"
group = "close-order"
kind = "order-close"
database_url = "{}"
backoff = "fixed:200ms"
[reconciliation]
cron = "* * * * * *"
grace = "1s"
"#,
            redis.url(),
            t.url
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let o = orders.clone();
    wait_for(
        "due and orphan closed in the database",
        Duration::from_secs(60),
        move || {
            let o = o.clone();
            async move { o.counts().await.unwrap().closed == 2 }
        },
    )
    .await;
    let reason = |id: &'static str| {
        let o = orders.clone();
        async move { o.get(id).await.unwrap().unwrap().close_reason }
    };
    assert_eq!(reason("due").await.as_deref(), Some("expired"));
    assert_eq!(reason("orphan").await.as_deref(), Some("reconciled"));
    let paid = orders.get("paid").await.unwrap().unwrap();
    assert_eq!(paid.status, delayq::OrderStatus::Paid);

    // The outcomes are counted apart (the paid order's event was acknowledged unclosed).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = format!("http://127.0.0.1:{api_port}/metrics");
    wait_for(
        "closed and already_paid counted",
        Duration::from_secs(30),
        move || {
            let url = url.clone();
            async move {
                let Ok(r) = reqwest::get(&url).await else {
                    return false;
                };
                let text = r.text().await.unwrap_or_default();
                ["closed", "already_paid"].iter().all(|outcome| {
                    text.lines().any(|l| {
                        l.starts_with("delayq_order_close_total")
                            && l.contains(&format!("outcome=\"{outcome}\""))
                    })
                })
            }
        },
    )
    .await;
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "exit status {status}: {}",
        std::fs::read_to_string(dir.path().join("serve.log")).unwrap()
    );
}

/// A partner that takes `slow` per call while `slow` is set, and records each order id.
#[derive(Clone, Default)]
struct Partner {
    ids: Arc<Mutex<std::collections::HashSet<String>>>,
    calls: Arc<std::sync::atomic::AtomicUsize>,
    slow: Arc<std::sync::atomic::AtomicBool>,
}

async fn partner(State(p): State<Partner>, body: axum::body::Bytes) -> StatusCode {
    use std::sync::atomic::Ordering;
    p.calls.fetch_add(1, Ordering::SeqCst);
    if p.slow.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Some(id) = v["id"].as_str() {
        p.ids.lock().unwrap().insert(id.to_owned());
    }
    StatusCode::OK
}

fn spawn_serve(cfg: &std::path::Path, log: std::path::PathBuf) -> std::process::Child {
    Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env_remove("DELAYQ_REDIS_URL")
        .env_remove("DELAYQ_NAMESPACE")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_a_backlog_exits_within_the_grace_and_a_restart_delivers_everything() {
    use std::sync::atomic::Ordering;
    let redis = delayq::LocalRedis::start().unwrap();
    let p = Partner::default();
    p.slow.store(true, Ordering::SeqCst);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_port = listener.local_addr().unwrap().port();
    let app = axum::Router::new()
        .route("/close", post(partner))
        .with_state(p.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // 50,000 overdue orders before the service starts.
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    client.admin().create_queue("order-close", 1).await.unwrap();
    let n = 50_000;
    for chunk in 0..(n / 5000) {
        let orders: Vec<delayq::NewOrder> = (0..5000)
            .map(|i| {
                delayq::NewOrder::new(
                    format!("b{}", chunk * 5000 + i),
                    delayq::When::in_ms(0),
                    json!({}),
                )
            })
            .collect();
        client
            .schedule_many("order-close", &orders, delayq::Mode::Upsert)
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("delayq.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
redis_url = "{}"
shutdown_grace = "1s"
[http]
listen = "127.0.0.1:{}"
[[handlers]]
queue = "order-close"
group = "close"
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/close"
concurrency = 64
timeout = "60s"
visibility_timeout = "2s"
"#,
            redis.url(),
            free_port()
        ),
    )
    .unwrap();
    let mut child = spawn_serve(&cfg, dir.path().join("serve1.log"));
    let p2 = p.clone();
    wait_for("handlers running", Duration::from_secs(60), move || {
        let c = p2.calls.load(Ordering::SeqCst);
        async move { c >= 64 }
    })
    .await;
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    // Exits 0 within the grace (1 s) + a bound, whatever the backlog: the running handlers
    // take 30 s each and 50,000 orders wait.
    let exited = tokio::time::timeout(
        Duration::from_secs(1 + 5),
        tokio::task::spawn_blocking(move || child.wait()),
    )
    .await
    .expect("serve exited within the grace");
    let status = exited.unwrap().unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(dir.path().join("serve1.log")).unwrap()
    );
    // A restarted service delivers every order; the abandoned ones after their lease.
    p.slow.store(false, Ordering::SeqCst);
    let mut child = spawn_serve(&cfg, dir.path().join("serve2.log"));
    let p3 = p.clone();
    wait_for(
        "every order delivered",
        Duration::from_secs(300),
        move || {
            let got = p3.ids.lock().unwrap().len();
            async move { got >= n }
        },
    )
    .await;
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert!(child.wait().unwrap().success());
    assert_eq!(p.ids.lock().unwrap().len(), n, "none lost");
}

#[tokio::test]
async fn a_wrong_redis_password_exits_3_at_start_up_and_no_secret_is_printed() {
    let redis = delayq::LocalRedis::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("delayq.toml");
    let url = format!("redis://nobody:S3cretPW@127.0.0.1:{}", redis.port());
    std::fs::write(
        &cfg,
        format!(
            "redis_url = \"{url}\"\nqueues = [\"q\"]\n[http]\nlisten = \"127.0.0.1:{}\"\n",
            free_port()
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env_remove("DELAYQ_REDIS_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::task::spawn_blocking(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut { stderr }, &mut s).unwrap();
            (child.wait().unwrap(), s)
        }),
    )
    .await
    .expect("serve gave up at start-up instead of retrying forever")
    .unwrap();
    assert_eq!(out.0.code(), Some(3), "{}", out.1);
    assert!(!out.1.contains("S3cretPW"), "{}", out.1);
    // `--help` never shows the values of secret-bearing environment variables.
    let o = Command::new(BIN)
        .args(["schedule", "--help"])
        .env("DELAYQ_REDIS_URL", &url)
        .env("DELAYQ_DATABASE_URL", "postgres://u:DbSecret@h/db")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("DELAYQ_REDIS_URL"), "{help}");
    assert!(
        !help.contains("S3cretPW") && !help.contains("DbSecret"),
        "{help}"
    );
    let o = Command::new(BIN)
        .args(["demo", "--help"])
        .env("DELAYQ_DATABASE_URL", "postgres://u:DbSecret@h/db")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&o.stdout).contains("DbSecret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_is_obeyed_by_every_serve_process() {
    let redis = delayq::LocalRedis::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let mut children = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let cfg = dir.path().join(format!("delayq{i}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "redis_url = \"{}\"\nqueues = [\"order-close\"]\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
                redis.url()
            ),
        )
        .unwrap();
        children.push(spawn_serve(&cfg, dir.path().join(format!("serve{i}.log"))));
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    for port in ports {
        wait_readyz(&http, port).await;
    }
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let base = |i: usize| format!("http://127.0.0.1:{}/v1/queues/order-close", ports[i]);
    // Paused through the first process...
    let r = http
        .post(format!("{}:pause", base(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // ...and obeyed by both as soon as it answered: orders scheduled through the second
    // stay put (the flag is checked inside the dispatch script).
    for i in 0..20 {
        let r = http
            .put(format!("{}/messages/p{i}", base(1)))
            .header("content-type", "application/json")
            .body(json!({"delay_ms": 0}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = client.admin().stats("order-close").await.unwrap();
    assert_eq!(
        (s.scheduled, s.stream_length),
        (20, 0),
        "dispatched while paused"
    );
    // Resumed through the second process: every order goes out.
    let r = http
        .post(format!("{}:resume", base(1)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let c = client.clone();
    wait_for(
        "dispatched after resume",
        Duration::from_secs(30),
        move || {
            let c = c.clone();
            async move { c.admin().stats("order-close").await.unwrap().stream_length == 20 }
        },
    )
    .await;
    for mut child in children {
        assert!(
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap()
                .success()
        );
        assert!(child.wait().unwrap().success());
    }
}

#[tokio::test]
async fn a_busy_port_is_reported_as_such() {
    let redis = delayq::LocalRedis::start().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("delayq.toml");
    std::fs::write(
        &cfg,
        format!(
            "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let o = Command::new(BIN)
        .args(["serve", "--config", cfg.to_str().unwrap()])
        .env_remove("DELAYQ_REDIS_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("binding the HTTP listener"), "{stderr}");
    assert!(!stderr.contains("redis"), "{stderr}");
    drop(busy);
}

#[tokio::test]
async fn every_queue_of_the_registry_is_served_and_a_deleted_one_is_not() {
    let redis = delayq::LocalRedis::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = dir.path().join("delayq.toml");
    std::fs::write(
        &cfg,
        format!(
            "redis_url = \"{}\"\nqueues = [\"a\"]\n[http]\nlisten = \"127.0.0.1:{port}\"\n",
            redis.url()
        ),
    )
    .unwrap();
    let mut child = spawn_serve(&cfg, dir.path().join("serve.log"));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    wait_readyz(&http, port).await;
    let base = format!("http://127.0.0.1:{port}/v1/queues");
    // Declared through the API while serve runs: no restart, no config change.
    let r = put_json(&http, format!("{base}/b"), json!({})).await;
    assert_eq!(r.status(), 201);
    // ...and through the CLI, from another process.
    let out = Command::new(BIN)
        .args(["--redis-url", &redis.url(), "queue", "create", "c"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    for q in ["b", "c"] {
        let seen = seen.clone();
        let w = delayq::Worker::new(
            &client,
            q,
            "g",
            move |d: delayq::Delivery| {
                seen.lock().unwrap().push(d.id);
                std::future::ready(Ok(()))
            },
            delayq::WorkerOptions::default(),
        )
        .unwrap();
        tokio::spawn(w.run(stop.clone()));
        let r = put_json(
            &http,
            format!("{base}/{q}/messages/{q}-1"),
            json!({"delay_ms": 0}),
        )
        .await;
        assert_eq!(r.status(), 201);
    }
    let s2 = seen.clone();
    wait_for(
        "both orders delivered by serve's dispatchers",
        Duration::from_secs(20),
        move || {
            let n = s2.lock().unwrap().len();
            async move { n == 2 }
        },
    )
    .await;
    // Its gauges are scraped while it exists...
    let before = get_text(&http, port, "/metrics").await;
    assert!(before.contains("delayq_scheduled{queue=\"b\"}"), "{before}");
    // Deleted: serve stops accepting it at once (its cached record is refused by the
    // script) and no key of it is left.
    let r = http
        .delete(format!("{base}/b?force=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = put_json(
        &http,
        format!("{base}/b/messages/late"),
        json!({"delay_ms": 0}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{dq:b:*")
        .query_async(&mut client.connection())
        .await
        .unwrap();
    let keys: Vec<&String> = keys.iter().filter(|k| !k.ends_with(":alive")).collect();
    assert!(keys.is_empty(), "{keys:?}");
    // Its gauges are gone from /metrics (c's are there) once the snapshot is renewed.
    let h2 = http.clone();
    wait_for(
        "a /metrics without b's gauges",
        Duration::from_secs(10),
        move || {
            let h = h2.clone();
            async move {
                let m = get_text(&h, port, "/metrics").await;
                !m.contains("delayq_scheduled{queue=\"b\"}")
            }
        },
    )
    .await;
    let metrics = get_text(&http, port, "/metrics").await;
    assert!(
        metrics.contains("delayq_scheduled{queue=\"c\"}"),
        "{metrics}"
    );
    for gauge in [
        "delayq_scheduled{queue=\"b\"}",
        "delayq_pending{queue=\"b\"",
    ] {
        assert!(!metrics.contains(gauge), "{gauge}: {metrics}");
    }
    // A retention change without `shards` keeps a 4-shard queue's count.
    let r = put_json(&http, format!("{base}/wide"), json!({"shards": 4})).await;
    assert_eq!(r.status(), 201);
    let r = put_json(
        &http,
        format!("{base}/wide"),
        json!({"history_retention": "1s"}),
    )
    .await;
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    stop.cancel();
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    assert!(child.wait().unwrap().success());
}

/// Waits until the serve on `port` answers `/readyz` 200.
async fn wait_readyz(http: &reqwest::Client, port: u16) {
    let h = http.clone();
    wait_for("serve to answer /readyz", Duration::from_secs(60), move || {
        let h = h.clone();
        async move {
            matches!(h.get(format!("http://127.0.0.1:{port}/readyz")).send().await, Ok(r) if r.status() == 200)
        }
    })
    .await;
}

/// `PUT url` with a JSON body.
async fn put_json(http: &reqwest::Client, url: String, body: Value) -> reqwest::Response {
    http.put(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// The body of `GET path` on the serve at `port`.
async fn get_text(http: &reqwest::Client, port: u16, path: &str) -> String {
    http.get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// At the default log level (no `RUST_LOG`), serve's first lines name the listen address, the
/// Redis target (its password masked) and the queues served; dependency noise stays quiet.
#[tokio::test]
async fn at_the_default_level_serve_says_where_it_listens_its_redis_and_its_queues() {
    const PASSWORD: &str = "Pw-never-shown";
    let redis = delayq::LocalRedis::start().unwrap();
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let _: String = support::raw(&client, &["CONFIG", "SET", "requirepass", PASSWORD]).await;
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", redis.port());
    let cfg = format!(
        "redis_url = \"{url}\"\nqueues = [\"alpha-q\", \"beta-q\"]\n\
         [http]\nlisten = \"127.0.0.1:{{port}}\"\ntokens = [\"{TOKEN}\"]\n"
    );
    let mut serve = support::serve::Serve::start_with_vars(&cfg, &[("RUST_LOG", None)]);
    serve.wait_ready(Duration::from_secs(30)).await;
    let s = &serve;
    wait_for("the serving line", Duration::from_secs(30), || {
        let done = s.log().contains("delayq serving");
        async move { done }
    })
    .await;
    let log = serve.log();
    let first: Vec<&str> = log.lines().take(6).collect();
    let first = first.join("\n");
    let listen = format!("127.0.0.1:{}", serve.port);
    let target = format!("redis://***@127.0.0.1:{}", redis.port());
    assert!(first.contains(&listen), "{log}");
    assert!(first.contains(&target), "{log}");
    assert!(
        first.contains("alpha-q") && first.contains("beta-q"),
        "{log}"
    );
    assert!(!log.contains(PASSWORD), "{log}");
    // Info for delayq's own lines only: nothing below, nothing from the dependencies.
    for l in log.lines() {
        assert!(
            l.contains(" INFO delayq") || l.contains(" WARN ") || l.contains(" ERROR "),
            "{l}\n{log}"
        );
    }
    assert!(!log.contains("Job creator created"), "{log}");
    serve.sigterm();
    assert_eq!(serve.wait_exit(Duration::from_secs(30)).await, Some(0));
}

/// The value of the line `series` (name and labels, exactly) in a Prometheus text.
fn series_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Issue 39 item 14: the safety sweep honours `dispatch`. A `dispatch = "none"` serve and a
/// `dispatch = ["a"]` serve on one Redis, queues a and b with orders due now: a is
/// dispatched (by the second), b's orders stay scheduled through two sweeps of each, the
/// first serve dispatched nothing and the second nothing of b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_safety_sweep_dispatches_only_the_selected_queues() {
    let redis = delayq::LocalRedis::start().unwrap();
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    for q in ["a", "b"] {
        client.admin().create_queue(q, 1).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port()];
    let mut children = Vec::new();
    for (i, (port, dispatch)) in ports.iter().zip(["\"none\"", "[\"a\"]"]).enumerate() {
        let cfg = dir.path().join(format!("delayq{i}.toml"));
        std::fs::write(
            &cfg,
            format!(
                // A sweep every second (the default is every minute): the test watches
                // which queues the sweeps dispatch.
                "redis_url = \"{}\"\ndispatch = {dispatch}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[housekeeping]\nsweep_cron = \"* * * * * *\"\n",
                redis.url()
            ),
        )
        .unwrap();
        children.push(spawn_serve(&cfg, dir.path().join(format!("serve{i}.log"))));
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    for port in ports {
        wait_readyz(&http, port).await;
    }
    const SWEEPS: &str = "delayq_maintenance_runs_total{service=\"sweep\"}";
    let mut sweeps_before = Vec::new();
    for port in ports {
        let m = get_text(&http, port, "/metrics").await;
        sweeps_before.push(series_value(&m, SWEEPS).unwrap_or(0.0));
    }
    for q in ["a", "b"] {
        let orders: Vec<delayq::NewOrder> = (0..10)
            .map(|i| delayq::NewOrder::new(format!("{q}{i}"), delayq::When::in_ms(0), json!({})))
            .collect();
        client
            .schedule_many(q, &orders, delayq::Mode::Upsert)
            .await
            .unwrap();
    }
    let c = client.clone();
    wait_for("a dispatched", Duration::from_secs(30), move || {
        let c = c.clone();
        async move { c.admin().stats("a").await.unwrap().stream_length == 10 }
    })
    .await;
    // Two sweeps of each process after the orders were scheduled.
    for (port, before) in ports.into_iter().zip(sweeps_before) {
        let h = http.clone();
        wait_for("two more sweeps", Duration::from_secs(30), move || {
            let h = h.clone();
            async move {
                let m = get_text(&h, port, "/metrics").await;
                series_value(&m, SWEEPS).unwrap_or(0.0) >= before + 2.0
            }
        })
        .await;
    }
    let b = client.admin().stats("b").await.unwrap();
    assert_eq!((b.scheduled, b.stream_length), (10, 0), "b was dispatched");
    let none = get_text(&http, ports[0], "/metrics").await;
    assert!(
        !none.contains("delayq_dispatched_total"),
        "the \"none\" process dispatched: {none}"
    );
    let only_a = get_text(&http, ports[1], "/metrics").await;
    assert!(
        only_a.contains("delayq_dispatched_total{queue=\"a\"}"),
        "{only_a}"
    );
    assert!(
        !only_a.contains("delayq_dispatched_total{queue=\"b\"}"),
        "{only_a}"
    );
    for mut child in children {
        assert!(
            Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .unwrap()
                .success()
        );
        assert!(child.wait().unwrap().success());
    }
}

/// Issue 39: force-deleting one of the two queues a serve's webhook handler consumes never
/// stops that serve: the other queue is delivered throughout, the deleted one again once it
/// is created again, `/readyz` stays 200, and SIGTERM still exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serve_keeps_delivering_across_a_force_delete_of_a_consumed_queue() {
    let redis = delayq::LocalRedis::start().unwrap();
    let p = Partner::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_port = listener.local_addr().unwrap().port();
    let app = axum::Router::new()
        .route("/close", post(partner))
        .with_state(p.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let api_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("delayq.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
redis_url = "{}"
[http]
listen = "127.0.0.1:{api_port}"
[[handlers]]
queues = ["eph", "keep"]
group = "close"
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/close"
"#,
            redis.url()
        ),
    )
    .unwrap();
    let log = dir.path().join("serve.log");
    let mut child = spawn_serve(&cfg, log.clone());
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let within = Duration::from_secs(60);
    let delivered = |id: &'static str| {
        let p = p.clone();
        async move {
            wait_for(&format!("{id} delivered"), within, move || {
                let got = p.ids.lock().unwrap().contains(id);
                async move { got }
            })
            .await;
        }
    };
    for (q, id) in [("eph", "e1"), ("keep", "k1")] {
        wait_for(&format!("{q} registered"), within, || {
            let c = client.clone();
            async move { c.schedule(q, id, Duration::ZERO, json!({})).await.is_ok() }
        })
        .await;
        delivered(id).await;
    }

    client.admin().delete_queue("eph", true).await.unwrap();
    client
        .schedule("keep", "k2", Duration::ZERO, json!({}))
        .await
        .unwrap();
    delivered("k2").await;
    client.admin().create_queue("eph", 1).await.unwrap();
    client
        .schedule("eph", "e2", Duration::ZERO, json!({}))
        .await
        .unwrap();
    delivered("e2").await;
    client
        .schedule("keep", "k3", Duration::ZERO, json!({}))
        .await
        .unwrap();
    delivered("k3").await;

    assert!(
        child.try_wait().unwrap().is_none(),
        "serve stopped: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ready = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{api_port}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    assert!(
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap()
    );
}
