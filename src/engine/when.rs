//! When an order is due: [`When`] (an instant, a delay from the Redis server's now, or a
//! local wall-clock time in an IANA zone), the text surfaces' due-time fields
//! ([`DueFields`]), and the one rule for each (10 years ahead at most, no seconds mistaken
//! for milliseconds).

use crate::engine::error::InvalidInput;
use chrono::{DateTime, Datelike, NaiveDateTime, TimeDelta, Timelike, Utc};
use chrono_tz::Tz;

/// The furthest ahead an order may be scheduled: 10 years (3,653 days).
pub const MAX_AHEAD_MS: i64 = 3653 * 24 * 3600 * 1000;
/// Unix ms of 2000-01-01T00:00:00Z. A due time given as a number of milliseconds (text, or
/// [`When::AtMs`]) that is smaller than this is almost surely seconds by mistake, and is
/// refused on every surface ([`check_not_seconds`]); a date-time is not a number and may be
/// earlier (from 1970).
pub const YEAR_2000_MS: i64 = 946_684_800_000;

/// The one rule for a due time given as unix milliseconds: from [`YEAR_2000_MS`] (a smaller
/// number is seconds by mistake; a negative one is before 1970).
fn check_not_seconds(ms: i64) -> Result<(), InvalidInput> {
    let reason = if ms < 0 {
        format!("{ms} is before 1970")
    } else if ms < YEAR_2000_MS {
        format!("{ms} is before the year 2000: it looks like seconds, not milliseconds")
    } else {
        return Ok(());
    };
    Err(InvalidInput::DueTime { reason })
}

/// When an order is due: an absolute time, or a delay from "now" (the Redis server's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum When {
    /// At this instant.
    At(DateTime<Utc>),
    /// At this unix time in milliseconds.
    AtMs(i64),
    /// This long after now. Negative delays are refused.
    Delay(TimeDelta),
    /// This many milliseconds after now (any `i64`; checked by [`When::resolve`]).
    DelayMs(i64),
    /// At this local wall-clock time of this IANA time zone, resolved to one instant by
    /// [`When::resolve`] with the recurring schedules' rules: a time that does not exist
    /// (the spring-forward gap) is the first instant after the gap, a time that happens
    /// twice (fall-back) its first occurrence.
    Local {
        /// The wall-clock time.
        at: NaiveDateTime,
        /// Its time zone.
        tz: Tz,
    },
}

impl When {
    /// Due `ms` milliseconds from now. Any `i64` is accepted here; [`When::resolve`] refuses
    /// negative delays and delays beyond the accepted window.
    pub fn in_ms(ms: i64) -> Self {
        When::DelayMs(ms)
    }

    /// Due at unix time `ms` (from the year 2000: a smaller number is refused by
    /// [`When::resolve`] as seconds by mistake; give an earlier time as a date-time).
    pub fn at_ms(ms: i64) -> Self {
        When::AtMs(ms)
    }

    /// Due at the local wall-clock time `at` of time zone `tz` (e.g. 09:00 in
    /// `chrono_tz::Europe::Berlin`); see [`When::Local`] for the daylight-saving rules.
    pub fn local(at: NaiveDateTime, tz: Tz) -> Self {
        When::Local { at, tz }
    }

    /// Parses a local wall-clock due time given as text (the HTTP API's `at_local` and
    /// `timezone`, the CLI's `--at` with `--tz`): `at_local` is `YYYY-MM-DDTHH:MM`, with
    /// optional `:SS` and fraction, and no UTC offset (`invalid_local_time`); `timezone` an
    /// IANA name, case-insensitive (`invalid_timezone`). `at_local` is checked first.
    pub fn parse_local(at_local: &str, timezone: &str) -> Result<Self, InvalidInput> {
        let at = parse_local_time(at_local)?;
        let tz = crate::engine::schedules::spec::lookup_timezone(timezone)
            .map_err(|reason| InvalidInput::TimeZone { reason })?;
        Ok(When::Local { at, tz })
    }

