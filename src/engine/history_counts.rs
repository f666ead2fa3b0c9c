//! The `history` count of the stats, at a cost independent of the retention.
//!
//! A shard's history is one HASH per hour ([`crate::engine::history`]): 2,162 buckets at the
//! 90-day retention. A bucket older than the one before the current one is **sealed**:
//! dispatches, replays and redeliveries write the bucket of their own `now`, so the only
//! writes that still reach it are markers (an ack after several attempts, a dead letter),
//! which go to the bucket of their entry's time, and nothing deletes single fields from a
//! bucket: it only expires whole. Each marker write also records its bucket and time in the
//! shard's touched log ([`crate::engine::keys::ShardKeys::history_touched`]: `dead.lua`,
//! and the ack pipeline through [`HistoryPolicy::touch`]).
//!
//! So this process keeps, per shard, each sealed bucket's length and expiry (`HLEN`, `PTTL`,
//! read once), and one count reads:
//! - `HLEN` of the open buckets (at most three);
//! - the touched log since its last look, less [`MARGIN_MS`] (for writers' clocks and the
//!   time a write is in flight), and `HLEN` + `PTTL` of each sealed bucket it names;
//! - `HLEN` + `PTTL` of a bucket newly sealed, of a bucket whose expiry has come, and of
//!   [`VERIFY_PER_CALL`] cached buckets in turn, so that a length changed behind the log's
//!   back (an eviction, a failover that lost writes, a hand-made edit) heals within about
//!   2,162 / 4 counts.
//!
//! The first count of a shard in this process (or after its queue's epoch or retention
//! changed, or after its cache entry was evicted, or when the last look is older than the
//! log keeps) reads every bucket once, in pipelines of [`FILL_CHUNK`]. The cache holds at most
//! [`MAX_CACHED_BUCKETS`] buckets (16 bytes each) over all shards; the shards used least
//! recently go first, and the shards of queues no longer listed are dropped by
//! [`HistoryCounts::retain_queues`].

use crate::engine::error::{RedisContext, Result};
use crate::engine::history::{HistoryPolicy, TOUCH_KEEP_MS};
use crate::engine::keys::ShardKeys;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

/// How far before its last look a count reads the touched log again: a marker write whose
/// `now` was taken up to this long before it reached Redis is still seen.
pub const MARGIN_MS: i64 = 300_000;
/// Cached buckets re-read per count, in turn.
pub const VERIFY_PER_CALL: usize = 4;
/// The most buckets the cache holds over all shards (2,162 per shard at 90 days).
pub const MAX_CACHED_BUCKETS: usize = 1 << 21;
/// Buckets per pipeline when a shard's cache is filled.
pub const FILL_CHUNK: usize = 512;

/// One sealed bucket as last read.
#[derive(Debug, Clone, Copy)]
struct Cached {
    len: u64,
    /// When it expires, unix ms (`i64::MAX`: no expiry, or gone).
    expires_ms: i64,
}

/// One shard's cache: the sealed buckets `lo ..` in order.
#[derive(Debug)]
struct Shard {
    epoch: String,
    retention_ms: i64,
    lo: i64,
    buckets: VecDeque<Cached>,
    /// When the touched log was last read (`now` at the start of that count).
    seen_ms: i64,
    cursor: usize,
    used: u64,
}

/// The per-process cache of sealed buckets' lengths (see the module docs).
#[derive(Debug, Default)]
pub struct HistoryCounts {
    shards: Mutex<HashMap<(String, u16), Shard>>,
}

/// What one count must read, planned under the lock and read without it.
struct Plan {
    /// The touched log's lower bound, when the cache is warm.
    since: Option<i64>,
    /// Open buckets: `HLEN` only.
    open: Vec<i64>,
    /// Sealed buckets to read (`HLEN` + `PTTL`).
    read: BTreeSet<i64>,
    /// The sealed range: `lo ..= hi`.
    lo: i64,
    hi: i64,
}

impl HistoryCounts {
    /// Buckets cached over all shards (the `delayq_history_count_cache_buckets` figure).
    pub fn cached_buckets(&self) -> usize {
        self.lock().values().map(|s| s.buckets.len()).sum()
    }

