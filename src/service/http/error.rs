//! The error envelope, `{"error":{"code":"...","message":"..."}}`, and the one mapping from
//! library errors to status codes and codes. Internal details (Redis URLs, OS errors) are
//! logged (redacted), never returned.

use crate::engine::error::{Error, InvalidInput};
use crate::engine::outcome::WriteOutcome;
use crate::engine::redact;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An API error, rendered in the envelope.
#[derive(Debug)]
pub struct ApiError {
    pub(super) status: StatusCode,
    pub(super) code: &'static str,
    pub(super) message: String,
    /// A top-level field beside `error` (a partial batch's `results`).
    pub(super) extra: Option<(&'static str, Value)>,
}

impl ApiError {
    /// An error with `status`, a stable `code` and a human `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            extra: None,
        }
    }

    /// A 400.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The envelope of a response that arrived without one (a rejection by the framework,
    /// a timeout): the code follows from the status.
    pub(super) fn for_status(status: StatusCode, message: &str) -> Self {
        let code = match status.as_u16() {
            400 => "invalid_request",
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            405 => "method_not_allowed",
            408 => "request_timeout",
            413 => "body_too_large",
            414 => "uri_too_long",
            415 => "unsupported_media_type",
            422 => "invalid_body",
            431 => "headers_too_large",
            503 => "unavailable",
            s if s >= 500 => "internal",
            _ => "invalid_request",
        };
        let message = if message.trim().is_empty() {
            status.canonical_reason().unwrap_or("error").to_owned()
        } else {
            redact::error(message.trim())
        };
        Self::new(status, code, message)
    }
}

impl ApiError {
    /// The envelope's JSON.
    fn body(self) -> Value {
        let mut body = json!({"error": {"code": self.code, "message": self.message}});
        if let (Some((k, v)), Some(obj)) = (self.extra, body.as_object_mut()) {
            obj.insert(k.to_owned(), v);
        }
        body
    }

    /// The whole HTTP/1.1 response, closing the connection: what the accept loop writes
    /// itself for a request it refuses before the router sees it.
    pub(crate) fn wire_bytes(self) -> Vec<u8> {
        let status = self.status;
        let body = self.body().to_string();
        format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes()
    }
}

/// The `Retry-After` (seconds) of every 503: the condition is expected to pass (Redis
/// reachable again, a failover finished, a replica following the master), and a client
/// that honours it spreads its retries instead of hammering.
pub(crate) const RETRY_AFTER_SECS: u64 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut r = (status, Json(self.body())).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECS),
            );
        }
        r
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        ApiError::bad(e.code(), e.to_string())
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        match e {
            Error::Invalid(i) => i.into(),
            e @ Error::QueueNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "queue_not_found", e.to_string())
            }
            e @ Error::ShardMismatch { .. } => {
                ApiError::new(StatusCode::CONFLICT, "shard_mismatch", e.to_string())
            }
            e @ (Error::GroupNotFound { .. } | Error::GroupDeleted { .. }) => {
                ApiError::new(StatusCode::NOT_FOUND, "group_not_found", e.to_string())
            }
            e @ Error::GroupBusy { .. } => {
                ApiError::new(StatusCode::CONFLICT, "group_busy", e.to_string())
            }
            e @ Error::QueueNotEmpty { .. } => {
                let lag = match &e {
                    Error::QueueNotEmpty { lag, .. } => lag
                        .iter()
                        .map(|(g, n)| (g.clone(), serde_json::Value::from(*n)))
                        .collect::<serde_json::Map<_, _>>(),
                    _ => serde_json::Map::new(),
                };
                let mut a = ApiError::new(StatusCode::CONFLICT, "queue_not_empty", e.to_string());
                a.extra = Some(("lag", serde_json::Value::Object(lag)));
                a
            }
            e @ Error::TooManyQueues { .. } => {
                ApiError::new(StatusCode::CONFLICT, "too_many_queues", e.to_string())
            }
            e @ Error::TooManyGroups { .. } => {
                ApiError::new(StatusCode::CONFLICT, "too_many_groups", e.to_string())
            }
            e @ Error::TooManySchedules { .. } => {
                ApiError::new(StatusCode::CONFLICT, "too_many_schedules", e.to_string())
            }
            e @ Error::NotReplicated { .. } => {
                ApiError::new(unavailable, "not_replicated", e.to_string())
            }
            Error::PartialBatch { results, source } => {
                tracing::warn!(error = %redact::text(&source.to_string()), "batch partly written");
                let written = results.len();
                let mut a = ApiError::new(
                    unavailable,
                    "partial_write",
                    format!(
                        "the batch failed part way ({}); `results` says for each of the {written} \
                         messages whether it was written, not written, or may have been; \
                         repeating the batch is safe (scheduling by id is idempotent)",
                        short(&source)
                    ),
                );
                a.extra = Some(("results", serde_json::to_value(results).unwrap_or_default()));
                a
            }
            e if e.is_out_of_memory() => {
                tracing::warn!(error = %redact::text(&e.to_string()), "redis out of memory");
                ApiError::new(
                    unavailable,
                    "redis_oom",
                    "redis is out of memory (maxmemory reached); nothing was written; try again \
                     once memory is freed",
                )
            }
            e if matches!(e, Error::Redis { .. }) && e.write_outcome() == WriteOutcome::Unknown => {
                tracing::warn!(error = %redact::text(&e.to_string()), "redis did not answer");
                ApiError::new(
                    unavailable,
                    "outcome_unknown",
                    "redis did not answer in time (or the connection broke): a write may or may \
                     not have been applied; repeating the request is safe while the order waits \
                     (scheduling and cancelling by id are idempotent); once it may have been \
                     dispatched, a repeated schedule creates it again unless the queue has a \
                     dedup_window (then the answer is duplicate, with dispatched_at_ms)",
                )
            }
            e if e.is_transient() => {
                tracing::warn!(error = %redact::text(&e.to_string()), "redis unavailable");
                ApiError::new(
                    unavailable,
                    "redis_unavailable",
                    "redis is unavailable; nothing was written; try again",
                )
            }
            e => {
                tracing::error!(error = %redact::text(&e.to_string()), "request failed");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}

/// What went wrong, in a few words a client may see (no URL, no OS detail).
fn short(e: &Error) -> &'static str {
    if e.is_out_of_memory() {
        "redis is out of memory"
    } else if e.write_outcome() == WriteOutcome::Unknown {
        "redis did not answer in time"
    } else {
        "redis refused a write"
    }
}

/// A handler's result.
pub type ApiResult<T> = Result<T, ApiError>;
