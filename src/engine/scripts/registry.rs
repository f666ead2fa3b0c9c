//! The registry and maintenance scripts: declaring and fencing queues
//! (`create_queue.lua`, `fence.lua`), joining groups and heartbeats (`join_group.lua`,
//! `heartbeat.lua`), and the maintenance passes (`trim.lua`, `consumers.lua`).

use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::keys::ShardKeys;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/create_queue.lua`.
pub static CREATE_QUEUE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/create_queue.lua")));
/// Source of `lua/fence.lua`.
pub static FENCE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/fence.lua")));
/// Source of `lua/retire.lua`.
pub static RETIRE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/retire.lua")));
/// Source of `lua/purge.lua`.
pub static PURGE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/purge.lua")));
/// Source of `lua/join_group.lua`.
pub static JOIN_GROUP_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/join_group.lua")));
/// Source of `lua/heartbeat.lua`.
pub static HEARTBEAT_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/heartbeat.lua")));
static CREATE_QUEUE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(&CREATE_QUEUE_LUA));
static FENCE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&FENCE_LUA));
static RETIRE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&RETIRE_LUA));
static PURGE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&PURGE_LUA));
static JOIN_GROUP: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&JOIN_GROUP_LUA));
static HEARTBEAT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&HEARTBEAT_LUA));

/// What `create_queue.lua` answered: 1 when it registered the queue, 0 when it existed, -1
/// when it is being deleted; its shard count and its epoch.
pub(crate) async fn create_queue<C: ConnectionLike>(
    conn: &mut C,
    keyspace: &crate::engine::keys::Keyspace,
    queue: &crate::engine::keys::QueueName,
    shards: u16,
    new_epoch: &str,
    max_queues: usize,
) -> Result<(i64, u16, String)> {
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
    Ok((created, stored, epoch))
}

/// Runs `retire.lua` in mode `begin`: marks the record of `queue` deleting (left as it is
/// when it already is); its shard count and epoch, or `None` when it is not registered.
pub(crate) async fn retire_begin<C: ConnectionLike>(
    conn: &mut C,
    keyspace: &crate::engine::keys::Keyspace,
    queue: &crate::engine::keys::QueueName,
    now_ms: i64,
) -> Result<Option<(u16, String)>> {
    let reply: Vec<redis::Value> = retire(keyspace, queue)
        .arg("begin")
        .arg(queue.as_str())
        .arg(now_ms)
        .invoke_async(conn)
        .await
        .ctx("marking the queue deleting (retire.lua)")?;
    match reply.as_slice() {
        [flag] if redis::from_redis_value_ref::<i64>(flag).ok() == Some(0) => Ok(None),
        [_, shards, epoch] => Ok(Some((
            redis::from_redis_value_ref(shards).map_err(|_| retire_reply())?,
            redis::from_redis_value_ref(epoch).map_err(|_| retire_reply())?,
        ))),
        _ => Err(retire_reply()),
    }
}

/// Runs `retire.lua` in mode `end`: removes the record of `queue` when it is marked
/// deleting with `epoch`; true when it did.
pub(crate) async fn retire_end<C: ConnectionLike>(
    conn: &mut C,
    keyspace: &crate::engine::keys::Keyspace,
    queue: &crate::engine::keys::QueueName,
    epoch: &str,
) -> Result<bool> {
    let n: i64 = retire(keyspace, queue)
        .arg("end")
        .arg(queue.as_str())
        .arg(epoch)
        .invoke_async(conn)
        .await
        .ctx("removing the deleted queue's record (retire.lua)")?;
    Ok(n == 1)
}

fn retire(
    keyspace: &crate::engine::keys::Keyspace,
    queue: &crate::engine::keys::QueueName,
) -> redis::ScriptInvocation<'static> {
    let mut inv = RETIRE.prepare_invoke();
    inv.key(keyspace.queues())
        .key(keyspace.queue_record(queue))
        .key(keyspace.registry_version())
        .key(keyspace.deleting());
    inv
}

fn retire_reply() -> Error {
    Error::Reply {
        context: "marking the queue deleting (retire.lua)",
        detail: "malformed reply".into(),
    }
}

/// Runs `purge.lua` on one shard: unlinks `keys` (the meta hash first) unless the shard holds
/// another epoch than `epoch`; true when it did.
pub(crate) async fn purge<C: ConnectionLike>(
    conn: &mut C,
    meta: &str,
    keys: &[String],
    epoch: &str,
) -> Result<bool> {
    let mut inv = PURGE.prepare_invoke();
    inv.key(meta);
    for k in keys {
        inv.key(k);
    }
    let n: i64 = inv
        .arg(epoch)
        .invoke_async(conn)
        .await
        .ctx("removing a deleted shard's keys (purge.lua)")?;
    Ok(n == 1)
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
    let [high, _, low] = keys.lanes();
    let reply: Vec<redis::Value> = FENCE
        .key(&keys.due)
        .key(&keys.stream)
        .key(&keys.dead)
        .key(&keys.meta)
        .key(&high.stream)
        .key(&low.stream)
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
/// On a `high` or `low` lane: only where the lane's stream exists (`rejoin` alike).
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
        .arg(if keys.level != crate::engine::priority::Priority::Normal {
            "lane"
        } else if rejoin {
            "rejoin"
        } else {
            "create"
        })
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

/// Source of `lua/trim.lua`.
pub static TRIM_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/trim.lua")));
/// Source of `lua/consumers.lua`.
pub static CONSUMERS_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/consumers.lua")));

static TRIM: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&TRIM_LUA));
static CONSUMERS: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&CONSUMERS_LUA));

/// Runs `trim.lua` on each priority lane of the shard; returns how many entries were
/// removed and whether the shard is left clean.
pub(crate) async fn trim<C: ConnectionLike>(conn: &mut C, keys: &ShardKeys) -> Result<Trimmed> {
    let mut t = Trimmed {
        removed: 0,
        clean: true,
    };
    for lane in keys.lanes() {
        let (n, _point, len): (u64, Option<String>, u64) = TRIM
            .key(&lane.stream)
            .invoke_async(conn)
            .await
            .ctx("trimming the stream (trim.lua)")?;
        t.removed += n;
        // One entry stays at the trim point (XTRIM MINID keeps it).
        t.clean &= len <= 1;
    }
    Ok(t)
}

/// What [`trim`] did to a shard's lanes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trimmed {
    /// Entries removed.
    pub(crate) removed: u64,
    /// Every lane is read and acknowledged by every group (nothing left to trim later).
    pub(crate) clean: bool,
}

/// Runs `consumers.lua`; returns how many consumers were deleted.
pub(crate) async fn remove_idle_consumers<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    min_idle_ms: i64,
) -> Result<u64> {
    let mut removed = 0;
    for lane in keys.lanes() {
        let n: u64 = CONSUMERS
            .key(&lane.stream)
            .arg(min_idle_ms)
            .invoke_async(conn)
            .await
            .ctx("removing idle consumers (consumers.lua)")?;
        removed += n;
    }
    Ok(removed)
}
