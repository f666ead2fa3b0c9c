//! The Lua scripts in `lua/`, loaded at compile time, one typed wrapper each.
//!
//! Scripts are invoked by SHA (`EVALSHA`) and loaded again when Redis answers `NOSCRIPT`
//! (after a restart or `SCRIPT FLUSH`); [`redis::Script::invoke_async`] does both.

use crate::engine::history::{HistoryPolicy, marker_field};
use crate::engine::keys::ShardKeys;
use crate::engine::message::ScheduleOutcome;
use crate::error::{Error, RedisContext, Result};
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/enqueue.lua`.
pub const ENQUEUE_LUA: &str = include_str!("../../lua/enqueue.lua");
/// Source of `lua/dequeue.lua`.
pub const DEQUEUE_LUA: &str = include_str!("../../lua/dequeue.lua");
/// Source of `lua/cancel.lua`.
pub const CANCEL_LUA: &str = include_str!("../../lua/cancel.lua");
/// Source of `lua/reschedule.lua`.
pub const RESCHEDULE_LUA: &str = include_str!("../../lua/reschedule.lua");

static ENQUEUE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(ENQUEUE_LUA));
static DEQUEUE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DEQUEUE_LUA));
static CANCEL: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CANCEL_LUA));
static RESCHEDULE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RESCHEDULE_LUA));

/// Most dequeued orders per script call (each costs ~5 µs of Redis time).
pub const MAX_DEQUEUE_BATCH: usize = 1000;

/// One order as the enqueue script takes it.
pub(crate) struct EnqueueArg<'a> {
    pub id: &'a str,
    pub due_ms: i64,
    pub payload: &'a str,
}

/// The `enqueue.lua` invocation for orders of one shard (run it alone, or in a pipeline).
pub(crate) fn enqueue_invocation<'a>(
    keys: &ShardKeys,
    if_absent: bool,
    now_ms: i64,
    orders: &[EnqueueArg<'_>],
) -> redis::ScriptInvocation<'a> {
    let mut inv = ENQUEUE.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.payload)
        .arg(if if_absent { "nx" } else { "upsert" })
        .arg(now_ms);
    for o in orders {
        inv.arg(o.id).arg(o.due_ms).arg(o.payload);
    }
    inv
}

/// Runs `enqueue.lua` for orders of one shard; returns one outcome per order.
pub(crate) async fn enqueue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    if_absent: bool,
    now_ms: i64,
    orders: &[EnqueueArg<'_>],
) -> Result<Vec<ScheduleOutcome>> {
    let codes: Vec<i64> = enqueue_invocation(keys, if_absent, now_ms, orders)
        .invoke_async(conn)
        .await
        .ctx("scheduling orders (enqueue.lua)")?;
    enqueue_outcomes(codes, orders.len())
}

/// Loads `enqueue.lua` (after a `NOSCRIPT` in a pipeline, which does not reload by itself).
pub(crate) async fn load_enqueue<C: ConnectionLike>(conn: &mut C) -> Result<()> {
    ENQUEUE
        .prepare_invoke()
        .load_async(conn)
        .await
        .ctx("loading enqueue.lua")?;
    Ok(())
}

/// `enqueue.lua`'s reply codes as outcomes, one per order.
pub(crate) fn enqueue_outcomes(codes: Vec<i64>, orders: usize) -> Result<Vec<ScheduleOutcome>> {
    if codes.len() != orders {
        return Err(Error::Reply {
            context: "scheduling orders (enqueue.lua)",
            detail: format!("{} outcomes for {orders} orders", codes.len()),
        });
    }
    codes
        .into_iter()
        .map(|c| match c {
            1 => Ok(ScheduleOutcome::Created),
            2 => Ok(ScheduleOutcome::Updated),
            0 => Ok(ScheduleOutcome::Unchanged),
            other => Err(Error::Reply {
                context: "scheduling orders (enqueue.lua)",
                detail: format!("unknown outcome code {other}"),
            }),
        })
        .collect()
}

/// What one `dequeue.lua` call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DequeueReport {
    /// Orders moved into the stream.
    pub moved: usize,
    /// Due time of the earliest order still scheduled in the shard.
    pub next_due_ms: Option<i64>,
}

/// Runs `dequeue.lua` on one shard, recording the order history as `history` says.
pub(crate) async fn dequeue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now_ms: i64,
    limit: usize,
    history: &HistoryPolicy,
) -> Result<DequeueReport> {
    let (bucket, expires_at) = history.write_target(keys, now_ms);
    let (moved, next): (usize, Option<f64>) = DEQUEUE
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.stream)
        .key(bucket)
        .arg(now_ms)
        .arg(limit.clamp(1, MAX_DEQUEUE_BATCH))
        .arg(expires_at)
        .invoke_async(conn)
        .await
        .ctx("dispatching due orders (dequeue.lua)")?;
    Ok(DequeueReport {
        moved,
        next_due_ms: next.map(score_to_ms),
    })
}

/// Runs `cancel.lua`; true when the order was scheduled.
pub(crate) async fn cancel<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    id: &str,
) -> Result<bool> {
    let n: i64 = CANCEL
        .key(&keys.due)
        .key(&keys.payload)
        .arg(id)
        .invoke_async(conn)
        .await
        .ctx("cancelling an order (cancel.lua)")?;
    Ok(n == 1)
}

/// Runs `reschedule.lua`; true when the order was scheduled.
pub(crate) async fn reschedule<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    id: &str,
    due_ms: i64,
) -> Result<bool> {
    let n: i64 = RESCHEDULE
        .key(&keys.due)
        .arg(id)
        .arg(due_ms)
        .invoke_async(conn)
        .await
        .ctx("rescheduling an order (reschedule.lua)")?;
    Ok(n == 1)
}

/// A ZSET score (a double holding whole milliseconds) as unix ms.
#[allow(clippy::cast_possible_truncation)]
pub(crate) fn score_to_ms(score: f64) -> i64 {
    // Scores are written from i64 milliseconds below 2^53, so they are exact integers.
    score.round() as i64
}

/// Source of `lua/read.lua`.
pub const READ_LUA: &str = include_str!("../../lua/read.lua");
/// Source of `lua/reclaim.lua`.
pub const RECLAIM_LUA: &str = include_str!("../../lua/reclaim.lua");
/// Source of `lua/retry.lua`.
pub const RETRY_LUA: &str = include_str!("../../lua/retry.lua");
/// Source of `lua/dead.lua`.
pub const DEAD_LUA: &str = include_str!("../../lua/dead.lua");
/// Source of `lua/replay.lua`.
pub const REPLAY_LUA: &str = include_str!("../../lua/replay.lua");

static READ: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(READ_LUA));
static RECLAIM: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RECLAIM_LUA));
static RETRY: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RETRY_LUA));
static DEAD: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(DEAD_LUA));
static REPLAY: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(REPLAY_LUA));
/// Source of `lua/extend.lua`.
pub const EXTEND_LUA: &str = include_str!("../../lua/extend.lua");
static EXTEND: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(EXTEND_LUA));

/// Runs `extend.lua`: moves the lease of each `(entry id, lease end last set)` in `held` to
/// `until_ms`, where the timer still holds that lease; returns the ids extended.
pub(crate) async fn extend<C: ConnectionLike>(
    conn: &mut C,
    timers_key: &str,
    until_ms: i64,
    held: &[(String, i64)],
) -> Result<Vec<String>> {
    let mut inv = EXTEND.prepare_invoke();
    inv.key(timers_key).arg(until_ms);
    for (id, lease) in held {
        inv.arg(id).arg(*lease);
    }
    inv.invoke_async(conn)
        .await
        .ctx("extending leases (extend.lua)")
}

/// Runs `read.lua`: returns the raw entries (`[[id, [f, v, ...]], ...]`) and the stream's
/// last entry id.
pub(crate) async fn read<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    count: usize,
    lease_until_ms: i64,
) -> Result<(redis::Value, String)> {
    READ.key(&keys.stream)
        .key(keys.timers(group))
        .arg(group)
        .arg(consumer)
        .arg(count.clamp(1, 1000))
        .arg(lease_until_ms)
        .invoke_async(conn)
        .await
        .ctx("reading the stream (read.lua)")
}

/// Runs `reclaim.lua`: returns the raw claimed entries (`[[id, [f, v, ...], count], ...]`) and
/// the earliest remaining timer.
pub(crate) async fn reclaim<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    now_ms: i64,
    lease_until_ms: i64,
    limit: usize,
) -> Result<(redis::Value, Option<f64>)> {
    RECLAIM
        .key(&keys.stream)
        .key(keys.timers(group))
        .key(keys.errors(group))
        .arg(group)
        .arg(consumer)
        .arg(now_ms)
        .arg(lease_until_ms)
        .arg(limit.clamp(1, 1000))
        .invoke_async(conn)
        .await
        .ctx("reclaiming due entries (reclaim.lua)")
}

/// Runs `retry.lua` (the next attempt at `at_ms`; `error` recorded for the history); false
/// when the entry is no longer this consumer's.
pub(crate) async fn retry<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    entry_id: &str,
    at_ms: i64,
    error: &str,
) -> Result<bool> {
    let n: i64 = RETRY
        .key(&keys.stream)
        .key(keys.timers(group))
        .key(keys.errors(group))
        .arg(group)
        .arg(consumer)
        .arg(entry_id)
        .arg(at_ms)
        .arg(error)
        .invoke_async(conn)
        .await
        .ctx("scheduling a retry (retry.lua)")?;
    Ok(n == 1)
}

/// What to record with a dead letter.
pub(crate) struct DeadArgs<'a> {
    pub group: &'a str,
    pub consumer: &'a str,
    pub entry_id: &'a str,
    pub attempts: u32,
    pub error: &'a str,
    pub now_ms: i64,
    /// The queue's history retention (where the `dead` marker goes).
    pub history: HistoryPolicy,
}

/// Runs `dead.lua`; false when the entry is no longer this consumer's.
pub(crate) async fn dead_letter<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    a: &DeadArgs<'_>,
) -> Result<bool> {
    let (bucket, expires_at) = a.history.marker_target(keys, a.entry_id);
    let n: i64 = DEAD
        .key(&keys.stream)
        .key(keys.timers(a.group))
        .key(&keys.dead)
        .key(keys.errors(a.group))
        .key(bucket)
        .arg(a.group)
        .arg(a.consumer)
        .arg(a.entry_id)
        .arg(a.attempts)
        .arg(a.error)
        .arg(a.now_ms)
        .arg(marker_field(a.group, a.entry_id))
        .arg(expires_at)
        .invoke_async(conn)
        .await
        .ctx("dead-lettering an entry (dead.lua)")?;
    Ok(n == 1)
}

/// Runs `replay.lua` (the history follows the new entries, written at `now_ms`); returns how
/// many dead letters were replayed.
pub(crate) async fn replay<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: Option<&str>,
    dead_ids: &[String],
    now_ms: i64,
    history: &HistoryPolicy,
) -> Result<u64> {
    let (bucket, expires_at) = history.write_target(keys, now_ms);
    REPLAY
        .key(&keys.dead)
        .key(&keys.stream)
        .key(bucket)
        .arg(group.unwrap_or(""))
        .arg(expires_at)
        .arg(dead_ids)
        .invoke_async(conn)
        .await
        .ctx("replaying dead letters (replay.lua)")
}

/// Source of `lua/trim.lua`.
pub const TRIM_LUA: &str = include_str!("../../lua/trim.lua");
/// Source of `lua/consumers.lua`.
pub const CONSUMERS_LUA: &str = include_str!("../../lua/consumers.lua");

static TRIM: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(TRIM_LUA));
static CONSUMERS: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CONSUMERS_LUA));

/// Runs `trim.lua`; returns how many entries were removed.
pub(crate) async fn trim<C: ConnectionLike>(conn: &mut C, keys: &ShardKeys) -> Result<u64> {
    let (removed, _point): (u64, Option<String>) = TRIM
        .key(&keys.stream)
        .invoke_async(conn)
        .await
        .ctx("trimming the stream (trim.lua)")?;
    Ok(removed)
}

/// Runs `consumers.lua`; returns how many consumers were deleted.
pub(crate) async fn remove_idle_consumers<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    min_idle_ms: i64,
) -> Result<u64> {
    CONSUMERS
        .key(&keys.stream)
        .arg(min_idle_ms)
        .invoke_async(conn)
        .await
        .ctx("removing idle consumers (consumers.lua)")
}

/// Source of `lua/get.lua`.
pub const GET_LUA: &str = include_str!("../../lua/get.lua");
static GET: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(GET_LUA));

/// Runs `get.lua`: the order's score and stored value, read together.
pub(crate) async fn get<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    id: &str,
) -> Result<(Option<f64>, Option<String>)> {
    GET.key(&keys.due)
        .key(&keys.payload)
        .arg(id)
        .invoke_async(conn)
        .await
        .ctx("reading an order (get.lua)")
}
