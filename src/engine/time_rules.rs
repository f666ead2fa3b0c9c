//! Time rules an order can carry beyond its due time (issue 44): a queue's **dedup window**
//! after dispatch and an order's **debounce** with a maximum wait. The one place for their
//! ranges, defaults and stored forms; `lua/enqueue.lua` and `lua/dequeue.lua` apply them.
//!
//! **Dedup window** (per queue, default off). While a queue has one, `dequeue.lua` adds each
//! dispatched id to the shard's dispatched ZSET (`{ns:q:s}:dispatched`, scored by the
//! dispatch time) and `enqueue.lua` answers [`Duplicate`](crate::ScheduleOutcome::Duplicate)
//! for an id that is not waiting and was dispatched within the window, writing nothing,
//! unless the order asks to be scheduled again ([`NewOrder::repeat`](crate::NewOrder)). The
//! window lives in every shard's meta hash (`{ns:q:s}:meta`, field [`DEDUP_FIELD`], beside the
//! epoch the scripts read anyway), so scripts stay within the shard's hash tag on a cluster,
//! and a copy in the registry record for listings. Redis 7.0 has no per-field hash expiry, so
//! the ZSET is trimmed by `dequeue.lua` (at most a batch's worth of ids older than the window
//! per call, as many as a call can add) and expires whole a window after the shard's last
//! dispatch. Cost: one ZSET member per id dispatched within the window (measured in
//! docs/time-rules.md).
//!
//! **Debounce** (per order): each call moves the order to now + `delay`, payload replaced,
//! but never later than its first call + `max_wait`; the first call's time and that cap are
//! kept with the waiting order (`{ns:q:s}:debounce`, id -> `"<first ms>:<cap ms>"`) and
//! dropped when it is dispatched or cancelled, so the next call starts a new debounce. A
//! call whose orders carry no rules sends `enqueue.lua` what it sent before the rules.

use crate::engine::duration::{MAX_DURATION, format_duration};
use crate::engine::error::InvalidInput;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The meta-hash and registry-record field holding a queue's dedup window, in ms.
pub(crate) const DEDUP_FIELD: &str = "dedup_ms";

/// A queue's dedup window after dispatch: zero (off, the default) or 1 ms ..= 10 years.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DedupWindow {
    ms: i64,
}

