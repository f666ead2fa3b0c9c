//! The order scripts: what producers run (`enqueue.lua`, `cancel.lua`, `reschedule.lua`,
//! `get.lua`) and what the dispatcher runs (`dequeue.lua`).

use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::history::HistoryPolicy;
use crate::engine::keys::ShardKeys;
use crate::engine::message::ScheduleOutcome;
use crate::engine::priority::Priority;
use crate::engine::reply::{score_to_ms, stored_level};
use crate::engine::time_rules::DebounceState;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/enqueue.lua`.
pub static ENQUEUE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/enqueue.lua")));
/// Source of `lua/dequeue.lua`.
pub static DEQUEUE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/dequeue.lua")));
/// Source of `lua/cancel.lua`.
pub static CANCEL_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/cancel.lua")));
/// Source of `lua/reschedule.lua`.
pub static RESCHEDULE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/reschedule.lua")));

static ENQUEUE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&ENQUEUE_LUA));
static DEQUEUE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&DEQUEUE_LUA));
static CANCEL: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&CANCEL_LUA));
static RESCHEDULE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&RESCHEDULE_LUA));

/// Most dequeued orders per script call (each costs ~5 µs of Redis time).
pub const MAX_DEQUEUE_BATCH: usize = 1000;

/// One order as the enqueue script takes it.
pub(crate) struct EnqueueArg<'a> {
    pub id: &'a str,
    pub due_ms: i64,
    pub payload: &'a str,
    pub priority: Priority,
    /// The time rules argument ([`crate::engine::time_rules::enqueue_rules_arg`]).
    pub rules: String,
    /// The payload argument holds the order's tags (see [`crate::engine::tags`]).
    pub tagged: bool,
    /// The order's key (see [`crate::engine::order_key`]).
    pub key: Option<&'a str>,
}

/// What `enqueue.lua` did with one order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Enqueued {
    pub outcome: ScheduleOutcome,
    /// The due time the script set (a debounced order's, capped), when it differs from the
    /// requested one.
    pub due_ms: Option<i64>,
    /// A duplicate's last dispatch, unix ms.
    pub dispatched_at_ms: Option<i64>,
    /// Cancelled by an event that arrived first: the event's name.
    pub event: Option<String>,
}

/// The KEYS of `enqueue.lua` for one shard, in its order (it takes these ten, no other
/// count): what a direct caller passes.
pub fn enqueue_keys(keys: &ShardKeys) -> [&str; 10] {
    [
        &keys.due,
        &keys.payload,
        &keys.meta,
        &keys.levels,
        &keys.dispatched,
        &keys.tags,
        &keys.debounce,
        &keys.keyed,
        &keys.key_ring,
        &keys.remembered,
    ]
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
    // Every shard key, so an upsert can re-index a keyed order on any call; the columns
    // are named in the mode (`upsert:rk`). Orders without time rules or keys go as
    // quadruples, as before those existed: no more work per order for them.
    for k in enqueue_keys(keys) {
        inv.key(k);
    }
    let rules = orders.iter().any(|o| !o.rules.is_empty());
    let keyed = orders.iter().any(|o| o.key.is_some());
    // A call without tags says so: the script does no work per order for tags.
    let tagged = orders.iter().any(|o| o.tagged);
    let mode = format!(
        "{}{}:{}{}",
        if if_absent { "nx" } else { "upsert" },
        if tagged { "+tags" } else { "" },
        if rules { "r" } else { "" },
        if keyed { "k" } else { "" },
    );
    inv.arg(mode).arg(now_ms).arg(epoch);
    for o in orders {
        inv.arg(o.id)
            .arg(o.due_ms)
            .arg(o.payload)
            .arg(lane_arg(o.priority));
        if rules {
            inv.arg(&o.rules);
        }
        if keyed {
            inv.arg(o.key.unwrap_or(""));
        }
    }
    inv
}

/// A level as the scripts take it: `""` for normal (the cheapest argument), else its name.
fn lane_arg(p: Priority) -> &'static str {
    match p {
        Priority::Normal => "",
        other => other.as_str(),
    }
}

/// Runs `enqueue.lua` for orders of one shard; returns one outcome per order.
pub(crate) async fn enqueue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    epoch: &str,
    if_absent: bool,
    now_ms: i64,
    orders: &[EnqueueArg<'_>],
) -> Result<Vec<Enqueued>> {
    let codes: Vec<redis::Value> = enqueue_invocation(keys, epoch, if_absent, now_ms, orders)
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

/// `enqueue.lua`'s reply as outcomes, one per order: a code, or `{code, ms}` (a
/// duplicate's dispatch time, a debounced order's due time).
pub(crate) fn enqueue_outcomes(codes: Vec<redis::Value>, orders: usize) -> Result<Vec<Enqueued>> {
    let bad = |detail: String| Error::Reply {
        context: "scheduling orders (enqueue.lua)",
        detail,
    };
    if codes.len() != orders {
        return Err(bad(format!("{} outcomes for {orders} orders", codes.len())));
    }
    codes
        .into_iter()
        .map(|v| {
            let (code, ms) = match v {
                redis::Value::Int(c) => (c, None),
                redis::Value::Array(a) if matches!(a.first(), Some(redis::Value::Int(4))) => {
                    let (_, token): (i64, String) = redis::from_redis_value(redis::Value::Array(a))
                        .map_err(|e| bad(e.to_string()))?;
                    return Ok(Enqueued {
                        outcome: ScheduleOutcome::CancelledByEvent,
                        due_ms: None,
                        dispatched_at_ms: None,
                        event: Some(crate::engine::events::event_of_token(&token).to_owned()),
                    });
                }
                other => {
                    let (c, ms): (i64, i64) =
                        redis::from_redis_value(other).map_err(|e| bad(e.to_string()))?;
                    (c, Some(ms))
                }
            };
            let outcome = match code {
                1 => ScheduleOutcome::Created,
                2 => ScheduleOutcome::Updated,
                0 => ScheduleOutcome::Unchanged,
                3 => ScheduleOutcome::Duplicate,
                other => return Err(bad(format!("unknown outcome code {other}"))),
            };
            let duplicate = outcome == ScheduleOutcome::Duplicate;
            Ok(Enqueued {
                outcome,
                due_ms: ms.filter(|_| !duplicate),
                dispatched_at_ms: ms.filter(|_| duplicate),
                event: None,
            })
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

/// Runs `dequeue.lua` on one shard, recording the order history as `history` says.
pub(crate) async fn dequeue<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now_ms: i64,
    limit: usize,
    history: &HistoryPolicy,
    hgetdel: bool,
) -> Result<DequeueReport> {
    let (bucket, expires_at) = history.write_target(keys, now_ms);
    let (moved, next, paused, gone): (usize, Option<f64>, i64, i64) = DEQUEUE
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.stream)
        .key(bucket)
        .key(&keys.meta)
        .key(&keys.levels)
        .key(&keys.lane(Priority::High).stream)
        .key(&keys.lane(Priority::Low).stream)
        .key(&keys.dispatched)
        .key(&keys.debounce)
        .key(&keys.tags)
        .key(&keys.keyed)
        .key(&keys.key_ring)
        .arg(now_ms)
        .arg(limit.clamp(1, MAX_DEQUEUE_BATCH))
        .arg(expires_at)
        .arg(if hgetdel { "1" } else { "0" })
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

/// Where a cancelling script records the cancellation: the history bucket of now, its
/// expiry (0: history off, nothing recorded) and now, unix ms
/// ([`crate::engine::history::HistoryPolicy::cancel_target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CancelRecord {
    /// The bucket key.
    pub bucket: String,
    /// When it expires, unix ms (0: history off).
    pub expires_at: i64,
    /// Now, unix ms.
    pub now_ms: i64,
}

