//! Logging and trace export of the `delayq` binary: plain text logs for every verb; for
//! `serve`, JSON logs on request (`log_format = "json"`, with `trace_id` / `span_id`) and
//! OpenTelemetry traces over OTLP/HTTP (protobuf) when an endpoint is configured.
//!
//! **Export never slows delivery.** A finished span goes into a bounded queue
//! ([`QueueProcessor`]: `max_queue` spans, never waited for; a full queue drops the span and
//! counts it); one task sends the queue in batches of `max_batch` every `export_interval`,
//! one request at a time, each bounded by `export_timeout` (retries included). Spans a
//! batch could not deliver (collector down, refusing, too slow) are dropped and counted
//! too: `delayq_trace_spans_dropped_total{reason="queue_full" | "export_failed"}`, with a
//! warning at most once a minute.
//!
//! **What is exported:** the `delayq::otel` spans (`send`, `process`, `UPDATE orders`; see
//! [`crate::engine::trace`]) and, as their events, delayq's warnings inside them (a failed
//! handler, say). The standard variables apply: `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (when the configuration names no endpoint),
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` (and `_ARG`); `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn export off. A user name and password in the endpoint
//! URL go to the collector as an `Authorization: Basic` header; the URL the HTTP stack
//! holds (and logs at debug and trace level) has none.
//!
//! **Why not the library ones:** opentelemetry_sdk's `BatchSpanProcessor` keeps its count
//! of dropped spans private (one log line, another at shutdown) and counts no failed export,
//! so it could not feed `delayq_trace_spans_dropped_total`; `tracing-subscriber`'s `json`
//! format cannot put the current OpenTelemetry `trace_id` / `span_id` on a line (they live
//! in the span's OpenTelemetry context, not in a `tracing` field).

use crate::engine::trace::SPAN_TARGET;
use crate::service::config::{LogFormat, TelemetryOptions};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter, SpanProcessor};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterExt, Targets, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// What a verb logs when `RUST_LOG` is not set: warnings and errors only (a verb's output
/// is on stdout).
const VERB_LEVEL: &str = "warn";

/// What `serve` logs when `RUST_LOG` is not set: delayq's own lines from `info` (where it
/// listens, its Redis target masked, the queues it serves, dispatchers and workers starting
/// and stopping), the dependencies' warnings and errors only.
const SERVE_LEVEL: &str = "warn,delayq=info";

/// The log filter: `RUST_LOG`, else `default`.
fn env_filter(default: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
}

/// Colours only on a terminal: a log file or collector gets plain text.
fn ansi() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
}

/// Plain text logs on stderr, for every verb but `serve` (and for `serve` until its
/// configuration is read).
pub(crate) fn init_plain() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(env_filter(VERB_LEVEL))
        .with_writer(std::io::stderr)
        .with_ansi(ansi())
        .try_init();
}

/// A layer of the process's subscriber.
type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// What `serve`'s telemetry holds until shutdown: the tracer provider and the export task.
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
    export: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
}

impl Telemetry {
    /// Sends what is still queued (within `within`), then stops.
    pub(crate) async fn shutdown(self, within: Duration) {
        if let Some((stop, task)) = self.export {
            stop.cancel();
            if tokio::time::timeout(within, task).await.is_err() {
                tracing::warn!(
                    "trace export did not finish within {within:?}: the rest is dropped"
                );
            }
        }
        if let Some(p) = self.provider {
            let _ = p.shutdown();
        }
    }
}

/// Where traces go, if anywhere: the configuration's URL, else the standard variables.
enum Destination {
    /// The configured `<otlp_endpoint>/v1/traces`.
    Configured(String),
    /// The traces URL `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` names, by the standard's rule:
    /// the traces variable as it is, else the general one with `/v1/traces` appended.
    Environment(String),
}

fn env_set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn destination(t: &TelemetryOptions) -> Option<Destination> {
    let off =
        |name: &str, word: &str| env_set(name).is_some_and(|v| v.trim().eq_ignore_ascii_case(word));
    if off("OTEL_SDK_DISABLED", "true") || off("OTEL_TRACES_EXPORTER", "none") {
        return None;
    }
    if let Some(url) = t.traces_url() {
        return Some(Destination::Configured(url));
    }
    env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| {
            env_set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| {
                let base = base.trim();
                format!("{}/v1/traces", base.strip_suffix('/').unwrap_or(base))
            })
        })
        .map(Destination::Environment)
}

