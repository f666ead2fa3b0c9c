//! Recurrences: when a recurring schedule ticks, as instants in Unix milliseconds.
//!
//! Pure computation (no Redis, no I/O): a [`Recurrence`] is parsed and validated once by
//! [`Recurrence::parse`] and then answers [`Recurrence::next_after`] and
//! [`Recurrence::upcoming`]. Each tick becomes an ordinary order elsewhere.
//!
//! # Cron expressions
//!
//! The syntax is the one tokio-cron-scheduler accepts, parsed by the same parser
//! ([`croner`]) configured the same way: six fields with seconds first
//! (`sec min hour day-of-month month day-of-week`, e.g. `0 30 2 * * *`); a seventh (year)
//! field is refused; day-of-month and day-of-week are combined with AND (`0 0 0 13 * FRI` is
//! Friday the 13th only), names (`MON`, `JAN`), `L`, `W`, `#`, `?` and `@daily`-style
//! nicknames work. In addition the classic five-field form (`min hour dom month dow`) is
//! accepted, meaning second 0.
//!
//! # Time zones and daylight saving
//!
//! Cron fields are evaluated in the local wall time of the schedule's IANA time zone (UTC
//! when none is given). Every local date-time matching the pattern is mapped to one
//! instant, the way cron users expect around daylight-saving transitions:
//!
//! - a local time that exists once is that instant;
//! - a local time that does not exist (the spring-forward gap, e.g. 02:30 on 2026-03-29 in
//!   Europe/Berlin) fires at the first instant after the gap (03:00 CEST = 01:00Z); all the
//!   nonexistent matches of one gap collapse into that single instant, which fires once
//!   (also when the first local time after the gap matches itself);
//! - a local time that happens twice (the fall-back overlap, e.g. 02:30 on 2026-10-25 in
//!   Europe/Berlin) fires once, at its first (earlier) occurrence; the repeated hour does
//!   not fire again.
//!
//! The pattern is therefore evaluated by croner over naive local date-times (in UTC, where
//! nothing is skipped or repeated) and each match is mapped to an instant here, rather than
//! relying on croner's own daylight-saving rules (which fire interval patterns twice in the
//! overlap and skip them in the gap). The mapping never goes backwards in time, so the ticks
//! are strictly increasing, each instant at most once.
//!
//! The search is bounded: a cron whose next match is more than [`MAX_DURATION`] (10 years,
//! the longest due time accepted anywhere) after the starting point, or that never matches
//! again, has ended ([`Recurrence::next_after`] returns `None`). Instants before year 1 or
//! after year 5000 (croner's range) have no cron ticks either.
//!
//! # Intervals
//!
//! `every` (e.g. `5m`, `1h30m`, at least [`MIN_INTERVAL`]) ticks at `anchor + k × interval`
//! for every integer `k`, where the anchor is the window's `start` when given and otherwise
//! the Unix epoch: `every = "5m"` fires at :00, :05, :10, … UTC like `*/5`, whatever the
//! moment the schedule was created. The time zone does not affect intervals (it is still
//! validated and kept).
//!
//! # Window
//!
//! An optional `start` and `end` (Unix milliseconds, both inclusive) bound the ticks: no
//! tick is ever before `start` or after `end`.

use crate::engine::duration::{MAX_DURATION, parse_duration};
use crate::engine::error::InvalidInput;
use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::{GapInfo, Tz};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use std::time::Duration;

/// The smallest interval accepted for `every`: one second.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// What the cron error message suggests.
const CRON_HINT: &str = "use 6 fields `sec min hour day-of-month month day-of-week` \
     (e.g. `0 30 2 * * *`) or the classic 5 fields `min hour day-of-month month day-of-week`";

/// How many upcoming ticks [`Recurrence::min_gap_ms`] examines for a cron.
pub const GAP_SAMPLE: usize = 256;

/// The longest cron expression accepted, bytes.
pub const MAX_CRON_LEN: usize = 256;

/// How many candidate local times one cron search examines at most before giving up.
/// Candidates are only passed over inside a fall-back overlap (at most one per second of
/// it), so this is far more than any real time zone needs.
const MAX_CANDIDATES: u32 = 200_000;