    /// Parses an absolute time given as text: RFC 3339 with an offset
    /// (`2026-11-22T10:30:00+01:00`, `...Z`) or unix milliseconds (`1795000000000`).
    ///
    /// RFC 3339 without an offset is refused as ambiguous; a number before the year 2000 is
    /// refused as "looks like seconds, not milliseconds".
    pub fn parse_at(text: &str) -> Result<Self, InvalidInput> {
        let t = text.trim();
        let bad = |reason: String| InvalidInput::DueTime { reason };
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
            let ms: i64 = t
                .parse()
                .map_err(|_| bad(format!("{t:?} is not a valid unix millisecond timestamp")))?;
            check_not_seconds(ms)?;
            return Ok(When::AtMs(ms));
        }
        match DateTime::parse_from_rfc3339(t) {
            Ok(dt) => Ok(When::At(dt.with_timezone(&Utc))),
            Err(_) if chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f").is_ok() => {
                Err(bad(format!(
                    "{t:?} has no UTC offset and is ambiguous: add Z or +hh:mm"
                )))
            }
            Err(e) => Err(bad(format!(
                "{t:?} is neither RFC 3339 with an offset nor unix milliseconds ({e})"
            ))),
        }
    }

    /// The due time in unix ms, given the current time; refuses negative delays, times
    /// before 1970 (a number of milliseconds: before 2000, as seconds by mistake) and times
    /// more than 10 years after `now_ms`. A past time is allowed (it fires at once).
    pub fn resolve(&self, now_ms: i64) -> Result<i64, InvalidInput> {
        let due = match *self {
            When::Delay(d) => delay_due(now_ms, d.num_milliseconds())?,
            When::DelayMs(ms) => delay_due(now_ms, ms)?,
            When::At(t) => t.timestamp_millis(),
            When::AtMs(ms) => {
                check_not_seconds(ms)?;
                ms
            }
            When::Local { at, tz } => crate::engine::schedules::spec::local_to_instant(tz, at)
                .ok_or_else(|| InvalidInput::DueTime {
                    reason: format!("{at} in {} is beyond the time zone data", tz.name()),
                })?
                .timestamp_millis(),
        };
        if due < 0 {
            return Err(InvalidInput::DueTime {
                reason: format!("{due} is before 1970"),
            });
        }
        if due > now_ms.saturating_add(MAX_AHEAD_MS) {
            return Err(InvalidInput::DueTime {
                reason: format!("{due} is more than 10 years ahead"),
            });
        }
        Ok(due)
    }
}

/// The due-time fields of a producer's request as the text surfaces take them (the HTTP
/// API's message body, the conformance cases): exactly one of a delay, a due time, or a
/// local wall-clock time with its time zone. The one place for how they combine.
#[derive(Debug, Clone, Copy, Default)]
pub struct DueFields<'a> {
    /// `delay_ms`: milliseconds from now.
    pub delay_ms: Option<i64>,
    /// `due_at`: RFC 3339 with an offset, or unix milliseconds, as text.
    pub due_at: Option<&'a str>,
    /// `at_local`: a local wall-clock time without offset (needs `timezone`).
    pub at_local: Option<&'a str>,
    /// `timezone`: the IANA time zone of `at_local` (only with it).
    pub timezone: Option<&'a str>,
}

impl DueFields<'_> {
    /// The due time these fields give, or why they do not give exactly one.
    pub fn when(&self) -> Result<When, InvalidInput> {
        let other = self.delay_ms.is_some() || self.due_at.is_some();
        match (self.at_local, self.timezone) {
            (Some(_), _) if other => Err(InvalidInput::LocalTime {
                reason: "at_local is a due time of its own: give it without delay_ms or due_at"
                    .into(),
            }),
            (Some(_), None) => Err(InvalidInput::TimeZone {
                reason: "missing: at_local needs the IANA time zone it is in (e.g. Europe/Berlin)"
                    .into(),
            }),
            (None, Some(_)) => Err(InvalidInput::TimeZone {
                reason: "given without at_local (a due_at carries its own offset)".into(),
            }),
            (Some(at), Some(tz)) => When::parse_local(at, tz),
            (None, None) => match (self.delay_ms, self.due_at) {
                (Some(ms), None) => Ok(When::in_ms(ms)),
                (None, Some(t)) => When::parse_at(t),
                _ => Err(InvalidInput::DueTime {
                    reason: "give exactly one of delay_ms, due_at or at_local".into(),
                }),
            },
        }
    }
}

