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
    epoch: &str,
    if_absent: bool,
    now_ms: i64,
    orders: &[EnqueueArg<'_>],
) -> redis::ScriptInvocation<'a> {
    let mut inv = ENQUEUE.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.payload)
        .key(&keys.meta)
        .arg(if if_absent { "nx" } else { "upsert" })
        .arg(now_ms)
        .arg(epoch);
    for o in orders {
        inv.arg(o.id).arg(o.due_ms).arg(o.payload);
    }
    inv
}

/// Runs `enqueue.lua` for orders of one shard; returns one outcome per order.
pub(crate) async fn enqueue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    epoch: &str,
    if_absent: bool,
    now_ms: i64,
    orders: &[EnqueueArg<'_>],
) -> Result<Vec<ScheduleOutcome>> {
    let codes: Vec<i64> = enqueue_invocation(keys, epoch, if_absent, now_ms, orders)
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
    /// The queue's dispatch is paused (nothing was moved).
    pub paused: bool,
    /// The shard has no epoch: the queue was deleted, or Redis lost its data.
    pub gone: bool,
}

/// What a script's error reply says about the queue, when it says something
/// (`enqueue.lua`, `join_group.lua`, `create_queue.lua` answer these, writing nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptRefusal {
    /// The queue does not exist (deleted, or being deleted).
    QueueNotFound,
    /// The queue was deleted and created again: re-read the registry.
    StaleEpoch,
    /// The consumer group was deleted while its worker ran.
    GroupDeleted,
    /// The namespace's cap on queues is reached.
    TooManyQueues,
    /// The queue's cap on groups is reached.
    TooManyGroups,
}

impl ScriptRefusal {
    /// The refusal an error carries, if any.
    pub(crate) fn of(e: &Error) -> Option<ScriptRefusal> {
        let Error::Redis { source, .. } = e else {
            return None;
        };
        let text = source.to_string();
        [
            ("delayq queue_not_found", ScriptRefusal::QueueNotFound),
            ("delayq stale_epoch", ScriptRefusal::StaleEpoch),
            ("delayq group_deleted", ScriptRefusal::GroupDeleted),
            ("delayq too_many_queues", ScriptRefusal::TooManyQueues),
            ("delayq too_many_groups", ScriptRefusal::TooManyGroups),
        ]
        .into_iter()
        .find(|(needle, _)| text.contains(needle))
        .map(|(_, r)| r)
    }
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
    let (moved, next, paused, gone): (usize, Option<f64>, i64, i64) = DEQUEUE
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.stream)
        .key(bucket)
        .key(&keys.meta)
        .arg(now_ms)
        .arg(limit.clamp(1, MAX_DEQUEUE_BATCH))
        .arg(expires_at)
        .invoke_async(conn)
        .await
        .ctx("dispatching due orders (dequeue.lua)")?;
    Ok(DequeueReport {
        moved,
        next_due_ms: next.map(score_to_ms),
        paused: paused == 1,
        gone: gone == 1,
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
) -> Result<(redis::Value, String, i64)> {
    READ.key(&keys.stream)
        .key(keys.timers(group))
        .key(&keys.meta)
        .arg(group)
        .arg(consumer)
        .arg(count.clamp(1, 1000))
        .arg(lease_until_ms)
        .invoke_async(conn)
        .await
        .ctx("reading the stream (read.lua)")
}

/// Runs `reclaim.lua`: returns the raw claimed entries (`[[id, [f, v, ...], count], ...]`),
/// the earliest remaining timer, and the pending entries whose stream entry is gone
/// (entry id, owner, delivery count), left for the caller to dead-letter.
pub(crate) async fn reclaim<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    consumer: &str,
    now_ms: i64,
    lease_until_ms: i64,
    limit: usize,
) -> Result<(redis::Value, Option<f64>, Vec<(String, String, u32)>)> {
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

/// Source of `lua/create_queue.lua`.
pub const CREATE_QUEUE_LUA: &str = include_str!("../../lua/create_queue.lua");
/// Source of `lua/fence.lua`.
pub const FENCE_LUA: &str = include_str!("../../lua/fence.lua");
/// Source of `lua/join_group.lua`.
pub const JOIN_GROUP_LUA: &str = include_str!("../../lua/join_group.lua");
/// Source of `lua/heartbeat.lua`.
pub const HEARTBEAT_LUA: &str = include_str!("../../lua/heartbeat.lua");
static CREATE_QUEUE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(CREATE_QUEUE_LUA));
static FENCE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(FENCE_LUA));
static JOIN_GROUP: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(JOIN_GROUP_LUA));
static HEARTBEAT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(HEARTBEAT_LUA));

