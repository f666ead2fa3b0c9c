//! What a schedule is: its spec (queue, id, cron or interval, time zone, payload, missed-tick
//! policy, window), how it is checked, its limits, and the id of each tick's order.

use super::spec::Recurrence;
use crate::engine::error::InvalidInput;
use crate::engine::keys::QueueName;
use crate::engine::message::{NewOrder, Payload, When};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A tick handled later than this after its instant counts as missed (see [`Missed`]).
pub const MISSED_AFTER: Duration = Duration::from_secs(1);
/// The most recurring schedules a namespace may have.
pub const MAX_SCHEDULES: usize = 100_000;
/// The most ticks a second a namespace's schedules may fire together, counting each
/// schedule at its highest rate (one tick per its shortest gap, paused ones too). A tick
/// costs Redis roughly 85–220 µs of CPU (issue 39's measure; docs/benchmarks.md's
/// `schedules` scenario), so the full budget is 0.1–0.2 of a Redis core, whatever the
/// number of schedules.
pub const MAX_FIRES_PER_SECOND: u64 = 1_000;
/// What one tick a second costs against [`MAX_FIRES_PER_SECOND`], in the unit schedules'
/// costs are stored and summed in (millionths of a tick a second: a schedule firing every
/// second costs 1,000,000, every minute 16,667, every hour 278).
pub const COST_PER_FIRE_PER_SECOND: u64 = 1_000_000;
/// Longest schedule id, bytes.
pub const MAX_SCHEDULE_ID_LEN: usize = 128;
/// The latest `start` or `end` accepted: 9999-12-31T23:59:59.999Z, unix ms.
pub const MAX_WINDOW_MS: i64 = 253_402_300_799_999;
/// How many upcoming fire times [`Schedules::get`](super::Schedules::get) shows.
pub const UPCOMING: usize = 5;
/// Schedules advanced per index read.
pub(super) const PASS_BATCH: isize = 500;

/// What to do with ticks that passed while no scheduler ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Deliver none of them; go on from the next instant after now (the default).
    #[default]
    Skip,
    /// Deliver one catch-up tick, then go on from the next instant after now.
    FireOnce,
}

impl Missed {
    /// From its name (`skip`, `fire_once`); the error names the field `missed`.
    pub fn parse(text: &str) -> std::result::Result<Missed, InvalidInput> {
        match text {
            "skip" => Ok(Missed::Skip),
            "fire_once" => Ok(Missed::FireOnce),
            other => Err(InvalidInput::Option {
                name: "missed",
                reason: format!("{other:?} is not a missed-tick policy (skip or fire_once)"),
            }),
        }
    }
}

/// A recurring schedule as declared: on `queue`, under `id`, a `cron` expression or an
/// `every` interval (exactly one), in `timezone`, delivering `payload` at each tick.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleSpec {
    /// The queue its ticks go to (registered).
    pub queue: String,
    /// Its id: `[A-Za-z0-9._-]`, 1..=128 bytes; each tick's order id is `<id>@<instant ms>`.
    pub id: String,
    /// A cron expression (six fields with seconds first, or the classic five).
    pub cron: Option<String>,
    /// An interval (`30s`, `5m`, `1h`; at least 1 s), ticks aligned to the Unix epoch (or to
    /// `start_ms`).
    pub every: Option<String>,
    /// An IANA time zone for the cron fields (default `UTC`).
    pub timezone: Option<String>,
    /// The payload every tick delivers.
    pub payload: Payload,
    /// No tick before this (unix ms).
    pub start_ms: Option<i64>,
    /// No tick after this (unix ms).
    pub end_ms: Option<i64>,
    /// What to do with ticks that passed while no scheduler ran.
    pub missed: Missed,
    /// Paused: no tick is scheduled until it is resumed (ticks in between are neither
    /// delivered nor counted as missed).
    pub paused: bool,
}

impl ScheduleSpec {
    /// A cron schedule with the defaults (UTC, no window, `skip`).
    pub fn cron(queue: &str, id: &str, cron: &str, payload: impl Into<Payload>) -> Self {
        ScheduleSpec {
            queue: queue.into(),
            id: id.into(),
            cron: Some(cron.into()),
            every: None,
            timezone: None,
            payload: payload.into(),
            start_ms: None,
            end_ms: None,
            missed: Missed::Skip,
            paused: false,
        }
    }

    /// An interval schedule with the defaults.
    pub fn every(queue: &str, id: &str, every: &str, payload: impl Into<Payload>) -> Self {
        ScheduleSpec {
            every: Some(every.into()),
            cron: None,
            ..Self::cron(queue, id, "", payload)
        }
    }

    /// The same spec in `timezone`.
    pub fn timezone(mut self, tz: &str) -> Self {
        self.timezone = Some(tz.into());
        self
    }

    /// The same spec with a missed-tick policy.
    pub fn missed(mut self, m: Missed) -> Self {
        self.missed = m;
        self
    }

    /// The same spec, paused or not.
    pub fn paused(mut self, paused: bool) -> Self {
        self.paused = paused;
        self
    }

