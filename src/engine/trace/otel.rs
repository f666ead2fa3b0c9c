//! The OpenTelemetry side (feature `otel`): the current span's context, W3C contexts to and
//! from OpenTelemetry span contexts, and the `send` / `process` spans with their attributes.

use super::span::Process;
use super::{SPAN_TARGET, TraceContext};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The context of the current `tracing` span, else of the current OpenTelemetry
/// context.
pub(super) fn current() -> Option<TraceContext> {
    let span = tracing::Span::current();
    if !span.is_disabled()
        && let Some(c) = of_span_context(span.context().span().span_context())
    {
        return Some(c);
    }
    of_span_context(opentelemetry::Context::current().span().span_context())
}

/// A W3C context of an OpenTelemetry span context, when valid.
pub(super) fn of_span_context(sc: &SpanContext) -> Option<TraceContext> {
    if !sc.is_valid() {
        return None;
    }
    let state = sc.trace_state().header();
    TraceContext::from_parts(
        &format!("{:032x}", sc.trace_id()),
        &format!("{:016x}", sc.span_id()),
        sc.trace_flags().to_u8(),
        (!state.is_empty()).then_some(state.as_str()),
    )
}

/// The OpenTelemetry span context of a stored context (remote).
pub(super) fn to_span_context(c: &TraceContext) -> Option<SpanContext> {
    let trace_id = TraceId::from_hex(c.trace_id()).ok()?;
    let span_id = SpanId::from_hex(c.span_id()).ok()?;
    let state = c
        .tracestate()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(c.flags()),
        true,
        state,
    ))
}

/// The `send {queue}` span: a child of the caller's context (`ambient`), else of the
/// first order's own, linked to the other contexts the orders carry.
pub(super) fn send_span(
    queue: &str,
    single: Option<&str>,
    count: usize,
    ambient: Option<&TraceContext>,
    own: &[&TraceContext],
) -> (tracing::Span, Option<TraceContext>) {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        parent: None,
        "send",
        otel.name = tracing::field::Empty,
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        messaging.system = "delayq",
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = queue,
        messaging.message.id = single,
        messaging.batch.message_count = tracing::field::Empty,
    );
    if span.is_disabled() {
        return (span, None);
    }
    span.record("otel.name", format!("send {queue}").as_str());
    if single.is_none() {
        span.record(
            "messaging.batch.message_count",
            i64::try_from(count).unwrap_or(i64::MAX),
        );
    }
    let parent = ambient.or_else(|| own.first().copied());
    if let Some(sc) = parent.and_then(to_span_context) {
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
    }
    let mut linked: Vec<&TraceContext> = Vec::new();
    for c in own {
        if Some(*c) != parent && !linked.contains(c) && linked.len() < 32 {
            linked.push(c);
            if let Some(sc) = to_span_context(c) {
                span.add_link(sc);
            }
        }
    }
    let context = of_span_context(span.context().span().span_context());
    (span, context)
}

/// The `process {queue}` span of one delivery.
pub(super) fn process_span(p: &Process<'_>) -> tracing::Span {
    let span = tracing::info_span!(
        target: SPAN_TARGET,
        parent: None,
        "process",
        otel.name = tracing::field::Empty,
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        error.type = tracing::field::Empty,
        messaging.system = "delayq",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = p.queue,
        messaging.consumer.group.name = p.group,
        messaging.message.id = p.id,
        messaging.delayq.entry_id = p.entry_id,
        messaging.delayq.attempt = i64::from(p.attempt),
        messaging.delayq.lateness_ms = p.lateness_ms,
        messaging.delayq.priority = p.priority,
        messaging.delayq.outcome = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    span.record("otel.name", format!("process {}", p.queue).as_str());
    if let Some(sc) = p.stored.and_then(to_span_context) {
        match super::consumer_span() {
            super::ConsumerSpan::Parent => {
                let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(sc));
            }
            super::ConsumerSpan::Link => span.add_link(sc),
        }
    }
    span
}
