//! The Lua scripts in `lua/`, loaded at compile time, one typed wrapper each.
//!
//! Scripts are invoked by SHA (`EVALSHA`) and loaded again when Redis answers `NOSCRIPT`
//! (after a restart or `SCRIPT FLUSH`); [`redis::Script::invoke_async`] does both.

use crate::error::{Error, RedisContext, Result};
use crate::keys::ShardKeys;
use crate::order::ScheduleOutcome;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/enqueue.lua`.
pub const ENQUEUE_LUA: &str = include_str!("../lua/enqueue.lua");
/// Source of `lua/dequeue.lua`.
pub const DEQUEUE_LUA: &str = include_str!("../lua/dequeue.lua");
/// Source of `lua/cancel.lua`.
pub const CANCEL_LUA: &str = include_str!("../lua/cancel.lua");
/// Source of `lua/reschedule.lua`.
pub const RESCHEDULE_LUA: &str = include_str!("../lua/reschedule.lua");

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

/// Runs `enqueue.lua` for orders of one shard; returns one outcome per order.
pub(crate) async fn enqueue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    if_absent: bool,
    now_ms: i64,
    orders: &[EnqueueArg<'_>],
) -> Result<Vec<ScheduleOutcome>> {
    let mut inv = ENQUEUE.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.payload)
        .arg(if if_absent { "nx" } else { "upsert" })
        .arg(now_ms);
    for o in orders {
        inv.arg(o.id).arg(o.due_ms).arg(o.payload);
    }
    let codes: Vec<i64> = inv
        .invoke_async(conn)
        .await
        .ctx("scheduling orders (enqueue.lua)")?;
    if codes.len() != orders.len() {
        return Err(Error::Protocol {
            context: "scheduling orders (enqueue.lua)",
            detail: format!("{} outcomes for {} orders", codes.len(), orders.len()),
        });
    }
    codes
        .into_iter()
        .map(|c| match c {
            1 => Ok(ScheduleOutcome::Created),
            2 => Ok(ScheduleOutcome::Updated),
            0 => Ok(ScheduleOutcome::Unchanged),
            other => Err(Error::Protocol {
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

/// Runs `dequeue.lua` on one shard.
pub(crate) async fn dequeue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now_ms: i64,
    limit: usize,
) -> Result<DequeueReport> {
    let (moved, next): (usize, Option<f64>) = DEQUEUE
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.stream)
        .arg(now_ms)
        .arg(limit.clamp(1, MAX_DEQUEUE_BATCH))
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
