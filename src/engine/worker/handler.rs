//! What a handler sees and returns: [`Delivery`], [`Handler`], [`HandlerError`], the
//! outcome [`Hooks`] and the worker's counters.

use crate::engine::priority::Priority;
use crate::engine::trace::TraceContext;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// Why an order was delivered with something unusual about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryFlag {
    /// The payload entry was missing when the order was dispatched (the HASH was tampered
    /// with); the payload is `null`.
    PayloadMissing,
    /// The stored payload did not carry the `<enqueued_ms>:` prefix (written by a producer
    /// that does not follow ARCHITECTURE.md); the payload is the raw stored value.
    BadEncoding,
    /// The payload in the stream is not valid JSON; `payload` holds it as a JSON string.
    InvalidJson,
}

/// One order handed to a handler.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Delivery {
    /// The queue.
    pub queue: String,
    /// The consumer group (the business handler).
    pub group: String,
    /// The order id.
    pub id: String,
    /// The payload that was scheduled, parsed (numbers beyond `f64` lose precision here:
    /// see [`payload_text`](Delivery::payload_text)).
    pub payload: serde_json::Value,
    /// The payload's JSON text exactly as it was scheduled, byte for byte (the stored text
    /// itself when `flag` says it is not valid JSON).
    pub payload_text: String,
    /// When the order was due, unix ms.
    pub due_at_ms: i64,
    /// When it was (last) scheduled, unix ms, if known.
    pub enqueued_at_ms: Option<i64>,
    /// When the dispatcher moved it into the stream, unix ms (the stream entry id's time).
    pub dispatched_at_ms: i64,
    /// The stream entry id.
    pub entry_id: String,
    /// The shard the order lives in.
    pub shard: u16,
    /// The order's priority level (the lane it was read from).
    pub priority: Priority,
    /// Which delivery this is for this group, from 1.
    pub attempt: u32,
    /// Set when something about the order is unusual; it is delivered all the same.
    pub flag: Option<DeliveryFlag>,
    /// The W3C trace context the order was scheduled in, when it was scheduled in one
    /// (see [`crate::engine::trace`]): the same on every attempt, reclaim and replay.
    pub trace: Option<TraceContext>,
    /// The order's tags (see [`crate::engine::tags`]): the same on every attempt, reclaim
    /// and replay.
    pub tags: Vec<String>,
    /// The order's key (see [`crate::engine::order_key`]), when it has one: the same on
    /// every attempt, reclaim and replay.
    pub key: Option<String>,
}

impl Delivery {
    /// The order's tags, as scheduled (empty for an untagged order).
    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    /// The order's key, when it has one (see [`crate::engine::order_key`]).
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// A copy with what settling an entry needs (ids, shard, attempt, due time), without
    /// the payload: kept while the handler owns the delivery itself.
    pub(crate) fn settling_copy(&self) -> Delivery {
        Delivery {
            queue: String::new(),
            group: String::new(),
            id: self.id.clone(),
            payload: serde_json::Value::Null,
            payload_text: String::new(),
            due_at_ms: self.due_at_ms,
            enqueued_at_ms: self.enqueued_at_ms,
            dispatched_at_ms: self.dispatched_at_ms,
            entry_id: self.entry_id.clone(),
            shard: self.shard,
            priority: self.priority,
            attempt: self.attempt,
            flag: self.flag,
            trace: None,
            tags: Vec::new(),
            key: self.key.clone(),
        }
    }
}

/// How a handler failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Try again later (optionally not before `after`).
    #[error("retryable failure: {message}")]
    Retry {
        /// What went wrong.
        message: String,
        /// The handler's own wish for the next attempt's delay.
        after: Option<Duration>,
    },
    /// Will never succeed; do not retry.
    #[error("permanent failure: {message}")]
    Permanent {
        /// What went wrong.
        message: String,
    },
}

impl HandlerError {
    /// A retryable failure.
    pub fn retry(message: impl std::fmt::Display) -> Self {
        HandlerError::Retry {
            message: message.to_string(),
            after: None,
        }
    }

    /// A retryable failure with a delay of the handler's choosing.
    pub fn retry_after(message: impl std::fmt::Display, after: Duration) -> Self {
        HandlerError::Retry {
            message: message.to_string(),
            after: Some(after),
        }
    }

    /// A permanent failure.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        HandlerError::Permanent {
            message: message.to_string(),
        }
    }
}

/// What a handler returns.
pub type HandlerResult = std::result::Result<(), HandlerError>;

/// A business handler. Implemented for every `Fn(Delivery) -> impl Future<Output =
/// HandlerResult>`.
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery. Must be idempotent: delivery is at least once.
    fn handle(&self, delivery: Delivery) -> impl Future<Output = HandlerResult> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send,
{
    fn handle(&self, delivery: Delivery) -> impl Future<Output = HandlerResult> + Send {
        self(delivery)
    }
}

/// Callbacks on each outcome, so applications can log, alert or compensate. They run on the
/// worker's task: keep them short (spawn for slow work).
pub trait Hooks: Send + Sync + 'static {
    /// The handler succeeded.
    fn on_success(&self, _delivery: &Delivery) {}
    /// An attempt failed; `retry_in` is the delay before the next one (`None`: dead-lettered).
    fn on_failure(&self, _delivery: &Delivery, _error: &str, _retry_in: Option<Duration>) {}
    /// The order was moved to the dead-letter stream.
    fn on_dead(&self, _delivery: &Delivery, _error: &str) {}
}

impl<T: Hooks> Hooks for Arc<T> {
    fn on_success(&self, d: &Delivery) {
        (**self).on_success(d);
    }
    fn on_failure(&self, d: &Delivery, error: &str, retry_in: Option<Duration>) {
        (**self).on_failure(d, error, retry_in);
    }
    fn on_dead(&self, d: &Delivery, error: &str) {
        (**self).on_dead(d, error);
    }
}

/// Hooks that do nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// Counters of one worker, readable while it runs.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Handler calls that succeeded.
    pub succeeded: AtomicU64,
    /// Handler calls that returned an error.
    pub failed: AtomicU64,
    /// Handler calls that panicked.
    pub panicked: AtomicU64,
    /// Handler calls that exceeded the timeout.
    pub timed_out: AtomicU64,
    /// Entries acknowledged.
    pub acked: AtomicU64,
    /// Retries scheduled.
    pub retried: AtomicU64,
    /// Entries moved to the dead-letter stream.
    pub dead_lettered: AtomicU64,
    /// Entries claimed from the timers (retries that came due, or a dead consumer's entries).
    pub reclaimed: AtomicU64,
    /// Entries claimed from the timers that this worker still held (their lease extension
    /// failed for a while): the running copy keeps them, nothing is handled twice.
    pub reclaimed_own: AtomicU64,
    /// Acknowledgements of entries this worker no longer owned (another consumer reclaimed
    /// them after this one's lease ran out): counted, and nothing of them is left behind.
    pub late_acks: AtomicU64,
    /// Entries addressed to another group (dead-letter replays) acknowledged unhandled.
    pub skipped: AtomicU64,
    /// Entries not handed to the handler because they expired (`expires_after`): also
    /// counted in `dead_lettered`.
    pub expired: AtomicU64,
    /// Pull receives that found nothing and began to wait (`receive_wait`).
    pub waits: AtomicU64,
}
