//! The operator's kit against the real thing: `delayq healthcheck` against a real `serve`;
//! the alert rules of `deploy/observability/` through `promtool`; and a real Prometheus
//! (Debian's `prometheus` package, which `.ci/test` installs) scraping a real `serve` under
//! a small load, asked every dashboard query and every alert's signal.
//!
//! What is checked of each alert: Prometheus loads `alerts.yml` and evaluates every rule
//! without error (`/api/v1/rules` health `ok`); the whole expression is a valid query; and
//! its signal (the expression without its one top-level `<op> <threshold>`) returns series
//! from this serve. Whether a threshold is right is what the promtool unit tests
//! (`alerts.test.yml`) check, on synthetic series.
//!
//! Missing `prometheus` or `promtool` fails these tests with a message saying how to
//! install them; nothing is skipped.
#![allow(clippy::unwrap_used)]

use crate::support;
use crate::support::serve::{BIN, Serve, free_port};

use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn observability_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/observability")
}

/// `name` on PATH, or a failure that says how to get it.
fn tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "`{name}` is not on PATH: these tests need Debian's prometheus package \
             (`apt-get install -y prometheus` installs /usr/bin/prometheus and /usr/bin/promtool; \
             .ci/test installs it)"
        )
    })
}

fn healthcheck(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .arg("healthcheck")
        .args(args)
        .env_remove("DELAYQ_HTTP__LISTEN")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Exit code and stdout; stdout must be exactly one line.
fn one_line(o: &Output) -> (i32, String) {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        out.lines().count(),
        1,
        "healthcheck must print one line, printed {out:?} (stderr {:?})",
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), out.trim().to_owned())
}

#[tokio::test]
async fn healthcheck_answers_0_for_a_serving_process_and_1_with_one_line_otherwise() {
    let redis = delayq::LocalRedis::start().unwrap();
    let config = format!(
        "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n",
        redis.url()
    );
    let mut serve = Serve::start(&config, None);
    serve.wait_ready(Duration::from_secs(60)).await;
    let cfg = serve.dir.path().join("delayq.toml");
    let cfg = cfg.to_str().unwrap();
    let addr = format!("127.0.0.1:{}", serve.port);

    // The address from serve's own file, then from the environment alone.
    let (code, line) = one_line(&healthcheck(&["--config", cfg], &[]));
    assert_eq!(
        (code, line.as_str()),
        (0, &*format!("healthz: 200 from {addr}"))
    );
    let (code, line) = one_line(&healthcheck(&["--config", cfg, "--ready"], &[]));
    assert_eq!(
        (code, line.as_str()),
        (0, &*format!("readyz: 200 from {addr}"))
    );
    let (code, line) = one_line(&healthcheck(
        &["--ready"],
        &[("DELAYQ_HTTP__LISTEN", &addr)],
    ));
    assert_eq!(
        (code, line.as_str()),
        (0, &*format!("readyz: 200 from {addr}"))
    );
    // The environment overrides the file, as for serve.
    let nobody = format!("127.0.0.1:{}", free_port());
    let o = healthcheck(&["--config", cfg], &[("DELAYQ_HTTP__LISTEN", &nobody)]);
    let (code, line) = one_line(&o);
    assert_eq!(code, 1, "{line}");
    assert!(
        line.starts_with(&format!("healthz: {nobody}: cannot connect")),
        "{line}"
    );

    // A configuration it cannot read: exit 1 (never 2, which health checks reserve).
    let (code, line) = one_line(&healthcheck(&["--config", "/nonexistent/delayq.toml"], &[]));
    assert_eq!(code, 1, "{line}");
    assert!(
        line.contains("cannot read /nonexistent/delayq.toml"),
        "{line}"
    );
    let (code, line) = one_line(&healthcheck(&["--timeout", "soon"], &[]));
    assert_eq!(code, 1, "{line}");
    assert!(line.contains("--timeout"), "{line}");

    // Redis gone: alive, not ready, and the line says why.
    drop(redis);
    let (code, line) = one_line(&healthcheck(&["--config", cfg], &[]));
    assert_eq!(code, 0, "{line}");
    let (code, line) = one_line(&healthcheck(&["--config", cfg, "--ready"], &[]));
    assert_eq!(
        (code, line.as_str()),
        (1, &*format!("readyz: 503 from {addr}: redis_unavailable"))
    );

    // Nothing listening at all.
    serve.sigterm();
    assert_eq!(serve.wait_exit(Duration::from_secs(30)).await, Some(0));
    let (code, line) = one_line(&healthcheck(&["--config", cfg], &[]));
    assert_eq!(code, 1, "{line}");
    assert!(
        line.starts_with(&format!("healthz: {addr}: cannot connect")),
        "{line}"
    );
}

