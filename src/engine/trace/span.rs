//! The spans of a schedule call (`send`, [`Producer`]) and of a delivery (`process`,
//! [`Process`]): recorded through `tracing`, with the OpenTelemetry attributes when the
//! feature `otel` is on, disabled (free) otherwise.

#[cfg(feature = "otel")]
use super::otel;
use super::{TraceContext, current};

/// What a schedule call records: its `send` span (disabled when nothing is traced or no
/// layer records it) and the context each traced order stores.
pub(crate) struct Producer {
    /// The `send {queue}` span.
    pub(crate) span: tracing::Span,
    /// The send span's context, when it has a valid one: stored in every traced order.
    context: Option<TraceContext>,
    /// The caller's current context: the orders without one of their own store it (or the
    /// send span's).
    ambient: Option<TraceContext>,
    /// Whether any order of the call is traced.
    traced: bool,
}

impl Producer {
    /// Starts the `send {queue}` span of a schedule call of `count` orders (`single`: the id,
    /// when it is one), when any of them is traced: `own` holds the orders' own contexts;
    /// else the caller's current one.
    pub(crate) fn start(
        queue: &str,
        count: usize,
        single: Option<&str>,
        own: Vec<&TraceContext>,
    ) -> Producer {
        let ambient = current();
        if ambient.is_none() && own.is_empty() {
            return Producer {
                span: tracing::Span::none(),
                context: None,
                ambient,
                traced: false,
            };
        }
        #[cfg(feature = "otel")]
        {
            let (span, context) = otel::send_span(queue, single, count, ambient.as_ref(), &own);
            Producer {
                span,
                context,
                ambient,
                traced: true,
            }
        }
        #[cfg(not(feature = "otel"))]
        {
            let _ = (queue, count, single);
            Producer {
                span: tracing::Span::none(),
                context: None,
                ambient,
                traced: true,
            }
        }
    }

    /// Whether any order of the call is traced (else nothing is stored or recorded).
    pub(crate) fn is_traced(&self) -> bool {
        self.traced
    }

    /// The context stored with an order whose own context is `own`: the send span's when
    /// the order is traced at all, else nothing.
    pub(crate) fn stored<'a>(&'a self, own: Option<&'a TraceContext>) -> Option<&'a TraceContext> {
        let traced = own.or(self.ambient.as_ref())?;
        Some(self.context.as_ref().unwrap_or(traced))
    }

    /// Marks the send span failed with `error` (redacted by the caller).
    pub(crate) fn failed(&self, error: &str) {
        if !self.span.is_disabled() {
            self.span.record("otel.status_code", "error");
            self.span.record("otel.status_description", error);
        }
    }
}

/// What the `process` span of a delivery says about it.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct Process<'a> {
    /// The queue.
    pub(crate) queue: &'a str,
    /// The consumer group.
    pub(crate) group: &'a str,
    /// The order id.
    pub(crate) id: &'a str,
    /// The stream entry id.
    pub(crate) entry_id: &'a str,
    /// The delivery's attempt, from 1.
    pub(crate) attempt: u32,
    /// How late the handler starts, ms (negative: early).
    pub(crate) lateness_ms: i64,
    /// The priority level's name.
    pub(crate) priority: &'static str,
    /// The context stored with the order.
    pub(crate) stored: Option<&'a TraceContext>,
}

/// The `process {queue}` span of one delivery: linked to (or a child of) the stored
/// context. Disabled (free) when no layer records `delayq::otel` spans, and always without
/// the feature `otel`.
pub(crate) fn process_span(p: &Process<'_>) -> tracing::Span {
    #[cfg(feature = "otel")]
    {
        otel::process_span(p)
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = p;
        tracing::Span::none()
    }
}

/// Records a delivery's outcome (`success`, `retry`, `dead`) on its process span, with the
/// error of a failure (credentials and query strings masked).
pub(crate) fn record_outcome(span: &tracing::Span, outcome: &'static str, error: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    span.record("messaging.delayq.outcome", outcome);
    if let Some(e) = error {
        span.record("otel.status_code", "error");
        span.record(
            "otel.status_description",
            crate::engine::redact::error(e).as_str(),
        );
        span.record("error.type", outcome);
    }
}
