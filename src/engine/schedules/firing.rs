//! Firing ticks: one scheduler pass over the schedules whose next tick is due, and the
//! three steps of advancing one (see the module documentation of `schedules`). The
//! judgement of a due tick ([`step`]: late or not, taken back or fired, how many passed,
//! what is next) is a pure function, unit-tested below; the methods only do the I/O.

use super::record::Record;
use super::spec::Recurrence;
use super::{MISSED_AFTER, Missed, PASS_BATCH, Reading, Schedules, member, tick_id};
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::keys::{QueueName, shard_of};
use crate::engine::scripts::ScriptRefusal;
use crate::engine::scripts::schedules::{self as script, Advance, Fired, Tick};

/// What advancing a schedule whose tick `due` is due at `now` does, decided before any
/// write: see [`step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Step {
    /// The tick is more than [`MISSED_AFTER`] late (no scheduler ran for a while).
    pub late: bool,
    /// Late under [`Missed::Skip`]: the tick is taken back if it was not dispatched yet.
    pub skip_due: bool,
    /// Ticks that passed after `due` up to `now` (counted as missed; 0 unless late).
    pub passed: u64,
    /// The schedule's next tick after this advance, if it has one.
    pub next: Option<i64>,
}

/// The pure judgement of one advance: a tick on time is fired and the next instant after
/// it follows; a late one is taken back under [`Missed::Skip`] (or fired once under
/// [`Missed::FireOnce`]), the ticks that passed since are missed, and the schedule goes on
/// from the next instant after `now`.
pub(super) fn step(r: &Recurrence, missed: Missed, due: i64, now: i64) -> Step {
    let late = now - due > i64::try_from(MISSED_AFTER.as_millis()).unwrap_or(i64::MAX);
    if late {
        Step {
            late,
            skip_due: missed == Missed::Skip,
            passed: count_between(r, due, now),
            next: r.next_after(now),
        }
    } else {
        Step {
            late,
            skip_due: false,
            passed: 0,
            next: r.next_after(due),
        }
    }
}

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
        let plan = step(&recurrence, rec.spec.missed, n, now);
        let (mut fired, mut missed) = (0u64, 0u64);
        let mut last = None;
        let result: Result<bool> = async {
            // 1. The due tick: delivered (once), or, late under `skip`, taken back.
            if plan.skip_due {
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
        missed += plan.passed;
        let next = plan.next;
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
    pub(crate) async fn pass_counting_failures(&self) -> Result<(u64, u64, usize)> {
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
    pub(crate) async fn earliest(&self) -> Result<Option<i64>> {
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

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;
    use crate::engine::client::{Client, ClientOptions};
    use crate::engine::clock::ManualClock;
    use crate::engine::schedules::ScheduleSpec;
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

#[cfg(test)]
mod step_tests {
    use super::*;

    #[allow(clippy::expect_used)]
    fn every_second(start_ms: i64) -> Recurrence {
        Recurrence::parse(None, Some("1s"), None, Some(start_ms), None).expect("valid interval")
    }

    const T0: i64 = 1_795_000_000_000;

    #[test]
    fn a_tick_on_time_fires_and_the_next_instant_follows_it() {
        let r = every_second(T0);
        let s = step(&r, Missed::Skip, T0 + 1_000, T0 + 1_000);
        assert_eq!(
            s,
            Step {
                late: false,
                skip_due: false,
                passed: 0,
                next: Some(T0 + 2_000),
            }
        );
        // Still on time at exactly MISSED_AFTER.
        let at_limit = T0 + 1_000 + i64::try_from(MISSED_AFTER.as_millis()).unwrap_or(0);
        assert!(!step(&r, Missed::Skip, T0 + 1_000, at_limit).late);
    }

    #[test]
    fn a_late_tick_is_taken_back_under_skip_and_the_passed_ones_are_missed() {
        let r = every_second(T0);
        let s = step(&r, Missed::Skip, T0 + 1_000, T0 + 10_500);
        assert_eq!(
            s,
            Step {
                late: true,
                skip_due: true,
                passed: 9,
                next: Some(T0 + 11_000),
            }
        );
    }

    #[test]
    fn a_late_tick_fires_once_under_fire_once_and_goes_on_from_now() {
        let r = every_second(T0);
        let s = step(&r, Missed::FireOnce, T0 + 1_000, T0 + 10_500);
        assert!(s.late && !s.skip_due);
        assert_eq!((s.passed, s.next), (9, Some(T0 + 11_000)));
    }

    #[test]
    fn the_count_of_passed_ticks_is_bounded() {
        let r = every_second(T0);
        let year = 366 * 24 * 3_600 * 1_000;
        assert_eq!(step(&r, Missed::Skip, T0, T0 + year).passed, 100_000);
    }
}
