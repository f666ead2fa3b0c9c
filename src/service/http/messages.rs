//! `/v1/queues/{queue}/messages...`: schedule (one or a batch), look up, cancel. Payloads
//! are taken as raw JSON and stored byte for byte.

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::engine::admin::history::OrderHistory;
use crate::engine::error::InvalidInput;
use crate::engine::message::{
    CancelOutcome, DueFields, Mode, NewOrder, Payload, ScheduleOutcome, Scheduled, When,
};
use crate::engine::priority::Priority;
use crate::engine::time_rules::Debounce;
use crate::engine::trace::TraceContext;
use crate::service::surface::{self, InQueue, Outcome};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// Parses a JSON body of the expected shape (400 `invalid_json` naming what is wrong).
pub(super) fn json_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<T> {
    let bytes =
        body.map_err(|_| ApiError::bad("invalid_body", "the request body could not be read"))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad("invalid_json", format!("invalid request body: {e}")))
}

/// One message: when it is due and its payload.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    delay_ms: Option<i64>,
    #[serde(default)]
    due_at: Option<Value>,
    /// A local wall-clock time without offset, in `timezone` ([`DueFields`]).
    #[serde(default)]
    at_local: Option<String>,
    /// The IANA time zone of `at_local`.
    #[serde(default)]
    timezone: Option<String>,
    /// Kept as the producer wrote it.
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    if_absent: bool,
    /// `high`, `normal` (default) or `low`; checked by [`Priority::from_json`] so a wrong
    /// value is named (serde's own message would not name the field).
    #[serde(default)]
    priority: Option<Value>,
    /// A duration (`"30m"`) or whole ms: see [`crate::engine::expiry`].
    #[serde(default)]
    expires_after: Option<Value>,
    /// Schedule it even if it was dispatched within the queue's dedup window.
    #[serde(default)]
    repeat: bool,
    /// A debounce instead of a due time ([`crate::engine::time_rules`]).
    #[serde(default)]
    debounce: Option<DebounceBody>,
    /// The order's tags ([`crate::engine::tags::from_json`] names the field when wrong).
    #[serde(default)]
    tags: Option<Value>,
    /// The order's key ([`crate::engine::order_key`]); taken as any JSON value so a wrong
    /// type is refused naming the field.
    #[serde(default)]
    key: Option<Value>,
    /// The order's own cancel-on-event rules ([`crate::engine::events::rules_from_json`]
    /// names the field when wrong).
    #[serde(default)]
    cancel_on: Option<Value>,
}

/// `debounce`: `{"delay_ms": ..., "max_wait_ms": ...}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DebounceBody {
    delay_ms: i64,
    max_wait_ms: i64,
}

impl MessageBody {
    /// The order this message asks for: its due time or debounce, payload, priority and
    /// `repeat`.
    fn order(&self, id: String) -> Result<NewOrder, InvalidInput> {
        let order = match &self.debounce {
            Some(d) => {
                if self.delay_ms.is_some()
                    || self.due_at.is_some()
                    || self.at_local.is_some()
                    || self.timezone.is_some()
                {
                    return Err(InvalidInput::Option {
                        name: "debounce",
                        reason: "a debounce is a due time of its own: give it without delay_ms, due_at or at_local".into(),
                    });
                }
                NewOrder::debounced(
                    id,
                    Debounce::from_ms(d.delay_ms, d.max_wait_ms)?,
                    self.payload(),
                )
            }
            None => NewOrder::new(id, self.when()?, self.payload()),
        };
        let order = match &self.tags {
            Some(t) => order.with_tags(crate::engine::tags::from_json(t)?),
            None => order,
        };
        let order = match &self.cancel_on {
            None | Some(Value::Null) => order,
            Some(v) => order.with_cancel_on(crate::engine::events::rules_from_json(v)?),
        };
        let order = self.expiring(order.with_priority(self.priority()?).repeat(self.repeat))?;
        self.keyed(order)
    }

    /// `order` with this message's `key`, if it has one (`null`: none); the key's rule is
    /// checked with the order ([`NewOrder`]'s validation).
    fn keyed(&self, order: NewOrder) -> Result<NewOrder, InvalidInput> {
        match &self.key {
            None | Some(Value::Null) => Ok(order),
            Some(Value::String(k)) => Ok(order.with_key(k.clone())),
            Some(_) => Err(InvalidInput::Option {
                name: crate::engine::order_key::FIELD,
                reason: "must be a string".into(),
            }),
        }
    }

    fn priority(&self) -> Result<Priority, InvalidInput> {
        self.priority
            .as_ref()
            .map_or(Ok(Priority::Normal), Priority::from_json)
    }

    fn when(&self) -> Result<When, InvalidInput> {
        let number;
        let due_at = match &self.due_at {
            None => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(Value::Number(n)) => {
                number = n.to_string();
                Some(number.as_str())
            }
            Some(_) => {
                return Err(InvalidInput::DueTime {
                    reason: "due_at must be an RFC 3339 string or unix milliseconds".into(),
                });
            }
        };
        DueFields {
            delay_ms: self.delay_ms,
            due_at,
            at_local: self.at_local.as_deref(),
            timezone: self.timezone.as_deref(),
        }
        .when()
    }

    /// `order` with this message's `expires_after`, if it has one.
    fn expiring(&self, order: NewOrder) -> Result<NewOrder, InvalidInput> {
        Ok(match &self.expires_after {
            Some(v) => NewOrder {
                expires_after_ms: Some(crate::engine::expiry::from_json(v)?),
                ..order
            },
            None => order,
        })
    }