/// Whether `s` is `YYYY-MM-DDTHH:MM`, optionally with `:SS` and then `.` and 1 to 9 digits.
fn local_shape(s: &str) -> bool {
    let b = s.as_bytes();
    let d = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let head = (0..4).all(d)
        && at(4, b'-')
        && d(5)
        && d(6)
        && at(7, b'-')
        && d(8)
        && d(9)
        && at(10, b'T')
        && d(11)
        && d(12)
        && at(13, b':')
        && d(14)
        && d(15);
    let secs = at(16, b':') && d(17) && d(18);
    match b.len() {
        16 => head,
        19 => head && secs,
        n @ 21..=28 => head && secs && at(19, b'.') && (20..n).all(d),
        _ => false,
    }
}

/// Parses `at_local` (see [`When::parse_local`]).
fn parse_local_time(text: &str) -> Result<NaiveDateTime, InvalidInput> {
    let bad = |reason: String| InvalidInput::LocalTime { reason };
    if !local_shape(text) {
        let n = text.len();
        let without_offset = if text.ends_with(['Z', 'z']) {
            text.get(..n - 1)
        } else if n >= 6
            && text.as_bytes()[n - 6].is_ascii()
            && matches!(text.as_bytes()[n - 6], b'+' | b'-')
            && text.as_bytes()[n - 3] == b':'
        {
            text.get(..n - 6)
        } else {
            None
        };
        if without_offset.is_some_and(local_shape) {
            return Err(bad(format!(
                "{text:?} has a UTC offset: at_local is a wall-clock time in `timezone`, \
                 without one (or give due_at instead)"
            )));
        }
        return Err(bad(format!(
            "{text:?} is not a local date-time YYYY-MM-DDTHH:MM[:SS[.fff]]"
        )));
    }
    let format = if text.len() == 16 {
        "%Y-%m-%dT%H:%M"
    } else {
        "%Y-%m-%dT%H:%M:%S%.f"
    };
    match NaiveDateTime::parse_from_str(text, format) {
        // chrono reads a second 60 as a leap second; no wall clock shows it. Year 0 is not
        // a calendar year (nor one the SDKs' date types know).
        Ok(at) if at.nanosecond() < 1_000_000_000 && at.year() >= 1 => Ok(at),
        _ => Err(bad(format!("{text:?} is not a valid date and time"))),
    }
}

/// The due time of a delay of `ms` from `now_ms`: the one rule for delays (0 ..= 10 years).
fn delay_due(now_ms: i64, ms: i64) -> Result<i64, InvalidInput> {
    if ms < 0 {
        return Err(InvalidInput::Delay {
            reason: format!("must not be negative, got {ms} ms"),
        });
    }
    if ms > MAX_AHEAD_MS {
        return Err(InvalidInput::Delay {
            reason: format!("{ms} ms is more than 10 years"),
        });
    }
    Ok(now_ms.saturating_add(ms))
}

impl From<DateTime<Utc>> for When {
    fn from(t: DateTime<Utc>) -> Self {
        When::At(t)
    }
}

impl From<TimeDelta> for When {
    fn from(d: TimeDelta) -> Self {
        When::Delay(d)
    }
}

impl From<std::time::Duration> for When {
    fn from(d: std::time::Duration) -> Self {
        // Durations beyond TimeDelta's range are clamped and then refused as too long.
        When::Delay(TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX))
    }
}
