//! Trace context carried through the queue: the producer's W3C Trace Context
//! (`traceparent`, `tracestate`) stored with an order and handed back with each delivery,
//! and, with the feature `otel`, the OpenTelemetry spans of the messaging semantic
//! conventions.
//!
//! **Stored form.** An order scheduled with a context keeps it at the front of its payload
//! value: `<enqueued_ms>:~<traceparent>[;<tracestate>]~<payload JSON>` (`~` can never start
//! a JSON text, so an order without context keeps exactly the bytes `<enqueued_ms>:<payload
//! JSON>` it always had). `enqueue.lua` writes the value as it is given, `dequeue.lua`
//! forwards it into the stream entry's `data` field, and retries, reclaims, dead letters and
//! replays re-read that entry: every delivery of the order carries the same context. The one
//! decoder is [`crate::engine::message`]'s `decode_stored`: `get`, the order history, dead
//! letters and deliveries all read the payload byte for byte, the context stripped.
//!
//! **Validation.** [`TraceContext::parse`] takes a `traceparent` only in the W3C form
//! `00-<32 hex>-<16 hex>-<2 hex>` (lower case, neither id all zeros); anything else gives
//! `None` and the order is scheduled without context, as the W3C recommends for an invalid
//! header (never an error). A `tracestate` over [`MAX_TRACESTATE_BYTES`], with a `~`, or
//! not a list of `key=value` members is dropped and the `traceparent` kept.
//!
//! **Spans** (feature `otel`, recorded through `tracing` with target `delayq::otel` and
//! exported by whatever `tracing-opentelemetry` layer the application installs; `delayq
//! serve` installs one when an OTLP endpoint is configured):
//!
//! - `send {queue}` (PRODUCER), around a schedule call whose orders have a context (given
//!   with [`NewOrder::with_trace`](crate::NewOrder::with_trace), or the caller's current
//!   span's): its context is the one stored.
//! - `process {queue}` (CONSUMER), around each delivery's handler: **linked** to the stored
//!   context by default (delays are minutes to days; a child would stretch the producer's
//!   trace over them), or its child with [`set_consumer_span`]`(`[`ConsumerSpan::Parent`]`)`.
//!   Attributes: `messaging.system` = `delayq`, `messaging.operation.type` = `process`,
//!   `messaging.destination.name`, `messaging.consumer.group.name`, `messaging.message.id`,
//!   `messaging.delayq.attempt`, `messaging.delayq.lateness_ms`,
//!   `messaging.delayq.entry_id`, `messaging.delayq.priority`, `messaging.delayq.outcome`.

#[cfg(feature = "otel")]
mod otel;
mod span;

pub(crate) use span::{Process, Producer, process_span, record_outcome};

use std::sync::atomic::{AtomicBool, Ordering};

/// The longest `tracestate` kept (bytes); a longer one is dropped (the W3C's own limit).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// The length of a version-00 `traceparent`.
const TRACEPARENT_LEN: usize = 55;

/// The span target every delayq span is recorded with: what an application's filters (and
/// `delayq serve`'s OTLP layer) select.
pub const SPAN_TARGET: &str = "delayq::otel";

