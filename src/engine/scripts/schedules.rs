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

/// The keys `schedule.lua` takes: the record, the due index, the queue's registry record,
/// the full index and the totals.
pub(crate) struct ScheduleKeys {
    pub record: String,
    pub index: String,
    pub queue_record: String,
    pub all: String,
    pub totals: String,
}

impl ScheduleKeys {
    fn on(&self, script: &'static redis::Script) -> redis::ScriptInvocation<'static> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.record)
            .key(&self.index)
            .key(&self.queue_record)
            .key(&self.all)
            .key(&self.totals);
        inv
    }
}

/// What `put` answered.
pub(crate) struct Put {
    /// The next tick the record had.
    pub previous: Option<i64>,
    /// The record's generation (new when `changed`).
    pub generation: i64,
    /// False when the record already held this spec for this queue epoch.
    pub changed: bool,
    /// True when there was no record.
    pub created: bool,
    /// The queue's epoch the schedule is declared on (`None` for a record without one).
    pub epoch: Option<String>,
}

/// One `put`.
pub(crate) struct PutArgs<'a> {
    pub spec_json: &'a str,
    pub next: Option<i64>,
    pub now: i64,
    pub max: usize,
    pub cost: u64,
    pub max_cost: u64,
}

/// `put`: writes the spec and the next tick (see `schedule.lua`).
pub(crate) async fn schedule_put<C: ConnectionLike>(
    conn: &mut C,
    k: &ScheduleKeys,
    member: &str,
    a: &PutArgs<'_>,
) -> Result<Put> {
    let (previous, generation, changed, epoch): (String, i64, i64, String) = k
        .on(&SCHEDULE)
        .arg("put")
        .arg(member)
        .arg(a.spec_json)
        .arg(opt_ms(a.next))
        .arg(a.now)
        .arg(a.max)
        .arg(a.cost)
        .arg(a.max_cost)
        .invoke_async(conn)
        .await
        .ctx("writing a schedule (schedule.lua)")?;
    Ok(Put {
        previous: previous.parse().ok(),
        generation,
        changed: changed != 0,
        created: changed == 2,
        epoch: Some(epoch).filter(|e| !e.is_empty()),
    })
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
    let done: i64 = k
        .on(&SCHEDULE)
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

/// `remove`: `None` when there was no schedule, else its next tick (if any) and the
/// removal's generation.
pub(crate) async fn schedule_remove<C: ConnectionLike>(
    conn: &mut C,
    k: &ScheduleKeys,
    member: &str,
    now: i64,
) -> Result<Option<(Option<i64>, i64)>> {
    let removed: Option<(String, i64)> = k
        .on(&SCHEDULE)
        .arg("remove")
        .arg(member)
        .arg(now)
        .invoke_async(conn)
        .await
        .ctx("removing a schedule (schedule.lua)")?;
    Ok(removed.map(|(p, g)| (p.parse().ok(), g)))
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
    /// Not enqueued: the schedule changed or was removed since the caller read it.
    Superseded,
}

/// One tick to fire.
pub(crate) struct Tick<'a> {
    pub schedule: &'a str,
    pub generation: i64,
    pub read_ms: i64,
    pub instant: i64,
    pub id: &'a str,
    pub due: i64,
    pub payload: &'a str,
    pub not_after: Option<i64>,
}

/// How long a scheduler's reading of a schedule stays good for a fire (older: superseded).
pub(crate) const MAX_READING_AGE: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a removed schedule's tombstone stays in each shard (well above
/// [`MAX_READING_AGE`]).
pub(crate) const TOMBSTONE_LIFE: std::time::Duration = std::time::Duration::from_secs(3600);

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn on_shard(keys: &ShardKeys, schedule: &str) -> redis::ScriptInvocation<'static> {
    let mut inv = TICK.prepare_invoke();
    inv.key(&keys.due)
        .key(&keys.payload)
        .key(&keys.meta)
        .key(keys.ticks())
        .key(keys.tick_tombstone(schedule));
    inv
}

/// `fire`: enqueues the tick at most once, unless the schedule changed since it was read.
pub(crate) async fn tick_fire<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    epoch: &str,
    now: i64,
    t: &Tick<'_>,
) -> Result<Fired> {
    let code: i64 = on_shard(keys, t.schedule)
        .arg("fire")
        .arg(now)
        .arg(epoch)
        .arg(t.schedule)
        .arg(t.generation)
        .arg(t.instant)
        .arg(t.id)
        .arg(t.due)
        .arg(t.payload)
        .arg(opt_ms(t.not_after))
        .arg(t.read_ms)
        .arg(ms(MAX_READING_AGE))
        .invoke_async(conn)
        .await
        .ctx("enqueuing a schedule's tick (tick.lua)")?;
    match code {
        1 => Ok(Fired::Enqueued),
        0 => Ok(Fired::Already),
        2 => Ok(Fired::TooLate),
        3 => Ok(Fired::Superseded),
        other => Err(Error::Reply {
            context: "enqueuing a schedule's tick (tick.lua)",
            detail: format!("unexpected code {other}"),
        }),
    }
}

/// `unfire`: takes a pending tick back; `Some(true)` when it was still scheduled, `None`
/// when the caller's generation is superseded.
pub(crate) async fn tick_unfire<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now: i64,
    schedule: &str,
    generation: i64,
    instant: i64,
    id: &str,
) -> Result<Option<bool>> {
    let code: i64 = on_shard(keys, schedule)
        .arg("unfire")
        .arg(now)
        .arg("")
        .arg(schedule)
        .arg(generation)
        .arg(instant)
        .arg(id)
        .invoke_async(conn)
        .await
        .ctx("taking a schedule's tick back (tick.lua)")?;
    Ok(match code {
        3 => None,
        c => Some(c == 1),
    })
}

/// How a schedule changed, for [`tick_sync`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Updated and still ticking: a pending tick not due yet is taken back.
    Update,
    /// Paused or ended: the pending tick is taken back, due or not.
    Stop,
    /// Removed: as `Stop`, and a tombstone is left.
    Remove,
}

/// `sync`: fences the schedule's older generations out of one shard and takes their
/// pending tick back; true when one was taken back.
pub(crate) async fn tick_sync<C: ConnectionLike>(
    conn: &mut C,
    keys: &ShardKeys,
    now: i64,
    schedule: &str,
    generation: i64,
    change: Change,
) -> Result<bool> {
    let kind = match change {
        Change::Update => "change",
        Change::Stop => "stop",
        Change::Remove => "remove",
    };
    let code: i64 = on_shard(keys, schedule)
        .arg("sync")
        .arg(now)
        .arg("")
        .arg(schedule)
        .arg(generation)
        .arg(kind)
        .arg(ms(TOMBSTONE_LIFE))
        .invoke_async(conn)
        .await
        .ctx("bringing a shard up to date with a schedule (tick.lua)")?;
    Ok(code == 1)
}
