//! One trace from checkout to close: the W3C trace context carried through the queue.
//!
//! `delayq serve` runs as a real process exporting over OTLP/HTTP to a receiver in this test
//! (the protobuf decoded with `opentelemetry-proto`) and posting webhooks to another: a PUT
//! with `traceparent` yields a `send` PRODUCER span in the caller's trace, a `process`
//! CONSUMER span per attempt linked to it (or its child with `consumer_span = "parent"`),
//! and webhooks carrying the process span's `traceparent`. A collector that is down drops
//! spans (counted) and never delivery. Orders without context store exactly the bytes they
//! always had. A library producer inside a `tracing` span is linked from the worker's
//! handler span (an in-memory exporter).
#![allow(clippy::unwrap_used)]

mod support;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span as ProtoSpan;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::serve::Serve;
use support::wait_for;

/// The caller's context: a checkout request's trace.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";
const QUEUE: &str = "order-close";
const WAIT: Duration = Duration::from_secs(60);

fn traceparent() -> String {
    format!("00-{TRACE}-{PARENT}-01")
}

// ---------------------------------------------------------------- receivers

/// What the in-test OTLP/HTTP receiver has been sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ProtoSpan>>>,
    /// The `service.name` of every request's resource.
    services: Arc<Mutex<HashSet<String>>>,
    /// Every request's `authorization` header (`None`: none was sent).
    auth: Arc<Mutex<Vec<Option<String>>>>,
}

impl Collector {
    /// Listens on a free port; its base URL.
    async fn start(&self) -> String {
        async fn traces(
            State(c): State<Collector>,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> impl axum::response::IntoResponse {
            c.auth.lock().unwrap().push(
                headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned()),
            );
            let req = ExportTraceServiceRequest::decode(body).unwrap();
            let mut spans = c.spans.lock().unwrap();
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| r.attributes.iter())
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| kv.value.as_ref()?.value.clone());
                c.services.lock().unwrap().insert(format!("{service:?}"));
                for ss in rs.scope_spans {
                    spans.extend(ss.spans);
                }
            }
            (
                [("content-type", "application/x-protobuf")],
                ExportTraceServiceResponse::default().encode_to_vec(),
            )
        }
        let app = axum::Router::new()
            .route("/v1/traces", post(traces))
            .with_state(self.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        format!("http://127.0.0.1:{port}")
    }

    fn spans(&self) -> Vec<ProtoSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans named `name` about order `id`.
    fn about(&self, name: &str, id: &str) -> Vec<ProtoSpan> {
        self.spans()
            .into_iter()
            .filter(|s| {
                s.name == name && attr_str(s, "messaging.message.id").as_deref() == Some(id)
            })
            .collect()
    }
}

/// The webhook receiver: every call's headers and body; ids starting with `flaky` fail
/// their first attempt, those starting with `dead` every attempt.
#[derive(Clone, Default)]
struct Hooks {
    calls: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
    ids: Arc<Mutex<HashSet<String>>>,
}

impl Hooks {
    async fn start(&self) -> String {
        async fn hook(
            State(h): State<Hooks>,
            headers: HeaderMap,
            body: axum::body::Bytes,
        ) -> StatusCode {
            let v: Value = serde_json::from_slice(&body).unwrap();
            let id = v["id"].as_str().unwrap().to_owned();
            let fail = (id.starts_with("flaky") && v["attempt"] == 1) || id.starts_with("dead");
            h.ids.lock().unwrap().insert(id);
            h.calls.lock().unwrap().push((headers, v));
            if fail {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::NO_CONTENT
            }
        }
        let app = axum::Router::new()
            .route("/hook", post(hook))
            .with_state(self.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        format!("http://127.0.0.1:{port}/hook")
    }

    /// The calls for order `id`, in order.
    fn calls_for(&self, id: &str) -> Vec<(HeaderMap, Value)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, v)| v["id"] == id)
            .cloned()
            .collect()
    }

    fn distinct(&self) -> usize {
        self.ids.lock().unwrap().len()
    }
}