    /// Drops the shards of queues not in `queues` (deleted ones).
    pub fn retain_queues(&self, queues: &[String]) {
        let keep: std::collections::HashSet<&str> = queues.iter().map(String::as_str).collect();
        self.lock().retain(|(q, _), _| keep.contains(q.as_str()));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, u16), Shard>> {
        self.shards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The records in `keys`' shard's history buckets at `now_ms` (what `HLEN` of every bucket
    /// of the retention sums to), for the queue `queue` of epoch `epoch`.
    pub(crate) async fn count<C: redis::aio::ConnectionLike + Clone>(
        &self,
        conn: &C,
        queue: &str,
        keys: &ShardKeys,
        epoch: &str,
        policy: &HistoryPolicy,
        now_ms: i64,
    ) -> Result<u64> {
        let all = policy.lookup(now_ms);
        let (Some(&newest), Some(&oldest)) = (all.first(), all.last()) else {
            return Ok(0); // history off
        };
        let id = (queue.to_owned(), keys.shard);
        let plan = self.plan(&id, epoch, policy, now_ms, oldest, newest);
        let bucket = |b: i64| keys.history(policy.bucket_ms(), b);
        let mut read = plan.read;
        // The open buckets, and the touched log when the cache is warm.
        let mut pipe = redis::pipe();
        for &b in &plan.open {
            pipe.cmd("HLEN").arg(bucket(b));
        }
        if let Some(since) = plan.since {
            pipe.cmd("ZRANGEBYSCORE")
                .arg(keys.history_touched())
                .arg(since)
                .arg("+inf");
        }
        let mut conn1 = conn.clone();
        let replies: Vec<redis::Value> = pipe
            .query_async(&mut conn1)
            .await
            .ctx("counting the order history (HLEN)")?;
        let mut total = 0u64;
        for v in replies.iter().take(plan.open.len()) {
            total += u64_of(v);
        }
        if let Some(redis::Value::Array(touched)) = replies.get(plan.open.len()) {
            for m in touched {
                if let Some(b) = text(m).and_then(|t| t.parse::<i64>().ok())
                    && (plan.lo..=plan.hi).contains(&b)
                {
                    read.insert(b);
                }
            }
        }
        // The sealed buckets to read, in chunks.
        let read: Vec<i64> = read.into_iter().collect();
        let mut fresh: Vec<(i64, Cached)> = Vec::with_capacity(read.len());
        for chunk in read.chunks(FILL_CHUNK) {
            let mut pipe = redis::pipe();
            for &b in chunk {
                pipe.cmd("HLEN").arg(bucket(b));
                pipe.cmd("PTTL").arg(bucket(b));
            }
            let mut c = conn.clone();
            let r: Vec<redis::Value> = pipe
                .query_async(&mut c)
                .await
                .ctx("counting the order history (HLEN)")?;
            for (&b, pair) in chunk.iter().zip(r.chunks(2)) {
                let len = pair.first().map_or(0, u64_of);
                let ttl = pair.get(1).map_or(-2, i64_of);
                let expires_ms = if ttl >= 0 && len > 0 {
                    now_ms.saturating_add(ttl)
                } else {
                    i64::MAX
                };
                fresh.push((b, Cached { len, expires_ms }));
            }
        }
        total += self.apply(&id, epoch, policy, now_ms, plan.lo, plan.hi, &fresh);
        Ok(total)
    }

    /// What to read for shard `id`, given its sealed range; resets the shard's entry when
    /// its queue's epoch or retention changed, or its last look is older than the log keeps.
    fn plan(
        &self,
        id: &(String, u16),
        epoch: &str,
        policy: &HistoryPolicy,
        now_ms: i64,
        oldest: i64,
        newest: i64,
    ) -> Plan {
        let hi = (policy.current(now_ms) - 2).min(newest);
        let lo = oldest;
        let open: Vec<i64> = ((hi + 1).max(lo)..=newest).collect();
        let mut shards = self.lock();
        let fresh = |lo| Shard {
            epoch: epoch.to_owned(),
            retention_ms: policy.retention_ms(),
            lo,
            buckets: VecDeque::new(),
            seen_ms: now_ms,
            cursor: 0,
            used: 0,
        };
        let s = shards.entry(id.clone()).or_insert_with(|| fresh(lo));
        if s.epoch != epoch
            || s.retention_ms != policy.retention_ms()
            || s.lo > lo
            || now_ms - s.seen_ms > TOUCH_KEEP_MS - MARGIN_MS
        {
            *s = fresh(lo);
        }
        // Buckets past the retention leave the cache.
        while s.lo < lo {
            s.buckets.pop_front();
            s.lo += 1;
        }
        let warm = !s.buckets.is_empty();
        let known_hi = s.lo + i64::try_from(s.buckets.len()).unwrap_or(0) - 1;
        let mut read: BTreeSet<i64> = ((known_hi + 1).max(lo)..=hi).collect();
        for (i, c) in s.buckets.iter().enumerate() {
            if c.expires_ms <= now_ms {
                read.insert(s.lo + i64::try_from(i).unwrap_or(0));
            }
        }
        for _ in 0..VERIFY_PER_CALL.min(s.buckets.len()) {
            s.cursor = (s.cursor + 1) % s.buckets.len();
            read.insert(s.lo + i64::try_from(s.cursor).unwrap_or(0));
        }
        Plan {
            since: warm.then_some(s.seen_ms - MARGIN_MS),
            open,
            read,
            lo,
            hi,
        }
    }

    /// Stores what a count read and sums the shard's sealed buckets alive at `now_ms`.
    #[allow(clippy::too_many_arguments)]
    fn apply(
        &self,
        id: &(String, u16),
        epoch: &str,
        policy: &HistoryPolicy,
        now_ms: i64,
        lo: i64,
        hi: i64,
        fresh: &[(i64, Cached)],
    ) -> u64 {
        let mut shards = self.lock();
        let read: HashMap<i64, Cached> = fresh.iter().copied().collect();
        let alive = |c: &Cached| if c.expires_ms > now_ms { c.len } else { 0 };
        let usable = shards
            .get(id)
            .is_some_and(|s| s.epoch == epoch && s.retention_ms == policy.retention_ms());
        if !usable {
            // Another count reset this entry meanwhile: answer from this read alone.
            return fresh.iter().map(|(_, c)| alive(c)).sum();
        }
        let tick = shards.values().map(|s| s.used).max().unwrap_or(0) + 1;
        let Some(s) = shards.get_mut(id) else {
            return 0;
        };
        for &(b, c) in fresh {
            let i = b - s.lo;
            let len = i64::try_from(s.buckets.len()).unwrap_or(0);
            if i == len {
                s.buckets.push_back(c);
            } else if let Some(slot) = usize::try_from(i).ok().and_then(|i| s.buckets.get_mut(i)) {
                *slot = c;
            }
        }
        s.seen_ms = s.seen_ms.max(now_ms);
        s.used = tick;
        let total = (lo..=hi)
            .map(|b| {
                read.get(&b).map(alive).unwrap_or_else(|| {
                    usize::try_from(b - s.lo)
                        .ok()
                        .and_then(|i| s.buckets.get(i))
                        .map_or(0, alive)
                })
            })
            .sum();
        evict(&mut shards);
        total
    }
}

/// Drops the least recently used shards until the cache holds at most
/// [`MAX_CACHED_BUCKETS`] buckets.
fn evict(shards: &mut HashMap<(String, u16), Shard>) {
    let mut held: usize = shards.values().map(|s| s.buckets.len()).sum();
    while held > MAX_CACHED_BUCKETS {
        let Some(victim) = shards
            .iter()
            .min_by_key(|(_, s)| s.used)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        if let Some(s) = shards.remove(&victim) {
            held -= s.buckets.len();
        }
    }
}

fn u64_of(v: &redis::Value) -> u64 {
    u64::try_from(i64_of(v)).unwrap_or(0)
}

fn i64_of(v: &redis::Value) -> i64 {
    match v {
        redis::Value::Int(n) => *n,
        _ => -2,
    }
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}
