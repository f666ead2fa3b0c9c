//! The consumer scripts: what a worker runs on a group's entries (`read.lua`, `extend.lua`,
//! `reclaim.lua`, `retry.lua`, `dead.lua`) and the dead-letter replay (`replay.lua`).

use crate::engine::error::{RedisContext, Result};
use crate::engine::history::{HistoryPolicy, marker_field};
use crate::engine::keys::ShardKeys;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/read.lua`.
pub static READ_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/read.lua")));
/// Source of `lua/reclaim.lua`.
pub static RECLAIM_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/reclaim.lua")));
/// Source of `lua/retry.lua`.
pub static RETRY_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/retry.lua")));
/// Source of `lua/dead.lua`.
pub static DEAD_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/dead.lua")));
/// Source of `lua/replay.lua`.
pub static REPLAY_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/replay.lua")));

static READ: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&READ_LUA));
static RECLAIM: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&RECLAIM_LUA));
static RETRY: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&RETRY_LUA));
static DEAD: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&DEAD_LUA));
static REPLAY: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&REPLAY_LUA));
/// Source of `lua/extend.lua`.
pub static EXTEND_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/extend.lua")));
static EXTEND: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&EXTEND_LUA));

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

/// What one `read.lua` call returned.
pub(crate) struct ReadReply {
    /// The raw entries (`[[id, [f, v, ...]], ...]`).
    pub entries: redis::Value,
    /// The stream's last entry id (`0-0` when empty or missing).
    pub last_id: String,
    /// The group is paused (nothing was read).
    pub paused: bool,
    /// The shard's priority lanes in use: 1 = high, 2 = low.
    pub lanes: u8,
    /// A `high` or `low` lane whose stream does not exist yet.
    pub missing: bool,
}

/// Runs `read.lua` on one lane of a shard.
pub(crate) async fn read<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    count: usize,
    lease_until_ms: i64,
) -> Result<ReadReply> {
    let mut inv = READ.prepare_invoke();
    inv.key(&keys.stream)
        .key(keys.timers(group))
        .key(&keys.meta)
        .arg(group)
        .arg(consumer)
        .arg(count.clamp(1, 1000))
        .arg(lease_until_ms);
    if keys.level != crate::engine::priority::Priority::Normal {
        inv.arg("lane");
    }
    let (entries, last_id, paused, lanes, missing): (redis::Value, String, i64, i64, i64) = inv
        .invoke_async(conn)
        .await
        .ctx("reading the stream (read.lua)")?;
    Ok(ReadReply {
        entries,
        last_id,
        paused: paused == 1,
        lanes: u8::try_from(lanes & 3).unwrap_or(0),
        missing: missing == 1,
    })
}

/// Runs `reclaim.lua`: returns the raw claimed entries (`[[id, [f, v, ...], count], ...]`),
/// the earliest remaining timer, the pending entries whose stream entry is gone
/// (entry id, owner, delivery count), left for the caller to dead-letter, and the due
/// entries of `held` (the ids of this shard the consumer still holds) leased again without
/// a claim.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn reclaim<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    now_ms: i64,
    lease_until_ms: i64,
    limit: usize,
    held: &[String],
) -> Result<(
    redis::Value,
    Option<f64>,
    Vec<(String, String, u32)>,
    Vec<String>,
)> {
    RECLAIM
        .key(&keys.stream)
        .key(keys.timers(group))
        .key(keys.errors(group))
        .arg(group)
        .arg(consumer)
        .arg(now_ms)
        .arg(lease_until_ms)
        .arg(limit.clamp(1, 1000))
        .arg(held)
        .invoke_async(conn)
        .await
        .ctx("reclaiming due entries (reclaim.lua)")
}

/// What a retry records (`retry.lua`).
pub(crate) struct RetryArgs<'a> {
    pub group: &'a str,
    pub consumer: &'a str,
    pub entry_id: &'a str,
    /// The next attempt, unix ms.
    pub at_ms: i64,
    /// The failed attempt's error, already redacted.
    pub error: &'a str,
    /// Publish `at_ms` on the shard's wake channel as a group timer, for waiting pull
    /// receives in every process (a pull group's hand-back).
    pub announce: bool,
}

/// Runs `retry.lua` (the next attempt at `a.at_ms`; the error recorded for the history);
/// false when the entry is no longer this consumer's.
pub(crate) async fn retry<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    a: &RetryArgs<'_>,
) -> Result<bool> {
    let n: i64 = RETRY
        .key(&keys.stream)
        .key(keys.timers(a.group))
        .key(keys.errors(a.group))
        .arg(a.group)
        .arg(a.consumer)
        .arg(a.entry_id)
        .arg(a.at_ms)
        .arg(a.error)
        .arg(if a.announce { "wake" } else { "" })
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
    /// Set when the entry expired: how late its hand-off would have been, ms (see
    /// [`crate::engine::expiry`]).
    pub late_ms: Option<i64>,
}

/// Runs `dead.lua`; false when the entry is no longer this consumer's.
pub(crate) async fn dead_letter<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    a: &DeadArgs<'_>,
) -> Result<bool> {
    let (bucket, expires_at) = a.history.marker_target(keys, a.entry_id);
    let mut inv = DEAD.prepare_invoke();
    inv.key(&keys.stream)
        .key(keys.timers(a.group))
        .key(&keys.dead)
        .key(keys.errors(a.group))
        .key(bucket)
        .key(keys.history_touched())
        .arg(a.group)
        .arg(a.consumer)
        .arg(a.entry_id)
        .arg(a.attempts)
        .arg(a.error)
        .arg(a.now_ms)
        .arg(marker_field(a.group, a.entry_id))
        .arg(expires_at)
        .arg(crate::engine::history::TOUCH_KEEP_MS);
    if let Some(late) = a.late_ms {
        inv.arg(late);
    }
    let n: i64 = inv
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
    let [high, _, low] = keys.lanes();
    REPLAY
        .key(&keys.dead)
        .key(&keys.stream)
        .key(bucket)
        .key(&high.stream)
        .key(&low.stream)
        .key(&keys.meta)
        .arg(group.unwrap_or(""))
        .arg(expires_at)
        .arg(dead_ids)
        .invoke_async(conn)
        .await
        .ctx("replaying dead letters (replay.lua)")
}