    /// The same spec within a window.
    pub fn window(mut self, start_ms: Option<i64>, end_ms: Option<i64>) -> Self {
        self.start_ms = start_ms;
        self.end_ms = end_ms;
        self
    }

    /// Checks everything but the queue's existence (the one place the rules are applied):
    /// the id, the recurrence, the payload (as an order's). Errors name the field.
    pub fn validate(&self, max_payload: usize) -> std::result::Result<Recurrence, InvalidInput> {
        QueueName::new(&self.queue)?;
        validate_schedule_id(&self.id)?;
        for (name, v) in [("start", self.start_ms), ("end", self.end_ms)] {
            if let Some(ms) = v
                && !(0..=MAX_WINDOW_MS).contains(&ms)
            {
                return Err(InvalidInput::Option {
                    name,
                    reason: format!("{ms} is not a unix ms time between 1970 and the year 9999"),
                });
            }
        }
        let rec = Recurrence::parse(
            self.cron.as_deref(),
            self.every.as_deref(),
            self.timezone.as_deref(),
            self.start_ms,
            self.end_ms,
        )?;
        // The payload as any order's (a tick far ahead stands for every tick).
        let probe = NewOrder::new(
            tick_id(&self.id, 0),
            When::AtMs(crate::engine::message::YEAR_2000_MS),
            self.payload.clone(),
        );
        probe.validate(crate::engine::message::YEAR_2000_MS, max_payload)?;
        Ok(rec)
    }
}

/// A schedule's cost against the namespace's budget ([`MAX_FIRES_PER_SECOND`]), in
/// millionths of a tick a second, rounded up (at least 1): its highest rate, one tick per
/// the shortest gap between its ticks.
pub fn schedule_cost(rec: &Recurrence, now_ms: i64) -> u64 {
    let per_second_ms = 1_000 * COST_PER_FIRE_PER_SECOND;
    rec.min_gap_ms(now_ms)
        .and_then(|gap| u64::try_from(gap).ok())
        .filter(|gap| *gap > 0)
        .map_or(1, |gap| per_second_ms.div_ceil(gap).max(1))
}

/// The first tick of `spec` after `now_ms`, or the error naming why it can never fire:
/// `end` (in the past, or before the first tick) or `cron` / `every` (no instant matches
/// within the 10 years searched, e.g. February 30th).
pub(super) fn first_tick(
    spec: &ScheduleSpec,
    rec: &Recurrence,
    now_ms: i64,
) -> std::result::Result<i64, InvalidInput> {
    if let Some(t) = rec.next_after(now_ms) {
        return Ok(t);
    }
    let field = if spec.cron.is_some() { "cron" } else { "every" };
    Err(match (spec.end_ms, rec.without_end().next_after(now_ms)) {
        (Some(end), _) if end <= now_ms => InvalidInput::Option {
            name: "end",
            reason: format!(
                "{end} is in the past (now is {now_ms}): the schedule would never fire"
            ),
        },
        (Some(end), Some(first)) => InvalidInput::Option {
            name: "end",
            reason: format!(
                "no tick falls before end ({end}; the first is at {first}): the schedule would never fire"
            ),
        },
        _ => InvalidInput::Option {
            name: field,
            reason: "no instant within the next 10 years matches: the schedule would never fire"
                .into(),
        },
    })
}

/// A schedule id: `[A-Za-z0-9._-]`, 1..=[`MAX_SCHEDULE_ID_LEN`] bytes (no `@`, which
/// separates it from the tick instant in order ids, and no `:`).
pub fn validate_schedule_id(id: &str) -> std::result::Result<(), InvalidInput> {
    let bad = |reason: String| InvalidInput::Option { name: "id", reason };
    if id.is_empty() || id.len() > MAX_SCHEDULE_ID_LEN {
        return Err(bad(format!(
            "a schedule id is 1..={MAX_SCHEDULE_ID_LEN} bytes"
        )));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(bad(format!(
            "{id:?} holds {c:?}: a schedule id uses A-Z a-z 0-9 . _ - only"
        )));
    }
    Ok(())
}

/// A window bound (`start`, `end`) given as text: RFC 3339 with an offset or unix
/// milliseconds (the rules of an order's absolute due time, without its 10-years-ahead
/// limit); the error names `name`. The CLI and the config file read bounds with it.
pub fn parse_window_bound(
    name: &'static str,
    text: &str,
) -> std::result::Result<i64, InvalidInput> {
    let named = |e: InvalidInput| InvalidInput::Option {
        name,
        reason: match e {
            InvalidInput::DueTime { reason } => reason,
            other => other.to_string(),
        },
    };
    match When::parse_at(text).map_err(named)? {
        When::AtMs(ms) => Ok(ms),
        When::At(t) => Ok(t.timestamp_millis()),
        _ => Err(InvalidInput::Option {
            name,
            reason: format!("{text:?} is not an absolute time"),
        }),
    }
}

/// The order id of a schedule's tick: `<schedule id>@<instant ms>`.
pub fn tick_id(schedule: &str, instant_ms: i64) -> String {
    format!("{schedule}@{instant_ms}")
}
