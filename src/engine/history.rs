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
//! [`Client::history`] answers one order; [`Client::redeliver`] sends orders straight to
//! one group unless they are still on their way (reconciliation).

use crate::engine::client::Client;
use crate::engine::keys::{QueueName, ShardKeys, shard_of, validate_id, validate_member_name};
use crate::engine::message::{NewOrder, decode_stored, raw_json};
use crate::engine::priority::Priority;
use crate::engine::scripts::stored_level;
use crate::engine::worker::Fields;
use crate::error::{Error, InvalidInput, RedisContext, Result};
use serde::Serialize;
use serde_json::value::RawValue;
use std::time::Duration;

/// History kept when a queue's record says nothing else: 24 hours.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The longest history retention: 90 days.
pub const MAX_HISTORY_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);
/// The registry record field holding a queue's history retention, in ms.
pub(crate) const RETENTION_FIELD: &str = "history_ms";

use crate::engine::scripts::admin::{HISTORY, REDELIVER};

/// The length of a history bucket, ms: one hour, independent of the retention.
pub const HISTORY_BUCKET_MS: i64 = 3_600_000;

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

    /// The keys of every bucket of `keys`' shard that may hold history now, newest first.
    pub(crate) fn buckets(&self, keys: &ShardKeys, now_ms: i64) -> Vec<String> {
        self.lookup(now_ms)
            .into_iter()
            .map(|b| keys.history(self.bucket_ms(), b))
            .collect()
    }

    /// The buckets that may hold an order dispatched within the retention, newest first
    /// (one more at the new end, for clocks of processes a few ms apart).
    fn lookup(&self, now_ms: i64) -> Vec<i64> {
        if !self.is_on() {
            return Vec::new();
        }
        let newest = self.bucket_of(now_ms) + 1;
        let oldest = self.bucket_of(now_ms - self.retention_ms);
        (oldest..=newest).rev().collect()
    }
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

/// Where an order is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderState {
    /// Waiting for its due time.
    Scheduled,
    /// Moved into the stream: see each group's state.
    Dispatched,
}

/// Where a dispatched order is in one consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// Not yet read by the group.
    Waiting,
    /// Taken by a consumer (leased), being handled.
    Running,
    /// An attempt failed; the next one is at `next_attempt_at_ms`.
    Retrying,
    /// Handled and acknowledged.
    Done,
    /// Given up on: dead-lettered.
    Dead,
}

/// One group's part in a dispatched order's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupHistory {
    /// The consumer group.
    pub group: String,
    /// Where the order is in it.
    pub state: GroupState,
    /// Deliveries so far (0 while waiting).
    pub attempts: u32,
    /// The last failure, when one is known.
    pub last_error: Option<String>,
    /// When the next attempt is due (retrying only), unix ms.
    pub next_attempt_at_ms: Option<i64>,
}

/// What happened to an order: the answer of `GET /v1/queues/{q}/messages/{id}` and `delayq
/// get`.
#[derive(Debug, Clone, Serialize)]
pub struct OrderHistory {
    /// The queue.
    pub queue: String,
    /// The order id.
    pub id: String,
    /// Scheduled or dispatched.
    pub state: OrderState,
    /// When it is (or was) due, unix ms.
    pub due_at_ms: i64,
    /// The payload, byte for byte as it was scheduled, while the order is scheduled or its
    /// stream entry exists; `null` after.
    pub payload: Option<Box<RawValue>>,
    /// When it was dispatched, unix ms.
    pub dispatched_at_ms: Option<i64>,
    /// Its stream entry id.
    pub entry_id: Option<String>,
    /// Each consumer group's state (dispatched orders; empty while scheduled).
    pub groups: Vec<GroupHistory>,
    /// The order's priority level (of its first delivery once dispatched).
    pub priority: Priority,
}

/// What [`Client::redeliver`] did with one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Redelivered {
    /// Appended to the stream for the group alone.
    Sent,
    /// Left alone: it is scheduled.
    Scheduled,
    /// Left alone: its latest entry is pending in the group or not yet read by it.
    InFlight,
}

impl Client {
    /// Sets how long `queue` keeps the history of its dispatched orders (zero: none). Every
    /// dispatcher and worker of the queue follows it within a second.
    pub async fn set_history_retention(&self, queue: &str, retention: Duration) -> Result<()> {
        let q = QueueName::new(queue)?;
        let policy = HistoryPolicy::new(retention)?;
        self.shards_of(&q).await?;
        let _: i64 = redis::cmd("HSET")
            .arg(self.queue_meta_key(&q))
            .arg(RETENTION_FIELD)
            .arg(policy.retention_ms())
            .query_async(&mut self.connection())
            .await
            .ctx("setting the history retention")?;
        self.bump_registry().await
    }

