//! `[telemetry]`: OpenTelemetry trace export. The option type is the table: it
//! deserializes itself (`deny_unknown_fields`, its defaults, durations through
//! [`human`](crate::engine::duration::human)) and [`TelemetryOptions::validate`] checks
//! what serde cannot (URL shape, ranges, `max_batch` against `max_queue`), naming the key.

use crate::engine::error::InvalidInput;
use crate::engine::redact;
use crate::engine::trace::ConsumerSpan;
use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// `export_timeout`'s range.
const EXPORT_TIMEOUT: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(120));
/// `export_interval`'s range.
const EXPORT_INTERVAL: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(60));
/// `max_queue`'s upper bound.
const MAX_QUEUE: usize = 1_000_000;
/// `max_batch`'s upper bound (and default, when `max_queue` allows).
const MAX_BATCH: usize = 10_000;
/// `max_batch` when unset (at most `max_queue`).
const DEFAULT_BATCH: usize = 512;

/// `[telemetry]`: OpenTelemetry traces. Nothing is exported unless `otlp_endpoint` (or the
/// standard `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryOptions {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`; `/v1/traces` is
    /// appended, as for `OTEL_EXPORTER_OTLP_ENDPOINT`, which it overrides). A user name and
    /// password in it are sent as an `Authorization: Basic` header, never in the URL.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the spans (default: `OTEL_SERVICE_NAME`, else `delayq`).
    pub service_name: Option<String>,
    /// How a delivery's `process` span relates to the producer's: `link` (default: a new
    /// trace linked to it) or `parent` (a child in the producer's trace).
    #[serde(deserialize_with = "consumer_span")]
    pub consumer_span: ConsumerSpan,
    /// The longest one export may take, retries included (default `10s`, 100ms..=2m);
    /// spans it could not deliver are dropped and counted.
    #[serde(with = "crate::engine::duration::human")]
    pub export_timeout: Duration,
    /// How long finished spans wait to be exported together (default `1s`, 10ms..=1m).
    #[serde(with = "crate::engine::duration::human")]
    pub export_interval: Duration,
    /// Finished spans waiting for export at most (default 2048, 1..=1000000); beyond, new
    /// ones are dropped and counted (`delayq_trace_spans_dropped_total`), never waited for.
    pub max_queue: usize,
    /// Spans per export request at most (1..=10000 and at most `max_queue`; default 512,
    /// or `max_queue` when smaller).
    pub max_batch: Option<usize>,
}

impl Default for TelemetryOptions {
    fn default() -> Self {
        TelemetryOptions {
            otlp_endpoint: None,
            service_name: None,
            consumer_span: ConsumerSpan::Link,
            export_timeout: Duration::from_secs(10),
            export_interval: Duration::from_secs(1),
            max_queue: 2048,
            max_batch: None,
        }
    }
}

impl std::fmt::Debug for TelemetryOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryOptions")
            .field(
                "otlp_endpoint",
                &self.otlp_endpoint.as_deref().map(redact::url),
            )
            .field("service_name", &self.service_name)
            .field("consumer_span", &self.consumer_span)
            .field("export_timeout", &self.export_timeout)
            .field("export_interval", &self.export_interval)
            .field("max_queue", &self.max_queue)
            .field("max_batch", &self.export_batch())
            .finish()
    }
}

/// `consumer_span`: `link` or `parent`.
fn consumer_span<'de, D: Deserializer<'de>>(d: D) -> Result<ConsumerSpan, D::Error> {
    let word = String::deserialize(d)?;
    ConsumerSpan::parse(word.trim())
        .ok_or_else(|| serde::de::Error::custom(format!("{word:?} is not link or parent")))
}

fn bad(name: &'static str, reason: impl Into<String>) -> InvalidInput {
    InvalidInput::Option {
        name,
        reason: reason.into(),
    }
}

impl TelemetryOptions {
    /// Checks what serde cannot: the endpoint an http(s) URL without a query, the service
    /// name's length, the durations and sizes in range. The error names the key.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if let Some(url) = self.otlp_endpoint.as_deref().map(str::trim) {
            let parsed = reqwest::Url::parse(url)
                .ok()
                .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some());
            let Some(parsed) = parsed else {
                return Err(bad(
                    "otlp_endpoint",
                    format!(
                        "{} is not an http(s) URL (the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318)",
                        redact::url(url)
                    ),
                ));
            };
            if parsed.query().is_some() {
                return Err(bad(
                    "otlp_endpoint",
                    "must not have a query (headers go in OTEL_EXPORTER_OTLP_HEADERS)",
                ));
            }
        }
        if let Some(name) = self.service_name()
            && (name.is_empty() || name.len() > 255 || name.chars().any(char::is_control))
        {
            return Err(bad(
                "service_name",
                "must be 1..=255 bytes without control characters",
            ));
        }
        for (name, d, (lo, hi)) in [
            ("export_timeout", self.export_timeout, EXPORT_TIMEOUT),
            ("export_interval", self.export_interval, EXPORT_INTERVAL),
        ] {
            if d < lo || d > hi {
                use crate::engine::duration::format_duration as f;
                return Err(bad(name, format!("must be {}..={}", f(lo), f(hi))));
            }
        }
        if !(1..=MAX_QUEUE).contains(&self.max_queue) {
            return Err(bad("max_queue", format!("must be 1..={MAX_QUEUE}")));
        }
        if let Some(n) = self.max_batch
            && !(1..=self.max_queue.min(MAX_BATCH)).contains(&n)
        {
            return Err(bad(
                "max_batch",
                format!("must be 1..={MAX_BATCH} and at most max_queue"),
            ));
        }
        Ok(())
    }

    /// The OTLP/HTTP traces URL the configuration names (`<otlp_endpoint>/v1/traces`);
    /// `None`: the standard `OTEL_EXPORTER_OTLP_*` variables decide (nothing is exported
    /// when they name no endpoint either).
    pub fn traces_url(&self) -> Option<String> {
        let base = self.otlp_endpoint.as_deref()?.trim().trim_end_matches('/');
        Some(if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        })
    }

    /// `service.name`, when the configuration sets it.
    pub fn service_name(&self) -> Option<&str> {
        self.service_name.as_deref().map(str::trim)
    }

    /// Spans per export request: `max_batch`, else 512 or `max_queue` when smaller.
    pub fn export_batch(&self) -> usize {
        self.max_batch.unwrap_or(DEFAULT_BATCH.min(self.max_queue))
    }
}
