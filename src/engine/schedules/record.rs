//! A schedule as stored (its record HASH) and as reported (`ScheduleInfo`,
//! `ScheduleUpserted`).

use super::definition::Missed;
use super::spec::Recurrence;
use crate::engine::error::InvalidInput;
use crate::engine::message::Payload;
use serde::{Deserialize, Serialize};

/// The record's `spec` field (one JSON shape, written and read here only).
#[derive(Serialize, Deserialize)]
pub(super) struct Stored {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(super) cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(super) every: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(super) timezone: Option<String>,
    pub(super) payload: Box<serde_json::value::RawValue>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(super) start_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub(super) end_ms: Option<i64>,
    #[serde(default)]
    pub(super) missed: Missed,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) paused: bool,
}

/// A schedule as stored, with where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// The queue.
    pub queue: String,
    /// The id.
    pub id: String,
    /// The cron expression, if it is one.
    pub cron: Option<String>,
    /// The interval, if it is one.
    pub every: Option<String>,
    /// The time zone (`UTC` when none was given).
    pub timezone: String,
    /// The payload each tick delivers.
    pub payload: Payload,
    /// No tick before this (unix ms).
    pub start_ms: Option<i64>,
    /// No tick after this (unix ms).
    pub end_ms: Option<i64>,
    /// The missed-tick policy.
    pub missed: Missed,
    /// Paused: no tick is scheduled until it is resumed.
    pub paused: bool,
    /// The next tick (unix ms), already scheduled as an order; `None` once it has ended or
    /// while it is paused.
    pub next_ms: Option<i64>,
    /// The order id of the next tick.
    pub next_id: Option<String>,
    /// The tick that fired last (unix ms).
    pub last_fired_ms: Option<i64>,
    /// Ticks fired.
    pub ticks: u64,
    /// Ticks missed (no scheduler ran in time, policy `skip`, or passed over by `fire_once`).
    pub missed_ticks: u64,
    /// The next [`UPCOMING`](super::UPCOMING) fire times from now (unix ms).
    pub upcoming_ms: Vec<i64>,
    /// When it was first declared (unix ms).
    pub created_ms: i64,
    /// When it was last declared (unix ms).
    pub updated_ms: i64,
}

/// What [`Schedules::upsert`](super::Schedules::upsert) did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleUpserted {
    /// The queue.
    pub queue: String,
    /// The id.
    pub id: String,
    /// False when it existed (and was replaced).
    pub created: bool,
    /// Its next tick (unix ms), `None` when it never ticks again.
    pub next_ms: Option<i64>,
}

/// A record as read: the spec, the generation and the counters.
pub(super) struct Record {
    pub(super) spec: Stored,
    pub(super) generation: i64,
    pub(super) epoch: Option<String>,
    pub(super) next: Option<i64>,
    pub(super) last: Option<i64>,
    pub(super) ticks: u64,
    pub(super) missed: u64,
    pub(super) created_ms: i64,
    pub(super) updated_ms: i64,
}

impl Record {
    pub(super) fn parse(fields: std::collections::HashMap<String, String>) -> Option<Record> {
        let num = |k: &str| fields.get(k).and_then(|v| v.parse::<i64>().ok());
        Some(Record {
            spec: serde_json::from_str(fields.get("spec")?).ok()?,
            generation: num("gen")?,
            epoch: fields.get("epoch").filter(|e| !e.is_empty()).cloned(),
            next: num("next"),
            last: num("last"),
            ticks: num("ticks")
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0),
            missed: num("missed")
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0),
            created_ms: num("created_ms").unwrap_or(0),
            updated_ms: num("updated_ms").unwrap_or(0),
        })
    }

    pub(super) fn recurrence(&self) -> std::result::Result<Recurrence, InvalidInput> {
        let s = &self.spec;
        Recurrence::parse(
            s.cron.as_deref(),
            s.every.as_deref(),
            s.timezone.as_deref(),
            s.start_ms,
            s.end_ms,
        )
    }
}