/// A W3C trace context: a valid `traceparent` and, when one came with it and is valid, a
/// `tracestate`. Built by [`TraceContext::parse`] only, so every value is valid.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// `00-<trace id>-<parent id>-<flags>`, 55 bytes.
    traceparent: String,
    /// The vendors' list, if any (never empty, no `~`, at most 512 bytes).
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from the `traceparent` and `tracestate` header values. `None` when
    /// `traceparent` is not a valid version-00 header (W3C: the context is then ignored); an
    /// invalid `tracestate` alone is dropped.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        let traceparent = traceparent.trim_matches([' ', '\t']);
        if !valid_traceparent(traceparent) {
            return None;
        }
        let tracestate = tracestate
            .map(|s| s.trim_matches([' ', '\t']))
            .filter(|s| valid_tracestate(s))
            .map(str::to_owned);
        Some(TraceContext {
            traceparent: traceparent.to_owned(),
            tracestate,
        })
    }

    /// A context from its parts: ids in lower-case hex, `flags` the trace flags byte.
    /// `None` when an id is not valid (wrong length, not hex, all zeros).
    pub fn from_parts(
        trace_id: &str,
        span_id: &str,
        flags: u8,
        tracestate: Option<&str>,
    ) -> Option<TraceContext> {
        TraceContext::parse(&format!("00-{trace_id}-{span_id}-{flags:02x}"), tracestate)
    }

    /// The `traceparent` header value.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header value, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id: 32 lower-case hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The id of the span the context names (the producer's): 16 lower-case hex digits.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The trace flags byte.
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.traceparent[53..55], 16).unwrap_or(0)
    }

    /// Whether the producer sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags() & 1 == 1
    }

    /// The stored payload text: `~<traceparent>[;<tracestate>]~<json>`.
    pub(crate) fn encode(&self, json: &str) -> String {
        let state = self.tracestate.as_deref().map_or(0, |s| s.len() + 1);
        let mut out = String::with_capacity(TRACEPARENT_LEN + state + 2 + json.len());
        out.push('~');
        out.push_str(&self.traceparent);
        if let Some(s) = &self.tracestate {
            out.push(';');
            out.push_str(s);
        }
        out.push('~');
        out.push_str(json);
        out
    }
}

impl std::fmt::Display for TraceContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.traceparent)
    }
}

/// Splits the part of a stored value after `<enqueued_ms>:` into its context and its
/// payload text. A value that does not start with `~` has no context (returned whole); one
/// that does loses everything up to its second `~`, and the context in it is `None` when it
/// is not valid (written by hand). A `~` with no closing `~` is returned whole (it is not
/// valid JSON; the worker flags it).
pub(crate) fn split_stored(body: &str) -> (Option<TraceContext>, &str) {
    let Some(rest) = body.strip_prefix('~') else {
        return (None, body);
    };
    let Some(end) = rest.find('~') else {
        return (None, body);
    };
    let (ctx, json) = (&rest[..end], &rest[end + 1..]);
    let context = match ctx.split_once(';') {
        Some((parent, state)) => TraceContext::parse(parent, Some(state)),
        None => TraceContext::parse(ctx, None),
    };
    (context, json)
}

/// `00-<32 hex>-<16 hex>-<2 hex>`, lower case, neither id all zeros.
fn valid_traceparent(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != TRACEPARENT_LEN || !s.starts_with("00-") || b[35] != b'-' || b[52] != b'-' {
        return false;
    }
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    let zeros = |r: std::ops::Range<usize>| b[r].iter().all(|&c| c == b'0');
    hex(3..35) && hex(36..52) && hex(53..55) && !zeros(3..35) && !zeros(36..52)
}

/// A `tracestate` worth keeping: at most [`MAX_TRACESTATE_BYTES`], no `~` (the stored
/// form's delimiter), at most 32 members, each `key=value` with a key of `[a-z0-9_*/@-]`
/// (1..=256) and a value of printable ASCII without `,` and `=` (1..=256, not ending in a
/// space).
fn valid_tracestate(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_TRACESTATE_BYTES || s.contains('~') {
        return false;
    }
    let mut members = 0;
    for m in s.split(',') {
        let m = m.trim_matches([' ', '\t']);
        if m.is_empty() {
            continue;
        }
        members += 1;
        let Some((key, value)) = m.split_once('=') else {
            return false;
        };
        let key_ok = !key.is_empty()
            && key.len() <= 256
            && key
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/@".contains(&c));
        let value_ok = !value.is_empty()
            && value.len() <= 256
            && !value.ends_with(' ')
            && value
                .bytes()
                .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=');
        if !key_ok || !value_ok {
            return false;
        }
    }
    (1..=32).contains(&members)
}

