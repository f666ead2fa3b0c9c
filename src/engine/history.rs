//! Order history: what happened to an order after it was dispatched, group by group, for the
//! queue's history retention (default 24 h, recorded in its registry record).
//!
//! The dispatch script records, for every order it moves, `order id -> "<entry id>:<due ms>"`
//! in a per-shard HASH bucket: `{ns:q:s}:history:<bucket_ms>:<bucket>`, the bucket
//! of the dispatch time. A bucket covers `bucket_ms` (a 24th of the retention, at least one
//! second) and expires on its own (`PEXPIREAT`) once every order in it is older than the
//! retention: nothing scans, trims or grows without bound. The rest is derived when asked:
//!
//! - `waiting`: the entry is after the group's last-delivered id;
//! - `running`: pending in the group (leased);
//! - `retrying`: pending, and the group's errors HASH (written by `retry.lua`) holds the
//!   current attempt's failure; the timer is the next attempt;
//! - `done`: delivered and no longer pending (an entry acknowledged after several attempts
//!   leaves the marker `a<n>` in the bucket of its entry id's time);
//! - `dead`: `dead.lua` left the marker `d<n>:<dead-letter id>` there.
//!
//! A **cancelled** order (issue 43: by id in `cancel.lua`, by tag or event in
//! `tag_bulk.lua`) is recorded by the cancelling script itself, in the same call, into the
//! bucket of the cancel time exactly as a dispatch is (same key, expiry and count): `order id
//! -> "c:<cancel ms>:<due ms>:<reason>"` ([`CancelledBy`]: `id`, `tag\x1f<tag>` or
//! `event\x1f<name>\x1f<event id>`). It is a record of the open bucket, like a dispatch's, so
//! the touched log (for markers written into sealed buckets) has nothing to add. The answer
//! is then `cancelled` with the reason and the time; an order scheduled again under the same
//! id answers `scheduled`, and dispatched again, `dispatched` (the newest record wins).
//!
//! [`Queues::history`](crate::engine::admin::Queues::history) answers one order; [`Queues::redeliver`](crate::engine::admin::Queues::redeliver) sends orders straight to
//! one group unless they are still on their way (reconciliation).

use crate::engine::error::InvalidInput;
use crate::engine::keys::ShardKeys;
use serde::Serialize;
use std::time::Duration;

/// History kept when a queue's record says nothing else: 24 hours.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The longest history retention: 90 days.
pub const MAX_HISTORY_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);
/// The registry record field holding a queue's history retention, in ms.
pub(crate) const RETENTION_FIELD: &str = "history_ms";

/// The length of a history bucket, ms: one hour, independent of the retention.
pub const HISTORY_BUCKET_MS: i64 = 3_600_000;

/// How long a marker write stays in a shard's touched log ([`crate::engine::keys::ShardKeys::history_touched`]):
/// the longest retention plus two buckets, past which its bucket has expired whatever the
/// retention was; the log is trimmed to it on every marker write, so it holds at most the
/// buckets touched in that span.
#[allow(clippy::cast_possible_truncation)] // 90 days of ms fit an i64 many times over
pub const TOUCH_KEEP_MS: i64 = MAX_HISTORY_RETENTION.as_millis() as i64 + 2 * HISTORY_BUCKET_MS;

/// A queue's history retention and the bucket arithmetic that follows from it: the one
/// place buckets are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryPolicy {
    retention_ms: i64,
}

impl Default for HistoryPolicy {
    fn default() -> Self {
        HistoryPolicy::from_ms(ms(DEFAULT_HISTORY_RETENTION))
    }
}

impl HistoryPolicy {
    /// A retention: zero (history off) or 1 s ..= 90 days.
    pub fn new(retention: Duration) -> Result<Self, InvalidInput> {
        if !retention.is_zero()
            && (retention < Duration::from_secs(1) || retention > MAX_HISTORY_RETENTION)
        {
            return Err(InvalidInput::Option {
                name: "history_retention",
                reason: format!(
                    "must be 0 (off) or 1s..=90d, got {}",
                    crate::engine::duration::format_duration(retention)
                ),
            });
        }
        Ok(HistoryPolicy::from_ms(ms(retention)))
    }

