//! The recurring-schedule scripts: a schedule's record and index (`schedule.lua`) and its
//! ticks, each enqueued at most once (`tick.lua`).

use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::keys::ShardKeys;
use redis::aio::ConnectionLike;
use std::sync::LazyLock;

/// Source of `lua/schedule.lua`.
pub static SCHEDULE_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/schedule.lua")));
/// Source of `lua/tick.lua`.
pub static TICK_LUA: LazyLock<String> =
    LazyLock::new(|| super::source(include_str!("../../../lua/tick.lua")));
static SCHEDULE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&SCHEDULE_LUA));
static TICK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&TICK_LUA));

/// `""` for none, else the decimal.
fn opt_ms(v: Option<i64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// The keys `schedule.lua` takes: the record, the index and the queue's registry record.
pub(crate) struct ScheduleKeys {
    pub record: String,
    pub index: String,
    pub queue_record: String,
}

/// `put`: writes the spec and the next tick; returns the previous next tick, the generation
/// and whether anything changed (a spec declared again as it is keeps its record).
pub(crate) async fn schedule_put<C: ConnectionLike>(
    conn: &mut C,
    k: &ScheduleKeys,
    member: &str,
    spec_json: &str,
    next: Option<i64>,
    now: i64,
    max: usize,
) -> Result<(Option<i64>, i64, bool)> {
    let (previous, gen_, changed): (String, i64, i64) = SCHEDULE
        .key(&k.record)
        .key(&k.index)
        .key(&k.queue_record)
        .arg("put")
        .arg(member)
        .arg(spec_json)
        .arg(opt_ms(next))
        .arg(now)
        .arg(max)
        .invoke_async(conn)
        .await
        .ctx("writing a schedule (schedule.lua)")?;
    Ok((previous.parse().ok(), gen_, changed == 1))
}

/// One advance of a schedule (see `schedule.lua`).
pub(crate) struct Advance {
    pub generation: i64,
    pub expected: i64,
    pub next: Option<i64>,
    pub fired: Option<i64>,
    pub ticks: u64,
    pub missed: u64,
}

/// `advance`: moves the next tick on if the record is as the caller read it.
pub(crate) async fn schedule_advance<C: ConnectionLike>(
    conn: &mut C,
    k: &ScheduleKeys,
    member: &str,
    a: &Advance,
) -> Result<bool> {
    let done: i64 = SCHEDULE
        .key(&k.record)
        .key(&k.index)
        .key(&k.queue_record)
        .arg("advance")
        .arg(member)
        .arg(a.generation)
        .arg(a.expected)
        .arg(opt_ms(a.next))
        .arg(opt_ms(a.fired))
        .arg(a.ticks)
        .arg(a.missed)
        .invoke_async(conn)
        .await
        .ctx("advancing a schedule (schedule.lua)")?;
    Ok(done == 1)
}

/// `remove`: `None` when there was no schedule, else its next tick (if any).
pub(crate) async fn schedule_remove<C: ConnectionLike>(
    conn: &mut C,
    k: &ScheduleKeys,
    member: &str,
) -> Result<Option<Option<i64>>> {
    let previous: Option<String> = SCHEDULE
        .key(&k.record)
        .key(&k.index)
        .key(&k.queue_record)
        .arg("remove")
        .arg(member)
        .invoke_async(conn)
        .await
        .ctx("removing a schedule (schedule.lua)")?;
    Ok(previous.map(|p| p.parse().ok()))
}

/// What `tick.lua fire` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fired {
    /// Enqueued now.
    Enqueued,
    /// Enqueued earlier (this tick, or a later one of the schedule, in this shard).
    Already,
    /// Not enqueued: later than `not_after`.
    TooLate,
}

/// One tick to fire.
pub(crate) struct Tick<'a> {
    pub schedule: &'a str,
    pub instant: i64,
    pub id: &'a str,
    pub due: i64,
    pub payload: &'a str,
    pub not_after: Option<i64>,
}

/// `fire`: enqueues the tick at most once.
pub(crate) async fn tick_fire<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    epoch: &str,
    now: i64,
    t: &Tick<'_>,
) -> Result<Fired> {
    let code: i64 = TICK
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.meta)
        .key(keys.ticks())
        .arg("fire")
        .arg(now)
        .arg(epoch)
        .arg(t.schedule)
        .arg(t.instant)
        .arg(t.id)
        .arg(t.due)
        .arg(t.payload)
        .arg(opt_ms(t.not_after))
        .invoke_async(conn)
        .await
        .ctx("enqueuing a schedule's tick (tick.lua)")?;
    match code {
        1 => Ok(Fired::Enqueued),
        0 => Ok(Fired::Already),
        2 => Ok(Fired::TooLate),
        other => Err(Error::Reply {
            context: "enqueuing a schedule's tick (tick.lua)",
            detail: format!("unexpected code {other}"),
        }),
    }
}

/// `unfire`: takes a pending tick back; true when it was still scheduled.
pub(crate) async fn tick_unfire<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now: i64,
    schedule: &str,
    instant: i64,
    id: &str,
) -> Result<bool> {
    let code: i64 = TICK
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.meta)
        .key(keys.ticks())
        .arg("unfire")
        .arg(now)
        .arg("")
        .arg(schedule)
        .arg(instant)
        .arg(id)
        .invoke_async(conn)
        .await
        .ctx("taking a schedule's tick back (tick.lua)")?;
    Ok(code == 1)
}

/// `forget`: drops a removed schedule's latest tick in one shard.
pub(crate) async fn tick_forget<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now: i64,
    schedule: &str,
) -> Result<()> {
    let _: i64 = TICK
        .key(&keys.due)
        .key(&keys.payload)
        .key(&keys.meta)
        .key(keys.ticks())
        .arg("forget")
        .arg(now)
        .arg("")
        .arg(schedule)
        .invoke_async(conn)
        .await
        .ctx("forgetting a removed schedule (tick.lua)")?;
    Ok(())
}