/// A validated recurrence: a cron expression in a time zone, or a fixed interval, with an
/// optional window.
#[derive(Debug, Clone)]
pub struct Recurrence {
    rule: Rule,
    tz: Tz,
    start_ms: Option<i64>,
    end_ms: Option<i64>,
}

/// The two kinds of recurrence.
#[derive(Debug, Clone)]
enum Rule {
    /// Local wall-clock times matching a cron pattern.
    Cron {
        /// The parsed pattern.
        cron: Box<Cron>,
        /// Whether its year field allows every year (`*`, or no year field).
        any_year: bool,
    },
    /// `anchor + k × interval_ms`.
    Every {
        /// The interval, at least [`MIN_INTERVAL`].
        interval_ms: i64,
    },
}

impl Recurrence {
    /// Parses and validates a recurrence.
    ///
    /// Exactly one of `cron` (see the [module documentation](self) for the syntax) and
    /// `every` (a duration such as `5m` or `1h30m`, at least [`MIN_INTERVAL`]) must be
    /// given. `timezone` is an IANA name such as `Europe/Berlin` (matched
    /// case-insensitively, kept in its canonical spelling); `None` means UTC. `start_ms`
    /// and `end_ms` optionally bound the ticks (both inclusive); `end_ms` must be after
    /// `start_ms`.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::Option`] naming the offending field: `cron` (neither or both of
    /// cron and every, or an invalid or empty expression), `every` (not a duration, or
    /// shorter than 1s), `timezone` (unknown zone) or `end` (not after `start`).
    pub fn parse(
        cron: Option<&str>,
        every: Option<&str>,
        timezone: Option<&str>,
        start_ms: Option<i64>,
        end_ms: Option<i64>,
    ) -> Result<Recurrence, InvalidInput> {
        let rule = match (cron, every) {
            (Some(expr), None) => {
                let cron = parse_cron(expr)?;
                Rule::Cron {
                    any_year: cron.pattern.years.is_all_set(),
                    cron: Box::new(cron),
                }
            }
            (None, Some(interval)) => Rule::Every {
                interval_ms: parse_every(interval)?,
            },
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "cron",
                    "both cron and every given: give exactly one of cron and every".into(),
                ));
            }
            (None, None) => {
                return Err(invalid(
                    "cron",
                    "neither cron nor every given: give exactly one of cron and every".into(),
                ));
            }
        };
        let tz = parse_timezone(timezone)?;
        if let (Some(start), Some(end)) = (start_ms, end_ms)
            && end <= start
        {
            return Err(invalid(
                "end",
                format!("end ({end}) must be after start ({start})"),
            ));
        }
        Ok(Recurrence {
            rule,
            tz,
            start_ms,
            end_ms,
        })
    }

    /// The first tick strictly after `after_ms` (Unix milliseconds), or `None` when the
    /// schedule has ended: the next tick would be after `end`, the cron never matches
    /// again (within the bounded search described in the [module documentation](self)),
    /// or the tick is not representable.
    ///
    /// Never returns a tick before `start` or after `end`; successive calls feeding the
    /// previous tick back in give strictly increasing instants.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        // Ticks at or after `start`, i.e. strictly after `start - 1`.
        let after = match self.start_ms {
            Some(start) => after_ms.max(start.saturating_sub(1)),
            None => after_ms,
        };
        let tick = match &self.rule {
            Rule::Every { interval_ms } => {
                next_interval_tick(after, self.start_ms.unwrap_or(0), *interval_ms)
            }
            Rule::Cron { cron, any_year } => next_cron_tick(cron, *any_year, self.tz, after),
        }?;
        match self.end_ms {
            Some(end) if tick > end => None,
            _ => Some(tick),
        }
    }

    /// The first `n` ticks strictly after `after_ms`, in increasing order; fewer when the
    /// schedule ends before.
    pub fn upcoming(&self, after_ms: i64, n: usize) -> Vec<i64> {
        let mut ticks = Vec::with_capacity(n.min(1024));
        let mut cursor = after_ms;
        while ticks.len() < n {
            let Some(tick) = self.next_after(cursor) else {
                break;
            };
            ticks.push(tick);
            cursor = tick;
        }
        ticks
    }

    /// The same recurrence without its `end` (to tell "ends too soon" from "never matches").
    pub fn without_end(&self) -> Recurrence {
        Recurrence {
            end_ms: None,
            ..self.clone()
        }
    }

    /// The shortest gap between two consecutive ticks (ms), for pricing a schedule: the
    /// interval of `every`; for a cron, the smallest gap among its next [`GAP_SAMPLE`]
    /// ticks after `after_ms` (without the window), or `None` when it has fewer than two.
    pub fn min_gap_ms(&self, after_ms: i64) -> Option<i64> {
        match &self.rule {
            Rule::Every { interval_ms } => Some(*interval_ms),
            Rule::Cron { .. } => {
                let open = Recurrence {
                    start_ms: None,
                    end_ms: None,
                    ..self.clone()
                };
                open.upcoming(after_ms, GAP_SAMPLE)
                    .windows(2)
                    .map(|w| w[1] - w[0])
                    .min()
            }
        }
    }

    /// The time zone's IANA name in its canonical spelling (e.g. `Europe/Berlin`; `UTC`
    /// when none was given).
    pub fn timezone(&self) -> &str {
        self.tz.name()
    }
}