/// `url` without its user name and password, and the `Authorization` header value they
/// make (`Basic`, base64 of `user:password`, both percent-decoded). A collector behind basic
/// authentication gets them in the header, where HTTP sends them; the URL the HTTP stack
/// holds (and logs at debug and trace level) has none. A URL that does not parse is
/// returned as it is (the exporter refuses it).
fn split_credentials(url: &str) -> Result<(String, Option<String>), String> {
    use base64::Engine as _;
    let Ok(mut u) = reqwest::Url::parse(url.trim()) else {
        return Ok((url.to_owned(), None));
    };
    if u.username().is_empty() && u.password().is_none() {
        return Ok((url.to_owned(), None));
    }
    let user = userinfo_decode(u.username())?;
    let password = userinfo_decode(u.password().unwrap_or(""))?;
    let _ = u.set_username("");
    let _ = u.set_password(None);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    Ok((u.as_str().to_owned(), Some(format!("Basic {basic}"))))
}

/// Decodes the `%XX` escapes of a URL's user name or password (`+` is itself there).
fn userinfo_decode(s: &str) -> Result<String, String> {
    let bad = || "the OTLP endpoint's user name or password has a bad %-escape".to_owned();
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next().ok_or_else(bad)?, bytes.next().ok_or_else(bad)?];
            let hex = std::str::from_utf8(&hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Sets up `serve`'s logs and traces. Export only when an endpoint is configured; the
/// OpenTelemetry layer also when logs are JSON (their `trace_id` and `span_id` come from
/// it). Returns what to shut down at exit, or why the exporter could not be built.
pub(crate) fn init_serve(format: LogFormat, t: &TelemetryOptions) -> Result<Telemetry, String> {
    let dest = destination(t);
    let mut layers: Vec<BoxedLayer> = Vec::new();
    // delayq's spans are for the tracer, not for the log lines (which stay as they were).
    let not_ours = filter_fn(|m| !(m.is_span() && m.target() == SPAN_TARGET));
    layers.push(match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi())
            .with_filter(env_filter(SERVE_LEVEL).and(not_ours))
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .event_format(JsonLines)
            .with_writer(std::io::stderr)
            .with_filter(env_filter(SERVE_LEVEL).and(not_ours))
            .boxed(),
    });
    let mut telemetry = Telemetry {
        provider: None,
        export: None,
    };
    if dest.is_some() || format == LogFormat::Json {
        let resource = resource(t);
        let mut builder = SdkTracerProvider::builder().with_resource(resource.clone());
        let mut shown = None;
        if let Some(dest) = &dest {
            let (mut exporter, url) = exporter(dest, t)?;
            // The provider gives its resource to its processors; this one's exporter is
            // behind a queue, so it gets it here.
            exporter.set_resource(&resource);
            let (tx, rx) = mpsc::channel(t.max_queue);
            let stop = CancellationToken::new();
            let task = tokio::spawn(export_loop(
                rx,
                exporter,
                ExportOptions {
                    interval: t.export_interval,
                    max_batch: t.export_batch(),
                    timeout: t.export_timeout,
                    shown: url.clone(),
                },
                stop.clone(),
            ));
            telemetry.export = Some((stop, task));
            builder = builder.with_span_processor(QueueProcessor { tx });
            shown = Some(url);
            // The series exist from the start (0 until something is dropped).
            let _ = crate::service::metrics::handle();
            crate::engine::telemetry::trace_spans_dropped("queue_full", 0);
            crate::engine::telemetry::trace_spans_dropped("export_failed", 0);
        }
        let provider = builder.build();
        let tracer = provider.tracer("delayq");
        let selected = Targets::new()
            .with_target(SPAN_TARGET, tracing::Level::INFO)
            .with_target("delayq", tracing::Level::WARN);
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(selected)
                .boxed(),
        );
        telemetry.provider = Some(provider);
        tracing_subscriber::registry()
            .with(layers)
            .try_init()
            .map_err(|e| format!("setting up logging: {e}"))?;
        match shown {
            Some(url) => tracing::info!(endpoint = %url, "exporting traces over OTLP/HTTP"),
            None => tracing::debug!("trace ids for the JSON logs; no trace export"),
        }
    } else {
        tracing_subscriber::registry()
            .with(layers)
            .try_init()
            .map_err(|e| format!("setting up logging: {e}"))?;
    }
    if let Ok(p) = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL")
        && dest.is_some()
        && p.trim() != "http/protobuf"
    {
        tracing::warn!(
            protocol = %p,
            "OTEL_EXPORTER_OTLP_PROTOCOL is not http/protobuf: delayq exports over OTLP/HTTP with protobuf"
        );
    }
    Ok(telemetry)
}