    /// From a stored value (clamped into range; negative = off).
    pub(crate) fn from_ms(retention_ms: i64) -> Self {
        HistoryPolicy {
            retention_ms: retention_ms.clamp(0, ms(MAX_HISTORY_RETENTION)),
        }
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.retention_ms).unwrap_or(0))
    }

    /// The retention in ms (as stored in the registry).
    pub(crate) fn retention_ms(&self) -> i64 {
        self.retention_ms
    }

    /// Whether history is kept.
    pub fn is_on(&self) -> bool {
        self.retention_ms > 0
    }

    /// A bucket's length: fixed ([`HISTORY_BUCKET_MS`], one hour), whatever the retention,
    /// so changing the retention never hides a record: it only sets when buckets expire.
    /// Lookups ignore records older than the retention, so a record answers for exactly
    /// the retention even though its bucket lives up to an hour longer.
    pub fn bucket_ms(&self) -> i64 {
        HISTORY_BUCKET_MS
    }

    /// The oldest dispatch time (unix ms) a lookup at `now_ms` answers for.
    pub(crate) fn cutoff(&self, now_ms: i64) -> i64 {
        now_ms - self.retention_ms
    }

    fn bucket_of(&self, at_ms: i64) -> i64 {
        at_ms.div_euclid(self.bucket_ms())
    }

    /// When bucket `b` expires: once its last order is older than the retention.
    fn expires_at(&self, b: i64) -> i64 {
        (b + 1) * self.bucket_ms() + self.retention_ms
    }

    /// The bucket key a dispatch at `now_ms` writes, and its expiry (0 when history is off).
    pub(crate) fn write_target(&self, keys: &ShardKeys, now_ms: i64) -> (String, i64) {
        let b = self.bucket_of(now_ms);
        let at = if self.is_on() { self.expires_at(b) } else { 0 };
        (keys.history(self.bucket_ms(), b), at)
    }

    /// Where a cancelling script at `now_ms` records the cancellation: the bucket a
    /// dispatch at `now_ms` writes ([`HistoryPolicy::write_target`]).
    pub(crate) fn cancel_target(
        &self,
        keys: &ShardKeys,
        now_ms: i64,
    ) -> crate::engine::scripts::CancelRecord {
        let (bucket, expires_at) = self.write_target(keys, now_ms);
        crate::engine::scripts::CancelRecord {
            bucket,
            expires_at,
            now_ms,
        }
    }

    /// The bucket key holding the markers of stream entry `entry_id`, and its expiry (0 when
    /// history is off or the id is not a stream id).
    pub(crate) fn marker_target(&self, keys: &ShardKeys, entry_id: &str) -> (String, i64) {
        match entry_ms(entry_id) {
            Some(ms) if self.is_on() => {
                let b = self.bucket_of(ms);
                (keys.history(self.bucket_ms(), b), self.expires_at(b))
            }
            _ => (keys.history(self.bucket_ms(), 0), 0),
        }
    }

    /// Records in `pipe` that a marker was written at `now_ms` into the bucket holding the
    /// markers of `entry_id` (nothing when history is off): the shard's touched log, which
    /// the stats' count cache reads (see [`crate::engine::history_counts`]). `dead.lua` does
    /// the same inside its script.
    pub(crate) fn touch(
        &self,
        pipe: &mut redis::Pipeline,
        keys: &ShardKeys,
        entry_id: &str,
        now_ms: i64,
    ) {
        if let (true, Some(ms)) = (self.is_on(), entry_ms(entry_id)) {
            let log = keys.history_touched();
            pipe.cmd("ZADD")
                .arg(&log)
                .arg("GT")
                .arg(now_ms)
                .arg(self.bucket_of(ms))
                .ignore();
            pipe.cmd("ZREMRANGEBYSCORE")
                .arg(&log)
                .arg("-inf")
                .arg(format!("({}", now_ms - TOUCH_KEEP_MS))
                .ignore();
            pipe.cmd("PEXPIRE").arg(&log).arg(TOUCH_KEEP_MS).ignore();
        }
    }

    /// The current bucket at `now_ms`: buckets before the one before it are sealed (a
    /// dispatch, replay or redelivery writes the bucket of its own `now`, so only markers,
    /// which go to their entry's bucket, still reach them).
    pub(crate) fn current(&self, now_ms: i64) -> i64 {
        self.bucket_of(now_ms)
    }

    /// The keys of every bucket of `keys`' shard that may hold history now, newest first.
    pub(crate) fn buckets(&self, keys: &ShardKeys, now_ms: i64) -> Vec<String> {
        self.lookup(now_ms)
            .into_iter()
            .map(|b| keys.history(self.bucket_ms(), b))
            .collect()
    }

    /// The buckets that may hold an order dispatched within the retention, newest first
    /// (one more at the new end, for clocks of processes a few ms apart).
    pub(crate) fn lookup(&self, now_ms: i64) -> Vec<i64> {
        if !self.is_on() {
            return Vec::new();
        }
        let newest = self.bucket_of(now_ms) + 1;
        let oldest = self.bucket_of(now_ms - self.retention_ms);
        (oldest..=newest).rev().collect()
    }
}

/// Why an order was cancelled: the reason part of its history record (see the module docs)
/// and of the history answer's `cancelled` object (`{"reason": "event", "event": ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum CancelledBy {
    /// By its id (`cancel`).
    Id,
    /// By a tag it carried (`cancel --tag`).
    Tag {
        /// The tag.
        tag: String,
    },
    /// By an event matching a cancel-on-event rule.
    Event {
        /// The event's name.
        event: String,
        /// The event's id, when it had one.
        #[serde(skip_serializing_if = "Option::is_none")]
        event_id: Option<String>,
    },
}