/// An [`InvalidInput::Option`] error.
fn invalid(name: &'static str, reason: String) -> InvalidInput {
    InvalidInput::Option { name, reason }
}

/// Parses a cron expression the way tokio-cron-scheduler does (seconds first,
/// day-of-month AND day-of-week), also accepting the classic five fields.
fn parse_cron(expr: &str) -> Result<Cron, InvalidInput> {
    if expr.len() > MAX_CRON_LEN {
        return Err(invalid(
            "cron",
            format!(
                "the expression is {} bytes, longer than the {MAX_CRON_LEN} accepted",
                expr.len()
            ),
        ));
    }
    let text = expr.trim();
    if text.is_empty() {
        return Err(invalid(
            "cron",
            format!("empty cron expression ({CRON_HINT})"),
        ));
    }
    // A year field is refused: ticks are bounded to the next 10 years anyway, and a
    // seventh field is more often a mistake (a Quartz-style expression) than a year.
    let fields = text.split_whitespace().count();
    if fields == 7 {
        return Err(invalid(
            "cron",
            format!("{text:?} has 7 fields: a year field is not supported ({CRON_HINT})"),
        ));
    }
    // tokio-cron-scheduler uses `Seconds::Required`, which refuses five fields; `Optional`
    // accepts the same six- and seven-field patterns, the same way, plus five fields
    // (second 0).
    CronParser::builder()
        .seconds(Seconds::Optional)
        .dom_and_dow(true)
        .build()
        .parse(text)
        .map_err(|e| invalid("cron", format!("{text:?}: {e} ({CRON_HINT})")))
}

/// Parses `every`: a duration of at least [`MIN_INTERVAL`], in milliseconds.
fn parse_every(text: &str) -> Result<i64, InvalidInput> {
    let interval = parse_duration("every", text)?;
    if interval < MIN_INTERVAL {
        return Err(invalid(
            "every",
            format!("{:?} is too short: the minimum interval is 1s", text.trim()),
        ));
    }
    // At most MAX_DURATION (10 years) after parse_duration, so this always fits.
    i64::try_from(interval.as_millis())
        .map_err(|_| invalid("every", format!("{:?} is too long", text.trim())))
}

/// Parses an IANA time zone name (`None` = UTC), case-insensitively.
fn parse_timezone(name: Option<&str>) -> Result<Tz, InvalidInput> {
    let Some(name) = name else {
        return Ok(Tz::UTC);
    };
    lookup_timezone(name).map_err(|reason| invalid("timezone", reason))
}