/// The spans' resource: the standard variables (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`), `service.name` from the configuration or else `delayq`,
/// and `service.version`.
fn resource(t: &TelemetryOptions) -> opentelemetry_sdk::Resource {
    let name = t
        .service_name()
        .map(str::to_owned)
        .or_else(|| env_set("OTEL_SERVICE_NAME"))
        .unwrap_or_else(|| "delayq".into());
    opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

/// The OTLP/HTTP exporter for `dest` on a client of its own (every call bounded by
/// `export_timeout`, redirects never followed), and the URL as logs may show it.
fn exporter(
    dest: &Destination,
    t: &TelemetryOptions,
) -> Result<(opentelemetry_otlp::SpanExporter, String), String> {
    // https endpoints: TLS through rustls with the ring provider, as the webhooks.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(t.export_timeout)
        .connect_timeout(t.export_timeout.min(Duration::from_secs(5)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| {
            format!(
                "building the trace exporter's HTTP client: {}",
                e.without_url()
            )
        })?;
    let mut b = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(t.export_timeout)
        .with_http_client(http);
    let (Destination::Configured(url) | Destination::Environment(url)) = dest;
    let shown = crate::engine::redact::url(url);
    // The URL the exporter is given has no credentials; they travel as a header (one set
    // by OTEL_EXPORTER_OTLP_HEADERS wins).
    let (endpoint, auth) = split_credentials(url).map_err(|e| format!("telemetry: {e}"))?;
    b = b.with_endpoint(endpoint);
    if let Some(auth) = auth {
        b = b.with_headers([("authorization".to_owned(), auth)].into());
    }
    let exporter = b.build().map_err(|e| {
        format!(
            "telemetry: the OTLP exporter for {shown} could not be built: {}",
            crate::engine::redact::text(&e.to_string())
        )
    })?;
    Ok((exporter, shown))
}

/// Hands finished, sampled spans to the export task without ever waiting: a full queue
/// drops the span (counted).
#[derive(Debug)]
struct QueueProcessor {
    tx: mpsc::Sender<SpanData>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(span).is_err() {
            crate::engine::telemetry::trace_spans_dropped("queue_full", 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task's settings.
struct ExportOptions {
    interval: Duration,
    max_batch: usize,
    timeout: Duration,
    /// The endpoint as warnings show it (credentials and query masked).
    shown: String,
}

/// Sends the queued spans in batches until `stop`, then what is left (each export bounded
/// by the timeout); a failed batch is dropped and counted.
async fn export_loop(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: opentelemetry_otlp::SpanExporter,
    o: ExportOptions,
    stop: CancellationToken,
) {
    let mut warned: Option<tokio::time::Instant> = None;
    let mut buf: Vec<SpanData> = Vec::with_capacity(o.max_batch);
    loop {
        let first = tokio::select! {
            s = rx.recv() => s,
            _ = stop.cancelled() => None,
        };
        let Some(first) = first else { break };
        buf.push(first);
        let deadline = tokio::time::Instant::now() + o.interval;
        while buf.len() < o.max_batch {
            let room = o.max_batch - buf.len();
            tokio::select! {
                n = rx.recv_many(&mut buf, room) => if n == 0 { break },
                _ = tokio::time::sleep_until(deadline) => break,
                _ = stop.cancelled() => break,
            }
        }
        export(&exporter, std::mem::take(&mut buf), &o, &mut warned).await;
        if stop.is_cancelled() {
            break;
        }
    }
    // Shutdown: what is queued, in batches, then stop.
    loop {
        while buf.len() < o.max_batch {
            match rx.try_recv() {
                Ok(s) => buf.push(s),
                Err(_) => break,
            }
        }
        if buf.is_empty() {
            break;
        }
        export(&exporter, std::mem::take(&mut buf), &o, &mut warned).await;
    }
}

/// One export request; spans it could not deliver are dropped and counted, with a warning
/// at most once a minute.
async fn export(
    exporter: &opentelemetry_otlp::SpanExporter,
    batch: Vec<SpanData>,
    o: &ExportOptions,
    warned: &mut Option<tokio::time::Instant>,
) {
    let n = batch.len() as u64;
    // The exporter's own timeout bounds its retries; this one bounds everything else.
    let bound = o.timeout + Duration::from_secs(1);
    let failure = match tokio::time::timeout(bound, exporter.export(batch)).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => crate::engine::redact::text(&e.to_string()),
        Err(_) => format!("no answer within {bound:?}"),
    };
    crate::engine::telemetry::trace_spans_dropped("export_failed", n);
    let now = tokio::time::Instant::now();
    if warned.is_none_or(|at| now.duration_since(at) >= Duration::from_secs(60)) {
        *warned = Some(now);
        tracing::warn!(
            endpoint = %o.shown, spans = n, error = %failure,
            "trace export failed; its spans are dropped (counted in delayq_trace_spans_dropped_total)"
        );
    }
}

/// One JSON object per log line: `timestamp` (RFC 3339, UTC), `level`, `target`, the
/// message and the event's fields, and `trace_id` / `span_id` when the line is written
/// inside a traced span (a delivery's `process` span, a request's `send` span).
struct JsonLines;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut fields = JsonFields(serde_json::Map::new());
        event.record(&mut fields);
        let mut line = fields.0;
        let mut put = |k: &str, v: serde_json::Value| {
            line.insert(k.to_owned(), v);
        };
        put(
            "timestamp",
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into(),
        );
        put("level", meta.level().as_str().into());
        put("target", meta.target().into());
        if let Some(c) = crate::engine::trace::current() {
            put("trace_id", c.trace_id().into());
            put("span_id", c.span_id().into());
        }
        writeln!(writer, "{}", serde_json::Value::Object(line))
    }
}

/// An event's fields as JSON values (numbers and booleans as such, the rest as text).
struct JsonFields(serde_json::Map<String, serde_json::Value>);

impl JsonFields {
    fn put(&mut self, field: &tracing::field::Field, v: serde_json::Value) {
        self.0.insert(field.name().to_owned(), v);
    }
}

impl tracing::field::Visit for JsonFields {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.put(field, value.into());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.put(field, format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_credentials_become_a_basic_header_and_leave_the_url() {
        let (url, auth) =
            split_credentials("https://a%40b:p%2Bw+x%25@c.example:4318/v1/traces").unwrap();
        assert_eq!(url, "https://c.example:4318/v1/traces");
        // base64("a@b:p+w+x%")
        assert_eq!(auth.as_deref(), Some("Basic YUBiOnArdyt4JQ=="));
        let (url, auth) = split_credentials("http://token@c:4318/v1/traces").unwrap();
        assert_eq!(url, "http://c:4318/v1/traces");
        assert_eq!(auth.as_deref(), Some("Basic dG9rZW46"));
        let plain = "http://c:4318/v1/traces";
        assert_eq!(split_credentials(plain).unwrap(), (plain.to_owned(), None));
        let e = split_credentials("http://u:%zz@c:4318/v1/traces").unwrap_err();
        assert!(e.contains("%-escape") && !e.contains("zz"), "{e}");
    }

    #[test]
    fn json_lines_carry_the_fields_as_json() {
        use tracing_subscriber::fmt::MakeWriter;
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().map(|mut v| v.extend_from_slice(b)).ok();
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> MakeWriter<'a> for Buf {
            type Writer = Buf;
            fn make_writer(&'a self) -> Buf {
                self.clone()
            }
        }
        let buf = Buf::default();
        let sub = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .with_writer(buf.clone()),
        );
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(id = ?"o\"1", attempt = 3u32, ok = true, "handler failed");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(v["message"], "handler failed");
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["attempt"], 3);
        assert_eq!(v["ok"], true);
        assert_eq!(v["id"], "\"o\\\"1\"");
        assert!(v.get("trace_id").is_none(), "{v}");
    }
}