/// Every script, by name (the file name without `.lua`), as the engine runs it: what
/// `delayq scripts export` writes for the SDKs, whose copies must match byte for byte.
pub fn all() -> Vec<(&'static str, &'static str)> {
    vec![
        ("enqueue", ENQUEUE_LUA),
        ("dequeue", DEQUEUE_LUA),
        ("cancel", CANCEL_LUA),
        ("reschedule", RESCHEDULE_LUA),
        ("get", GET_LUA),
        ("read", READ_LUA),
        ("reclaim", RECLAIM_LUA),
        ("retry", RETRY_LUA),
        ("dead", DEAD_LUA),
        ("replay", REPLAY_LUA),
        ("extend", EXTEND_LUA),
        ("trim", TRIM_LUA),
        ("consumers", CONSUMERS_LUA),
        ("create_queue", CREATE_QUEUE_LUA),
        ("fence", FENCE_LUA),
        ("join_group", JOIN_GROUP_LUA),
        ("heartbeat", HEARTBEAT_LUA),
        ("stats", crate::engine::stats::STATS_LUA),
        ("history", crate::engine::history::HISTORY_LUA),
        ("redeliver", crate::engine::history::REDELIVER_LUA),
        ("ratelimit", crate::engine::flow::RATELIMIT_LUA),
    ]
}

/// What `create_queue.lua` answered: whether it registered the queue, its shard count and
/// its epoch.
pub(crate) async fn create_queue<C: ConnectionLike>(
    conn: &mut C,
    keyspace: &crate::engine::keys::Keyspace,
    queue: &crate::engine::keys::QueueName,
    shards: u16,
    new_epoch: &str,
    max_queues: usize,
) -> Result<(bool, u16, String)> {
    let (created, stored, epoch): (i64, u16, String) = CREATE_QUEUE
        .key(keyspace.queues())
        .key(keyspace.queue_record(queue))
        .key(keyspace.registry_version())
        .arg(queue.as_str())
        .arg(shards)
        .arg(new_epoch)
        .arg(max_queues)
        .invoke_async(conn)
        .await
        .ctx("registering the queue (create_queue.lua)")?;
    Ok((created == 1, stored, epoch))
}

/// What `fence.lua` found in one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fence {
    /// 1 fenced, 0 refused (not empty), -1 not this epoch's shard.
    pub fenced: i64,
    /// Orders scheduled.
    pub scheduled: u64,
    /// Dead letters.
    pub dead: u64,
    /// Per group: name, pending, lag.
    pub groups: Vec<(String, u64, u64)>,
}

/// Runs `fence.lua` on one shard (see the script).
pub(crate) async fn fence<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    epoch: &str,
    force: bool,
) -> Result<Fence> {
    let reply: Vec<redis::Value> = FENCE
        .key(&keys.due)
        .key(&keys.stream)
        .key(&keys.dead)
        .key(&keys.meta)
        .arg(epoch)
        .arg(if force { "1" } else { "0" })
        .invoke_async(conn)
        .await
        .ctx("fencing a shard for deletion (fence.lua)")?;
    let bad = || Error::Reply {
        context: "fencing a shard for deletion (fence.lua)",
        detail: "malformed reply".into(),
    };
    let int = |v: &redis::Value| redis::from_redis_value_ref::<i64>(v).map_err(|_| bad());
    let (head, rest) = reply.split_at_checked(3).ok_or_else(bad)?;
    let mut f = Fence {
        fenced: int(&head[0])?,
        scheduled: u64::try_from(int(&head[1])?).unwrap_or(0),
        dead: u64::try_from(int(&head[2])?).unwrap_or(0),
        groups: Vec::new(),
    };
    for g in rest.chunks(3) {
        let [name, pending, lag] = g else {
            return Err(bad());
        };
        let name: String = redis::from_redis_value_ref(name).map_err(|_| bad())?;
        f.groups.push((
            name,
            u64::try_from(int(pending)?).unwrap_or(0),
            u64::try_from(int(lag)?).unwrap_or(0),
        ));
    }
    Ok(f)
}

/// Runs `join_group.lua`: creates `group` on a shard's stream when it is new; true when
/// created. `rejoin`: a running worker's group vanished (refused when the stream exists).
pub(crate) async fn join_group<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    group: &str,
    rejoin: bool,
    max_groups: usize,
) -> Result<bool> {
    let n: i64 = JOIN_GROUP
        .key(&keys.stream)
        .key(&keys.meta)
        .arg(group)
        .arg(if rejoin { "rejoin" } else { "create" })
        .arg(max_groups)
        .invoke_async(conn)
        .await
        .ctx("creating the consumer group (join_group.lua)")?;
    Ok(n == 1)
}

/// Runs `heartbeat.lua`; false when the queue no longer exists.
pub(crate) async fn heartbeat<C: ConnectionLike>(
    conn: &mut C,
    alive_key: &str,
    shard0: &ShardKeys,
    member: &str,
    now_ms: i64,
    alive: bool,
    drop_before_ms: i64,
) -> Result<bool> {
    let n: i64 = HEARTBEAT
        .key(alive_key)
        .key(&shard0.meta)
        .arg(member)
        .arg(now_ms)
        .arg(if alive { "1" } else { "0" })
        .arg(drop_before_ms)
        .invoke_async(conn)
        .await
        .ctx("recording a heartbeat (heartbeat.lua)")?;
    Ok(n == 1)
}
