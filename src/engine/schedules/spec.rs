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
//! (`sec min hour day-of-month month day-of-week`, e.g. `0 30 2 * * *`), or seven with a
//! trailing year; day-of-month and day-of-week are combined with AND (`0 0 0 13 * FRI` is
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
     (e.g. `0 30 2 * * *`), optionally a 7th for the year, or the classic 5 fields \
     `min hour day-of-month month day-of-week`";

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
    let text = expr.trim();
    if text.is_empty() {
        return Err(invalid(
            "cron",
            format!("empty cron expression ({CRON_HINT})"),
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
    let name = name.trim();
    if let Ok(tz) = name.parse::<Tz>() {
        return Ok(tz);
    }
    chrono_tz::TZ_VARIANTS
        .iter()
        .copied()
        .find(|tz| !name.is_empty() && tz.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            invalid(
                "timezone",
                format!(
                    "unknown time zone {name:?} (use an IANA name such as Europe/Berlin, \
                     America/New_York or UTC)"
                ),
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
fn local_to_instant(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local).earliest() {
        Some(instant) => Some(instant.with_timezone(&Utc)),
        None => GapInfo::new(&local, &tz)
            .and_then(|gap| gap.end)
            .map(|end| end.with_timezone(&Utc)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix milliseconds of a UTC date-time.
    fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
        Utc.with_ymd_and_hms(y, mo, d, h, mi, s)
            .single()
            .expect("valid UTC date-time")
            .timestamp_millis()
    }

    fn cron(expr: &str, tz: Option<&str>) -> Recurrence {
        Recurrence::parse(Some(expr), None, tz, None, None).expect("valid cron")
    }

    fn every(interval: &str) -> Recurrence {
        Recurrence::parse(None, Some(interval), None, None, None).expect("valid interval")
    }

    /// The field an error names, and its message.
    fn refused(result: Result<Recurrence, InvalidInput>) -> (&'static str, String) {
        match result {
            Err(e @ InvalidInput::Option { name, .. }) => (name, e.to_string()),
            Err(other) => panic!("unexpected error kind: {other}"),
            Ok(r) => panic!("accepted: {r:?}"),
        }
    }

    fn strictly_increasing(ticks: &[i64]) -> bool {
        ticks.windows(2).all(|w| w[0] < w[1])
    }

    #[test]
    fn six_field_every_two_seconds_in_utc() {
        let r = cron("*/2 * * * * *", None);
        assert_eq!(r.timezone(), "UTC");
        let from = utc(2026, 5, 1, 12, 0, 0);
        assert_eq!(r.next_after(from), Some(utc(2026, 5, 1, 12, 0, 2)));
        assert_eq!(r.next_after(from + 1), Some(utc(2026, 5, 1, 12, 0, 2)));
        assert_eq!(r.next_after(from - 1), Some(from));
        assert_eq!(
            r.upcoming(from + 1_500, 3),
            vec![
                utc(2026, 5, 1, 12, 0, 2),
                utc(2026, 5, 1, 12, 0, 4),
                utc(2026, 5, 1, 12, 0, 6)
            ]
        );
        // Crossing a minute boundary: :58 then :00 of the next minute.
        let late = utc(2026, 5, 1, 12, 0, 57);
        assert_eq!(
            r.upcoming(late, 2),
            vec![utc(2026, 5, 1, 12, 0, 58), utc(2026, 5, 1, 12, 1, 0)]
        );
    }

    #[test]
    fn six_field_daily_in_utc() {
        let r = cron("0 30 2 * * *", None);
        assert_eq!(
            r.next_after(utc(2026, 5, 1, 0, 0, 0)),
            Some(utc(2026, 5, 1, 2, 30, 0))
        );
        // Exactly at a tick: the next one, a day later.
        assert_eq!(
            r.next_after(utc(2026, 5, 1, 2, 30, 0)),
            Some(utc(2026, 5, 2, 2, 30, 0))
        );
        assert_eq!(
            r.next_after(utc(2026, 12, 31, 3, 0, 0)),
            Some(utc(2027, 1, 1, 2, 30, 0))
        );
    }

    #[test]
    fn five_field_classic_form_means_second_zero() {
        let r = cron("30 2 * * *", None);
        assert_eq!(
            r.upcoming(utc(2026, 5, 1, 0, 0, 0), 2),
            vec![utc(2026, 5, 1, 2, 30, 0), utc(2026, 5, 2, 2, 30, 0)]
        );
        let r = cron("*/15 * * * *", None);
        assert_eq!(
            r.next_after(utc(2026, 5, 1, 10, 7, 31)),
            Some(utc(2026, 5, 1, 10, 15, 0))
        );
    }

    #[test]
    fn seven_field_with_year() {
        let r = cron("0 0 9 1 1 * 2027", None);
        assert_eq!(
            r.upcoming(utc(2026, 5, 1, 0, 0, 0), 3),
            vec![utc(2027, 1, 1, 9, 0, 0)]
        );
    }

    #[test]
    fn day_of_month_and_day_of_week_combine_with_and() {
        // Friday the 13th only, as tokio-cron-scheduler configures croner.
        let r = cron("0 0 12 13 * FRI", None);
        // 2026-02-13 and 2026-03-13 are Fridays; 2026-11-13 is the next one.
        assert_eq!(
            r.upcoming(utc(2026, 1, 1, 0, 0, 0), 3),
            vec![
                utc(2026, 2, 13, 12, 0, 0),
                utc(2026, 3, 13, 12, 0, 0),
                utc(2026, 11, 13, 12, 0, 0)
            ]
        );
    }

    #[test]
    fn berlin_daily_in_winter_and_summer() {
        let r = cron("0 30 2 * * *", Some("Europe/Berlin"));
        assert_eq!(r.timezone(), "Europe/Berlin");
        // CET (+01:00) in January, CEST (+02:00) in July.
        assert_eq!(
            r.next_after(utc(2026, 1, 10, 0, 0, 0)),
            Some(utc(2026, 1, 10, 1, 30, 0))
        );
        assert_eq!(
            r.next_after(utc(2026, 7, 10, 0, 0, 0)),
            Some(utc(2026, 7, 10, 0, 30, 0))
        );
    }

    #[test]
    fn berlin_spring_forward_gap_fires_once_at_the_end_of_the_gap() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z); 02:30 does not exist.
        let r = cron("0 30 2 * * *", Some("Europe/Berlin"));
        let ticks = r.upcoming(utc(2026, 3, 27, 12, 0, 0), 4);
        assert_eq!(
            ticks,
            vec![
                utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
                utc(2026, 3, 29, 1, 0, 0),  // 03:00 CEST, the first instant after the gap
                utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
                utc(2026, 3, 31, 0, 30, 0),
            ]
        );
        let day = utc(2026, 3, 29, 0, 0, 0)..utc(2026, 3, 30, 0, 0, 0);
        assert_eq!(ticks.iter().filter(|t| day.contains(t)).count(), 1);
    }

    #[test]
    fn berlin_gap_collapses_several_matches_and_a_matching_gap_end() {
        // Every 20 minutes: 02:00, 02:20, 02:40 do not exist, 03:00 (the gap end) matches
        // itself: all four fire once, at 01:00Z.
        let r = cron("0 */20 * * * *", Some("Europe/Berlin"));
        let ticks = r.upcoming(utc(2026, 3, 29, 0, 30, 0), 4);
        assert_eq!(
            ticks,
            vec![
                utc(2026, 3, 29, 0, 40, 0), // 01:40 CET
                utc(2026, 3, 29, 1, 0, 0),  // the gap, and 03:00 CEST
                utc(2026, 3, 29, 1, 20, 0), // 03:20 CEST
                utc(2026, 3, 29, 1, 40, 0),
            ]
        );
        // Every second across the gap: 01:59:59 CET, then 03:00:00 CEST, 03:00:01 CEST.
        let r = cron("* * * * * *", Some("Europe/Berlin"));
        let gap_end = utc(2026, 3, 29, 1, 0, 0);
        assert_eq!(
            r.upcoming(gap_end - 2_000, 3),
            vec![gap_end - 1_000, gap_end, gap_end + 1_000]
        );
    }

    #[test]
    fn berlin_fall_back_fires_once_at_the_first_occurrence() {
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00Z); 02:30 happens at 00:30Z
        // and again at 01:30Z.
        let r = cron("0 30 2 * * *", Some("Europe/Berlin"));
        let ticks = r.upcoming(utc(2026, 10, 23, 12, 0, 0), 4);
        assert_eq!(
            ticks,
            vec![
                utc(2026, 10, 24, 0, 30, 0), // 02:30 CEST
                utc(2026, 10, 25, 0, 30, 0), // 02:30 CEST, the earlier occurrence
                utc(2026, 10, 26, 1, 30, 0), // 02:30 CET
                utc(2026, 10, 27, 1, 30, 0),
            ]
        );
        let day = utc(2026, 10, 25, 0, 0, 0)..utc(2026, 10, 26, 0, 0, 0);
        assert_eq!(ticks.iter().filter(|t| day.contains(t)).count(), 1);
        // Asked from inside the second pass, the repeated 02:30 does not fire again.
        assert_eq!(
            r.next_after(utc(2026, 10, 25, 1, 15, 0)),
            Some(utc(2026, 10, 26, 1, 30, 0))
        );
    }

    #[test]
    fn hourly_across_fall_back_has_no_duplicates() {
        let r = cron("0 0 * * * *", Some("Europe/Berlin"));
        let ticks = r.upcoming(utc(2026, 10, 24, 21, 30, 0), 8);
        assert!(strictly_increasing(&ticks), "{ticks:?}");
        assert_eq!(
            ticks,
            vec![
                utc(2026, 10, 24, 22, 0, 0), // 00:00 CEST
                utc(2026, 10, 24, 23, 0, 0), // 01:00 CEST
                utc(2026, 10, 25, 0, 0, 0),  // 02:00 CEST (02:00 CET at 01:00Z does not fire)
                utc(2026, 10, 25, 2, 0, 0),  // 03:00 CET
                utc(2026, 10, 25, 3, 0, 0),
                utc(2026, 10, 25, 4, 0, 0),
                utc(2026, 10, 25, 5, 0, 0),
                utc(2026, 10, 25, 6, 0, 0),
            ]
        );
    }

    #[test]
    fn every_second_across_fall_back_is_strictly_increasing() {
        let r = cron("*/10 * * * * *", Some("Europe/Berlin"));
        let from = utc(2026, 10, 24, 23, 59, 0);
        let ticks = r.upcoming(from, 3 * 360);
        assert!(strictly_increasing(&ticks));
        // The repeated hour (01:00Z..02:00Z) has no ticks; 00:00Z..01:00Z and after 02:00Z do.
        let repeated = utc(2026, 10, 25, 1, 0, 0)..utc(2026, 10, 25, 2, 0, 0);
        assert!(!ticks.iter().any(|t| repeated.contains(t)));
        assert!(ticks.contains(&utc(2026, 10, 25, 0, 59, 50)));
        assert!(ticks.contains(&utc(2026, 10, 25, 2, 0, 0)));
        // Started inside the second pass: the next tick is after it, at 03:00 CET.
        assert_eq!(
            r.next_after(utc(2026, 10, 25, 1, 20, 5)),
            Some(utc(2026, 10, 25, 2, 0, 0))
        );
    }

    #[test]
    fn new_york_dst_both_ways() {
        // 2026-03-08 02:30 does not exist in New York (02:00 EST -> 03:00 EDT = 07:00Z);
        // 2026-11-01 01:30 happens twice (05:30Z EDT, 06:30Z EST).
        let r = cron("0 30 2 * * *", Some("America/New_York"));
        assert_eq!(
            r.next_after(utc(2026, 3, 8, 0, 0, 0)),
            Some(utc(2026, 3, 8, 7, 0, 0))
        );
        let r = cron("0 30 1 * * *", Some("America/New_York"));
        assert_eq!(
            r.upcoming(utc(2026, 11, 1, 0, 0, 0), 2),
            vec![utc(2026, 11, 1, 5, 30, 0), utc(2026, 11, 2, 6, 30, 0)]
        );
    }

    #[test]
    fn every_is_aligned_to_the_epoch() {
        let r = every("5m");
        assert_eq!(
            r.upcoming(utc(2026, 5, 1, 10, 7, 31) + 250, 3),
            vec![
                utc(2026, 5, 1, 10, 10, 0),
                utc(2026, 5, 1, 10, 15, 0),
                utc(2026, 5, 1, 10, 20, 0)
            ]
        );
        assert_eq!(
            r.next_after(utc(2026, 5, 1, 10, 10, 0)),
            Some(utc(2026, 5, 1, 10, 15, 0))
        );
        assert_eq!(r.next_after(-1), Some(0));
        assert_eq!(r.next_after(-300_000), Some(0));
        // The time zone does not move intervals.
        let berlin =
            Recurrence::parse(None, Some("5m"), Some("Europe/Berlin"), None, None).expect("valid");
        assert_eq!(berlin.timezone(), "Europe/Berlin");
        assert_eq!(
            berlin.next_after(utc(2026, 5, 1, 10, 7, 31)),
            Some(utc(2026, 5, 1, 10, 10, 0))
        );
        let r = every("1h30m");
        assert_eq!(r.next_after(0), Some(5_400_000));
        assert_eq!(every("1s").next_after(1_234), Some(2_000));
    }

    #[test]
    fn every_is_anchored_at_start() {
        let start = utc(2026, 5, 1, 10, 7, 31);
        let r = Recurrence::parse(None, Some("5m"), None, Some(start), None).expect("valid");
        assert_eq!(
            r.upcoming(0, 3),
            vec![start, start + 300_000, start + 600_000]
        );
        assert_eq!(r.next_after(start), Some(start + 300_000));
        assert_eq!(r.next_after(start + 299_999), Some(start + 300_000));
    }

    #[test]
    fn too_short_intervals_are_refused() {
        for text in ["10ms", "0s", "999ms", "0ms"] {
            let (name, message) = refused(Recurrence::parse(None, Some(text), None, None, None));
            assert_eq!(name, "every", "{text}");
            assert!(message.contains("1s"), "{message}");
        }
        for text in ["", "five minutes", "-5m", "5"] {
            let (name, _) = refused(Recurrence::parse(None, Some(text), None, None, None));
            assert_eq!(name, "every", "{text:?}");
        }
    }

    #[test]
    fn unknown_time_zones_are_refused() {
        for tz in ["Mars/Olympus", "", "CEST+2", "Europe/Berlin/Mitte"] {
            let (name, message) = refused(Recurrence::parse(
                Some("0 0 * * * *"),
                None,
                Some(tz),
                None,
                None,
            ));
            assert_eq!(name, "timezone", "{tz:?}");
            assert!(message.contains("Europe/Berlin"), "{message}");
        }
        let (name, _) = refused(Recurrence::parse(
            None,
            Some("5m"),
            Some("Mars/Olympus"),
            None,
            None,
        ));
        assert_eq!(name, "timezone");
    }

    #[test]
    fn time_zone_names_are_canonical() {
        assert_eq!(cron("0 0 * * * *", Some("UTC")).timezone(), "UTC");
        assert_eq!(
            cron("0 0 * * * *", Some(" europe/berlin ")).timezone(),
            "Europe/Berlin"
        );
        assert_eq!(
            cron("0 0 * * * *", Some("America/New_York")).timezone(),
            "America/New_York"
        );
    }

    #[test]
    fn invalid_crons_are_refused() {
        for expr in [
            "61 * * * * *",
            "hello",
            "",
            "   ",
            "* * * *",
            "* * * * * * * *",
            "0 60 * * * *",
            "0 0 24 * * *",
            "0 0 0 32 * *",
            "0 0 0 * 13 *",
            "*/0 * * * * *",
        ] {
            let (name, message) = refused(Recurrence::parse(Some(expr), None, None, None, None));
            assert_eq!(name, "cron", "{expr:?}");
            assert!(message.starts_with("invalid option cron: "), "{message}");
        }
    }

    #[test]
    fn exactly_one_of_cron_and_every() {
        for (c, e) in [(Some("0 0 * * * *"), Some("5m")), (None, None)] {
            let (name, message) = refused(Recurrence::parse(c, e, None, None, None));
            assert_eq!(name, "cron");
            assert!(
                message.contains("exactly one of cron and every"),
                "{message}"
            );
        }
    }

    #[test]
    fn window_bounds_the_ticks() {
        let start = utc(2026, 5, 1, 10, 0, 0);
        let end = utc(2026, 5, 1, 10, 3, 0);
        let r = Recurrence::parse(Some("0 * * * * *"), None, None, Some(start), Some(end))
            .expect("valid");
        // Start and end are inclusive.
        assert_eq!(
            r.upcoming(0, 10),
            vec![start, start + 60_000, start + 120_000, end]
        );
        assert_eq!(r.next_after(end), None);
        assert_eq!(r.next_after(end - 1), Some(end));
        assert_eq!(r.next_after(i64::MAX), None);

        let r = Recurrence::parse(None, Some("1m"), None, None, Some(end)).expect("valid");
        assert_eq!(r.next_after(end - 60_000), Some(end));
        assert_eq!(r.next_after(end), None);

        // The first tick at or after start, not start itself, for a cron.
        let r = Recurrence::parse(Some("0 0 * * * *"), None, None, Some(start + 1), None)
            .expect("valid");
        assert_eq!(r.next_after(0), Some(start + 3_600_000));

        for (s, e) in [(start, start), (start, start - 1)] {
            let (name, _) = refused(Recurrence::parse(
                Some("0 * * * * *"),
                None,
                None,
                Some(s),
                Some(e),
            ));
            assert_eq!(name, "end");
        }
    }

    #[test]
    fn upcoming_gives_n_ticks() {
        let r = cron("0 0 9 * * MON-FRI", Some("Europe/Berlin"));
        // 2026-05-01 is a Friday; CEST is +02:00.
        assert_eq!(
            r.upcoming(utc(2026, 5, 1, 0, 0, 0), 5),
            vec![
                utc(2026, 5, 1, 7, 0, 0),
                utc(2026, 5, 4, 7, 0, 0),
                utc(2026, 5, 5, 7, 0, 0),
                utc(2026, 5, 6, 7, 0, 0),
                utc(2026, 5, 7, 7, 0, 0),
            ]
        );
        assert!(r.upcoming(0, 0).is_empty());
    }

    #[test]
    fn ends_when_the_cron_never_matches_again() {
        // February 30th never exists; a year in the past never comes back.
        assert_eq!(cron("0 0 0 30 2 *", None).next_after(0), None);
        assert_eq!(
            cron("0 0 0 * * * 2020", None).next_after(utc(2026, 1, 1, 0, 0, 0)),
            None
        );
        assert!(cron("0 0 0 * * * 2020", None).upcoming(0, 3).is_empty());
        // Nothing to find within the search horizon (10 years): ended, and quickly.
        let started = std::time::Instant::now();
        assert_eq!(cron("0 0 0 31 4 *", None).next_after(0), None);
        assert_eq!(
            cron("0 0 0 30 2 *", Some("Europe/Berlin")).upcoming(utc(2026, 1, 1, 0, 0, 0), 2),
            Vec::<i64>::new()
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let from = utc(2026, 1, 1, 0, 0, 0);
        assert_eq!(
            cron("0 0 0 1 1 * 2035", None).next_after(from),
            Some(utc(2035, 1, 1, 0, 0, 0))
        );
        assert_eq!(cron("0 0 0 1 1 * 2037", None).next_after(from), None);
        // A leap day, four years later, is found.
        assert_eq!(
            cron("0 0 0 29 2 *", None).next_after(utc(2024, 3, 1, 0, 0, 0)),
            Some(utc(2028, 2, 29, 0, 0, 0))
        );
    }

    #[test]
    fn extreme_instants_do_not_panic() {
        let crons = [
            cron("* * * * * *", Some("Europe/Berlin")),
            cron("0 0 0 1 1 *", Some("Pacific/Apia")),
        ];
        for r in &crons {
            for at in [i64::MIN, i64::MIN + 1, -1, 0, i64::MAX - 1, i64::MAX] {
                let _ = r.next_after(at);
                let _ = r.upcoming(at, 3);
            }
        }
        assert_eq!(crons[0].next_after(i64::MAX), None);
        let start = i64::MAX - 10;
        let r = Recurrence::parse(None, Some("10d"), None, Some(start), None).expect("valid");
        assert_eq!(r.next_after(i64::MIN), Some(start));
        assert_eq!(r.next_after(start), None);
        let r = every("10d");
        assert!(r.next_after(i64::MIN).is_some());
        assert_eq!(r.next_after(i64::MAX), None);
    }

    #[test]
    fn random_strings_never_panic() {
        const ALPHABET: &[char] = &[
            '*', '/', ',', '-', '?', 'L', 'W', '#', '@', '+', ' ', ' ', ' ', '\t', '0', '1', '2',
            '3', '5', '7', '9', '6', 'M', 'O', 'N', 'J', 'A', 'F', 'S', 'x', 'é', 'ß', 'ﬀ',
        ];
        let mut rng = fastrand::Rng::with_seed(0x5eed_c0de);
        let mut accepted = 0;
        for _ in 0..600 {
            let len = rng.usize(0..24);
            let text: String = (0..len)
                .map(|_| ALPHABET[rng.usize(0..ALPHABET.len())])
                .collect();
            for result in [
                Recurrence::parse(Some(&text), None, None, None, None),
                Recurrence::parse(None, Some(&text), None, None, None),
                Recurrence::parse(Some("0 * * * * *"), None, Some(&text), None, None),
            ] {
                match result {
                    Ok(r) => {
                        accepted += 1;
                        let ticks = r.upcoming(utc(2026, 3, 29, 0, 0, 0), 3);
                        assert!(strictly_increasing(&ticks), "{text:?}: {ticks:?}");
                    }
                    Err(InvalidInput::Option { name, .. }) => {
                        assert!(["cron", "every", "timezone"].contains(&name));
                    }
                    Err(other) => panic!("{text:?}: unexpected error kind {other}"),
                }
            }
        }
        // Also random field-shaped patterns, many of which are valid.
        let fields = [
            "*", "*/7", "0", "1-5", "L", "5W", "1#2", "MON", "0,30", "?", "59",
        ];
        for _ in 0..400 {
            let count = rng.usize(4..=8);
            let expr: Vec<&str> = (0..count)
                .map(|_| fields[rng.usize(0..fields.len())])
                .collect();
            let expr = expr.join(" ");
            if let Ok(r) = Recurrence::parse(Some(&expr), None, Some("Europe/Berlin"), None, None) {
                accepted += 1;
                let ticks = r.upcoming(utc(2026, 10, 24, 0, 0, 0), 3);
                assert!(strictly_increasing(&ticks), "{expr:?}: {ticks:?}");
            }
        }
        assert!(accepted > 0);
    }
}