/// The IANA time zone `name` (case-insensitive, surrounding whitespace ignored), or why it
/// is unknown: the one lookup for recurring schedules and local due times
/// ([`crate::engine::message::When::parse_local`]).
pub(crate) fn lookup_timezone(name: &str) -> Result<Tz, String> {
    let name = name.trim();
    if let Ok(tz) = name.parse::<Tz>() {
        return Ok(tz);
    }
    chrono_tz::TZ_VARIANTS
        .iter()
        .copied()
        .find(|tz| !name.is_empty() && tz.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            format!(
                "unknown time zone {name:?} (use an IANA name such as Europe/Berlin, \
                 America/New_York or UTC)"
            )
        })
}

/// The first `anchor + k × interval` strictly after `after`, if it fits in an `i64`.
fn next_interval_tick(after: i64, anchor: i64, interval: i64) -> Option<i64> {
    let (after, anchor, interval) = (i128::from(after), i128::from(anchor), i128::from(interval));
    if interval <= 0 {
        return None;
    }
    let k = (after - anchor).div_euclid(interval) + 1;
    i64::try_from(anchor + k * interval).ok()
}

/// The first instant strictly after `after_ms` at which `cron`, evaluated in local wall
/// time of `tz`, fires (see the module documentation for the daylight-saving rules).
fn next_cron_tick(cron: &Cron, any_year: bool, tz: Tz, after_ms: i64) -> Option<i64> {
    // Ticks are whole seconds: the first candidate is the local time one second after the
    // whole second containing `after_ms`. Every local time up to that second maps to an
    // instant at or before `after_ms` (the mapping never goes backwards), so the search
    // starts there and only skips candidates that map to `after_ms` or earlier, which can
    // only happen in a fall-back overlap when `after_ms` is in its second pass.
    let after_s = after_ms.div_euclid(1000);
    let after_local = DateTime::from_timestamp(after_s, 0)?
        .with_timezone(&tz)
        .naive_local();
    // croner only searches years 1..=5000; before year 1 nothing can match earlier than
    // its first second.
    let first_local = NaiveDate::from_ymd_opt(1, 1, 1)?.and_hms_opt(0, 0, 0)?;
    let (mut cursor, mut inclusive) = if after_local < first_local {
        (first_local, true)
    } else {
        (after_local, false)
    };
    let horizon = cursor.checked_add_signed(TimeDelta::from_std(MAX_DURATION).ok()?)?;
    // Without a year field croner would search up to year 5000 for a pattern that never
    // matches again (February 30th): limit it to the years up to the horizon.
    let bounded = if any_year {
        within_years(cron, cursor.year(), horizon.year())
    } else {
        None
    };
    let cron = bounded.as_ref().unwrap_or(cron);
    for _ in 0..MAX_CANDIDATES {
        // Local wall times are searched in UTC, where every one exists exactly once.
        let found = cron
            .find_next_occurrence(&cursor.and_utc(), inclusive)
            .ok()?
            .naive_utc();
        if found > horizon {
            return None;
        }
        if let Some(tick) = local_to_instant(tz, found)
            && tick.timestamp_millis() > after_ms
        {
            return Some(tick.timestamp_millis());
        }
        cursor = found;
        inclusive = false;
    }
    None
}

/// `cron` with its year field (`*`) replaced by `first..=last`, or `None` when croner
/// cannot express that range (outside years 1..=5000).
fn within_years(cron: &Cron, first: i32, last: i32) -> Option<Cron> {
    let last = last.min(croner::YEAR_UPPER_LIMIT);
    let years = CronParser::builder()
        .seconds(Seconds::Required)
        .build()
        .parse(&format!("0 0 0 * * * {first}-{last}"))
        .ok()?
        .pattern
        .years;
    let mut bounded = cron.clone();
    bounded.pattern.years = years;
    Some(bounded)
}

/// The instant at which the local wall time `local` of `tz` fires: itself when it exists
/// once, its earlier occurrence when it is repeated (fall-back), the first instant after
/// the gap when it does not exist (spring-forward). `None` only at the edges of the time
/// zone data.
pub(crate) fn local_to_instant(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local).earliest() {
        Some(instant) => Some(instant.with_timezone(&Utc)),
        None => GapInfo::new(&local, &tz)
            .and_then(|gap| gap.end)
            .map(|end| end.with_timezone(&Utc)),
    }
}

#[cfg(test)]
mod tests;
