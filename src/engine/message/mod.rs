//! What producers send: an order id, when it is due, and a JSON payload; and what they get back.

use crate::engine::error::InvalidInput;
use crate::engine::keys::validate_id;
use crate::engine::priority::Priority;
use crate::engine::trace::{self, TraceContext};
use serde::{Deserialize, Serialize};

mod due;

pub use due::{DueFields, MAX_AHEAD_MS, When, YEAR_2000_MS};

/// Deepest nesting of arrays and objects a payload may have, on every surface.
pub const MAX_PAYLOAD_DEPTH: usize = 64;

/// A JSON payload: one valid JSON value, kept as the text the producer sent, byte for byte
/// (numbers beyond 64-bit or double precision survive). Its size and depth are checked with
/// the order ([`NewOrder`]), on every surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload(String);

impl Payload {
    /// From a JSON value (serialized compactly).
    pub fn from_value(v: &serde_json::Value) -> Self {
        Payload(v.to_string())
    }

    /// From JSON text, kept byte for byte: refused unless it is exactly one valid JSON
    /// value.
    pub fn from_json(text: &str) -> Result<Self, InvalidInput> {
        serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| InvalidInput::Payload {
            reason: format!("not valid JSON: {e}"),
        })?;
        Ok(Payload(text.to_owned()))
    }

    /// From a raw JSON value (an HTTP body's field), byte for byte.
    pub fn from_raw(raw: &serde_json::value::RawValue) -> Self {
        Payload(raw.get().to_owned())
    }

    /// How deep arrays and objects nest in it (0 for a scalar).
    pub fn depth(&self) -> usize {
        json_depth(&self.0)
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true for a valid payload (the smallest JSON value is one byte); here for clippy.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Serialized as the JSON text itself, byte for byte (what every answer that carries a
/// payload uses: a dead letter's, an order's).
impl serde::Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::value::RawValue::from_string(self.0.clone()) {
            Ok(raw) => raw.serialize(s),
            Err(_) => s.serialize_str(&self.0),
        }
    }
}

impl Payload {
    /// The payload parsed (numbers beyond double precision lose digits; use
    /// [`as_str`](Payload::as_str) to keep them).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }
}

impl From<serde_json::Value> for Payload {
    fn from(v: serde_json::Value) -> Self {
        Payload::from_value(&v)
    }
}

impl From<&serde_json::Value> for Payload {
    fn from(v: &serde_json::Value) -> Self {
        Payload::from_value(v)
    }
}

/// One order to schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct NewOrder {
    /// The business id (e.g. the order number): 1..=256 bytes of UTF-8, no control characters.
    pub id: String,
    /// When it is due.
    pub when: When,
    /// Its payload.
    pub payload: Payload,
    /// Its priority level (default `normal`): see [`crate::engine::priority`].
    pub priority: Priority,
    /// The W3C trace context it is scheduled in, stored with it (see
    /// [`crate::engine::trace`]); `None` takes the caller's current span's, if any. Not
    /// counted in the payload's size.
    pub trace: Option<TraceContext>,
}

impl NewOrder {
    /// An order (priority `normal`).
    pub fn new(id: impl Into<String>, when: impl Into<When>, payload: impl Into<Payload>) -> Self {
        NewOrder {
            id: id.into(),
            when: when.into(),
            payload: payload.into(),
            priority: Priority::Normal,
            trace: None,
        }
    }

    /// The same order scheduled in trace context `trace` (e.g. a request's `traceparent`
    /// and `tracestate` headers, [`TraceContext::parse`]d).
    pub fn with_trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The same order with priority `priority`.
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Checks id, due time, payload size and depth (the one place, for every surface);
    /// returns the due time in unix ms.
    pub(crate) fn validate(&self, now_ms: i64, max_payload: usize) -> Result<i64, InvalidInput> {
        validate_id(&self.id)?;
        if self.payload.len() > max_payload {
            return Err(InvalidInput::PayloadTooLarge {
                size: self.payload.len(),
                limit: max_payload,
            });
        }
        let depth = self.payload.depth();
        if depth > MAX_PAYLOAD_DEPTH {
            return Err(InvalidInput::Payload {
                reason: format!(
                    "nested {depth} levels deep; at most {MAX_PAYLOAD_DEPTH} levels of arrays and objects"
                ),
            });
        }
        self.when.resolve(now_ms)
    }
}

