//! [`WorkerOptions`]: defaults and the one place their ranges are checked.

use crate::engine::backoff::Backoff;
use crate::engine::error::InvalidInput;
use crate::engine::flow::RateLimit;
use crate::engine::priority::{Priority, PriorityMode};
use std::time::Duration;

/// The most slots per order key (`key_concurrency`); `key_slots.lua` checks the same bound.
pub const MAX_KEY_CONCURRENCY: u32 = 10_000;

/// Options of a [`Worker`]; in `serve`'s configuration, keys of each `[[handlers]]` entry
/// (the handler's timeout is `timeout`, the priority weights `priority_weights`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// Handler calls at once, 1..=10000 (default 16).
    pub concurrency: usize,
    /// A handler running longer than this has failed (default `30s`).
    #[serde(rename = "timeout", with = "crate::engine::duration::human")]
    pub handler_timeout: Duration,
    /// How long one blocking read waits (default 1 s). Shutdown waits for the read in flight.
    #[serde(skip)]
    pub block: Duration,
    /// How long shutdown waits for in-flight handlers (default 10 s); those still running
    /// then are abandoned and their entries stay pending (reclaimed after their lease).
    /// `serve` sets every worker's from its `shutdown_grace`.
    #[serde(skip)]
    pub shutdown_grace: Duration,
    /// The consumer name (default `<host>-<pid>-<random>`).
    #[serde(skip)]
    pub consumer: Option<String>,
    /// Attempts before dead-lettering (default 10).
    pub max_attempts: u32,
    /// Delay before each retry: `fixed:5s`, `linear:2m:1m`, `exponential:1s:10m` (the
    /// default, with jitter).
    #[serde(deserialize_with = "backoff_text")]
    pub backoff: Backoff,
    /// An entry whose consumer stopped extending its lease this long ago is taken over by
    /// another consumer (default `30s`; at least `30ms`).
    #[serde(with = "crate::engine::duration::human")]
    pub visibility_timeout: Duration,
    /// Longest wait between two looks at the group's due timers while it has any (default
    /// 1 s); the loop also wakes at the earliest timer and at this worker's own retries. A
    /// group with no timer at all is looked at less often, doubling up to a third of
    /// `visibility_timeout`.
    #[serde(skip)]
    pub reclaim_every: Duration,
    /// Entries taken ahead of free handler slots (default: three times `concurrency`).
    /// Under a backlog, each read then takes up to `concurrency + prefetch` entries (at most
    /// 1,000) instead of the few slots that just came free, so there are fewer round trips
    /// per entry (storm drain +25–35% measured, see docs/benchmarks.md). Prefetched entries
    /// are leased, and their leases extended, like running ones; they wait for a slot in
    /// this process. 0 turns it off.
    pub prefetch: Option<usize>,
    /// At most this many handler calls per period, shared by every process of the group:
    /// `200/s`, `30/m`, `1000/h` (default none). Entries beyond it stay in the stream,
    /// unread.
    #[serde(deserialize_with = "rate_limit_text")]
    pub rate_limit: Option<RateLimit>,
    /// How reads pick among the `high`, `normal` and `low` orders (default strict: every
    /// `high` entry before any `normal` one, every `normal` before any `low`); weighted
    /// takes three weights, most urgent first (`priority_weights = [6, 3, 1]`).
    #[serde(rename = "priority_weights", deserialize_with = "priority_weights")]
    pub priority: PriorityMode,
    /// At most this many deliveries of one order key in flight in this group at once,
    /// across every process and shard of the group, 1..=10000 (default none: no limit per
    /// key). Entries of a saturated key wait (parked, not counting as attempts) without
    /// holding up other keys; a waiting retry holds no slot. Orders without a key are not
    /// limited.
    pub key_concurrency: Option<u32>,
    /// One delivery per order key at a time, in due order, and an order waiting for its
    /// retry keeps its key until it is done or dead-lettered (default false). Implies a
    /// `key_concurrency` of 1.
    pub key_sequence: bool,
}

/// `backoff = "linear:2m:1m"`, read by [`Backoff::parse`].
fn backoff_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Backoff, D::Error> {
    crate::engine::duration::human::from_text(d, Backoff::parse)
}

/// `rate_limit = "200/s"`, read by [`RateLimit::parse`].
fn rate_limit_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<RateLimit>, D::Error> {
    crate::engine::duration::human::from_text(d, RateLimit::parse).map(Some)
}

/// `priority_weights = [6, 3, 1]`: one weight per level, most urgent first.
fn priority_weights<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PriorityMode, D::Error> {
    use serde::{Deserialize, de::Error};
    let weights = Vec::<u32>::deserialize(d)?;
    PriorityMode::weighted(weights, Priority::ALL.len()).map_err(D::Error::custom)
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 16,
            handler_timeout: Duration::from_secs(30),
            block: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            consumer: None,
            max_attempts: 10,
            backoff: Backoff::default(),
            visibility_timeout: Duration::from_secs(30),
            reclaim_every: Duration::from_secs(1),
            prefetch: None,
            rate_limit: None,
            priority: PriorityMode::Strict,
            key_concurrency: None,
            key_sequence: false,
        }
    }
}

