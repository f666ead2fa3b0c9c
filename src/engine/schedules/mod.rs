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
//! 1. it makes sure that tick was enqueued (`tick.lua fire`, a no-op when it was);
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
//! An update writes the new spec and next tick in one step, then takes the previous pending
//! tick back (if it was not dispatched yet) and enqueues the new one. A removal deletes the
//! record and takes the pending tick back. A schedule whose queue was deleted is removed by
//! the next scheduler that meets it.
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
use crate::engine::scripts::schedules::{self as script, Advance, Fired, ScheduleKeys, Tick};
use spec::Recurrence;

/// Recurring schedules of a namespace: declare, list, show, remove.
#[derive(Clone)]
pub struct Schedules {
    pub(super) client: Client,
}

impl Schedules {
    /// Schedules through `client` (its namespace, clock and payload limit).
    pub fn new(client: &Client) -> Self {
        Schedules {
            client: client.clone(),
        }
    }

    fn keys(&self, queue: &QueueName, id: &str) -> ScheduleKeys {
        let ks = self.client.keyspace();
        ScheduleKeys {
            record: ks.schedule_record(queue, id),
            index: ks.schedules(),
            queue_record: ks.queue_record(queue),
        }
    }

    /// Declares (or replaces) a schedule. Bad input is refused naming the field and writes
    /// nothing; a queue that is not registered is [`Error::QueueNotFound`]. The next tick
    /// is scheduled at once; a replaced schedule's pending tick is taken back.
    pub async fn upsert(&self, spec: &ScheduleSpec) -> Result<ScheduleUpserted> {
        let rec = spec.validate(self.client.options().max_payload_bytes)?;
        let queue = QueueName::new(&spec.queue)?;
        let now = self.client.now_ms();
        let next = if spec.paused {
            None
        } else {
            rec.next_after(now)
        };
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
        let put = script::schedule_put(
            &mut self.client.connection(),
            &k,
            &member,
            &json,
            next,
            now,
            MAX_SCHEDULES,
        )
        .await;
        let (previous, generation, changed) = match put {
            Err(e) => {
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
        let next = if changed { next } else { previous };
        // The replaced spec's pending tick is taken back unless it is already due (then it
        // is delivered: it was due before the change).
        if changed
            && let Some(p) = previous
            && Some(p) != next
            && p > now
        {
            self.take_back(&queue, &spec.id, p).await?;
        }
        if let Some(n) = next {
            self.fire(&queue, &spec.id, n, n, spec.payload.as_str(), None)
                .await?;
        }
        Ok(ScheduleUpserted {
            queue: queue.as_str().to_owned(),
            id: spec.id.clone(),
            created: changed && generation == 1,
            next_ms: next,
        })
    }

    /// Removes a schedule and takes its pending tick back; false when there was none.
    pub async fn remove(&self, queue: &str, id: &str) -> Result<bool> {
        let queue = QueueName::new(queue)?;
        validate_schedule_id(id)?;
        let k = self.keys(&queue, id);
        let removed =
            script::schedule_remove(&mut self.client.connection(), &k, &member(&queue, id)).await?;
        let Some(previous) = removed else {
            return Ok(false);
        };
        if let Some(p) = previous {
            self.take_back(&queue, id, p).await?;
        }
        if let Ok(keys) = self.client.registered_keys(&queue).await {
            let now = self.client.now_ms();
            for k in keys {
                script::tick_forget(&mut self.client.connection(), &k, now, id).await?;
            }
        }
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

    /// One schedule, with its next tick, counters and the next [`UPCOMING`] fire times.
    pub async fn get(&self, queue: &str, id: &str) -> Result<Option<ScheduleInfo>> {
        let queue = QueueName::new(queue)?;
        validate_schedule_id(id)?;
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys(&queue, id).record)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading a schedule")?;
        if fields.is_empty() {
            return Ok(None);
        }
        let rec = Record::parse(fields).ok_or_else(|| Error::Reply {
            context: "reading a schedule",
            detail: "malformed record".into(),
        })?;
        Ok(Some(self.info(queue.as_str(), id, &rec)))
    }

    /// Every schedule of `queue` (or of every queue), sorted by queue and id.
    pub async fn list(&self, queue: Option<&str>) -> Result<Vec<ScheduleInfo>> {
        let queue = queue.map(QueueName::new).transpose()?;
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.client.keyspace().schedules())
            .arg(0)
            .arg(-1)
            .query_async(&mut self.client.connection())
            .await
            .ctx("listing schedules")?;
        let mut out = Vec::new();
        for m in members {
            let Some((q, id)) = m.split_once(':') else {
                continue;
            };
            if queue.as_ref().is_some_and(|want| want.as_str() != q) {
                continue;
            }
            if let Some(info) = self.get(q, id).await? {
                out.push(info);
            }
        }
        out.sort_by(|a, b| (&a.queue, &a.id).cmp(&(&b.queue, &b.id)));
        Ok(out)
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

    /// Enqueues one tick at most once (`due` is the instant, or now for a catch-up).
    async fn fire(
        &self,
        queue: &QueueName,
        id: &str,
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
            instant,
            id: &order,
            due,
            payload,
            not_after,
        };
        let now = self.client.now_ms();
        let r = script::tick_fire(&mut self.client.connection(), &keys, &qref.epoch, now, &t).await;
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

    /// Takes a pending tick back; true when it had not been dispatched.
    async fn take_back(&self, queue: &QueueName, id: &str, instant: i64) -> Result<bool> {
        let Ok(qref) = self.client.queue_ref(queue).await else {
            return Ok(false);
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
            instant,
            &order,
        )
        .await
    }

    /// Advances one schedule whose next tick is due (see the module documentation); returns
    /// the ticks fired and missed by this call.
    async fn advance(&self, queue: &QueueName, id: &str) -> Result<(u64, u64)> {
        let k = self.keys(queue, id);
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&k.record)
            .query_async(&mut self.client.connection())
            .await
            .ctx("reading a schedule")?;
        let member = member(queue, id);
        let Some(rec) = Record::parse(fields) else {
            // Removed meanwhile (or unreadable): drop it from the index.
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
        let payload = rec.spec.payload.get();
        let late = now - n > i64::try_from(MISSED_AFTER.as_millis()).unwrap_or(i64::MAX);
        let (mut fired, mut missed) = (0u64, 0u64);
        let mut last = None;
        let result: Result<()> = async {
            // 1. The due tick: delivered (once), or, late under `skip`, taken back.
            if late && rec.spec.missed == Missed::Skip {
                if self.take_back(queue, id, n).await? {
                    missed += 1;
                } else if self.fire(queue, id, n, n, payload, Some(n)).await? == Fired::Already {
                    fired += 1;
                    last = Some(n);
                } else {
                    missed += 1;
                }
            } else {
                self.fire(queue, id, n, n, payload, None).await?;
                fired += 1;
                last = Some(n);
            }
            Ok(())
        }
        .await;
        if let Err(Error::QueueNotFound { .. }) = result {
            tracing::info!(queue = ?queue.as_str(), schedule = ?id, "the schedule's queue was deleted: removing the schedule");
            self.remove(queue.as_str(), id).await?;
            return Ok((0, 0));
        }
        result?;
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
        // 3. The new next tick, ahead of time.
        if let Some(nx) = next {
            self.fire(queue, id, nx, nx, payload, None).await?;
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