impl DedupWindow {
    /// A window (`0s`: off); longer than 10 years is refused, naming `dedup_window`.
    pub fn new(window: Duration) -> Result<Self, InvalidInput> {
        if window > MAX_DURATION {
            return Err(InvalidInput::Option {
                name: "dedup_window",
                reason: format!(
                    "must be 0s (off) up to 10 years, got {}",
                    format_duration(window)
                ),
            });
        }
        Ok(DedupWindow {
            ms: i64::try_from(window.as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// From a stored value (negative or unreadable: off).
    pub(crate) fn from_ms(ms: i64) -> Self {
        DedupWindow { ms: ms.max(0) }
    }

    /// The window in ms (0: off).
    pub fn as_ms(&self) -> i64 {
        self.ms
    }

    /// Whether the queue has a window.
    pub fn is_on(&self) -> bool {
        self.ms > 0
    }
}

/// An order's debounce: each schedule call moves it to now + `delay`, never later than its
/// first call + `max_wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Debounce {
    /// How long after each call the order is due (more than zero).
    pub delay: Duration,
    /// The longest time from the first call to dispatch (at least `delay`, at most 10
    /// years).
    pub max_wait: Duration,
}

impl Debounce {
    /// A debounce, checked ([`Debounce::validate`]).
    pub fn new(delay: Duration, max_wait: Duration) -> Result<Self, InvalidInput> {
        let d = Debounce { delay, max_wait };
        d.validate()?;
        Ok(d)
    }

    /// From milliseconds as the text surfaces take them (`debounce.delay_ms`,
    /// `debounce.max_wait_ms`); a negative value is refused naming its field.
    pub fn from_ms(delay_ms: i64, max_wait_ms: i64) -> Result<Self, InvalidInput> {
        let ms = |name: &'static str, v: i64| {
            u64::try_from(v)
                .map(Duration::from_millis)
                .map_err(|_| InvalidInput::Option {
                    name,
                    reason: format!("must not be negative, got {v} ms"),
                })
        };
        Debounce::new(
            ms("debounce.delay", delay_ms)?,
            ms("debounce.max_wait", max_wait_ms)?,
        )
    }

    /// The one rule: `delay` and `max_wait` more than zero, at most 10 years, and
    /// `max_wait >= delay`.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |name, reason: String| Err(InvalidInput::Option { name, reason });
        for (name, d) in [
            ("debounce.delay", self.delay),
            ("debounce.max_wait", self.max_wait),
        ] {
            if d < Duration::from_millis(1) {
                return bad(name, "must be at least 1ms".into());
            }
            if d > MAX_DURATION {
                return bad(
                    name,
                    format!("{} is more than 10 years", format_duration(d)),
                );
            }
        }
        if self.max_wait < self.delay {
            return bad(
                "debounce.max_wait",
                format!(
                    "{} is shorter than the delay {}",
                    format_duration(self.max_wait),
                    format_duration(self.delay)
                ),
            );
        }
        Ok(())
    }

    /// `delay` in ms.
    pub(crate) fn delay_ms(&self) -> i64 {
        i64::try_from(self.delay.as_millis()).unwrap_or(i64::MAX)
    }

    /// `max_wait` in ms.
    pub(crate) fn max_wait_ms(&self) -> i64 {
        i64::try_from(self.max_wait.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A waiting debounced order's state, as `get` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebounceState {
    /// When the debounce's first call was, unix ms.
    pub first_call_ms: i64,
    /// The latest it may be dispatched: first call + `max_wait`, unix ms.
    pub max_due_ms: i64,
}

impl DebounceState {
    /// From the stored record `"<first ms>:<cap ms>"` (`None` when malformed).
    pub(crate) fn parse(record: &str) -> Option<Self> {
        let (a, b) = record.split_once(':')?;
        Some(DebounceState {
            first_call_ms: a.parse().ok()?,
            max_due_ms: b.parse().ok()?,
        })
    }
}

/// The per-order rules argument of `enqueue.lua`: `r` for repeat, then the debounce's
/// `max_wait` in ms (empty: neither).
pub(crate) fn enqueue_rules_arg(repeat: bool, debounce: Option<&Debounce>) -> String {
    let mut s = String::new();
    if repeat {
        s.push('r');
    }
    if let Some(d) = debounce {
        s.push_str(&d.max_wait_ms().to_string());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debounce_rules() {
        let s = Duration::from_secs;
        assert!(Debounce::new(Duration::from_millis(500), s(2)).is_ok());
        assert!(Debounce::new(s(2), s(2)).is_ok());
        let name = |d: Result<Debounce, InvalidInput>| match d.unwrap_err() {
            InvalidInput::Option { name, .. } => name,
            other => panic!("{other}"),
        };
        assert_eq!(name(Debounce::new(s(0), s(2))), "debounce.delay");
        assert_eq!(name(Debounce::new(s(1), s(0))), "debounce.max_wait");
        assert_eq!(name(Debounce::new(s(3), s(2))), "debounce.max_wait");
        assert_eq!(
            name(Debounce::new(s(1), MAX_DURATION + s(1))),
            "debounce.max_wait"
        );
        assert_eq!(name(Debounce::from_ms(-1, 5)), "debounce.delay");
        assert_eq!(name(Debounce::from_ms(1, -5)), "debounce.max_wait");
        assert_eq!(
            DebounceState::parse("10:20"),
            Some(DebounceState {
                first_call_ms: 10,
                max_due_ms: 20
            })
        );
        assert_eq!(DebounceState::parse("x"), None);
        let d = Debounce::new(s(1), s(2)).unwrap();
        assert_eq!(enqueue_rules_arg(true, Some(&d)), "r2000");
        assert_eq!(enqueue_rules_arg(false, None), "");
    }

    #[test]
    fn window_rules() {
        assert!(!DedupWindow::new(Duration::ZERO).unwrap().is_on());
        assert_eq!(
            DedupWindow::new(Duration::from_secs(3600)).unwrap().as_ms(),
            3_600_000
        );
        assert!(DedupWindow::new(MAX_DURATION + Duration::from_secs(1)).is_err());
        assert_eq!(DedupWindow::from_ms(-5).as_ms(), 0);
    }
}
