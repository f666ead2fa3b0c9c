//! Recurring schedules: cron expressions and intervals in IANA time zones, each tick an
//! ordinary order enqueued exactly once.
//!
//! - [`spec`]: parsing and validating a recurrence, and its tick instants (pure, no Redis).
//! - `definition`: a schedule's spec ([`ScheduleSpec`], [`Missed`]), its checks and limits,
//!   and each tick's order id; `record`: a schedule as stored and as reported
//!   ([`ScheduleInfo`]).
//! - [`Schedules`]: declare, list, show and remove schedules (built from a [`Client`]).
//! - [`Scheduler`] (`scheduler`): the loop every `serve` process runs, moving each schedule
//!   to its next tick.
//!
//! # How a tick becomes an order, exactly once
//!
//! A schedule's record (`{ns}:schedule:<queue>:<id>`) holds its spec, a generation bumped by
//! every update, and its **next tick**; the namespace's index (`{ns}:schedules`, a ZSET)
//! scores it by that tick. The next tick is always enqueued ahead, as an ordinary order
//! with the id `<schedule id>@<tick instant ms>` due at the instant, so it is dispatched on
//! time by the dispatchers like any other order (pause, fan-out, retries, history and the
//! dashboard included). Once it is due, any scheduler advances the schedule:
//!
//! 1. it makes sure that tick was enqueued (`tick.lua fire`, a no-op when it was, refused
//!    when the schedule changed since it was read);
//! 2. it moves the record from that tick to the next one, if the record is still as it read
//!    it (`schedule.lua advance`: generation and next tick compared, else another scheduler
//!    or an update won and this one stops);
//! 3. it enqueues the new next tick ahead.
//!
//! `tick.lua` records in each shard the latest tick instant of each schedule it enqueued
//! there and refuses any instant up to it, so any number of schedulers, crashing and
//! restarting at any point, enqueue each tick at most once; step 1 of the next advance makes
//! it at least once. Time is the Redis server's clock (the client's [`Clock`]).
//!
//! # Missed ticks
//!
//! When no scheduler ran for a while (every process down), the schedule's next tick is
//! found more than [`MISSED_AFTER`] late. With [`Missed::Skip`] (the default) that tick is
//! taken back if it was not dispatched yet, the ticks that passed are counted as missed, and
//! the schedule goes on from the next instant after now. With [`Missed::FireOnce`] the late
//! tick is delivered (one catch-up, whatever the number missed) and the schedule goes on
//! from the next instant after now. `serve` runs one scheduler pass before it starts its
//! dispatchers, so a late tick is judged before it could be dispatched.
//!
//! # Updates and removal
//!
//! An update (a pause too) writes the new spec, next tick and a new generation in one step,
//! then brings every shard of the queue up to date (`tick.lua sync`: the shard refuses ticks
//! of older generations from then on, and takes back the old version's pending tick unless
//! it is due, or due or not for a pause), then enqueues the new next tick. A removal deletes
//! the record and leaves an expiring tombstone in every shard the same way. Each tick's
//! enqueue carries the generation its scheduler read, checked in the same script, so once
//! the change answers no scheduler can fire the old version, whatever point it was at.
//! A record fires with the queue epoch it was declared on: a schedule whose queue was
//! deleted (and perhaps created again) is removed by the next scheduler or list that meets
//! it, never firing into the new queue.
//!
//! [`Clock`]: crate::engine::clock::Clock

mod definition;
mod record;
mod scheduler;
pub mod spec;

pub use definition::*;
use record::*;
pub use record::{ScheduleInfo, ScheduleUpserted};
pub use scheduler::Scheduler;

use crate::engine::client::Client;
use crate::engine::error::{Error, InvalidInput, RedisContext, Result};
use crate::engine::keys::{QueueName, shard_of};
use crate::engine::message::Payload;
use crate::engine::scripts::ScriptRefusal;
use crate::engine::scripts::schedules::{
    self as script, Advance, Change, Fired, PutArgs, ScheduleKeys, Tick,
};
use spec::Recurrence;

/// Recurring schedules of a namespace: declare, list, show, remove.
#[derive(Clone)]
pub struct Schedules {
    pub(super) client: Client,
    /// A test's pause between an advance's compare-and-set and its enqueue of the next tick.
    #[cfg(feature = "test-util")]
    advance_pause: std::time::Duration,
}

