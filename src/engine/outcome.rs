//! What a write did: one order's scheduling, a batch's items, a cancel or a reschedule, and
//! whether a failed write may have been applied. Plain data, shared by the producer API, the
//! errors that report a partly written batch, and every surface that prints them; it imports
//! nothing of the engine.

use serde::{Deserialize, Serialize};

/// What scheduling one order did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleOutcome {
    /// The id was not scheduled; now it is.
    Created,
    /// The id was scheduled; its due time and payload were replaced.
    Updated,
    /// The id was scheduled and `IfAbsent` left it as it was.
    Unchanged,
    /// The id is not waiting and was dispatched within the queue's dedup window: nothing
    /// was written (see [`crate::engine::time_rules`]; `repeat` schedules it again).
    Duplicate,
    /// A cancel-on-event rule matched an event that arrived before, within its `remember`
    /// window: nothing was written and the order never fires (see
    /// [`crate::engine::events`]).
    CancelledByEvent,
}

/// The result of scheduling one order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scheduled {
    /// The order id.
    pub id: String,
    /// The due time, unix ms: the requested one (a debounced order's as capped by its
    /// `max_wait`). With `Unchanged` or `Duplicate`, the stored due time may differ: see
    /// [`Client::get`](crate::Client::get).
    pub due_at_ms: i64,
    /// What happened.
    pub outcome: ScheduleOutcome,
    /// With `Duplicate`: when the id was last dispatched, unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatched_at_ms: Option<i64>,
    /// With `CancelledByEvent`: the event's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

/// What happened to one order of a batch that failed part way
/// ([`Error::PartialBatch`](crate::Error::PartialBatch)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemOutcome {
    /// Written: it was not scheduled, now it is.
    Created,
    /// Written: its due time and payload were replaced.
    Updated,
    /// Left as it was (`IfAbsent`).
    Unchanged,
    /// Not written: dispatched within the queue's dedup window.
    Duplicate,
    /// Not written: an event that arrived first cancelled it.
    CancelledByEvent,
    /// Not written: Redis refused its call before writing anything (e.g. out of memory).
    NotWritten,
    /// May or may not have been written (its call timed out or lost its connection).
    Unknown,
}

impl From<ScheduleOutcome> for ItemOutcome {
    fn from(o: ScheduleOutcome) -> Self {
        match o {
            ScheduleOutcome::Created => ItemOutcome::Created,
            ScheduleOutcome::Updated => ItemOutcome::Updated,
            ScheduleOutcome::Unchanged => ItemOutcome::Unchanged,
            ScheduleOutcome::Duplicate => ItemOutcome::Duplicate,
            ScheduleOutcome::CancelledByEvent => ItemOutcome::CancelledByEvent,
        }
    }
}

/// One order of a batch that failed part way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchItem {
    /// The order id.
    pub id: String,
    /// What happened to it.
    pub outcome: ItemOutcome,
}

/// The result of `cancel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// It was scheduled and is now removed: it will not be delivered.
    Cancelled,
    /// It was never scheduled, was already cancelled, or was already dispatched.
    NotFound,
}

/// The result of `reschedule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RescheduleOutcome {
    /// The order now has the new due time (payload kept).
    Rescheduled,
    /// It was not scheduled (never, cancelled, or already dispatched).
    NotFound,
}

/// Whether a failed write may have been applied ([`Error::write_outcome`](crate::Error::write_outcome)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOutcome {
    /// Nothing was written.
    NotApplied,
    /// It may or may not have been written.
    Unknown,
}
