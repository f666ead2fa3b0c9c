//! Advancing schedules: firing a due tick exactly once, taking a late one back, moving the
//! record to its next tick, and the scheduler's pass over the due index (the steps the
//! parent module's documentation describes).

use super::record::Record;
use super::spec::Recurrence;
use super::{MISSED_AFTER, Missed, PASS_BATCH, Reading, Schedules, member, tick_id};
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::keys::{QueueName, shard_of};
use crate::engine::scripts::ScriptRefusal;
use crate::engine::scripts::schedules::{self as script, Advance, Fired, Tick};

impl Schedules {
    /// Enqueues one tick at most once (`due` is the instant, or now for a catch-up), unless
    /// the schedule changed since `reading`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fire(
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
    pub(super) async fn take_back(
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