/// Who is firing a tick: the schedule's generation, the queue epoch it was declared on, and
/// when it was read.
struct Reading<'a> {
    generation: i64,
    epoch: Option<&'a str>,
    read_ms: i64,
}

impl Schedules {
    /// Schedules through `client` (its namespace, clock and payload limit).
    pub fn new(client: &Client) -> Self {
        Schedules {
            client: client.clone(),
            #[cfg(feature = "test-util")]
            advance_pause: std::time::Duration::ZERO,
        }
    }

    /// The same, pausing `pause` between each advance's compare-and-set and its enqueue of
    /// the next tick: a test widens the window a change races into (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn with_advance_pause(mut self, pause: std::time::Duration) -> Self {
        self.advance_pause = pause;
        self
    }

    fn keys(&self, queue: &QueueName, id: &str) -> ScheduleKeys {
        let ks = self.client.keyspace();
        ScheduleKeys {
            record: ks.schedule_record(queue, id),
            index: ks.schedules(),
            queue_record: ks.queue_record(queue),
            all: ks.schedules_all(),
            totals: ks.schedules_totals(),
        }
    }

    /// Declares (or replaces) a schedule. Bad input is refused naming the field and writes
    /// nothing: a schedule that can never fire (`end` in the past, a cron that never
    /// matches) too, and one whose cost would take the namespace's schedules over
    /// [`MAX_FIRES_PER_SECOND`] (naming `cron` or `every`); a queue that is not registered
    /// is [`Error::QueueNotFound`]. The next tick is scheduled at once; before this
    /// returns, every shard of the queue refuses ticks of the replaced version and its
    /// pending tick is taken back (unless due: then it is delivered, it was due before the
    /// change; a pause takes it back due or not).
    pub async fn upsert(&self, spec: &ScheduleSpec) -> Result<ScheduleUpserted> {
        let rec = spec.validate(self.client.options().max_payload_bytes)?;
        let queue = QueueName::new(&spec.queue)?;
        let now = self.client.now_ms();
        let first = first_tick(spec, &rec, now)?;
        let next = if spec.paused { None } else { Some(first) };
        let cost = schedule_cost(&rec, now);
        let stored = Stored {
            cron: spec.cron.clone(),
            every: spec.every.clone(),
            timezone: Some(rec.timezone().to_owned()),
            payload: serde_json::value::RawValue::from_string(spec.payload.as_str().to_owned())
                .map_err(|e| InvalidInput::Payload {
                    reason: e.to_string(),
                })?,
            start_ms: spec.start_ms,
            end_ms: spec.end_ms,
            missed: spec.missed,
            paused: spec.paused,
        };
        let json = serde_json::to_string(&stored).map_err(|e| Error::Reply {
            context: "writing a schedule",
            detail: e.to_string(),
        })?;
        let k = self.keys(&queue, &spec.id);
        let member = member(&queue, &spec.id);
        let max_cost = MAX_FIRES_PER_SECOND * COST_PER_FIRE_PER_SECOND;
        let put = script::schedule_put(
            &mut self.client.connection(),
            &k,
            &member,
            &PutArgs {
                spec_json: &json,
                next,
                now,
                max: MAX_SCHEDULES,
                cost,
                max_cost,
            },
        )
        .await;
        let put = match put {
            Err(e) => {
                if let Some(used) = budget_used(&e) {
                    return Err(over_budget(spec, cost, used, max_cost).into());
                }
                return Err(match ScriptRefusal::of(&e) {
                    Some(ScriptRefusal::QueueNotFound) => Error::QueueNotFound {
                        queue: queue.as_str().to_owned(),
                    },
                    Some(ScriptRefusal::TooManySchedules) => {
                        Error::TooManySchedules { max: MAX_SCHEDULES }
                    }
                    _ => e,
                });
            }
            Ok(r) => r,
        };
        // Declared again as it is: the record keeps its next tick (made sure of below).
        let next = if put.changed { next } else { put.previous };
        if put.changed {
            let change = if next.is_some() {
                Change::Update
            } else {
                Change::Stop
            };
            self.sync(&queue, &spec.id, put.generation, change).await?;
        }
        if let Some(n) = next {
            let reading = Reading {
                generation: put.generation,
                epoch: put.epoch.as_deref(),
                read_ms: now,
            };
            // Superseded: a newer update won meanwhile (its own answer says what is next).
            self.fire(
                &queue,
                &spec.id,
                &reading,
                n,
                n,
                spec.payload.as_str(),
                None,
            )
            .await?;
        }
        Ok(ScheduleUpserted {
            queue: queue.as_str().to_owned(),
            id: spec.id.clone(),
            created: put.created,
            next_ms: next,
        })
    }

    /// Fences the schedule's older generations out of every shard of its queue and takes
    /// their pending tick back (see `lua/tick.lua` `sync`). Nothing to do when the queue
    /// is gone.
    async fn sync(
        &self,
        queue: &QueueName,
        id: &str,
        generation: i64,
        change: Change,
    ) -> Result<()> {
        let Ok(keys) = self.client.registered_keys(queue).await else {
            return Ok(());
        };
        let now = self.client.now_ms();
        for k in keys {
            script::tick_sync(
                &mut self.client.connection(),
                &k,
                now,
                id,
                generation,
                change,
            )
            .await?;
        }
        Ok(())
    }

    /// Removes a schedule and takes its pending tick back; false when there was none. When
    /// this returns, no shard of the queue enqueues a tick of it any more.
    pub async fn remove(&self, queue: &str, id: &str) -> Result<bool> {
        let queue = QueueName::new(queue)?;
        validate_schedule_id(id)?;
        let k = self.keys(&queue, id);
        let removed = script::schedule_remove(
            &mut self.client.connection(),
            &k,
            &member(&queue, id),
            self.client.now_ms(),
        )
        .await?;
        let Some((_, generation)) = removed else {
            return Ok(false);
        };
        self.sync(&queue, id, generation, Change::Remove).await?;
        Ok(true)
    }

    /// Pauses or resumes a schedule: paused, its pending tick is taken back and no tick is
    /// scheduled; resumed, it goes on from the next instant after now (the ticks in between
    /// are neither delivered nor missed). `None` when there is no such schedule.
    pub async fn set_paused(
        &self,
        queue: &str,
        id: &str,
        paused: bool,
    ) -> Result<Option<ScheduleInfo>> {
        let Some(info) = self.get(queue, id).await? else {
            return Ok(None);
        };
        let spec = ScheduleSpec {
            queue: info.queue.clone(),
            id: info.id.clone(),
            cron: info.cron.clone(),
            every: info.every.clone(),
            timezone: Some(info.timezone.clone()),
            payload: info.payload.clone(),
            start_ms: info.start_ms,
            end_ms: info.end_ms,
            missed: info.missed,
            paused,
        };
        self.upsert(&spec).await?;
        self.get(queue, id).await
    }

    async fn read(&self, queue: &QueueName, id: &str) -> Result<Option<Record>> {
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys(queue, id).record)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading a schedule")?;
        if fields.is_empty() {
            return Ok(None);
        }
        Record::parse(fields).map(Some).ok_or_else(|| Error::Reply {
            context: "reading a schedule",
            detail: "malformed record".into(),
        })
    }

    /// One schedule, with its next tick, counters and the next [`UPCOMING`] fire times.
    pub async fn get(&self, queue: &str, id: &str) -> Result<Option<ScheduleInfo>> {
        let queue = QueueName::new(queue)?;
        validate_schedule_id(id)?;
        Ok(self
            .read(&queue, id)
            .await?
            .map(|rec| self.info(queue.as_str(), id, &rec)))
    }

    /// Every schedule of `queue` (or of every queue) whatever its state (ticking, paused,
    /// ended), sorted by queue and id. A schedule whose queue was deleted (or deleted and
    /// created again) since it was declared is removed here instead.
    pub async fn list(&self, queue: Option<&str>) -> Result<Vec<ScheduleInfo>> {
        let queue = queue.map(QueueName::new).transpose()?;
        let (min, max) = match &queue {
            Some(q) => (format!("[{}:", q.as_str()), format!("({};", q.as_str())),
            None => ("-".to_owned(), "+".to_owned()),
        };
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.client.keyspace().schedules_all())
            .arg(&min)
            .arg(&max)
            .arg("BYLEX")
            .query_async(&mut self.client.connection())
            .await
            .ctx("listing schedules")?;
        let mut epochs: std::collections::HashMap<String, Option<String>> =
            std::collections::HashMap::new();
        let mut out = Vec::new();
        for m in members {
            let Some((q, id)) = m.split_once(':') else {
                continue;
            };
            let Ok(qn) = QueueName::new(q) else { continue };
            let Some(rec) = self.read(&qn, id).await? else {
                continue;
            };
            if !epochs.contains_key(q) {
                let e: Option<String> = redis::cmd("HGET")
                    .arg(self.client.keyspace().queue_record(&qn))
                    .arg("epoch")
                    .query_async(&mut self.client.connection())
                    .await
                    .ctx("reading a queue's epoch")?;
                epochs.insert(q.to_owned(), e);
            }
            let current = epochs.get(q).cloned().flatten();
            let orphan = match (&rec.epoch, &current) {
                (_, None) => true,
                (Some(declared), Some(now)) => declared != now,
                (None, Some(_)) => false,
            };
            if orphan {
                tracing::info!(queue = ?q, schedule = ?id, "the schedule's queue was deleted: removing the schedule");
                self.remove(q, id).await?;
                continue;
            }
            out.push(self.info(q, id, &rec));
        }
        out.sort_by(|a, b| (&a.queue, &a.id).cmp(&(&b.queue, &b.id)));
        Ok(out)
    }

    /// Adds the schedules of an earlier version (in the due index only) to the full index,
    /// once per namespace.
    pub(super) async fn adopt_earlier_records(&self) -> Result<()> {
        let ks = self.client.keyspace();
        let done: Option<String> = redis::cmd("HGET")
            .arg(ks.schedules_totals())
            .arg("adopted")
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the schedule totals")?;
        if done.is_some() {
            return Ok(());
        }
        // Page by page with the commands the documented ACL allows (ZRANGE, ZADD NX).
        let mut start = 0isize;
        loop {
            let page: Vec<String> = redis::cmd("ZRANGE")
                .arg(ks.schedules())
                .arg(start)
                .arg(start + PASS_BATCH - 1)
                .query_async(&mut self.client.connection())
                .await
                .ctx("adopting earlier schedules into the full index")?;
            if page.is_empty() {
                break;
            }
            let mut add = redis::cmd("ZADD");
            add.arg(ks.schedules_all()).arg("NX");
            for m in &page {
                add.arg(0).arg(m);
            }
            let _: i64 = add
                .query_async(&mut self.client.connection())
                .await
                .ctx("adopting earlier schedules into the full index")?;
            start += PASS_BATCH;
        }
        let _: i64 = redis::cmd("HSET")
            .arg(ks.schedules_totals())
            .arg("adopted")
            .arg(1)
            .query_async(&mut self.client.connection())
            .await
            .ctx("adopting earlier schedules into the full index")?;
        Ok(())
    }

    fn info(&self, queue: &str, id: &str, rec: &Record) -> ScheduleInfo {
        let now = self.client.now_ms();
        let upcoming = if rec.spec.paused {
            Vec::new()
        } else {
            rec.recurrence()
                .map(|r| r.upcoming(now, UPCOMING))
                .unwrap_or_default()
        };
        let s = &rec.spec;
        ScheduleInfo {
            queue: queue.to_owned(),
            id: id.to_owned(),
            cron: s.cron.clone(),
            every: s.every.clone(),
            timezone: s.timezone.clone().unwrap_or_else(|| "UTC".into()),
            payload: Payload::from_raw(&s.payload),
            start_ms: s.start_ms,
            end_ms: s.end_ms,
            missed: s.missed,
            paused: s.paused,
            next_ms: rec.next,
            next_id: rec.next.map(|n| tick_id(id, n)),
            last_fired_ms: rec.last,
            ticks: rec.ticks,
            missed_ticks: rec.missed,
            upcoming_ms: upcoming,
            created_ms: rec.created_ms,
            updated_ms: rec.updated_ms,
        }
    }

    /// Enqueues one tick at most once (`due` is the instant, or now for a catch-up), unless
    /// the schedule changed since `reading`.
    #[allow(clippy::too_many_arguments)]
    async fn fire(
        &self,
        queue: &QueueName,
        id: &str,
        reading: &Reading<'_>,
        instant: i64,
        due: i64,
        payload: &str,
        not_after: Option<i64>,
    ) -> Result<Fired> {
        let qref = self.client.queue_ref(queue).await?;
        let order = tick_id(id, instant);
        let keys = self
            .client
            .keyspace()
            .shard(queue, shard_of(&order, qref.shards));
        let t = Tick {
            schedule: id,
            generation: reading.generation,
            read_ms: reading.read_ms,
            instant,
            id: &order,
            due,
            payload,
            not_after,
        };
        // The epoch the schedule was declared on (the registry's for an earlier record): a
        // queue deleted and created again refuses it.
        let epoch = reading.epoch.unwrap_or(&qref.epoch);
        let now = self.client.now_ms();
        let r = script::tick_fire(&mut self.client.connection(), &keys, epoch, now, &t).await;
        match r {
            Err(e) if ScriptRefusal::of(&e).is_some() => {
                self.client.forget(queue);
                Err(Error::QueueNotFound {
                    queue: queue.as_str().to_owned(),
                })
            }
            other => other,
        }
    }

    /// Takes a pending tick back; `Some(true)` when it had not been dispatched, `None` when
    /// the schedule changed since `reading`.
    async fn take_back(
        &self,
        queue: &QueueName,
        id: &str,
        reading: &Reading<'_>,
        instant: i64,
    ) -> Result<Option<bool>> {
        let Ok(qref) = self.client.queue_ref(queue).await else {
            return Ok(Some(false));
        };
        let order = tick_id(id, instant);
        let keys = self
            .client
            .keyspace()
            .shard(queue, shard_of(&order, qref.shards));
        script::tick_unfire(
            &mut self.client.connection(),
            &keys,
            self.client.now_ms(),
            id,
            reading.generation,
            instant,
            &order,
        )
        .await
    }

    /// Advances one schedule whose next tick is due (see the module documentation); returns
    /// the ticks fired and missed by this call.
    async fn advance(&self, queue: &QueueName, id: &str) -> Result<(u64, u64)> {
        let k = self.keys(queue, id);
        let read_ms = self.client.now_ms();
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&k.record)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading a schedule")?;
        let member = member(queue, id);
        let Some(rec) = Record::parse(fields) else {
            // Removed meanwhile (or unreadable): drop it from the due index.
            let _: i64 = redis::cmd("ZREM")
                .arg(&k.index)
                .arg(&member)
                .query_async(&mut self.client.connection())
                .await
                .ctx("dropping a schedule from the index")?;
            return Ok((0, 0));
        };
        let Some(n) = rec.next else { return Ok((0, 0)) };
        let now = self.client.now_ms();
        if n > now {
            return Ok((0, 0));
        }
        let recurrence = match rec.recurrence() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(queue = ?queue.as_str(), schedule = ?id, error = %e, "a stored schedule no longer parses: removing it");
                self.remove(queue.as_str(), id).await?;
                return Ok((0, 0));
            }
        };
        let reading = Reading {
            generation: rec.generation,
            epoch: rec.epoch.as_deref(),
            read_ms,
        };
        let payload = rec.spec.payload.get();
        let late = now - n > i64::try_from(MISSED_AFTER.as_millis()).unwrap_or(i64::MAX);
        let (mut fired, mut missed) = (0u64, 0u64);
        let mut last = None;
        let result: Result<bool> = async {
            // 1. The due tick: delivered (once), or, late under `skip`, taken back.
            if late && rec.spec.missed == Missed::Skip {
                match self.take_back(queue, id, &reading, n).await? {
                    None => return Ok(false),
                    Some(true) => missed += 1,
                    Some(false) => {
                        match self
                            .fire(queue, id, &reading, n, n, payload, Some(n))
                            .await?
                        {
                            Fired::Superseded => return Ok(false),
                            Fired::Already => {
                                fired += 1;
                                last = Some(n);
                            }
                            _ => missed += 1,
                        }
                    }
                }
            } else {
                if self.fire(queue, id, &reading, n, n, payload, None).await? == Fired::Superseded {
                    return Ok(false);
                }
                fired += 1;
                last = Some(n);
            }
            Ok(true)
        }
        .await;
        if let Err(Error::QueueNotFound { .. }) = result {
            tracing::info!(queue = ?queue.as_str(), schedule = ?id, "the schedule's queue was deleted: removing the schedule");
            self.remove(queue.as_str(), id).await?;
            return Ok((0, 0));
        }
        if !result? {
            // Updated, paused or removed since it was read: the change's own steps win.
            return Ok((0, 0));
        }
        // 2. The ticks that passed since (none unless no scheduler ran for a while).
        let next = if late {
            let passed = count_between(&recurrence, n, now);
            missed += passed;
            recurrence.next_after(now)
        } else {
            recurrence.next_after(n)
        };
        let advanced = script::schedule_advance(
            &mut self.client.connection(),
            &k,
            &member,
            &Advance {
                generation: rec.generation,
                expected: n,
                next,
                fired: last,
                ticks: fired,
                missed,
            },
        )
        .await?;
        if !advanced {
            return Ok((0, 0));
        }
        #[cfg(feature = "test-util")]
        if !self.advance_pause.is_zero() {
            tokio::time::sleep(self.advance_pause).await;
        }
        // 3. The new next tick, ahead of time: refused in its shard if an update, a pause
        // or a removal got there first (then that change decides what is next).
        if let Some(nx) = next {
            self.fire(queue, id, &reading, nx, nx, payload, None)
                .await?;
        }
        let q = queue.as_str();
        crate::engine::telemetry::schedule_ticks(q, fired, missed);
        Ok((fired, missed))
    }

    /// One scheduler pass over the schedules whose next tick is due; returns the ticks fired
    /// and missed.
    pub async fn pass(&self) -> Result<(u64, u64)> {
        self.pass_counting_failures()
            .await
            .map(|(fired, missed, _)| (fired, missed))
    }

    /// [`pass`](Self::pass), also saying how many schedules failed to advance (they stay
    /// due: the scheduler waits its longest sleep before it tries them again).
    pub(super) async fn pass_counting_failures(&self) -> Result<(u64, u64, usize)> {
        let now = self.client.now_ms();
        let due: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.client.keyspace().schedules())
            .arg("-inf")
            .arg(now)
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(PASS_BATCH)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the schedules that are due")?;
        let (mut fired, mut missed, mut failed) = (0, 0, 0);
        for m in due {
            let Some((q, id)) = m.split_once(':') else {
                continue;
            };
            let Ok(queue) = QueueName::new(q) else {
                continue;
            };
            match self.advance(&queue, id).await {
                Ok((f, x)) => {
                    fired += f;
                    missed += x;
                }
                // One schedule's trouble does not hold the others up; it is retried on the
                // next pass (its next tick is still due).
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    failed += 1;
                    tracing::warn!(queue = ?q, schedule = ?id, error = %e, "advancing a schedule failed");
                }
            }
        }
        Ok((fired, missed, failed))
    }

    /// When the earliest next tick is (unix ms), if any schedule has one.
    pub(super) async fn earliest(&self) -> Result<Option<i64>> {
        let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.client.keyspace().schedules())
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading the earliest schedule")?;
        Ok(first
            .first()
            .map(|(_, s)| crate::engine::reply::score_to_ms(*s)))
    }
}