/// The call of `cancel.lua` for order `id`, recording into `record` (its reply: 1 when the
/// order was scheduled).
pub(crate) fn cancel_invocation<'a>(
    keys: &ShardKeys,
    id: &str,
    record: &CancelRecord,
) -> redis::ScriptInvocation<'a> {
    let mut inv = CANCEL.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.payload)
        .key(&keys.levels)
        .key(&keys.debounce)
        .key(&keys.tags)
        .key(&keys.keyed)
        .key(&keys.key_ring)
        .key(&record.bucket)
        .arg(id)
        .arg(record.expires_at)
        .arg(record.now_ms);
    inv
}

/// Runs `cancel.lua`; true when the order was scheduled.
pub(crate) async fn cancel<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    id: &str,
    record: &CancelRecord,
) -> Result<bool> {
    let n: i64 = cancel_invocation(keys, id, record)
        .invoke_async(conn)
        .await
        .ctx("cancelling an order (cancel.lua)")?;
    Ok(n == 1)
}

/// The call of `reschedule.lua` (a new `priority`, or the order keeps its level; its reply:
/// 1 when the order was scheduled).
pub(crate) fn reschedule_invocation<'a>(
    keys: &ShardKeys,
    id: &str,
    due_ms: i64,
    priority: Option<Priority>,
) -> redis::ScriptInvocation<'a> {
    let mut inv = RESCHEDULE.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.levels)
        .key(&keys.payload)
        .key(&keys.keyed)
        .key(&keys.key_ring)
        .arg(id)
        .arg(due_ms);
    if let Some(p) = priority {
        inv.arg(p.as_str());
    }
    inv
}

/// Runs `reschedule.lua` (a new `priority`, or the order keeps its level); true when the
/// order was scheduled.
pub(crate) async fn reschedule<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    id: &str,
    due_ms: i64,
    priority: Option<Priority>,
) -> Result<bool> {
    let n: i64 = reschedule_invocation(keys, id, due_ms, priority)
        .invoke_async(conn)
        .await
        .ctx("rescheduling an order (reschedule.lua)")?;
    Ok(n == 1)
}

/// Source of `lua/get.lua`.
pub static GET_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/get.lua")));
static GET: LazyLock<super::ReadOnly> = LazyLock::new(|| super::ReadOnly::new(&GET_LUA));

/// One order as `get.lua` reads it: score, stored value, level and debounce state.
pub(crate) type GotOrder = (Option<f64>, Option<String>, Priority, Option<DebounceState>);

/// Runs `get.lua` (flagged read-only where `server` knows flags): the order's score, stored
/// value, level and debounce record, read together.
pub(crate) async fn get<C: ConnectionLike>(
    conn: &mut C,
    server: Option<crate::engine::version::ServerInfo>,
    keys: &ShardKeys,
    id: &str,
) -> Result<GotOrder> {
    type Reply = (Option<f64>, Option<String>, Option<String>, Option<String>);
    let (due, stored, level, deb): Reply = GET
        .for_server(server)
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.levels)
        .key(&keys.debounce)
        .arg(id)
        .invoke_async(conn)
        .await
        .ctx("reading an order (get.lua)")?;
    let deb = deb.as_deref().and_then(DebounceState::parse);
    Ok((due, stored, stored_level(level.as_deref()), deb))
}
