//! Recurring schedules: cron expressions and intervals in IANA time zones, each tick an
//! ordinary order enqueued exactly once.
//!
//! - [`spec`]: parsing and validating a recurrence, and its tick instants (pure, no Redis).
//! - `definition`: a schedule's spec ([`ScheduleSpec`], [`Missed`]), its checks and limits,
//!   and each tick's order id; `record`: a schedule as stored and as reported
//!   ([`ScheduleInfo`]).
//! - [`Schedules`]: declare, list, show and remove schedules (built from a [`Client`]);
//!   `firing`: a scheduler pass and the advance of one schedule, judged by a pure `step`.
//! - [`Scheduler`](crate::engine::loops::scheduler::Scheduler) (`engine/loops/scheduler.rs`): the loop every `serve` process runs, moving each schedule
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
mod firing;
mod record;
pub mod spec;

pub use definition::*;
use record::*;
pub use record::{ScheduleInfo, ScheduleUpserted};

use crate::engine::client::Client;
use crate::engine::error::{Error, InvalidInput, RedisContext, Result};
use crate::engine::keys::QueueName;
use crate::engine::message::Payload;
use crate::engine::scripts::ScriptRefusal;
use crate::engine::scripts::schedules::{self as script, Change, PutArgs, ScheduleKeys};

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
        // `durability = "replicated"`: answered once the replicas have the change.
        self.client.replicated_barrier().await?;
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
        self.client.replicated_barrier().await?;
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
    pub(crate) async fn adopt_earlier_records(&self) -> Result<()> {
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