/// How many ticks fall in `(from, to]` (bounded: a count beyond 100,000 stops there).
fn count_between(r: &Recurrence, from: i64, to: i64) -> u64 {
    let mut n = 0u64;
    let mut t = from;
    while let Some(next) = r.next_after(t) {
        if next > to || n >= 100_000 {
            break;
        }
        n += 1;
        t = next;
    }
    n
}

/// The index member of a schedule.
fn member(queue: &QueueName, id: &str) -> String {
    format!("{}:{id}", queue.as_str())
}

/// The sum of the other schedules' costs a `schedule_budget` refusal carries.
fn budget_used(e: &Error) -> Option<u64> {
    let Error::Redis { source, .. } = e else {
        return None;
    };
    let text = source.to_string();
    let (_, rest) = text.split_once("delayq schedule_budget: ")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
}

/// The refusal of a schedule over the namespace's budget, naming its recurrence field.
fn over_budget(spec: &ScheduleSpec, cost: u64, used: u64, max: u64) -> InvalidInput {
    let per = |c: u64| c as f64 / COST_PER_FIRE_PER_SECOND as f64;
    InvalidInput::Option {
        name: if spec.cron.is_some() { "cron" } else { "every" },
        reason: format!(
            "it may fire {:.3} times a second, and the namespace's other schedules {:.3}: \
             together over the budget of {} ticks a second (space its ticks out, or \
             remove schedules)",
            per(cost),
            per(used),
            max / COST_PER_FIRE_PER_SECOND
        ),
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;
    use crate::engine::client::ClientOptions;
    use crate::engine::clock::ManualClock;
    use crate::testing::local_redis::LocalRedis;
    use std::sync::Arc;
    use std::time::Duration;

    /// A scheduler that read the schedule before an update, a pause or a removal answered
    /// (the race of issue 39 item 8: between its compare-and-set and its enqueue) enqueues
    /// nothing after the answer, in any shard: the enqueue itself checks the generation.
    #[tokio::test]
    #[allow(clippy::unwrap_used)]
    async fn a_reading_from_before_a_change_enqueues_nothing_after_it() {
        let t0 = 1_795_000_000_000;
        let clock = Arc::new(ManualClock::new(t0));
        let server = LocalRedis::start().unwrap();
        let client = Client::connect_with_clock(
            &server.url(),
            ClientOptions {
                shards: 4,
                ..ClientOptions::default()
            },
            clock.clone(),
        )
        .await
        .unwrap();
        client.admin().create_queue("q", 4).await.unwrap();
        let q = QueueName::new("q").unwrap();
        let s = Schedules::new(&client);
        for change in ["remove", "pause", "update"] {
            s.upsert(&ScheduleSpec::every(
                "q",
                change,
                "1s",
                serde_json::json!({}),
            ))
            .await
            .unwrap();
            let before = s.read(&q, change).await.unwrap().unwrap();
            let reading = Reading {
                generation: before.generation,
                epoch: before.epoch.as_deref(),
                read_ms: client.now_ms(),
            };
            match change {
                "remove" => assert!(s.remove("q", change).await.unwrap()),
                "pause" => {
                    s.set_paused("q", change, true).await.unwrap().unwrap();
                }
                _ => {
                    s.upsert(&ScheduleSpec::every(
                        "q",
                        change,
                        "1s",
                        serde_json::json!({"v": 2}),
                    ))
                    .await
                    .unwrap();
                }
            }
            // Every later instant, whatever its shard, is refused to the old reading.
            for k in 2..40 {
                let at = t0 + k * 1000;
                let r = s
                    .fire(&q, change, &reading, at, at, "{}", None)
                    .await
                    .unwrap();
                assert_eq!(r, Fired::Superseded, "{change} @{at}");
                assert!(
                    client
                        .get("q", &tick_id(change, at))
                        .await
                        .unwrap()
                        .is_none()
                );
            }
            assert_eq!(
                s.take_back(&q, change, &reading, t0 + 1000).await.unwrap(),
                None,
                "{change}: the old reading cannot take a tick back either"
            );
        }
        // The namespace's generation counter lost (a failover, by hand): a schedule declared
        // again later still gets a generation above every fence and tombstone.
        let _: () = redis::cmd("DEL")
            .arg(client.keyspace().schedules_totals())
            .query_async(&mut client.connection())
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
        for id in ["remove", "update"] {
            let r = s
                .upsert(&ScheduleSpec::every(
                    "q",
                    id,
                    "1s",
                    serde_json::json!({"v": 3}),
                ))
                .await
                .unwrap();
            let next = r.next_ms.unwrap();
            assert!(
                client.get("q", &tick_id(id, next)).await.unwrap().is_some(),
                "{id}"
            );
        }
        // A reading older than MAX_READING_AGE is refused too (tombstones expire).
        s.upsert(&ScheduleSpec::every(
            "q",
            "old",
            "1s",
            serde_json::json!({}),
        ))
        .await
        .unwrap();
        let rec = s.read(&q, "old").await.unwrap().unwrap();
        let reading = Reading {
            generation: rec.generation,
            epoch: rec.epoch.as_deref(),
            read_ms: client.now_ms(),
        };
        clock.advance(script::MAX_READING_AGE + Duration::from_millis(1));
        let at = client.now_ms() + 5000;
        assert_eq!(
            s.fire(&q, "old", &reading, at, at, "{}", None)
                .await
                .unwrap(),
            Fired::Superseded
        );
    }
}
