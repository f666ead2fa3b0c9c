//! Long polling: [`Puller::receive_wait`] waits for an entry without polling Redis in a
//! loop.
//!
//! A receive that found nothing waits, holding no Redis connection and no task of its own,
//! for the first of:
//! - this process's dispatcher of the queue moving orders into its streams: one waiting
//!   receive of each group is woken ([`Wake::dispatched`](crate::engine::wake::Wake)), not
//!   every one; a receive that fills its batch (`max`) wakes the next waiter of its group,
//!   since more may be there, so a burst is taken by as many waiters as it needs and an
//!   order alone costs one read, not one per waiting receive;
//! - a wake-up from another process (`engine::listen`: the shard's earliest due time, on
//!   `{ns:q:s}:wake`; the waiter holds a watch on the queue's channels while it waits, so
//!   they are heard even where no dispatcher of the queue runs): it reads at that due time,
//!   then again after 25, 50, 100, ... ms (a dispatcher elsewhere moves the order a moment
//!   later) up to the fallback;
//! - the group's earliest timer (a lease that runs out, a retry coming due), as the last
//!   receive saw it; a retry any process sets later (a `nack`, a failed attempt) is
//!   announced on the shard's wake channel (`retry.lua`), and heard as above;
//! - this process resuming the queue or group;
//! - the fallback poll ([`POLL_HEARD`] while the queue's wake channels are all subscribed,
//!   or what [`Puller::with_fallback_poll`] set; else [`POLL_DEAF`]): a lost signal costs
//!   at most that long (replays are announced too: `replay.lua`);
//! - the deadline, or `cancel` (shutdown): then it answers what it has (nothing).

use super::{PullDelivery, Puller};
use crate::engine::duration::ms;
use crate::engine::error::{Error, InvalidInput, Result};
use crate::engine::keys::ShardKeys;
use crate::engine::telemetry;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The longest a receive may wait for an entry (`wait_ms` up to 20,000).
pub const MAX_WAIT: Duration = Duration::from_secs(20);
/// The fallback look of a waiting receive while every wake channel of the queue is heard.
pub const POLL_HEARD: Duration = Duration::from_secs(2);
/// The fallback look while they are not (before the subscription is confirmed, after the
/// listener's connection broke).
pub const POLL_DEAF: Duration = Duration::from_millis(250);
/// The first step of the look-again after a heard due time (doubling up to the fallback).
const CHASE_FIRST: Duration = Duration::from_millis(25);
/// The least time between two reads of one waiting receive.
const MIN_STEP: Duration = Duration::from_millis(5);

/// Receives waiting in this process now (for the gauge).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Counts one waiting receive while alive.
struct Waiting;

impl Waiting {
    fn new() -> Self {
        telemetry::pull_waiting(WAITING.fetch_add(1, Ordering::Relaxed) + 1);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        telemetry::pull_waiting(WAITING.fetch_sub(1, Ordering::Relaxed).saturating_sub(1));
    }
}

/// The time until `at_ms` (unix ms, Redis time) from `now_ms`, at least [`MIN_STEP`].
fn until(now_ms: i64, at_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(at_ms.saturating_sub(now_ms)).unwrap_or(0)).max(MIN_STEP)
}

impl Puller {
    /// Like [`receive`](Puller::receive), but when nothing can be received now, waits up to
    /// `wait` (at most [`MAX_WAIT`]) for an entry, and answers as soon as one is received;
    /// empty when `wait` passed or `cancel` fired first (at once). See the module docs for
    /// what wakes it; it holds no Redis connection while it waits.
    pub async fn receive_wait(
        &self,
        max: usize,
        lease: Duration,
        wait: Duration,
        cancel: &CancellationToken,
    ) -> Result<Vec<PullDelivery>> {
        if wait > MAX_WAIT {
            return Err(Error::from(InvalidInput::Option {
                name: "wait",
                reason: format!("{wait:?} is over {MAX_WAIT:?}"),
            }));
        }
        if wait.is_zero() {
            return self.receive(max, lease).await;
        }
        let s = &self.s;
        let deadline = Instant::now() + wait;
        let wake = s.client.wake().get(s.queue.as_str());
        let moved_signal = wake.moved_signal(&s.group);
        // One set of keys per shard, in shard order (a shard's lanes share its channel).
        let shards: Vec<ShardKeys> = s.lanes.iter().step_by(3).cloned().collect();
        let _watch = s.client.listener().watch(&wake, &shards);
        let _waiting = Waiting::new();
        let mut heard_at: Option<i64> = None;
        let mut chase: Option<Duration> = None;
        loop {
            // Registered before the read, so a move during it is not missed.
            let moved = moved_signal.notified();
            let resumed = wake.resume.notified();
            tokio::pin!(moved, resumed);
            moved.as_mut().enable();
            resumed.as_mut().enable();
            // A wake-up heard during the read (a retry set after it looked) is kept too.
            let mut heard = Box::pin(wake.heard.notified());
            heard.as_mut().enable();
            let got = self.receive(max, lease).await?;
            if got.len() >= max {
                // A full batch: more may be waiting; the group's next waiter looks.
                moved_signal.notify_one();
            }
            if !got.is_empty() || cancel.is_cancelled() || Instant::now() >= deadline {
                return Ok(got);
            }
            let poll = if wake.listening.load(Ordering::SeqCst) >= shards.len() {
                self.fallback_poll
            } else {
                POLL_DEAF
            };
            s.stats.waits.fetch_add(1, Ordering::Relaxed);
            loop {
                let now_ms = s.client.now_ms();
                let mut look = poll;
                // A timer already due that the read did not take (paused, rate-limited) is
                // left to the fallback, never looked at in a tight loop.
                let timer = self.next_timer_ms.load(Ordering::Relaxed);
                if timer > now_ms {
                    look = look.min(until(now_ms, timer));
                }
                if let Some(h) = heard_at {
                    look = look.min(until(now_ms, h));
                }
                if let Some(c) = chase {
                    look = look.min(c);
                }
                let at = (Instant::now() + look).min(deadline);
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {
                        // A heard due time reached: read, then look again a few times soon
                        // after (a dispatcher elsewhere moves it a moment later); each look
                        // that finds nothing waits twice as long, up to the fallback.
                        if heard_at.is_some_and(|h| h <= s.client.now_ms() + ms(MIN_STEP)) {
                            heard_at = None;
                            chase = Some(CHASE_FIRST);
                        } else {
                            chase = chase.map(|c| c * 2).filter(|c| *c < poll);
                        }
                        break;
                    }
                    () = &mut moved => break,
                    () = &mut resumed => break,
                    () = &mut heard => {
                        heard = Box::pin(wake.heard.notified());
                        heard.as_mut().enable();
                        let h = wake.heard_ms.load(Ordering::SeqCst);
                        heard_at = Some(heard_at.map_or(h, |old| old.min(h)));
                    }
                    () = cancel.cancelled() => return Ok(Vec::new()),
                }
            }
        }
    }
}