/// The separator of a cancel record's reason fields (no tag, event name or id holds it).
const US: char = '\u{1f}';

impl CancelledBy {
    /// The reason as the cancelling scripts record it.
    pub(crate) fn record(&self) -> String {
        match self {
            CancelledBy::Id => "id".to_owned(),
            CancelledBy::Tag { tag } => format!("tag{US}{tag}"),
            CancelledBy::Event { event, event_id } => {
                format!("event{US}{event}{US}{}", event_id.as_deref().unwrap_or(""))
            }
        }
    }

    /// A recorded reason read back (`None`: not one this version writes).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(US);
        let by = match (parts.next()?, parts.next(), parts.next()) {
            ("id", None, None) => CancelledBy::Id,
            ("tag", Some(tag), None) => CancelledBy::Tag {
                tag: tag.to_owned(),
            },
            ("event", Some(event), Some(id)) => CancelledBy::Event {
                event: event.to_owned(),
                event_id: (!id.is_empty()).then(|| id.to_owned()),
            },
            _ => return None,
        };
        parts.next().is_none().then_some(by)
    }
}

impl std::fmt::Display for CancelledBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CancelledBy::Id => write!(f, "cancelled by id"),
            CancelledBy::Tag { tag } => write!(f, "cancelled by tag {tag}"),
            CancelledBy::Event { event, event_id } => match event_id {
                Some(id) => write!(f, "cancelled by event {event} ({id})"),
                None => write!(f, "cancelled by event {event}"),
            },
        }
    }
}

/// A cancelled order's cancellation: the history answer's `cancelled` object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cancellation {
    /// When it was cancelled, unix ms (the Redis clock).
    pub at_ms: i64,
    /// Why.
    #[serde(flatten)]
    pub by: CancelledBy,
}

/// The history marker field of (`group`, `entry_id`) in a bucket: it cannot be an order id
/// (ids hold no control characters).
pub(crate) fn marker_field(group: &str, entry_id: &str) -> String {
    format!("\u{1}{group}\u{1}{entry_id}")
}

/// The millisecond part of a stream entry id (`<ms>-<seq>`).
pub(crate) fn entry_ms(entry_id: &str) -> Option<i64> {
    entry_id.split_once('-').and_then(|(ms, _)| ms.parse().ok())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::keys::validate_id;

    #[test]
    fn buckets_cover_the_retention() {
        let p = HistoryPolicy::new(Duration::from_secs(24 * 3600)).unwrap();
        assert_eq!(p.bucket_ms(), 3_600_000);
        let now = 1_800_000_000_000;
        let l = p.lookup(now);
        assert_eq!(l.len(), 26);
        assert_eq!(l[0], now / 3_600_000 + 1);
        // An order dispatched just now expires no sooner than the retention after it.
        let b = p.bucket_of(now);
        assert!(p.expires_at(b) >= now + 24 * 3_600_000);
        assert!(p.expires_at(b) <= now + 25 * 3_600_000);
        // The width does not follow the retention: a change of retention finds the same
        // buckets.
        let short = HistoryPolicy::new(Duration::from_secs(2)).unwrap();
        assert_eq!(short.bucket_ms(), 3_600_000);
        assert_eq!(short.cutoff(now), now - 2000);
        let half = HistoryPolicy::new(Duration::from_secs(12 * 3600)).unwrap();
        assert!(half.lookup(now).iter().all(|b| l.contains(b)));
        assert!(HistoryPolicy::new(Duration::ZERO).is_ok_and(|p| !p.is_on()));
        assert!(HistoryPolicy::new(Duration::from_millis(10)).is_err());
        assert!(HistoryPolicy::new(MAX_HISTORY_RETENTION * 2).is_err());
    }

    #[test]
    fn cancel_reasons_read_back_as_written() {
        for by in [
            CancelledBy::Id,
            CancelledBy::Tag {
                tag: "customer:7".into(),
            },
            CancelledBy::Event {
                event: "order.paid".into(),
                event_id: Some("pay:1".into()),
            },
            CancelledBy::Event {
                event: "order.paid".into(),
                event_id: None,
            },
        ] {
            assert_eq!(CancelledBy::parse(&by.record()), Some(by));
        }
        assert_eq!(CancelledBy::parse("other"), None);
        assert_eq!(CancelledBy::parse("id\u{1f}x"), None);
        let c = Cancellation {
            at_ms: 5,
            by: CancelledBy::Event {
                event: "order.paid".into(),
                event_id: Some("e1".into()),
            },
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"at_ms": 5, "reason": "event", "event": "order.paid", "event_id": "e1"})
        );
    }

    #[test]
    fn markers_never_collide_with_order_ids() {
        let f = marker_field("close", "1-0");
        assert!(validate_id(&f).is_err());
    }
}
