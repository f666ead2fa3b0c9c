//! What producers send: an order id, when it is due, and a JSON payload; and what they get back.

use crate::engine::error::InvalidInput;
use crate::engine::keys::validate_id;
use crate::engine::priority::Priority;
use crate::engine::time_rules::{Debounce, DebounceState};
use crate::engine::trace::{self, TraceContext};
use serde::{Deserialize, Serialize};

pub use crate::engine::when::{DueFields, MAX_AHEAD_MS, When, YEAR_2000_MS};

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
    /// How long after its due time the order may still be handed to a group, in ms
    /// (`None`: the queue's default, if any); see [`crate::engine::expiry`].
    pub expires_after_ms: Option<i64>,
    /// Debounce: due at now + its delay, never later than the first call + its max wait
    /// (see [`crate::engine::time_rules`]); set with [`NewOrder::debounced`].
    pub debounce: Option<Debounce>,
    /// Schedule it even if it was dispatched within the queue's dedup window.
    pub repeat: bool,
    /// Its tags (see [`crate::engine::tags`]); an upsert replaces the set.
    pub tags: Vec<String>,
    /// Its key (see [`crate::engine::order_key`]): due orders are dispatched round robin
    /// between keys. `None`: no key (an upsert without a key removes the one it had).
    pub key: Option<String>,
    /// Its own cancel-on-event rules (see [`crate::engine::events`], "Order rules"):
    /// checked as a queue's, at most [`crate::engine::events::MAX_RULES`].
    pub cancel_on: Vec<crate::engine::events::CancelRule>,
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
            expires_after_ms: None,
            debounce: None,
            repeat: false,
            tags: Vec::new(),
            key: None,
            cancel_on: Vec::new(),
        }
    }

    /// The same order with its own cancel-on-event rules (replacing any it had): an event
    /// named by a rule whose data matches the payload on the rule's paths cancels it, as a
    /// queue's rules do (see [`crate::engine::events`]).
    pub fn with_cancel_on(mut self, rules: Vec<crate::engine::events::CancelRule>) -> Self {
        self.cancel_on = rules;
        self
    }

    /// The same order with tags `tags` (at most 10, each 1..=128 bytes without control
    /// characters; see [`crate::engine::tags`]).
    pub fn with_tags<T: Into<String>>(mut self, tags: impl IntoIterator<Item = T>) -> Self {
        self.tags = tags.into_iter().map(Into::into).collect();
        self
    }

    /// The same order with key `key` (1..=128 bytes, no control characters; see
    /// [`crate::engine::order_key`]).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The same order, not handed to a group later than `expires_after` past its due time
    /// (1 ms ..= 10 years; see [`crate::engine::expiry`]).
    pub fn with_expires_after(mut self, expires_after: std::time::Duration) -> Self {
        self.expires_after_ms = Some(crate::engine::duration::ms(expires_after));
        self
    }

    /// A debounced order: each call moves it to now + `debounce.delay`, payload replaced,
    /// but never later than the first call + `debounce.max_wait` (see
    /// [`crate::engine::time_rules`]).
    pub fn debounced(
        id: impl Into<String>,
        debounce: Debounce,
        payload: impl Into<Payload>,
    ) -> Self {
        let mut o = NewOrder::new(id, When::DelayMs(debounce.delay_ms()), payload);
        o.debounce = Some(debounce);
        o
    }

    /// The same order, scheduled even if it was dispatched within the queue's dedup window
    /// (`repeat = true`).
    pub fn repeat(mut self, repeat: bool) -> Self {
        self.repeat = repeat;
        self
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
        if let Some(d) = &self.debounce {
            d.validate()?;
            if self.when != When::DelayMs(d.delay_ms()) {
                return Err(InvalidInput::Option {
                    name: "debounce",
                    reason:
                        "a debounced order is due its delay after each call: give no other due time"
                            .into(),
                });
            }
        }
        let due = self.when.resolve(now_ms)?;
        if let Some(e) = self.expires_after_ms {
            crate::engine::expiry::check_ms(e)?;
        }
        crate::engine::tags::validate(&self.tags)?;
        if let Some(k) = &self.key {
            crate::engine::order_key::validate(k)?;
        }
        crate::engine::events::validate_rules(&self.cancel_on)?;
        Ok(due)
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
    /// A debounced order's first call and cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<DebounceState>,
    /// Its tags (none: left out of the JSON).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Its key (see [`crate::engine::order_key`]), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
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
    let (ms, _, ctx, json) = decode_stored_tagged(raw);
    (ms, ctx, json)
}