// ---------------------------------------------------------------- span helpers

fn attr(s: &ProtoSpan, key: &str) -> Option<AnyValue> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

fn attr_str(s: &ProtoSpan, key: &str) -> Option<String> {
    match attr(s, key)? {
        AnyValue::StringValue(v) => Some(v),
        _ => None,
    }
}

fn attr_int(s: &ProtoSpan, key: &str) -> Option<i64> {
    match attr(s, key)? {
        AnyValue::IntValue(v) => Some(v),
        _ => None,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// (trace id, span id) of a `traceparent` header.
fn ids_of(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00", "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

// ---------------------------------------------------------------- serve helpers

fn config(redis: &str, otlp: &str, hook: &str, extra: &str) -> String {
    format!(
        r#"
redis_url = "{redis}"
log_format = "json"
[http]
listen = "127.0.0.1:{{port}}"
[telemetry]
otlp_endpoint = "{otlp}"
export_interval = "50ms"
export_timeout = "2s"
{extra}
[[handlers]]
queue = "{QUEUE}"
group = "close-order"
kind = "webhook"
url = "{hook}"
concurrency = 32
timeout = "5s"
max_attempts = 3
backoff = "fixed:50ms"
visibility_timeout = "5s"
"#
    )
}

async fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// PUT an order (due after `delay_ms`) with `headers`; its status.
async fn put(
    http: &reqwest::Client,
    serve: &Serve,
    id: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let mut req = http
        .put(format!("{}/v1/queues/{QUEUE}/messages/{id}", serve.base()))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap().status().as_u16()
}

/// The stored payload value of a scheduled order (one shard).
async fn stored(client: &delayq::Client, id: &str) -> String {
    support::raw(client, &["HGET", &format!("{{dq:{QUEUE}:0}}:payload"), id]).await
}

/// `"<ms>:<json>"` exactly: the bytes an order without context always had.
fn assert_plain(stored: &str, json: &str) {
    let (ms, rest) = stored.split_once(':').unwrap();
    assert!(ms.parse::<i64>().is_ok(), "{stored}");
    assert_eq!(rest, json, "{stored}");
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn a_put_with_traceparent_is_traced_through_serve_to_the_webhook_and_its_retry() {
    let redis = delayq::LocalRedis::start().unwrap();
    let collector = Collector::default();
    let hooks = Hooks::default();
    let otlp = collector.start().await;
    let hook = hooks.start().await;
    let mut serve = Serve::start(&config(&redis.url(), &otlp, &hook, ""), None);
    serve.wait_ready(WAIT).await;
    let http = http().await;
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let tp = traceparent();
    let traced: [(&str, &str); 2] = [("traceparent", &tp), ("tracestate", "shop=checkout")];

    // Scheduled, not yet due: stored with its context, read back byte for byte.
    let payload = r#"{"n":123456789012345678901234567890,"s":"~a~"}"#;
    let body = format!(r#"{{"delay_ms": 3600000, "payload": {payload}}}"#);
    assert_eq!(put(&http, &serve, "later", &body, &traced).await, 201);
    let send = {
        let c = collector.clone();
        wait_for("the send span of `later`", WAIT, || {
            let n = c.about(&format!("send {QUEUE}"), "later").len();
            async move { n == 1 }
        })
        .await;
        collector.about(&format!("send {QUEUE}"), "later").remove(0)
    };
    let raw = stored(&client, "later").await;
    let (ms, rest) = raw.split_once(':').unwrap();
    assert!(ms.parse::<i64>().is_ok(), "{raw}");
    assert_eq!(
        rest,
        format!(
            "~00-{TRACE}-{}-01;shop=checkout~{payload}",
            hex(&send.span_id)
        )
    );
    let got = http
        .get(format!("{}/v1/queues/{QUEUE}/messages/later", serve.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(got.contains(&format!(r#""payload":{payload}"#)), "{got}");
    let order = client.get(QUEUE, "later").await.unwrap().unwrap();
    assert_eq!(
        order.payload,
        serde_json::from_str::<Value>(payload).unwrap()
    );

    // Orders without a context (none, or an invalid one: ignored, never an error) store the
    // bytes they always had.
    assert_eq!(put(&http, &serve, "plain", &body, &[]).await, 201);
    assert_plain(&stored(&client, "plain").await, payload);
    let bad = [(
        "traceparent",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    )];
    assert_eq!(put(&http, &serve, "bad", &body, &bad).await, 201);
    assert_plain(&stored(&client, "bad").await, payload);
    for id in ["later", "plain", "bad"] {
        client.cancel(QUEUE, id).await.unwrap();
    }

    // Due now; its webhook fails once and is retried.
    let body = format!(r#"{{"delay_ms": 0, "payload": {payload}}}"#);
    assert_eq!(put(&http, &serve, "flaky-1", &body, &traced).await, 201);
    let h = hooks.clone();
    wait_for("two webhook calls", WAIT, || {
        let n = h.calls_for("flaky-1").len();
        async move { n >= 2 }
    })
    .await;
    let c = collector.clone();
    wait_for("a send span and two process spans", WAIT, || {
        let ok = c.about(&format!("send {QUEUE}"), "flaky-1").len() == 1
            && c.about(&format!("process {QUEUE}"), "flaky-1").len() == 2;
        async move { ok }
    })
    .await;

    let services = collector.services.lock().unwrap().clone();
    let delayq = format!("{:?}", Some(AnyValue::StringValue("delayq".into())));
    assert_eq!(services, HashSet::from([delayq]));
    // The producer span: in the caller's trace, a child of its span.
    let send = collector
        .about(&format!("send {QUEUE}"), "flaky-1")
        .remove(0);
    assert_eq!(send.kind, SpanKind::Producer as i32);
    assert_eq!(hex(&send.trace_id), TRACE);
    assert_eq!(hex(&send.parent_span_id), PARENT);
    assert_eq!(
        attr_str(&send, "messaging.system").as_deref(),
        Some("delayq")
    );
    assert_eq!(
        attr_str(&send, "messaging.operation.type").as_deref(),
        Some("send")
    );
    assert_eq!(
        attr_str(&send, "messaging.destination.name").as_deref(),
        Some(QUEUE)
    );

    // One consumer span per attempt, each a new trace linked to the producer span, and the
    // webhook of that attempt carrying its context.
    let mut process = collector.about(&format!("process {QUEUE}"), "flaky-1");
    process.sort_by_key(|s| attr_int(s, "messaging.delayq.attempt"));
    let calls = hooks.calls_for("flaky-1");
    for (attempt, (span, (headers, body))) in process.iter().zip(&calls).enumerate() {
        let attempt = attempt as i64 + 1;
        assert_eq!(span.kind, SpanKind::Consumer as i32);
        assert_eq!(attr_int(span, "messaging.delayq.attempt"), Some(attempt));
        assert_eq!(body["attempt"], attempt);
        assert_eq!(
            attr_str(span, "messaging.system").as_deref(),
            Some("delayq")
        );
        assert_eq!(
            attr_str(span, "messaging.operation.type").as_deref(),
            Some("process")
        );
        assert_eq!(
            attr_str(span, "messaging.destination.name").as_deref(),
            Some(QUEUE)
        );
        assert_eq!(
            attr_str(span, "messaging.consumer.group.name").as_deref(),
            Some("close-order")
        );
        assert!(
            attr_int(span, "messaging.delayq.lateness_ms").is_some(),
            "{span:?}"
        );
        assert_ne!(hex(&span.trace_id), TRACE, "linked, not a child");
        assert!(span.parent_span_id.is_empty(), "{span:?}");
        assert_eq!(span.links.len(), 1, "{span:?}");
        assert_eq!(hex(&span.links[0].trace_id), TRACE);
        assert_eq!(span.links[0].span_id, send.span_id);
        let (trace_id, span_id) = ids_of(headers["traceparent"].to_str().unwrap());
        assert_eq!(trace_id, hex(&span.trace_id));
        assert_eq!(span_id, hex(&span.span_id));
        // Beside the Standard Webhooks headers, byte for byte.
        assert!(headers.get("idempotency-key").is_some());
        assert_eq!(
            body["payload"],
            serde_json::from_str::<Value>(payload).unwrap()
        );
    }
    let (first, retry) = (&process[0], &process[1]);
    assert_eq!(
        attr_str(first, "messaging.delayq.outcome").as_deref(),
        Some("retry")
    );
    assert_eq!(
        first.status.as_ref().map(|s| s.code),
        Some(2),
        "error: {first:?}"
    );
    assert_eq!(
        attr_str(retry, "messaging.delayq.outcome").as_deref(),
        Some("success")
    );
    assert_ne!(first.trace_id, retry.trace_id);

    // After dispatch, dead-lettered too: the payload reads back byte for byte, the context
    // left out.
    let got = http
        .get(format!(
            "{}/v1/queues/{QUEUE}/messages/flaky-1",
            serve.base()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(got.contains(&format!(r#""payload":{payload}"#)), "{got}");
    assert_eq!(put(&http, &serve, "dead-1", &body, &traced).await, 201);
    let dead_url = format!("{}/v1/queues/{QUEUE}/dead", serve.base());
    wait_for("the dead letter", WAIT, || {
        let (http, url) = (http.clone(), dead_url.clone());
        async move {
            let text = http.get(url).send().await.unwrap().text().await.unwrap();
            text.contains("dead-1")
        }
    })
    .await;
    let dead = http
        .get(&dead_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(dead.contains(&format!(r#""payload":{payload}"#)), "{dead}");
    assert!(!dead.contains(TRACE), "{dead}");
    let c = collector.clone();
    wait_for("three process spans of the dead letter", WAIT, || {
        let n = c.about(&format!("process {QUEUE}"), "dead-1").len();
        async move { n == 3 }
    })
    .await;
    let last = collector
        .about(&format!("process {QUEUE}"), "dead-1")
        .into_iter()
        .find(|s| attr_int(s, "messaging.delayq.attempt") == Some(3))
        .unwrap();
    assert_eq!(
        attr_str(&last, "messaging.delayq.outcome").as_deref(),
        Some("dead")
    );
    assert_eq!(hex(&last.links[0].trace_id), TRACE);

    // JSON logs: every line an object; the failed attempt's warning carries its trace.
    let log = serve.log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["timestamp"].is_string())
    );
    let failed = lines
        .iter()
        .find(|l| l["message"] == "handler failed" && l["id"] == "\"flaky-1\"")
        .unwrap_or_else(|| panic!("no `handler failed` line:\n{log}"));
    assert_eq!(failed["trace_id"], hex(&first.trace_id), "{failed}");
    assert_eq!(failed["span_id"], hex(&first.span_id), "{failed}");
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test]
async fn with_consumer_span_parent_the_webhook_joins_the_producers_trace() {
    let redis = delayq::LocalRedis::start().unwrap();
    let collector = Collector::default();
    let hooks = Hooks::default();
    let otlp = collector.start().await;
    let hook = hooks.start().await;
    let cfg = config(&redis.url(), &otlp, &hook, "consumer_span = \"parent\"");
    let mut serve = Serve::start(&cfg, None);
    serve.wait_ready(WAIT).await;
    let http = http().await;
    let tp = traceparent();
    let body = r#"{"delay_ms": 0, "payload": {"order": 7}}"#;
    assert_eq!(
        put(&http, &serve, "o7", body, &[("traceparent", &tp)]).await,
        201
    );
    let h = hooks.clone();
    wait_for("the webhook call", WAIT, || {
        let n = h.calls_for("o7").len();
        async move { n == 1 }
    })
    .await;
    let c = collector.clone();
    wait_for("the send and process spans", WAIT, || {
        let ok = c.about(&format!("send {QUEUE}"), "o7").len() == 1
            && c.about(&format!("process {QUEUE}"), "o7").len() == 1;
        async move { ok }
    })
    .await;
    let send = collector.about(&format!("send {QUEUE}"), "o7").remove(0);
    let process = collector.about(&format!("process {QUEUE}"), "o7").remove(0);
    assert_eq!(hex(&process.trace_id), TRACE);
    assert_eq!(process.parent_span_id, send.span_id);
    assert!(process.links.is_empty(), "{process:?}");
    let (headers, _) = hooks.calls_for("o7").remove(0);
    let (trace_id, span_id) = ids_of(headers["traceparent"].to_str().unwrap());
    assert_eq!(
        trace_id, TRACE,
        "the same trace id as the PUT's traceparent"
    );
    assert_eq!(span_id, hex(&process.span_id));
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

#[tokio::test]
async fn a_collector_that_is_down_drops_spans_counted_and_never_delivery() {
    let redis = delayq::LocalRedis::start().unwrap();
    let hooks = Hooks::default();
    let hook = hooks.start().await;
    // Nothing listens there.
    let closed = format!("http://127.0.0.1:{}", support::serve::free_port());
    let cfg = config(&redis.url(), &closed, &hook, "max_queue = 256");
    let mut serve = Serve::start(&cfg, None);
    serve.wait_ready(WAIT).await;
    let http = http().await;
    let tp = traceparent();
    const ORDERS: usize = 5000;
    for batch in 0..5 {
        let messages: Vec<Value> = (0..ORDERS / 5)
            .map(|i| json!({"id": format!("o{batch}-{i}"), "delay_ms": 0, "payload": {"i": i}}))
            .collect();
        let r = http
            .post(format!("{}/v1/queues/{QUEUE}/messages:batch", serve.base()))
            .header("content-type", "application/json")
            .header("traceparent", &tp)
            .body(json!({ "messages": messages }).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let h = hooks.clone();
    wait_for("every order delivered", WAIT, || {
        let n = h.distinct();
        async move { n == ORDERS }
    })
    .await;
    // Spans were dropped, and counted: those the failed exports held at least.
    let metrics = format!("{}/metrics", serve.base());
    wait_for("failed exports counted", WAIT, || {
        let (http, metrics) = (http.clone(), metrics.clone());
        async move {
            let text = http
                .get(metrics)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            text.lines()
                .filter(|l| {
                    l.starts_with("delayq_trace_spans_dropped_total{reason=\"export_failed\"}")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
                > 0.0
        }
    })
    .await;
    wait_for("the failed export logged", WAIT, || {
        let logged = serve.log().contains("trace export failed");
        async move { logged }
    })
    .await;
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// Credentials in the endpoint URL (the configuration's, or `OTEL_EXPORTER_OTLP_ENDPOINT`)
/// reach the collector as an `Authorization: Basic` header (the URL stripped of them), and
/// never the logs, even at `RUST_LOG=trace`.
#[tokio::test]
async fn endpoint_credentials_reach_the_collector_as_basic_auth_and_never_the_logs() {
    for from_env in [false, true] {
        endpoint_credentials(from_env).await;
    }
}

async fn endpoint_credentials(from_env: bool) {
    use base64::Engine as _;
    const PASSWORD: &str = "s3cr3t+Pw";
    let redis = delayq::LocalRedis::start().unwrap();
    let collector = Collector::default();
    let hooks = Hooks::default();
    let otlp = collector.start().await;
    let hook = hooks.start().await;
    // `%40` is an `@` in the user name: sent decoded (and `+` as itself).
    let with_creds = otlp.replacen("http://", &format!("http://ops%40shop:{PASSWORD}@"), 1);
    let mut vars = vec![("RUST_LOG", Some("trace"))];
    let cfg = if from_env {
        vars.push(("OTEL_EXPORTER_OTLP_ENDPOINT", Some(&with_creds)));
        config(&redis.url(), "", &hook, "").replace("otlp_endpoint = \"\"", "")
    } else {
        config(&redis.url(), &with_creds, &hook, "")
    };
    let mut serve = Serve::start_with_vars(&cfg, &vars);
    serve.wait_ready(WAIT).await;
    let http = http().await;
    let tp = traceparent();
    let body = r#"{"delay_ms": 0, "payload": {}}"#;
    assert_eq!(
        put(&http, &serve, "authed", body, &[("traceparent", &tp)]).await,
        201
    );
    let c = collector.clone();
    wait_for("the process span of `authed`", WAIT, || {
        let n = c.about(&format!("process {QUEUE}"), "authed").len();
        async move { n >= 1 }
    })
    .await;
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("ops@shop:{PASSWORD}"))
    );
    let auth = collector.auth.lock().unwrap().clone();
    assert!(!auth.is_empty());
    for a in &auth {
        assert_eq!(
            a.as_deref(),
            Some(expected.as_str()),
            "from_env: {from_env}"
        );
    }
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
    let log = serve.log();
    // Trace level was on (the dependencies' lines are there), and the secret is not.
    assert!(log.contains("\"TRACE\""), "{}", &log[..log.len().min(4000)]);
    assert!(log.contains("exporting traces over OTLP/HTTP"), "{log}");
    for secret in ["s3cr3t", expected.trim_start_matches("Basic ")] {
        assert!(
            !log.contains(secret),
            "{secret} logged (from_env: {from_env})"
        );
    }
}

/// `delayq schedule` carries the caller's trace context from `TRACEPARENT` / `TRACESTATE`
/// (the OpenTelemetry convention for command-line tools) to the webhook; an invalid
/// `TRACEPARENT` is ignored with a warning naming it, as HTTP ignores an invalid header: the
/// order is scheduled with exactly the bytes it would have had without one.
#[tokio::test]
async fn delayq_schedule_takes_traceparent_from_the_environment_to_the_webhook() {
    let redis = delayq::LocalRedis::start().unwrap();
    let hooks = Hooks::default();
    let hook = hooks.start().await;
    // No exporter, text logs: the webhook gets the order's own context as it was stored.
    let cfg = format!(
        "redis_url = \"{}\"\n[http]\nlisten = \"127.0.0.1:{{port}}\"\n\
         [[handlers]]\nqueue = \"{QUEUE}\"\ngroup = \"close-order\"\nkind = \"webhook\"\n\
         url = \"{hook}\"\n",
        redis.url()
    );
    let mut serve = Serve::start(&cfg, None);
    serve.wait_ready(WAIT).await;
    let client = delayq::Client::connect(&redis.url()).await.unwrap();
    let cli = |id: &str, delay: &str, vars: &[(&str, &str)]| {
        let o = std::process::Command::new(support::serve::BIN)
            .args([
                "--redis-url",
                &redis.url(),
                "schedule",
                QUEUE,
                id,
                "--in",
                delay,
            ])
            .args(["--payload", r#"{"n":1}"#])
            .env_remove("DELAYQ_REDIS_URL")
            .env_remove("DELAYQ_NAMESPACE")
            .env_remove("TRACEPARENT")
            .env_remove("TRACESTATE")
            .env_remove("RUST_LOG")
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };

    let tp = traceparent();
    let (code, err) = cli(
        "cli-traced",
        "0s",
        &[("TRACEPARENT", &tp), ("TRACESTATE", "shop=checkout")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
    let h = hooks.clone();
    wait_for("the webhook of `cli-traced`", WAIT, || {
        let n = h.calls_for("cli-traced").len();
        async move { n >= 1 }
    })
    .await;
    let (headers, body) = hooks.calls_for("cli-traced").remove(0);
    assert_eq!(body["payload"], json!({"n": 1}));
    let got = headers.get("traceparent").unwrap().to_str().unwrap();
    assert_eq!(ids_of(got).0, TRACE, "{got}");
    assert_eq!(got, tp);
    assert_eq!(headers.get("tracestate").unwrap(), "shop=checkout");

    // Invalid: ignored with a warning that names the variable; stored as without context.
    for bad in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "garbage",
    ] {
        let (code, err) = cli("cli-bad", "1h", &[("TRACEPARENT", bad)]);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            err.contains("TRACEPARENT") && err.contains("ignored"),
            "{err}"
        );
        assert_plain(&stored(&client, "cli-bad").await, r#"{"n":1}"#);
    }
    // An invalid TRACESTATE alone is dropped, with a warning; the traceparent kept.
    let (code, err) = cli(
        "cli-state",
        "1h",
        &[("TRACEPARENT", &tp), ("TRACESTATE", "no members here")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("TRACESTATE"), "{err}");
    let raw = stored(&client, "cli-state").await;
    assert!(raw.ends_with(&format!("~{tp}~{{\"n\":1}}")), "{raw}");
    serve.sigterm();
    assert_eq!(serve.wait_exit(WAIT).await, Some(0));
}

/// The global subscriber of this test process: an OpenTelemetry layer exporting to memory.
fn memory_exporter() -> &'static opentelemetry_sdk::trace::InMemorySpanExporter {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::layer::SubscriberExt;
    static EXPORTER: std::sync::OnceLock<opentelemetry_sdk::trace::InMemorySpanExporter> =
        std::sync::OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::set_global_default(subscriber).unwrap();
        exporter
    })
}

#[tokio::test]
async fn a_library_producer_in_a_tracing_span_is_linked_from_the_workers_handler() {
    use delayq::engine::trace::{ConsumerSpan, TraceContext, set_consumer_span};
    use opentelemetry::trace::{SpanKind as Kind, TraceContextExt};
    use tracing::Instrument;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let exporter = memory_exporter();
    let (_redis, client) = support::start().await;
    let ctx_of = |span: &tracing::Span| span.context().span().span_context().clone();

    // The producer: a checkout request's span, the order scheduled inside it.
    let checkout = tracing::info_span!("checkout");
    let checkout_ctx = ctx_of(&checkout);
    client
        .schedule("q", "lib-1", Duration::ZERO, json!({"user": 42}))
        .instrument(checkout.clone())
        .await
        .unwrap();

    // The worker: its handler reports the span it runs in and the delivery's context.
    type Seen = (
        opentelemetry::trace::SpanContext,
        Option<TraceContext>,
        String,
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Seen>();
    let handler = move |d: delayq::Delivery| {
        let current = tracing::Span::current()
            .context()
            .span()
            .span_context()
            .clone();
        let _ = tx.send((current, d.trace.clone(), d.id.clone()));
        async { Ok(()) }
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let dispatcher =
        delayq::Dispatcher::new(&client, "q", delayq::DispatcherOptions::default()).unwrap();
    let d = tokio::spawn(dispatcher.run(stop.clone()));
    let worker =
        delayq::Worker::new(&client, "q", "g", handler, delayq::WorkerOptions::default()).unwrap();
    let w = tokio::spawn(worker.run(stop.clone()));
    let (running_in, stored, id) = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(id, "lib-1");

    // The send span: a PRODUCER child of the checkout span; its context is the stored one.
    let finished = |name: &str, pred: &dyn Fn(&opentelemetry_sdk::trace::SpanData) -> bool| {
        exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .find(|s| s.name == name && pred(s))
    };
    let send = finished("send q", &|_| true).expect("a send span");
    assert_eq!(send.span_kind, Kind::Producer);
    assert_eq!(send.span_context.trace_id(), checkout_ctx.trace_id());
    assert_eq!(send.parent_span_id, checkout_ctx.span_id());
    let stored = stored.expect("the delivery carries the producer's context");
    assert_eq!(
        stored.trace_id(),
        format!("{:032x}", checkout_ctx.trace_id())
    );
    assert_eq!(
        stored.span_id(),
        format!("{:016x}", send.span_context.span_id())
    );

    // The handler ran inside the process span: a new trace, linked to the send span.
    let process_id = running_in.span_id();
    let process = support::poll(WAIT, || {
        let s = finished("process q", &|s| s.span_context.span_id() == process_id);
        async move { s }
    })
    .await
    .expect("the process span the handler ran in");
    assert_eq!(process.span_kind, Kind::Consumer);
    assert_ne!(running_in.trace_id(), checkout_ctx.trace_id());
    let links: Vec<_> = process
        .links
        .iter()
        .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
        .collect();
    assert_eq!(
        links,
        vec![(send.span_context.trace_id(), send.span_context.span_id())]
    );
    let attr = |k: &str| {
        process
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == k)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attr("messaging.system").as_deref(), Some("delayq"));
    assert_eq!(attr("messaging.consumer.group.name").as_deref(), Some("g"));
    assert_eq!(attr("messaging.message.id").as_deref(), Some("lib-1"));
    assert_eq!(attr("messaging.delayq.attempt").as_deref(), Some("1"));

    // As a child instead: the handler runs in the checkout's trace.
    set_consumer_span(ConsumerSpan::Parent);
    let checkout = tracing::info_span!("checkout");
    let checkout_ctx = ctx_of(&checkout);
    client
        .schedule("q", "lib-2", Duration::ZERO, json!({"user": 43}))
        .instrument(checkout)
        .await
        .unwrap();
    let (running_in, _, id) = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    set_consumer_span(ConsumerSpan::Link);
    assert_eq!(id, "lib-2");
    assert_eq!(running_in.trace_id(), checkout_ctx.trace_id());
    stop.cancel();
    d.await.unwrap();
    w.await.unwrap().unwrap();
}

#[tokio::test]
async fn orders_without_context_store_exactly_the_bytes_they_always_had() {
    let (_redis, client) = support::start().await;
    let text = r#"{"n":123456789012345678901234567890}"#;
    let payload = delayq::Payload::from_json(text).unwrap();
    client
        .schedule(QUEUE, "one", Duration::from_secs(3600), payload.clone())
        .await
        .unwrap();
    let batch: Vec<delayq::NewOrder> = (0..3)
        .map(|i| delayq::NewOrder::new(format!("b{i}"), Duration::from_secs(3600), payload.clone()))
        .collect();
    client
        .schedule_many(QUEUE, &batch, delayq::Mode::Upsert)
        .await
        .unwrap();
    for id in ["one", "b0", "b1", "b2"] {
        assert_plain(&stored(&client, id).await, text);
        let got = client.get(QUEUE, id).await.unwrap().unwrap();
        assert_eq!(got.payload, serde_json::from_str::<Value>(text).unwrap());
    }
    // A context given explicitly is stored (as it is when no spans are recorded here) and
    // the payload still reads back byte for byte.
    let ctx = delayq::engine::trace::TraceContext::parse(&traceparent(), None).unwrap();
    client
        .schedule_with(
            QUEUE,
            delayq::NewOrder::new("given", Duration::from_secs(3600), payload.clone())
                .with_trace(ctx),
            delayq::Mode::Upsert,
        )
        .await
        .unwrap();
    let raw = stored(&client, "given").await;
    assert!(raw.ends_with(&format!("-01~{text}")), "{raw}");
    assert!(raw.contains(&format!(":~00-{TRACE}-")), "{raw}");
    let got = client.get(QUEUE, "given").await.unwrap().unwrap();
    assert_eq!(got.payload, serde_json::from_str::<Value>(text).unwrap());
}