/// How a delivery's `process` span relates to the context stored with its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ConsumerSpan {
    /// A new trace, with a link to the producer's span (the default: an order waits minutes
    /// to days, and a child span would stretch the producer's trace over that time).
    #[default]
    Link,
    /// A child of the producer's span, in its trace.
    Parent,
}

impl ConsumerSpan {
    /// From its configuration word: `link` or `parent`.
    pub fn parse(word: &str) -> Option<ConsumerSpan> {
        match word {
            "link" => Some(ConsumerSpan::Link),
            "parent" => Some(ConsumerSpan::Parent),
            _ => None,
        }
    }
}

static CONSUMER_PARENT: AtomicBool = AtomicBool::new(false);

/// Sets how this process's workers relate their `process` spans to the producer's context
/// (default [`ConsumerSpan::Link`]).
pub fn set_consumer_span(mode: ConsumerSpan) {
    CONSUMER_PARENT.store(mode == ConsumerSpan::Parent, Ordering::Relaxed);
}

/// How this process's workers relate their `process` spans to the producer's context.
pub fn consumer_span() -> ConsumerSpan {
    if CONSUMER_PARENT.load(Ordering::Relaxed) {
        ConsumerSpan::Parent
    } else {
        ConsumerSpan::Link
    }
}

/// The context of the caller's current span (its `tracing` span's OpenTelemetry context,
/// else the current OpenTelemetry context), when it is valid; always `None` without the
/// feature `otel`.
pub fn current() -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    {
        otel::current()
    }
    #[cfg(not(feature = "otel"))]
    {
        None
    }
}

/// The context to send downstream from inside a delivery (a webhook's `traceparent`): the
/// current span's ([`current`]) when there is one, else `stored`, the order's own (when no
/// spans are recorded, delayq passes the producer's context on as it is).
pub fn outgoing(stored: Option<&TraceContext>) -> Option<TraceContext> {
    current().or_else(|| stored.cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_validated_strictly() {
        let c = TraceContext::parse(TP, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.span_id(), "00f067aa0ba902b7");
        assert!(c.sampled());
        assert_eq!(c.tracestate(), Some("congo=t61rcWkgMzE"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01~",
        ] {
            assert!(TraceContext::parse(bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_tracestate_is_dropped_and_the_traceparent_kept() {
        let long = format!("a={}", "x".repeat(MAX_TRACESTATE_BYTES));
        for bad in [
            "a=b~c",
            "nokey",
            "=v",
            "A=b",
            "a=b,c",
            long.as_str(),
            "a=b=c",
            "",
        ] {
            let c = TraceContext::parse(TP, Some(bad)).unwrap();
            assert_eq!(c.tracestate(), None, "{bad:?}");
        }
        let c = TraceContext::parse(TP, Some("rojo=00f067aa0ba902b7, congo=t61;x")).unwrap();
        assert_eq!(c.tracestate(), Some("rojo=00f067aa0ba902b7, congo=t61;x"));
    }

    #[test]
    fn the_stored_form_round_trips_and_plain_payloads_are_untouched() {
        let c = TraceContext::parse(TP, Some("rojo=1;2")).unwrap();
        let stored = c.encode(r#"{"a":"~"}"#);
        assert_eq!(stored, format!("~{TP};rojo=1;2~{{\"a\":\"~\"}}"));
        assert_eq!(split_stored(&stored), (Some(c), r#"{"a":"~"}"#));
        let plain = TraceContext::parse(TP, None).unwrap();
        assert_eq!(split_stored(&plain.encode("1")), (Some(plain), "1"));
        assert_eq!(split_stored(r#"{"a":1}"#), (None, r#"{"a":1}"#));
        // Hand-written: the prefix goes, the context is not trusted.
        assert_eq!(split_stored("~garbage~[1]"), (None, "[1]"));
        assert_eq!(split_stored("~unterminated"), (None, "~unterminated"));
    }
}