/// How `schedule` treats an id that is already scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Replace its due time and payload (reschedule). The default.
    #[default]
    Upsert,
    /// Leave it untouched.
    IfAbsent,
}

pub use crate::engine::outcome::{
    BatchItem, CancelOutcome, ItemOutcome, RescheduleOutcome, ScheduleOutcome, Scheduled,
};

/// A scheduled order, as read back with `get`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledOrder {
    /// The order id.
    pub id: String,
    /// When it is due, unix ms.
    pub due_at_ms: i64,
    /// When it was (last) scheduled, unix ms; `None` when the stored value was written
    /// without the documented encoding.
    pub enqueued_at_ms: Option<i64>,
    /// Its payload (`null` when the payload entry is missing).
    pub payload: serde_json::Value,
    /// Its priority level.
    #[serde(default)]
    pub priority: Priority,
}

/// The deepest nesting of arrays and objects in JSON text (strings are skipped, escapes
/// honoured); linear, no recursion.
fn json_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_str, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_str {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// `text` as a raw JSON value, byte for byte when it is valid JSON; otherwise (a value a
/// foreign producer wrote) the text as a JSON string.
pub(crate) fn raw_json(text: &str) -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string(text.to_owned()).unwrap_or_else(|_| {
        serde_json::value::to_raw_value(text).unwrap_or_else(|_| {
            serde_json::value::RawValue::from_string("null".into()).unwrap_or_default()
        })
    })
}

/// Splits a stored payload value `"<enqueued_ms>:<json>"` into its parts; the trace
/// context of a traced order (`"<enqueued_ms>:~<traceparent>[;<tracestate>]~<json>"`, see
/// [`crate::engine::trace`]) is left out, so the payload reads back byte for byte.
pub(crate) fn decode_stored(raw: &str) -> (Option<i64>, &str) {
    let (ms, _, json) = decode_stored_traced(raw);
    (ms, json)
}

/// [`decode_stored`] with the order's trace context. A value without the `<ms>:` prefix is
/// returned whole, with no context.
pub(crate) fn decode_stored_traced(raw: &str) -> (Option<i64>, Option<TraceContext>, &str) {
    match raw.split_once(':') {
        Some((ms, rest)) => match ms.parse::<i64>() {
            Ok(ms) => {
                let (ctx, json) = trace::split_stored(rest);
                (Some(ms), ctx, json)
            }
            Err(_) => (None, None, raw),
        },
        None => (None, None, raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_depth() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#"{"a":[1,{"b":"]]]]{{"}]}"#), 3);
        assert_eq!(json_depth(r#"["\"[[["]"#), 1);
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        let o = NewOrder::new("o", When::in_ms(0), Payload::from_json(&deep).unwrap());
        assert!(matches!(
            o.validate(0, 1 << 20),
            Err(InvalidInput::Payload { .. })
        ));
        let ok = format!("{}{}", "[".repeat(64), "]".repeat(64));
        let o = NewOrder::new("o", When::in_ms(0), Payload::from_json(&ok).unwrap());
        assert!(o.validate(0, 1 << 20).is_ok());
        let big =
            r#"{"n":123456789012345678901234567890,"d":0.1000000000000000055511151231257827}"#;
        assert_eq!(Payload::from_json(big).unwrap().as_str(), big);
    }

    #[test]
    fn payloads() {
        assert!(Payload::from_json(r#"{"a":1}"#).is_ok());
        assert!(Payload::from_json("null").is_ok());
        assert!(Payload::from_json("{").is_err());
        assert!(Payload::from_json("1 2").is_err());
        assert!(Payload::from_json("").is_err());
    }

    #[test]
    fn stored_encoding() {
        assert_eq!(decode_stored("12:{\"a\":1}"), (Some(12), "{\"a\":1}"));
        assert_eq!(decode_stored("{\"a\":1}"), (None, "{\"a\":1}"));
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = format!("12:~{tp};k=v~{{\"a\":1}}");
        assert_eq!(decode_stored(&traced), (Some(12), "{\"a\":1}"));
        let (ms, ctx, json) = decode_stored_traced(&traced);
        assert_eq!((ms, json), (Some(12), "{\"a\":1}"));
        let ctx = ctx.unwrap();
        assert_eq!((ctx.traceparent(), ctx.tracestate()), (tp, Some("k=v")));
        // Only after the `<ms>:` prefix: a foreign value is left whole.
        assert_eq!(decode_stored_traced("~x~1"), (None, None, "~x~1"));
    }
}
