//! The dispatcher (poller): moves due orders from the schedule into the queue's streams.
//!
//! Each pass runs `dequeue.lua` once per shard, the calls of one pass in flight together
//! (pipelined on the multiplexed connection), so a backlog in one shard cannot starve
//! another. A shard whose last call reported its earliest order due later than now is
//! skipped until then, unless the idle look (`idle_poll`, 30 s, while wake-ups are heard;
//! `max_idle`, 250 ms, while not) has passed since it was last called, this process
//! scheduled something, or another process published an earlier due time on the shard's
//! wake channel (`engine::listen`). While any shard
//! returns a full batch it keeps draining; otherwise it sleeps until the earliest next due
//! time (capped by `max_idle`), and wakes early when this process schedules an earlier
//! order. While orders come due steadily, passes are spaced by a share of the lateness
//! budget so each call moves more of them (see [`DispatcherOptions::lateness_budget`]).
//! The script is atomic, so any number of dispatchers may run on one queue at once; while
//! several processes run one, each shard is called by one of them and the others stand by
//! for it (`takeover_after`; see [`crate::engine::roster`]).

use crate::engine::client::Client;
use crate::engine::error::{Error, RedisContext, Result};
use crate::engine::flow::QueueWatch;
use crate::engine::keys::{QueueName, ShardKeys};
use crate::engine::loops::pacing::{ArrivalRate, CallSizer};
pub use crate::engine::loops::pacing::{BUDGET_SPACING, MIN_CALL_BATCH};
use crate::engine::retry::{Pacer, RetryPolicy};
use crate::engine::scripts;
use crate::engine::sync::lock;
use crate::engine::telemetry;
use crate::engine::wake::Wake;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod options;
mod shards;

pub use options::{
    DEFAULT_IDLE_POLL, DispatcherOptions, MAX_CALL, MAX_IDLE_POLL, MAX_LATENESS_BUDGET,
    MAX_TAKEOVER_AFTER,
};
pub use shards::DispatcherStats;
use shards::{ShardView, Shards};

/// What one pass over all shards did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pass {
    /// Orders moved into streams.
    pub moved: usize,
    /// True when some shard returned a full batch (more may be due right now).
    pub more: bool,
    /// Earliest due time still scheduled, over all shards (not counting paused ones); for a
    /// shard another process owns, when it is next looked at.
    pub next_due_ms: Option<i64>,
    /// True when the queue's dispatch is paused.
    pub paused: bool,
}

/// Moves due orders of one queue into its streams. See the module docs.
#[derive(Debug)]
pub struct Dispatcher {
    client: Client,
    queue: QueueName,
    shards: Vec<ShardKeys>,
    opts: DispatcherOptions,
    wake: Arc<Wake>,
    /// Per shard, what is known and who calls it.
    state: std::sync::Mutex<Shards>,
    /// What it did (shared with [`Dispatcher::stats`]'s callers).
    stats: Arc<DispatcherStats>,
    /// This process's seat in the dispatch roster, while running with a `takeover_after`.
    seat: std::sync::Mutex<Option<crate::engine::roster::Seat>>,
    /// Set by [`Dispatcher::run`]: only a running dispatcher takes its queue's wake-ups (the
    /// safety sweep's, which only drains, shares the signal).
    runs: std::sync::atomic::AtomicBool,
    /// The measured time per dispatched order (ns, smoothed; see
    /// [`DispatcherOptions::max_call`]).
    sizer: CallSizer,
    /// The server has `HGETDEL` (one command instead of `HMGET` + `HDEL` per batch).
    hgetdel: bool,
    /// The queue's history retention, as this process last saw it.
    watch: QueueWatch,
    /// Register the queue with the client's shard count before each pass (a dispatcher
    /// the application made), or not (one a supervisor made from the registry record).
    register: bool,
}

impl Dispatcher {
    /// A dispatcher for `queue`, registering it with the client's shard count when it runs.
    pub fn new(client: &Client, queue: &str, opts: DispatcherOptions) -> Result<Self> {
        let shards = client.options().shards;
        Self::build(client, queue, shards, opts, true)
    }