    /// What happened to order `id` of `queue`: scheduled, or dispatched with each group's
    /// state. `None` when it was never seen, was cancelled, or is past the retention.
    pub async fn history(&self, queue: &str, id: &str) -> Result<Option<OrderHistory>> {
        let q = QueueName::new(queue)?;
        validate_id(id)?;
        let shards = self.shards_of(&q).await?;
        let keys = self.shard_keys(&q, shard_of(id, shards));
        let policy = self.queue_flags(&q, None).await?.history;
        let groups = group_names(self, &keys).await?;
        let buckets = policy.lookup(self.now_ms());
        let mut inv = HISTORY.prepare_invoke();
        let [high, normal, low] = keys.lanes();
        inv.key(&keys.due)
            .key(&keys.payload)
            .key(&normal.stream)
            .key(&keys.dead)
            .key(&high.stream)
            .key(&low.stream)
            .key(&keys.levels);
        for &b in &buckets {
            inv.key(keys.history(policy.bucket_ms(), b));
        }
        for g in &groups {
            for lane in [&normal, &high, &low] {
                inv.key(lane.timers(g)).key(lane.errors(g));
            }
        }
        inv.arg(id).arg(buckets.len()).arg(policy.bucket_ms());
        for &b in &buckets {
            inv.arg(b);
        }
        inv.arg(policy.cutoff(self.now_ms()));
        for g in &groups {
            inv.arg(g);
        }
        let reply: redis::Value = inv
            .invoke_async(&mut self.connection())
            .await
            .ctx("reading an order's history (history.lua)")?;
        parse_history(q.as_str(), id, reply)
    }

    /// Sends `orders` straight to consumer group `group` of `queue` (due now; no other
    /// group sees them, as with a dead-letter replay), except those still on their way: an
    /// order that is scheduled, or whose latest entry is pending in the group or not yet
    /// read by it, is left alone. The check and the send are one script per call, so
    /// concurrent runs never send an order twice. Used by reconciliation.
    pub async fn redeliver(
        &self,
        queue: &str,
        group: &str,
        orders: &[NewOrder],
    ) -> Result<Vec<Redelivered>> {
        let q = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        let now = self.now_ms();
        for (index, o) in orders.iter().enumerate() {
            o.validate(now, self.options().max_payload_bytes)
                .map_err(|e| InvalidInput::InBatch {
                    index,
                    source: Box::new(e),
                })?;
        }
        let shards = self.shards_of(&q).await?;
        let policy = self.queue_flags(&q, None).await?.history;
        let buckets = policy.lookup(now);
        let mut out = vec![Redelivered::Scheduled; orders.len()];
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); usize::from(shards)];
        for (i, o) in orders.iter().enumerate() {
            by_shard[usize::from(shard_of(&o.id, shards))].push(i);
        }
        for (shard, idxs) in by_shard.iter().enumerate() {
            let keys = self.shard_keys(&q, u16::try_from(shard).unwrap_or(0));
            for chunk in idxs.chunks(REDELIVER_CHUNK) {
                let mut inv = REDELIVER.prepare_invoke();
                let [high, _, low] = keys.lanes();
                inv.key(&keys.due)
                    .key(&keys.stream)
                    .key(&high.stream)
                    .key(&low.stream);
                for &b in &buckets {
                    inv.key(keys.history(policy.bucket_ms(), b));
                }
                inv.arg(group).arg(buckets.len()).arg(policy.bucket_ms());
                for &b in &buckets {
                    inv.arg(b);
                }
                inv.arg(now).arg(policy.write_target(&keys, now).1);
                for &i in chunk {
                    inv.arg(&orders[i].id).arg(orders[i].payload.as_str());
                }
                let codes: Vec<i64> = inv
                    .invoke_async(&mut self.connection())
                    .await
                    .ctx("redelivering orders (redeliver.lua)")?;
                for (&i, c) in chunk.iter().zip(codes) {
                    out[i] = match c {
                        1 => Redelivered::Sent,
                        2 => Redelivered::InFlight,
                        _ => Redelivered::Scheduled,
                    };
                }
            }
        }
        Ok(out)
    }
}