/// [`decode_stored_traced`] with the order's tags (see [`crate::engine::tags`]).
pub(crate) fn decode_stored_tagged(
    raw: &str,
) -> (Option<i64>, Vec<String>, Option<TraceContext>, &str) {
    match raw.split_once(':') {
        Some((ms, rest)) => match ms.parse::<i64>() {
            Ok(ms) => {
                let (_, rest) = crate::engine::expiry::split_stored(rest);
                let (_, rest) = crate::engine::order_key::split_stored(rest);
                let (tags, rest) = crate::engine::tags::split_stored(rest);
                let (ctx, json) = trace::split_stored(rest);
                (Some(ms), tags, ctx, json)
            }
            Err(_) => (None, Vec::new(), None, raw),
        },
        None => (None, Vec::new(), None, raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    #[test]
    fn parse_at_rules() {
        assert_eq!(
            When::parse_at("1795000000000").unwrap(),
            When::AtMs(1_795_000_000_000)
        );
        let e = When::parse_at("1795000000").unwrap_err();
        assert!(e.to_string().contains("seconds"), "{e}");
        let e = When::parse_at("2026-11-22T10:30:00").unwrap_err();
        assert!(e.to_string().contains("ambiguous"), "{e}");
        assert!(When::parse_at("2026-11-22T10:30:00Z").is_ok());
        assert!(When::parse_at("2026-11-22T10:30:00+01:00").is_ok());
        assert!(When::parse_at("tomorrow").is_err());
    }

    #[test]
    fn resolve_rules() {
        let now = 1_800_000_000_000;
        assert_eq!(When::in_ms(500).resolve(now), Ok(now + 500));
        assert!(matches!(
            When::in_ms(-1).resolve(now),
            Err(InvalidInput::Delay { .. })
        ));
        assert_eq!(When::at_ms(now - 10).resolve(now), Ok(now - 10));
        assert!(When::at_ms(-5).resolve(now).is_err());
        assert!(When::at_ms(now + MAX_AHEAD_MS + 1).resolve(now).is_err());
        assert!(When::at_ms(now + MAX_AHEAD_MS).resolve(now).is_ok());
        // A number of milliseconds before 2000 is seconds by mistake; a date-time is not.
        let e = When::at_ms(1_795_000_000).resolve(now).unwrap_err();
        assert!(e.to_string().contains("seconds"), "{e}");
        assert!(When::at_ms(0).resolve(now).is_err());
        assert!(When::at_ms(YEAR_2000_MS - 1).resolve(now).is_err());
        assert_eq!(When::at_ms(YEAR_2000_MS).resolve(now), Ok(YEAR_2000_MS));
        let t1990 = DateTime::from_timestamp_millis(631_152_000_000).unwrap();
        assert_eq!(When::from(t1990).resolve(now), Ok(631_152_000_000));
    }

    fn code_of_year0() -> &'static str {
        When::parse_local("0000-01-01T00:00", "UTC")
            .unwrap_err()
            .code()
    }

    #[test]
    fn local_times_resolve_with_the_schedules_rules() {
        let now = 1_800_000_000_000;
        let ms = |t: &str| DateTime::parse_from_rfc3339(t).unwrap().timestamp_millis();
        let at = |a: &str, z: &str| When::parse_local(a, z).and_then(|w| w.resolve(now));
        assert_eq!(
            at("2027-03-28T09:00", "Europe/Berlin"),
            Ok(ms("2027-03-28T07:00:00Z"))
        );
        // Spring forward: 02:30 does not exist, the end of the gap (03:00 CEST).
        assert_eq!(
            at("2027-03-28T02:30", "Europe/Berlin"),
            Ok(ms("2027-03-28T01:00:00Z"))
        );
        // Fall back: 02:30 happens twice, the first occurrence (CEST).
        assert_eq!(
            at("2027-10-31T02:30", "Europe/Berlin"),
            Ok(ms("2027-10-31T00:30:00Z"))
        );
        assert_eq!(
            at("2027-10-31T02:30:15.250", "europe/berlin"),
            Ok(ms("2027-10-31T00:30:15.250Z"))
        );
        // The library's constructor takes typed values; the same resolution.
        let naive = chrono::NaiveDate::from_ymd_opt(2027, 3, 28)
            .and_then(|d| d.and_hms_opt(2, 30, 0))
            .unwrap();
        assert_eq!(
            When::local(naive, chrono_tz::Europe::Berlin).resolve(now),
            Ok(ms("2027-03-28T01:00:00Z"))
        );
        assert_eq!(code_of_year0(), "invalid_local_time");
        let code = |a: &str, z: &str| at(a, z).unwrap_err().code();
        assert_eq!(code("2027-03-28T09:00", "Mars/Olympus"), "invalid_timezone");
        assert_eq!(code("2027-03-28T09:00", ""), "invalid_timezone");
        assert_eq!(
            code("2027-03-28T09:00Z", "Europe/Berlin"),
            "invalid_local_time"
        );
        assert_eq!(
            code("2027-03-28T09:00:00+01:00", "Europe/Berlin"),
            "invalid_local_time"
        );
        assert_eq!(
            code("2027-02-30T09:00", "Europe/Berlin"),
            "invalid_local_time"
        );
        assert_eq!(
            code("2027-03-28T09:00:60", "Europe/Berlin"),
            "invalid_local_time"
        );
        assert_eq!(
            code("2027-03-28 09:00", "Europe/Berlin"),
            "invalid_local_time"
        );
        assert_eq!(
            code("2040-03-28T09:00", "Europe/Berlin"),
            "invalid_due_time"
        );
        let e = at("2027-03-28T09:00Z", "UTC").unwrap_err().to_string();
        assert!(e.contains("at_local") && e.contains("offset"), "{e}");
        let f = |delay_ms, due_at, at_local, timezone| {
            DueFields {
                delay_ms,
                due_at,
                at_local,
                timezone,
            }
            .when()
            .map_err(|e| e.code())
        };
        assert_eq!(
            f(None, None, Some("2027-03-28T09:00"), None),
            Err("invalid_timezone")
        );
        assert_eq!(f(None, None, None, Some("UTC")), Err("invalid_timezone"));
        assert_eq!(
            f(Some(1), None, Some("2027-03-28T09:00"), Some("UTC")),
            Err("invalid_local_time")
        );
        assert_eq!(
            f(
                None,
                Some("1795000000000"),
                Some("2027-03-28T09:00"),
                Some("UTC")
            ),
            Err("invalid_local_time")
        );
        assert_eq!(f(None, None, None, None), Err("invalid_due_time"));
        assert_eq!(f(Some(5), None, None, None), Ok(When::in_ms(5)));
    }

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
        let tagged = format!("12:!5!\u{1d}a\u{1f}b\u{1d}~{tp}~{{\"a\":1}}");
        let (ms, ctx, json) = decode_stored_traced(&tagged);
        assert_eq!((ms, json, ctx.is_some()), (Some(12), "{\"a\":1}", true));
        // The key's prefix comes after the expiry's, before the trace context's.
        let keyed = format!("12:!500!\u{1e}m:17\u{1e}~{tp}~[1]");
        let (ms, ctx, json) = decode_stored_traced(&keyed);
        assert_eq!((ms, json), (Some(12), "[1]"));
        assert_eq!(ctx.unwrap().traceparent(), tp);
        // Only after the `<ms>:` prefix: a foreign value is left whole.
        assert_eq!(decode_stored_traced("~x~1"), (None, None, "~x~1"));
    }
}