    /// A dispatcher for a queue registered with `shards` shards (what a supervisor runs for
    /// each queue of the registry): it never registers the queue, so a deleted queue stays
    /// deleted.
    pub fn for_registered(
        client: &Client,
        queue: &str,
        shards: u16,
        opts: DispatcherOptions,
    ) -> Result<Self> {
        Self::build(client, queue, shards, opts, false)
    }

    fn build(
        client: &Client,
        queue: &str,
        shards: u16,
        opts: DispatcherOptions,
        register: bool,
    ) -> Result<Self> {
        let queue = QueueName::new(queue)?;
        opts.validate()?;
        let shards = client.keyspace().shards(&queue, shards);
        Ok(Dispatcher {
            register,
            state: std::sync::Mutex::new(Shards::new(shards.len())),
            seat: std::sync::Mutex::new(None),
            stats: Arc::new(DispatcherStats::new(shards.len())),
            sizer: CallSizer::default(),
            runs: std::sync::atomic::AtomicBool::new(false),
            hgetdel: client.server().is_some_and(|s| s.has_hgetdel()),
            watch: QueueWatch::new(queue.clone(), None),
            shards,
            wake: client.wake().get(queue.as_str()),
            client: client.clone(),
            queue,
            opts,
        })
    }

    /// The queue.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// One pass: one `dequeue.lua` call per shard that may have due orders, with the
    /// clock's "now", all in flight together.
    pub async fn pass(&self) -> Result<Pass> {
        if self.register {
            self.client.register(&self.queue).await?;
        }
        // A pause is checked by dequeue.lua itself, so it holds from the moment it is set.
        let flags = self.watch.flags(&self.client).await?;
        let history = flags.history;
        let now = self.client.now_ms();
        let started = Instant::now();
        let mut pass = Pass::default();
        // Something scheduled in this process has come due: its shard is unknown, so call
        // every shard. Not due yet: leave it for a later pass (and the sleep computation).
        let early = self.wake.early_ms.swap(i64::MAX, Ordering::SeqCst);
        if early <= now {
            self.forget();
        } else if early != i64::MAX {
            self.wake.early_ms.fetch_min(early, Ordering::SeqCst);
        }
        // Which shards to call, and the known next due time of those skipped.
        let mut call = Vec::with_capacity(self.shards.len());
        let mut probe = Vec::new();
        // Shards taken over from their owner in this pass.
        let mut took = Vec::new();
        let idle = self.idle();
        let grace = i64::try_from(self.opts.takeover_after.as_millis()).unwrap_or(1000);
        let assignment = self.assignment();
        {
            let mut st = lock(&self.state);
            if let Some((owned, version)) = assignment {
                st.assign(owned, version);
            }
            *lock(&self.stats.calling) = (0..self.shards.len()).map(|i| st.mine(i)).collect();
            let st = &mut *st;
            // Wake-ups from other processes: the shard's earliest due time is that one.
            let pushed = if self.runs.load(Ordering::Relaxed) {
                self.wake.take_pushed()
            } else {
                Default::default()
            };
            for (i, due) in pushed {
                if let Some(Some(v)) = st.views.get_mut(i) {
                    v.next_due_ms = min_opt(v.next_due_ms, Some(due));
                }
            }
            for (i, v) in st.views.iter().enumerate() {
                match v {
                    Some(v) if v.next_due_ms.is_none_or(|d| d > now) => {
                        if started.duration_since(v.at) < idle {
                            pass.next_due_ms = min_opt(pass.next_due_ms, v.next_due_ms);
                        } else {
                            probe.push(i);
                        }
                    }
                    // Another process's shard with an order due: looked at once it is
                    // `takeover_after` overdue, and no sooner than that after the last look.
                    Some(v) if !st.mine(i) => {
                        let since = i64::try_from(started.duration_since(v.at).as_millis())
                            .unwrap_or(i64::MAX);
                        let look = v
                            .next_due_ms
                            .unwrap_or(now)
                            .max(now.saturating_sub(since))
                            .saturating_add(grace);
                        if look <= now {
                            probe.push(i);
                        } else {
                            pass.next_due_ms = min_opt(pass.next_due_ms, Some(look));
                        }
                    }
                    None if !st.mine(i) => probe.push(i),
                    _ => call.push(i),
                }
            }
        }
        // The idle look: one `ZRANGE 0 0` of the shard's due set (a plain read, a quarter of
        // a script call's commands); the script runs only when the shard has orders due.
        if !probe.is_empty() {
            let heads = futures_util::future::try_join_all(probe.iter().map(|&i| {
                let mut conn = self.client.connection();
                let due = &self.shards[i].due;
                async move {
                    redis::cmd("ZRANGE")
                        .arg(due)
                        .arg(0)
                        .arg(0)
                        .arg("WITHSCORES")
                        .query_async::<Vec<(String, f64)>>(&mut conn)
                        .await
                        .ctx("probing a shard's earliest due time")
                }
            }))
            .await?;
            let mut st = lock(&self.state);
            for (&i, head) in probe.iter().zip(heads) {
                let (id, next) = match head.into_iter().next() {
                    Some((id, score)) => (Some(id), Some(crate::engine::reply::score_to_ms(score))),
                    None => (None, None),
                };
                if st.mine(i) {
                    if next.is_some_and(|d| d <= now) {
                        call.push(i);
                        continue;
                    }
                } else if next.is_some_and(|d| d.saturating_add(grace) <= now)
                    && !flags.paused
                    && id.is_some()
                    && st.heads[i] == id
                {
                    // The same order is still there, `takeover_after` overdue, a look
                    // later, and the queue is not paused (as last read): its owner does
                    // not dispatch this shard. Call it here until it has nothing due (a
                    // takeover once the call did not find the shard paused).
                    st.taken[i] = true;
                    st.heads[i] = None;
                    took.push(i);
                    call.push(i);
                    continue;
                } else {
                    st.heads[i] = id;
                }
                st.views[i] = Some(ShardView {
                    next_due_ms: next,
                    at: started,
                });
                let look = match next {
                    Some(d) if d <= now && !st.mine(i) => Some(now.saturating_add(grace)),
                    other => other,
                };
                pass.next_due_ms = min_opt(pass.next_due_ms, look);
            }
        }
        let n = self.sizer.size(self.opts.max_call, self.opts.batch);
        for &i in &call {
            self.stats.calls[i].fetch_add(1, Ordering::Relaxed);
        }
        // Every call runs to its end (a failing shard never drops the others' calls, nor
        // their results): the moved orders are counted, the failed shard is called again
        // next pass, and the first error is returned after.
        let results = futures_util::future::join_all(call.iter().map(|&i| {
            let mut conn = self.client.connection();
            let keys = &self.shards[i];
            let history = &history;
            let hgetdel = self.hgetdel;
            async move { scripts::dequeue(&mut conn, keys, now, n, history, hgetdel).await }
        }))
        .await;
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let views = &mut st.views;
        let gone = results.iter().any(|r| r.as_ref().is_ok_and(|r| r.gone));
        let mut failed = None;
        for (&i, r) in call.iter().zip(results) {
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    views[i] = None;
                    took.retain(|t| *t != i);
                    failed.get_or_insert(e);
                    continue;
                }
            };
            if r.paused {
                // Paused: its orders wait; call it again after the idle sleep (or at once
                // when this process resumes it).
                pass.paused = true;
                st.taken[i] = false;
                took.retain(|t| *t != i);
                views[i] = Some(ShardView {
                    next_due_ms: None,
                    at: started,
                });
                continue;
            }
            pass.moved += r.moved;
            if r.moved > 0 {
                // Its stream grew: the trim chore looks at it until it is clean again.
                self.client.touched().mark(&self.shards[i]);
            }
            let full = r.moved >= n;
            if !full && r.next_due_ms.is_none_or(|d| d > now) {
                // Caught up: a shard taken over goes back to its owner.
                st.taken[i] = false;
            }
            pass.more |= full;
            pass.next_due_ms = min_opt(pass.next_due_ms, r.next_due_ms);
            // A full shard has more due now: call it again next pass.
            views[i] = (!full).then_some(ShardView {
                next_due_ms: r.next_due_ms,
                at: started,
            });
        }
        drop(guard);
        for &i in &took {
            tracing::info!(queue = %self.queue, shard = i, "took over a shard its owner left overdue");
            telemetry::dispatch_takeover(self.queue.as_str());
            self.stats.takeovers.fetch_add(1, Ordering::Relaxed);
        }
        self.sizer.measure(started.elapsed(), pass.moved, n);
        if gone && self.register {
            // The queue vanished under a dispatcher the application made (deleted, or Redis
            // lost its data): it declares its queue again on the next pass, as at start.
            tracing::warn!(queue = %self.queue, "the queue is not registered any more; declaring it again");
            self.client.forget(&self.queue);
        }
        if pass.moved > 0 {
            tracing::debug!(queue = %self.queue, moved = pass.moved, "dispatched");
            telemetry::dispatched(self.queue.as_str(), pass.moved as u64);
            // One long poll of each group waiting on the queue in this process reads now
            // (no Redis call); one that fills its batch wakes the next.
            self.wake.dispatched();
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(pass),
        }
    }

    /// The longest idle sleep now: `idle_poll` while wake-ups are heard, else `max_idle`.
    fn idle(&self) -> Duration {
        if self.wake.listening.load(Ordering::SeqCst) >= self.shards.len() {
            self.opts.idle_poll.max(self.opts.max_idle)
        } else {
            self.opts.max_idle
        }
    }

    /// Forgets what the shards said: the next pass calls every shard it owns and looks at
    /// the others (after a wake-up by a producer in this process, or an error).
    fn forget(&self) {
        let mut st = lock(&self.state);
        st.views.iter_mut().for_each(|v| *v = None);
    }

    /// The roster's assignment of the shards, when it moved since the last pass: which ones
    /// this process owns (all of them while it holds no seat: not running, or
    /// `takeover_after` is zero), and the roster version.
    fn assignment(&self) -> Option<(Vec<bool>, u64)> {
        let known = lock(&self.state).version;
        let seat = lock(&self.seat);
        match seat.as_ref() {
            Some(seat) => {
                let v = seat.version();
                (known != Some(v)).then(|| (seat.owned(self.shards.len()), v))
            }
            None => known.is_some().then(|| (vec![true; self.shards.len()], 0)),
        }
    }

    /// What this dispatcher did, readable while it runs.
    pub fn stats(&self) -> Arc<DispatcherStats> {
        self.stats.clone()
    }

    /// Passes until no shard returns a full batch; returns the orders moved and the next
    /// due time.
    pub async fn drain(&self) -> Result<Pass> {
        let mut total = Pass::default();
        loop {
            let p = self.pass().await?;
            total.moved += p.moved;
            total.next_due_ms = p.next_due_ms;
            if !p.more {
                return Ok(total);
            }
        }
    }

    /// Like [`drain`](Dispatcher::drain), but stops between passes once `cancel` fires, so
    /// a backlog never holds up shutdown by more than one pass.
    pub(crate) async fn drain_until(&self, cancel: &CancellationToken) -> Result<Pass> {
        let mut total = Pass::default();
        loop {
            let p = self.pass().await?;
            total.moved += p.moved;
            total.next_due_ms = p.next_due_ms;
            if !p.more || cancel.is_cancelled() {
                return Ok(total);
            }
        }
    }

    /// Runs until `cancel` fires. Redis errors are logged and retried with backoff; the
    /// loop never gives up on its own.
    pub async fn run(self, cancel: CancellationToken) {
        let mut pacer = Pacer::new(RetryPolicy::LOOP);
        let mut last_sync = Instant::now();
        let mut rate = ArrivalRate::default();
        // Hear other processes' wake-ups for this queue while running.
        let _watch = self.client.listener().watch(&self.wake, &self.shards);
        // Take a seat in the dispatch roster: the shards are split with the queue's other
        // dispatching processes.
        if !self.opts.takeover_after.is_zero() {
            let seat = self.client.roster().join(
                &self.client.connection(),
                self.client.clock(),
                self.queue.as_str(),
            );
            *lock(&self.seat) = Some(seat);
        }
        self.runs.store(true, Ordering::Relaxed);
        tracing::info!(queue = %self.queue, shards = self.shards.len(), "dispatcher started");
        loop {
            if cancel.is_cancelled() {
                break;
            }
            #[cfg(feature = "test-util")]
            if self.wake.kill.swap(false, Ordering::SeqCst) {
                panic!(
                    "the dispatcher of {} was killed by the test hook",
                    self.queue
                );
            }
            // Mark busy: schedules during the pass need no wake-up (the pass or the next
            // sleep computation sees them).
            self.wake.next_look_ms.store(i64::MAX, Ordering::SeqCst);
            let started_us = self.client.clock().now_us();
            let (next, moved) = match self.drain_until(&cancel).await {
                Ok(p) => {
                    pacer.reset();
                    (p.next_due_ms, p.moved)
                }
                Err(e) if e.as_invalid().is_some() || matches!(e, Error::ShardMismatch { .. }) => {
                    // A configuration mismatch (e.g. the shard count) does not heal by waiting.
                    tracing::error!(queue = %self.queue, error = %e, "dispatcher refused the queue; stopping");
                    break;
                }
                Err(e) => {
                    tracing::warn!(queue = %self.queue, error = %e, retry_in = ?pacer.next_delay(), "dispatch failed");
                    self.wake.next_look_ms.store(0, Ordering::SeqCst);
                    if !pacer.wait(Some(&cancel)).await {
                        break;
                    }
                    continue;
                }
            };
            if last_sync.elapsed() >= self.opts.clock_sync_every {
                last_sync = Instant::now();
                if let Err(e) = self
                    .client
                    .sync_clock_if_older(self.opts.clock_sync_every)
                    .await
                {
                    tracing::warn!(error = %e, "clock sync failed");
                }
            }
            let now = self.client.now_ms();
            let idle_ms = i64::try_from(self.idle().as_millis()).unwrap_or(250);
            let look_at = next.map_or(now + idle_ms, |d| d.min(now + idle_ms));
            let look_at = look_at
                .min(self.wake.early_ms.load(Ordering::SeqCst))
                .min(self.wake.pushed_ms.load(Ordering::SeqCst));
            // Orders coming due steadily: pass again no sooner than the budget's share (or
            // the linger) after this pass started, so one call moves that much time's worth.
            let mut look_at_us = look_at.saturating_mul(1000);
            let spacing = rate.spacing(
                started_us,
                moved,
                self.opts.linger,
                self.opts.lateness_budget,
            );
            if moved > 0 && moved < self.opts.batch {
                let spacing_us = i64::try_from(spacing.as_micros()).unwrap_or(0);
                look_at_us = look_at_us.max(started_us.saturating_add(spacing_us));
            }
            let look_at = look_at_us.div_euclid(1000);
            self.wake.next_look_ms.store(look_at, Ordering::SeqCst);
            // Scheduled in between (and earlier), here or elsewhere: look again rather than
            // sleep.
            if self.wake.early_ms.load(Ordering::SeqCst) < look_at
                || self.wake.pushed_ms.load(Ordering::SeqCst) < look_at
            {
                continue;
            }
            // Sleep to the start of the due millisecond (or the linger's end), measured in
            // microseconds.
            let wait_us = look_at_us.saturating_sub(self.client.clock().now_us());
            let Ok(wait_us) = u64::try_from(wait_us) else {
                continue;
            };
            if wait_us == 0 {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_micros(wait_us)) => {}
                // An earlier order was scheduled here (the pass sees it in `early_ms`).
                _ = self.wake.notify.notified() => {}
                _ = cancel.cancelled() => break,
            }
        }
        // Give up the seat: the others own its shards from their next roster read.
        lock(&self.seat).take();
        tracing::info!(queue = %self.queue, "dispatcher stopped");
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