    fn payload(&self) -> Payload {
        self.payload
            .as_deref()
            .map_or_else(|| Payload::from_value(&Value::Null), Payload::from_raw)
    }
}

/// The W3C trace context of a request (`traceparent`, `tracestate`): the orders it schedules
/// store it (see [`crate::engine::trace`]). An invalid `traceparent` is ignored, as the W3C
/// says, never an error; several `tracestate` headers are one list.
fn trace_of(headers: &HeaderMap) -> Option<TraceContext> {
    let parent = headers.get("traceparent")?.to_str().ok()?;
    let mut state: Option<String> = None;
    for v in headers.get_all("tracestate") {
        let Ok(v) = v.to_str() else { continue };
        state = Some(match state {
            Some(s) => format!("{s},{v}"),
            None => v.to_owned(),
        });
    }
    TraceContext::parse(parent, state.as_deref())
}

/// `order` in the request's trace context, if it has one.
fn traced(order: NewOrder, trace: Option<&TraceContext>) -> NewOrder {
    match trace {
        Some(t) => order.with_trace(t.clone()),
        None => order,
    }
}

fn mode(if_absent: bool) -> Mode {
    if if_absent {
        Mode::IfAbsent
    } else {
        Mode::Upsert
    }
}

pub(super) async fn put_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: MessageBody = json_body(body)?;
    if b.id.is_some() {
        return Err(ApiError::bad(
            "invalid_body",
            "the id goes in the path, not the body",
        ));
    }
    let order = traced(b.order(id)?, trace_of(&headers).as_ref());
    let value = st
        .client
        .schedule_with(&queue, order, mode(b.if_absent))
        .await?;
    let status = if value.outcome == ScheduleOutcome::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(InQueue {
            queue: &queue,
            value,
        }),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    /// Parsed one by one, so an error names the message's index.
    messages: Vec<Box<RawValue>>,
    #[serde(default)]
    if_absent: bool,
}

/// serde_json's message without its " at line L column C" suffix (positions inside one
/// message of a batch mean nothing to the caller; the index does).
fn without_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

pub(super) async fn batch(
    State(st): State<AppState>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let b: BatchBody = json_body(body)?;
    let trace = trace_of(&headers);
    surface::check_batch_len(b.messages.len())?;
    let mut orders = Vec::with_capacity(b.messages.len());
    for (index, raw) in b.messages.iter().enumerate() {
        let in_batch = |e: InvalidInput| InvalidInput::InBatch {
            index,
            source: Box::new(e),
        };
        let m: MessageBody = serde_json::from_str(raw.get()).map_err(|e| {
            ApiError::bad(
                "invalid_json",
                format!("message {index}: {}", without_position(&e)),
            )
        })?;
        let id = m.id.clone().ok_or_else(|| {
            in_batch(InvalidInput::Id {
                reason: "missing".into(),
            })
        })?;
        if m.if_absent {
            return Err(in_batch(InvalidInput::Option {
                name: "if_absent",
                reason: "set if_absent for the whole batch, not per message".into(),
            })
            .into());
        }
        orders.push(traced(m.order(id).map_err(in_batch)?, trace.as_ref()));
    }
    let results = surface::schedule_batch(&st.client, &queue, &orders, mode(b.if_absent)).await?;
    Ok(Json(BatchAnswer {
        results: results
            .into_iter()
            .map(|value| InQueue {
                queue: &queue,
                value,
            })
            .collect(),
    })
    .into_response())
}

/// A batch's answer: one result per message, in order (the HTTP API's envelope).
#[derive(Debug, Serialize)]
struct BatchAnswer<'a> {
    results: Vec<InQueue<'a, Scheduled>>,
}

pub(super) async fn get_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<OrderHistory>> {
    match st.client.admin().history(&queue, &id).await? {
        Some(o) => Ok(Json(o)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such order: never scheduled, cancelled, or dispatched longer ago than the history retention",
        )),
    }
}

pub(super) async fn delete_message(
    State(st): State<AppState>,
    Path((queue, id)): Path<(String, String)>,
) -> ApiResult<Json<Outcome<CancelOutcome>>> {
    match st.client.cancel(&queue, &id).await? {
        outcome @ CancelOutcome::Cancelled => Ok(Json(Outcome { outcome })),
        CancelOutcome::NotFound => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "the order is not scheduled (never, cancelled, or already dispatched)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requests_trace_context_is_read_and_a_bad_one_ignored() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = HeaderMap::new();
        assert!(trace_of(&h).is_none());
        h.insert("traceparent", tp.parse().unwrap());
        h.append("tracestate", "a=1".parse().unwrap());
        h.append("tracestate", "b=2".parse().unwrap());
        let t = trace_of(&h).unwrap();
        assert_eq!((t.traceparent(), t.tracestate()), (tp, Some("a=1,b=2")));
        h.insert("traceparent", "00-zz-00f067aa0ba902b7-01".parse().unwrap());
        assert!(trace_of(&h).is_none());
    }

    #[test]
    fn positions_are_dropped_from_batch_errors() {
        let e = serde_json::from_str::<MessageBody>(r#"{"bogus": 1}"#).unwrap_err();
        let m = without_position(&e);
        assert!(m.starts_with("unknown field `bogus`"), "{m}");
        assert!(!m.contains("line"), "{m}");
    }
}