impl WorkerOptions {
    /// Sets the concurrency.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets the handler timeout.
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = d;
        self
    }

    /// Sets the shutdown grace period.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// Sets the read block time.
    pub fn block(mut self, d: Duration) -> Self {
        self.block = d;
        self
    }

    /// Sets the consumer name.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// Sets the attempt limit.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Sets the backoff policy.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Sets the visibility timeout.
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.visibility_timeout = d;
        self
    }

    /// Sets the longest wait between reclaim looks.
    pub fn reclaim_every(mut self, d: Duration) -> Self {
        self.reclaim_every = d;
        self
    }

    /// Sets the group's rate limit.
    pub fn rate_limit(mut self, r: RateLimit) -> Self {
        self.rate_limit = Some(r);
        self
    }

    /// Sets how many entries are taken ahead of free handler slots.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Sets how reads pick among priority levels.
    pub fn priority(mut self, mode: PriorityMode) -> Self {
        self.priority = mode;
        self
    }

    /// Sets how many deliveries of one order key may be in flight in the group at once.
    pub fn key_concurrency(mut self, n: u32) -> Self {
        self.key_concurrency = Some(n);
        self
    }

    /// Makes the group deliver each order key's orders one at a time, in due order, a
    /// retry keeping its key.
    pub fn key_sequence(mut self, on: bool) -> Self {
        self.key_sequence = on;
        self
    }

    /// The slots per order key, when the group limits keys: `key_concurrency`, or 1 for a
    /// `key_sequence`.
    pub(super) fn key_slots(&self) -> Option<u32> {
        match (self.key_concurrency, self.key_sequence) {
            (n, true) => Some(n.unwrap_or(1)),
            (n, false) => n,
        }
    }

    /// Handler slots plus prefetch: the most entries a reader holds at once.
    pub(super) fn taken_limit(&self) -> usize {
        self.concurrency + self.prefetch.unwrap_or(3 * self.concurrency)
    }

    /// Checks every option's range (the one place they are written).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |name: &'static str, reason: &str| InvalidInput::Option {
            name,
            reason: reason.to_owned(),
        };
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err(bad("concurrency", "must be 1..=10000"));
        }
        self.backoff.validate()?;
        if self.prefetch.is_some_and(|p| p > 10_000) {
            return Err(bad("prefetch", "must be 0..=10000"));
        }
        if self.block < Duration::from_millis(1) {
            return Err(bad("block", "must be at least 1 ms"));
        }
        if self.handler_timeout.is_zero() {
            return Err(bad("handler_timeout", "must be more than zero"));
        }
        if self.max_attempts == 0 {
            return Err(bad("max_attempts", "must be at least 1"));
        }
        if self.visibility_timeout < Duration::from_millis(30) {
            return Err(bad("visibility_timeout", "must be at least 30 ms"));
        }
        if let Some(r) = &self.rate_limit {
            r.validate()?;
        }
        if self.reclaim_every.is_zero() {
            return Err(bad("reclaim_every", "must be more than zero"));
        }
        if self
            .key_concurrency
            .is_some_and(|n| n == 0 || n > MAX_KEY_CONCURRENCY)
        {
            return Err(bad("key_concurrency", "must be 1..=10000"));
        }
        if self.key_sequence && self.key_concurrency.is_some_and(|n| n > 1) {
            return Err(bad(
                "key_sequence",
                "means one delivery per key at a time: key_concurrency must be 1 or unset",
            ));
        }
        if let PriorityMode::Weighted(w) = &self.priority {
            PriorityMode::weighted(w.clone(), Priority::ALL.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_limits_are_checked_and_named() {
        let named = |o: WorkerOptions| match o.validate() {
            Err(InvalidInput::Option { name, .. }) => Some(name),
            _ => None,
        };
        let o = WorkerOptions::default;
        assert_eq!(named(o().key_concurrency(0)), Some("key_concurrency"));
        assert_eq!(named(o().key_concurrency(10_001)), Some("key_concurrency"));
        assert_eq!(named(o().key_concurrency(10_000)), None);
        assert_eq!(
            named(o().key_sequence(true).key_concurrency(2)),
            Some("key_sequence")
        );
        assert_eq!(named(o().key_sequence(true).key_concurrency(1)), None);
        assert_eq!(o().key_slots(), None);
        assert_eq!(o().key_concurrency(3).key_slots(), Some(3));
        assert_eq!(o().key_sequence(true).key_slots(), Some(1));
    }
}