/// Orders per `redeliver.lua` call.
const REDELIVER_CHUNK: usize = 500;

/// The consumer groups of a shard's stream (none when it does not exist).
async fn group_names(client: &Client, keys: &ShardKeys) -> Result<Vec<String>> {
    let r: redis::RedisResult<redis::Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&keys.stream)
        .query_async(&mut client.connection())
        .await;
    let v = match r {
        Ok(v) => v,
        Err(e) if e.code() == Some("ERR") && e.to_string().contains("no such key") => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(e).ctx("listing consumer groups (XINFO GROUPS)"),
    };
    let redis::Value::Array(groups) = v else {
        return Ok(Vec::new());
    };
    Ok(groups
        .into_iter()
        .filter_map(|g| {
            crate::engine::worker::field_pairs(g)?
                .into_iter()
                .find(|(k, _)| k == "name")
                .map(|(_, v)| v)
        })
        .collect())
}

fn reply_err(detail: impl Into<String>) -> Error {
    Error::Reply {
        context: "reading an order's history (history.lua)",
        detail: detail.into(),
    }
}

fn text(v: &redis::Value) -> Option<String> {
    crate::engine::worker::as_string(v)
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        other => text(other)
            .and_then(|s| s.parse::<f64>().ok())
            .map(crate::engine::scripts::score_to_ms),
    }
}

/// The payload of a stored value (`"<enqueued_ms>:<json>"`), byte for byte; a traced
/// order's context (`"<enqueued_ms>:~<traceparent>...~<json>"`) is left out.
fn stored_payload(raw: &str) -> Box<RawValue> {
    raw_json(decode_stored(raw).1)
}

fn parse_history(queue: &str, id: &str, reply: redis::Value) -> Result<Option<OrderHistory>> {
    let redis::Value::Array(parts) = reply else {
        return Ok(None);
    };
    let mut parts = parts.into_iter();
    let state = parts
        .next()
        .as_ref()
        .and_then(text)
        .ok_or_else(|| reply_err("no state"))?;
    let base = |state, due_at_ms| OrderHistory {
        queue: queue.to_owned(),
        id: id.to_owned(),
        state,
        due_at_ms,
        payload: None,
        dispatched_at_ms: None,
        entry_id: None,
        groups: Vec::new(),
        priority: Priority::Normal,
    };
    if state == "scheduled" {
        let due = parts
            .next()
            .as_ref()
            .and_then(int)
            .ok_or_else(|| reply_err("no due time"))?;
        let mut h = base(OrderState::Scheduled, due);
        h.payload = parts
            .next()
            .as_ref()
            .and_then(text)
            .map(|s| stored_payload(&s));
        h.priority = stored_level(parts.next().as_ref().and_then(text).as_deref());
        return Ok(Some(h));
    }
    let entry = parts
        .next()
        .as_ref()
        .and_then(text)
        .ok_or_else(|| reply_err("no entry id"))?;
    let due = parts
        .next()
        .as_ref()
        .and_then(int)
        .ok_or_else(|| reply_err("no due time"))?;
    let mut h = base(OrderState::Dispatched, due);
    let fields: Option<Fields> = parts.next().and_then(crate::engine::worker::field_pairs);
    h.payload = fields.as_ref().and_then(|f| {
        f.iter()
            .find(|(k, _)| k == "data")
            .map(|(_, v)| stored_payload(v))
    });
    h.dispatched_at_ms = entry_ms(&entry);
    h.entry_id = Some(entry);
    if let Some(redis::Value::Array(groups)) = parts.next() {
        for g in groups {
            let redis::Value::Array(g) = g else { continue };
            let get = |i: usize| g.get(i);
            let state = match get(1).and_then(text).as_deref() {
                Some("waiting") => GroupState::Waiting,
                Some("running") => GroupState::Running,
                Some("retrying") => GroupState::Retrying,
                Some("dead") => GroupState::Dead,
                _ => GroupState::Done,
            };
            h.groups.push(GroupHistory {
                group: get(0).and_then(text).unwrap_or_default(),
                state,
                attempts: get(2)
                    .and_then(int)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                last_error: get(3).and_then(text),
                next_attempt_at_ms: get(4).and_then(int),
            });
        }
    }
    h.priority = stored_level(parts.next().as_ref().and_then(text).as_deref());
    Ok(Some(h))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn markers_never_collide_with_order_ids() {
        let f = marker_field("close", "1-0");
        assert!(validate_id(&f).is_err());
    }
}