#[test]
fn the_alert_rules_are_valid_and_pass_their_promtool_unit_tests() {
    let promtool = tool("promtool");
    let dir = observability_dir();
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts.test.yml"],
        vec!["check", "config", "prometheus.example.yml"],
    ] {
        let o = Command::new(&promtool)
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// An expression split at its one top-level comparison with a number: (signal, threshold
/// part). Fails when there is not exactly one.
fn split_threshold(expr: &str) -> Result<(String, String), String> {
    let b = expr.as_bytes();
    let (mut depth, mut quote, mut found) = (0i32, None::<u8>, Vec::new());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if let Some(q) = quote {
            if c == b'\\' {
                i += 1;
            } else if c == q {
                quote = None;
            }
        } else {
            match c {
                b'"' | b'\'' | b'`' => quote = Some(c),
                b'(' | b'{' | b'[' => depth += 1,
                b')' | b'}' | b']' => depth -= 1,
                b'>' | b'<' | b'=' | b'!' if depth == 0 => {
                    let two = b.get(i + 1) == Some(&b'=');
                    if c != b'=' || two {
                        found.push(i);
                        i += usize::from(two);
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    let [at] = found[..] else {
        return Err(format!(
            "{expr:?}: expected exactly one top-level comparison, found {}",
            found.len()
        ));
    };
    let rhs = expr[at..].trim_start_matches(['>', '<', '=', '!']).trim();
    let rhs = rhs.strip_prefix("bool").unwrap_or(rhs).trim();
    rhs.parse::<f64>()
        .map_err(|_| format!("{expr:?}: the comparison is not with a number"))?;
    Ok((expr[..at].trim().to_owned(), expr[at..].trim().to_owned()))
}

#[test]
fn alert_signals_are_split_from_their_thresholds() {
    let (s, t) =
        split_threshold(r#"max by (queue) (x unless on (queue) (p{group=""} == 1)) > 60"#).unwrap();
    assert_eq!(
        s,
        r#"max by (queue) (x unless on (queue) (p{group=""} == 1))"#
    );
    assert_eq!(t, "> 60");
    assert_eq!(split_threshold("up == 0").unwrap().0, "up");
    assert!(split_threshold("a > 1 and b > 2").is_err());
    assert!(split_threshold("a > b").is_err());
    assert!(split_threshold("rate(a[5m])").is_err());
}

/// Every PromQL expression of the dashboard, its Grafana variables replaced: `$queue` and
/// `$job` by `.*` (their "All"), `$__rate_interval` by 30s (fifteen of the test's scrapes).
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(observability_dir().join("delayq-dashboard.json")).unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            let expr = expr
                .replace("$__rate_interval", "30s")
                .replace("$queue", ".*")
                .replace("$job", ".*");
            assert!(
                !expr.contains('$'),
                "a variable the test does not know: {expr}"
            );
            out.push((p["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            // label_values(metric, label): the metric must have series with that label.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap();
            let (metric, label) = inner.split_once(',').unwrap();
            out.push((
                format!("variable {}", v["name"]),
                format!("count by ({}) ({})", label.trim(), metric.trim()),
            ));
        }
    }
    assert!(out.len() > 20, "{} queries", out.len());
    out
}

/// A Prometheus of its own: a temp dir, a free port, killed on drop.
struct Prometheus {
    child: Child,
    dir: tempfile::TempDir,
    base: String,
}

impl Prometheus {
    fn start(target_port: u16) -> Prometheus {
        let bin = tool("prometheus");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let rules = observability_dir().join("alerts.yml");
        let cfg = format!(
            "global: {{scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 1s}}\n\
             rule_files: [{:?}]\n\
             scrape_configs:\n  - job_name: delayq\n    static_configs:\n      - targets: [\"127.0.0.1:{target_port}\"]\n",
            rules.to_str().unwrap()
        );
        std::fs::write(dir.path().join("prometheus.yml"), cfg).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus {
            child,
            dir,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query: the result vector, or Prometheus's error.
    async fn query(&self, http: &reqwest::Client, expr: &str) -> Result<Vec<Value>, String> {
        let body = format!("query={}", form_encode(expr));
        let r = http
            .post(format!("{}/api/v1/query", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&r.text().await.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    async fn get(&self, http: &reqwest::Client, path: &str) -> Option<Value> {
        let r = http.get(format!("{}{path}", self.base)).send().await.ok()?;
        serde_json::from_str(&r.text().await.ok()?).ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|c| match c {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (c as char).to_string()
            }
            _ => format!("%{c:02X}"),
        })
        .collect()
}

/// The queries among `queries` that return no series (or fail), with why.
async fn empty_queries(
    prom: &Prometheus,
    http: &reqwest::Client,
    queries: &[(String, String)],
) -> Vec<String> {
    let mut empty = Vec::new();
    for (what, q) in queries {
        match prom.query(http, q).await {
            Ok(r) if !r.is_empty() => {}
            Ok(_) => empty.push(format!("{what}: {q}: no series")),
            Err(e) => empty.push(format!("{what}: {q}: {e}")),
        }
    }
    empty
}

/// Polls until every query returns series; panics listing those that do not.
async fn await_series(
    prom: &Prometheus,
    http: &reqwest::Client,
    queries: &[(String, String)],
    within: Duration,
    what: &str,
) {
    let start = std::time::Instant::now();
    loop {
        let empty = empty_queries(prom, http, queries).await;
        if empty.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < within,
            "{what}: after {within:?}, {} of {} queries return no series:\n  {}",
            empty.len(),
            queries.len(),
            empty.join("\n  ")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn a_real_prometheus_scraping_serve_answers_every_dashboard_query_and_alert_signal() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let mut redis = Some(delayq::LocalRedis::start().unwrap());

    // The webhook receiver fails every order whose id starts with "fail" (retried, then
    // dead-lettered), takes the others.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/hook",
        post(|body: axum::body::Bytes| async move {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if v["id"].as_str().is_some_and(|id| id.starts_with("fail")) {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    // A collector that is not there: spans are dropped (export_failed).
    let no_collector = free_port();
    let config = format!(
        r#"
redis_url = "{redis}"
[http]
listen = "127.0.0.1:{{port}}"
header_timeout = "1s"
request_timeout = "1s"
[housekeeping]
trim_cron = "* * * * * *"
[telemetry]
otlp_endpoint = "http://127.0.0.1:{no_collector}"
export_timeout = "200ms"
export_interval = "100ms"
[[handlers]]
queue = "orders"
group = "hook"
kind = "webhook"
url = "http://127.0.0.1:{hook_port}/hook"
max_attempts = 2
backoff = "fixed:100ms"
[[handlers]]
queue = "orders"
group = "audit"
kind = "log"
rate_limit = "40/s"
"#,
        redis = redis.as_ref().unwrap().url()
    );
    let mut serve = Serve::start(&config, None);
    serve.wait_ready(Duration::from_secs(60)).await;
    let prom = Prometheus::start(serve.port);
    support::wait_for("prometheus to be ready", Duration::from_secs(60), || {
        let (http, url) = (http.clone(), format!("{}/-/ready", prom.base));
        async move { matches!(http.get(url).send().await, Ok(r) if r.status() == 200) }
    })
    .await;

    // The load: 200 orders due within a second, at every level, 20 of them failing; one
    // cancelled; one connection cut past header_timeout (a head never finished).
    let messages: Vec<Value> = (0..200)
        .map(|i| {
            let id = if i % 10 == 0 {
                format!("fail-{i}")
            } else {
                format!("o-{i}")
            };
            let priority = ["high", "normal", "low"][i % 3];
            json!({"id": id, "delay_ms": 500 + (i as u64 % 5) * 100, "payload": {"n": i}, "priority": priority})
        })
        .collect();
    let r = http
        .post(format!("{}/v1/queues/orders/messages:batch", serve.base()))
        .header("content-type", "application/json")
        .body(json!({ "messages": messages }).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let r = http
        .put(format!("{}/v1/queues/orders/messages/keep", serve.base()))
        .header("content-type", "application/json")
        .body(json!({"delay_ms": 3_600_000}).to_string())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let r = http
        .delete(format!("{}/v1/queues/orders/messages/keep", serve.base()))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut idle = tokio::net::TcpStream::connect(("127.0.0.1", serve.port))
            .await
            .unwrap();
        // A head begun and never finished: cut after header_timeout.
        idle.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(30), idle.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "serve did not cut a silent connection");
    }

    // A lookup of an order that does not exist: a 4xx answer.
    let r = http
        .get(format!("{}/v1/queues/orders/messages/nobody", serve.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // Every rule is loaded and evaluates without error.
    let alerts = std::fs::read_to_string(observability_dir().join("alerts.yml")).unwrap();
    let alert_count = alerts
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let mut signals = Vec::new();
    let mut full = Vec::new();
    support::wait_for("every rule evaluated", Duration::from_secs(60), || {
        let (prom, http) = (&prom, &http);
        async move {
            let Some(v) = prom.get(http, "/api/v1/rules").await else {
                return false;
            };
            let rules: Vec<&Value> = v["data"]["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .collect();
            rules.len() == alert_count
                && rules
                    .iter()
                    .all(|r| r["lastEvaluation"] != "0001-01-01T00:00:00Z")
        }
    })
    .await;
    let rules = prom.get(&http, "/api/v1/rules").await.unwrap();
    for r in rules["data"]["groups"][0]["rules"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap().to_owned();
        assert_eq!(r["health"], "ok", "{name}: {}", r["lastError"]);
        let query = r["query"].as_str().unwrap();
        let (signal, threshold) =
            split_threshold(query).unwrap_or_else(|e| panic!("alert {name}: {e}"));
        eprintln!("alert {name}: signal `{signal}`, fires at `{threshold}`");
        signals.push((format!("alert {name} (signal)"), signal));
        full.push((name, query.to_owned()));
    }
    for (name, q) in &full {
        if let Err(e) = prom.query(&http, q).await {
            panic!("alert {name}: {q}: {e}");
        }
    }

    // Everything but what only a Redis failure shows returns series.
    let mut queries = dashboard_queries();
    queries.extend(signals);
    let needs_failure = |q: &str| {
        q.contains("delayq_maintenance_errors_total")
            || q.contains(r#"status=~"5.."#)
            || q.contains(r#"delayq_redis_errors_total{kind!~"noscript|reply"}"#)
    };
    let (later, now): (Vec<_>, Vec<_>) = queries.into_iter().partition(|(_, q)| needs_failure(q));
    assert!(!later.is_empty());
    await_series(&prom, &http, &now, Duration::from_secs(120), "under load").await;

    // Redis goes away: the maintenance passes and Redis calls fail, the API answers 503,
    // and what shows it returns series.
    drop(redis.take());
    let r = http
        .get(format!("{}/v1/queues/orders/messages/o-1", serve.base()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    await_series(&prom, &http, &later, Duration::from_secs(120), "Redis down").await;
    eprintln!(
        "{} dashboard queries and alert signals returned series",
        now.len() + later.len()
    );
}

/// The `/metrics` text of `serve`, once it shows `want` (it is rendered at most once a
/// second).
async fn metrics_showing(http: &reqwest::Client, serve: &Serve, want: &[&str]) -> String {
    let url = format!("{}/metrics", serve.base());
    let mut text = String::new();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        text = http.get(&url).send().await.unwrap().text().await.unwrap();
        if want.iter().all(|w| text.contains(w)) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let missing: Vec<_> = want.iter().filter(|w| !text.contains(*w)).collect();
    panic!("/metrics never showed {missing:?}:\n{text}");
}

/// HTTP requests are counted by route template, method and status, and timed; Redis calls
/// are timed by script and their errors counted by kind (a frozen Redis: `timeout`). No
/// label carries a raw path, an id or an unknown method.
#[tokio::test]
async fn serve_exports_http_status_and_latency_and_redis_round_trips_and_errors() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let redis = delayq::LocalRedis::start().unwrap();
    let config = format!(
        "redis_url = \"{}\"\nqueues = [\"q\"]\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n",
        redis.url()
    );
    let mut serve = Serve::start(&config, None);
    serve.wait_ready(Duration::from_secs(60)).await;
    let base = serve.base();
    let put = |id: &str| {
        http.put(format!("{base}/v1/queues/q/messages/{id}"))
            .header("content-type", "application/json")
            .body(json!({"delay_ms": 3_600_000}).to_string())
            .send()
    };
    assert!(put("secret-id-1").await.unwrap().status().is_success());
    assert!(put("secret-id-2").await.unwrap().status().is_success());
    let r = http
        .get(format!("{base}/v1/queues/q/messages/secret-id-3"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .get(format!("{base}/no/such/route-secret-4"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let odd = reqwest::Method::from_bytes(b"BREW").unwrap();
    let r = http
        .request(odd, format!("{base}/v1/queues"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);

    let route = "/v1/queues/{queue}/messages/{id}";
    let text = metrics_showing(
        &http,
        &serve,
        &[
            &format!(r#"delayq_http_requests_total{{route="{route}",method="PUT",status="201"}} 2"#),
            &format!(r#"delayq_http_requests_total{{route="{route}",method="GET",status="404"}} 1"#),
            r#"delayq_http_requests_total{route="unmatched",method="GET",status="404"} 1"#,
            r#"delayq_http_requests_total{route="/v1/queues",method="other",status="405"} 1"#,
            &format!(
                r#"delayq_http_request_duration_seconds_count{{route="{route}",method="PUT"}} 2"#
            ),
            r#"delayq_http_request_duration_seconds_bucket{route="/readyz",method="GET",le="0.001"}"#,
            r#"delayq_redis_call_duration_seconds_bucket{op="enqueue",le="0.0001"}"#,
            r#"delayq_redis_call_duration_seconds_count{op="other"}"#,
        ],
    )
    .await;
    assert!(!text.contains("secret-"), "a raw path or id in a label");
    assert!(!text.contains("BREW"), "an unknown method in a label");
    assert!(!text.contains("kind=\"timeout\""), "{text}");

    // Redis frozen: the write times out, and says so.
    redis.suspend().unwrap();
    let r = put("o-frozen").await.unwrap();
    redis.resume().unwrap();
    assert_eq!(r.status(), 503);
    metrics_showing(
        &http,
        &serve,
        &[
            r#"delayq_redis_errors_total{op="enqueue",kind="timeout"}"#,
            &format!(
                r#"delayq_http_requests_total{{route="{route}",method="PUT",status="503"}} 1"#
            ),
        ],
    )
    .await;
}
