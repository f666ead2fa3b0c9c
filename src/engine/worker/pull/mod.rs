//! Pull consumption: a [`Puller`] hands a group's entries to code that settles them later
//! (another process, an HTTP client), with the worker's own scripts and rules.
//!
//! `receive` claims the group's due timers first (a lease that ran out, a retry whose
//! backoff elapsed: `reclaim.lua`), then reads new entries (`read.lua`, most urgent lane
//! first), each leased until the lease asked for. Entries that cannot be handled, that
//! expired (`expire::past_limit`) or that were delivered more than `max_attempts` times
//! are dead-lettered there, as a worker does before its handler; the rest are returned with
//! a [receipt](super::receipt). `ack`, `nack` and `extend` honour a receipt only while the
//! group's timer still holds its lease: each first moves the lease by compare-and-set
//! (`extend.lua`), which fails once the lease ran out and another consumer (or this one)
//! took the entry over (`lease_lost`), then settles as a worker does (the ack pipeline,
//! `retry.lua`, `dead.lua`). History, metrics, `max_attempts`, pause, rate limits and
//! reclaim therefore behave as for a [`Worker`](super::Worker).
//!
//! A receipt is bound to this puller (queue, group, consumer name, key): settle it through
//! the puller that issued it, or one built with the same consumer name and key
//! ([`Puller::with_key`]).

mod settle;
mod wait;

pub use wait::MAX_WAIT;

use super::entry::{Taken, is_nogroup, to_taken};
use super::key_gate;
use super::receipt::{Receipt, Signer, random_key};
use super::settle::{
    delivery_metrics, exhausted, handled_metric, settle_dead, settle_expired, settle_missing,
};
use super::{Delivery, LaneId, Shared, WorkerOptions, WorkerStats, ensure_groups};
use crate::engine::client::Client;
use crate::engine::duration::ms;
use crate::engine::error::{Error, InvalidInput, Result};
use crate::engine::priority::Priority;
use crate::engine::reply::entries_of;
use crate::engine::scripts;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

/// Most deliveries one [`Puller::receive`] returns.
pub const MAX_RECEIVE: usize = 100;
/// Most receipts one [`Puller::ack`] or [`Puller::extend`] takes.
pub const MAX_RECEIPTS: usize = 1000;
/// The shortest lease a receive or an extension may ask for.
pub const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest lease a receive or an extension may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(12 * 3600);
/// The lease of a receive that names none (HTTP `:receive` without `lease_ms`, a pull
/// group declared without `lease`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// One delivery handed out by [`Puller::receive`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PullDelivery {
    /// The order as a worker's handler would see it (payload byte for byte in
    /// `payload_text`, attempt, due and dispatch times, priority, trace context).
    pub delivery: Delivery,
    /// Settles this delivery (`ack`, `nack`, `extend`); opaque.
    pub receipt: String,
    /// When the lease ends unless extended, unix ms (Redis time).
    pub lease_until_ms: i64,
}

/// What became of one receipt given to `ack` or `nack`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settled {
    /// Acknowledged, retried or dead-lettered as asked.
    Done,
    /// The receipt's lease ran out and the entry was taken over (or it was settled
    /// already): nothing was changed.
    LeaseLost,
}

/// What became of one receipt given to `extend`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Extended {
    /// Extended: the delivery's new receipt (the old one no longer settles it).
    Receipt(String),
    /// The receipt's lease ran out and the entry was taken over (or it was settled).
    LeaseLost,
}

/// How to settle a delivery that was not handled successfully.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Nack {
    /// Deliver it again after `after` (default: the group's backoff for this attempt);
    /// the last allowed attempt (`max_attempts`) is dead-lettered instead.
    Retry {
        /// The delay before the next attempt; `None` for the backoff policy's.
        after: Option<Duration>,
        /// Why it failed (kept for the history and a later dead letter).
        error: String,
    },
    /// Move it to the dead letters now, with this error text.
    Dead {
        /// Why it failed.
        error: String,
    },
}

/// A pull consumer of one group. See the module docs.
pub struct Puller {
    s: Arc<Shared<()>>,
    signer: Signer,
    /// The queue is registered and the group joined.
    joined: AtomicBool,
    /// Whether joining registers the queue when it is not (as a starting worker does), or
    /// refuses ([`Error::QueueNotFound`]): [`Puller::for_registered`].
    registers: bool,
    /// The last heartbeat, unix ms.
    beat_at: AtomicI64,
    /// Where the next read starts among a level's lanes, so small receives rotate over
    /// shards.
    rotate: AtomicUsize,
    /// The group's earliest timer a receive saw (a lease end, a retry's time), unix ms;
    /// `i64::MAX` for none: a long poll reads again then.
    next_timer_ms: AtomicI64,
    /// The fallback look of a waiting receive while the queue's wake channels are heard.
    fallback_poll: Duration,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("queue", &self.s.queue)
            .field("group", &self.s.group)
            .field("consumer", &self.s.consumer)
            .finish_non_exhaustive()
    }
}

fn bad_option(name: &'static str, reason: String) -> Error {
    InvalidInput::Option { name, reason }.into()
}

/// Whether `lease` is one a receive or an extension may ask for
/// ([`MIN_LEASE`]..=[`MAX_LEASE`]); the error names `lease`.
pub fn check_lease(lease: Duration) -> Result<()> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(bad_option(
            "lease",
            format!("{lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}"),
        ));
    }
    Ok(())
}

fn check_count(n: usize) -> Result<()> {
    if n == 0 || n > MAX_RECEIPTS {
        return Err(bad_option(
            "receipts",
            format!("{n} receipts; 1..={MAX_RECEIPTS} per call"),
        ));
    }
    Ok(())
}

impl Puller {
    /// A pull consumer of group `group` on `queue`, with the worker options that apply
    /// (consumer name, `max_attempts`, backoff, rate limit, visibility timeout: how long an
    /// `ack` or `nack` holds the lease while it settles). Receipts are signed with a random
    /// key of this process ([`with_key`](Puller::with_key) to share one).
    pub fn new(client: &Client, queue: &str, group: &str, opts: WorkerOptions) -> Result<Self> {
        let mut s = Shared::new(client, queue, group, (), opts)?;
        s.pull = true;
        let key = random_key().map_err(|source| Error::Io {
            context: "reading a random receipt key".into(),
            source,
        })?;
        let signer = Signer::new(key, s.queue.as_str(), &s.group, &s.consumer);
        Ok(Puller {
            s: Arc::new(s),
            signer,
            joined: AtomicBool::new(false),
            registers: true,
            beat_at: AtomicI64::new(0),
            rotate: AtomicUsize::new(0),
            next_timer_ms: AtomicI64::new(i64::MAX),
            fallback_poll: wait::POLL_HEARD,
        })
    }

    /// A pull consumer of a queue that must already be registered: receiving from a queue
    /// that is not (or was deleted) is [`Error::QueueNotFound`], never a new registration.
    pub fn for_registered(
        client: &Client,
        queue: &str,
        group: &str,
        opts: WorkerOptions,
    ) -> Result<Self> {
        Ok(Puller {
            registers: false,
            ..Puller::new(client, queue, group, opts)?
        })
    }

    /// Signs receipts with `key` (any length; keep it secret): pullers with the same
    /// consumer name and key accept each other's receipts.
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.signer = Signer::new(
            key.into(),
            self.s.queue.as_str(),
            &self.s.group,
            &self.s.consumer,
        );
        self
    }

    /// The longest a waiting receive goes without reading while every wake channel of the
    /// queue is heard (default 2 s, at least 250 ms, at most [`MAX_WAIT`]): the bound on
    /// what a lost signal costs. Lower costs Redis reads while idle; higher, a longer wait
    /// after a lost signal.
    pub fn with_fallback_poll(mut self, every: Duration) -> Self {
        self.fallback_poll = every.clamp(wait::POLL_DEAF, MAX_WAIT);
        self
    }

    /// 32 random bytes from the operating system: a key for [`with_key`](Puller::with_key)
    /// that several pullers of this process share.
    pub fn random_key() -> std::io::Result<Vec<u8>> {
        random_key()
    }

    /// The consumer name.
    pub fn consumer(&self) -> &str {
        &self.s.consumer
    }

    /// The counters, as a worker keeps them (acked, retried, dead-lettered, expired, late
    /// acks, reclaimed).
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.s.stats.clone()
    }

    /// Registers the queue (refused instead for [`for_registered`](Puller::for_registered))
    /// and creates the group where it is new, from the start of the stream, as a starting
    /// worker does; `receive` does it on its first call.
    pub async fn ensure_groups(&self) -> Result<()> {
        let s = &self.s;
        if self.registers {
            s.client.register(&s.queue).await?;
        }
        ensure_groups(&s.client, &s.queue, &s.lanes, &s.group, false).await?;
        s.remember_epoch().await;
        self.joined.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// A read found no group: the queue was deleted ([`Error::QueueNotFound`]; the next
    /// receive joins again), or deleted and created again (joined now, from the start of the
    /// new streams), or the group was deleted on purpose ([`Error::GroupDeleted`] on this
    /// and every later receive, as a worker stops then: a receive never creates it again
    /// over the entries it had; [`ensure_groups`](Puller::ensure_groups) does).
    async fn lost_group(&self) -> Result<()> {
        let s = &self.s;
        self.joined.store(false, Ordering::Relaxed);
        if s.queue_replaced().await {
            if s.client.lookup(&s.queue).await?.is_none() {
                return Err(Error::QueueNotFound {
                    queue: s.queue.as_str().to_owned(),
                });
            }
            return self.ensure_groups().await;
        }
        let r = ensure_groups(&s.client, &s.queue, &s.lanes, &s.group, true).await;
        // Joined again (the group vanished with its stream), or deleted on purpose: the
        // next receives keep answering so; only `ensure_groups` creates it again.
        if matches!(r, Ok(()) | Err(Error::GroupDeleted { .. })) {
            self.joined.store(true, Ordering::Relaxed);
        }
        r
    }

    /// Up to `max` (1..=[`MAX_RECEIVE`]) deliveries, each leased for `lease`
    /// ([`MIN_LEASE`]..=[`MAX_LEASE`]): due retries and taken-over leases first, then new
    /// entries, most urgent first. Empty when nothing is due, the group is paused, or its
    /// rate limit grants nothing now. Does not wait ([`receive_wait`](Puller::receive_wait)
    /// does).
    pub async fn receive(&self, max: usize, lease: Duration) -> Result<Vec<PullDelivery>> {
        if max == 0 || max > MAX_RECEIVE {
            return Err(bad_option(
                "max",
                format!("{max}; 1..={MAX_RECEIVE} per receive"),
            ));
        }
        check_lease(lease)?;
        let s = &self.s;
        if !self.joined.load(Ordering::Relaxed) {
            self.ensure_groups().await?;
        }
        self.heartbeat().await;
        if s.pause.paused(&s.client).await? {
            return Ok(Vec::new());
        }
        let mut budget = max;
        if let Some(rl) = &s.opts.rate_limit {
            let (granted, _) =
                crate::engine::flow::take_permits(&s.client, &s.queue, &s.group, rl, max).await?;
            if granted == 0 {
                crate::engine::telemetry::rate_limited(s.queue.as_str(), &s.group);
                return Ok(Vec::new());
            }
            budget = granted.min(max);
        }
        let now = s.client.now_ms();
        let lease_until = now + ms(lease);
        let mut taken = self.reclaim(now, lease_until, budget).await;
        if taken.len() < budget {
            let r = self.read_new(lease_until, budget - taken.len()).await;
            match r {
                Ok(t) => taken.extend(t),
                Err(e) if is_nogroup(&e) => {
                    self.refund(budget - taken.len().min(budget)).await;
                    let lost = self.lost_group().await;
                    // What the reclaim took is leased: hand it out (or dead-letter it).
                    if taken.is_empty() {
                        lost?;
                    }
                    return Ok(self.hand_off_all(taken, lease_until).await);
                }
                Err(e) if taken.is_empty() => {
                    self.refund(budget).await;
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "reading new entries failed")
                }
            }
        }
        self.refund(budget - taken.len().min(budget)).await;
        Ok(self.hand_off_all(taken, lease_until).await)
    }

    /// [`hand_off`](Puller::hand_off) of every taken entry, in order.
    async fn hand_off_all(&self, mut taken: Vec<Taken>, lease_until: i64) -> Vec<PullDelivery> {
        key_gate::sequence_order(&self.s, &mut taken);
        let mut out = Vec::with_capacity(taken.len());
        for t in taken {
            if let Some(d) = self.hand_off(t, lease_until).await {
                out.push(d);
            }
        }
        out
    }

    /// Gives rate-limit permits taken for entries not returned back.
    async fn refund(&self, unused: usize) {
        let s = &self.s;
        if let Some(rl) = &s.opts.rate_limit
            && unused > 0
            && let Err(e) =
                crate::engine::flow::refund_permits(&s.client, &s.queue, &s.group, rl, unused).await
        {
            tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "refunding rate-limit permits failed");
        }
    }

    /// Says this consumer is alive, at most every heartbeat interval.
    async fn heartbeat(&self) {
        let s = &self.s;
        let now = s.client.now_ms();
        let every = ms(crate::engine::client::HEARTBEAT_EVERY);
        if now - self.beat_at.load(Ordering::Relaxed) < every {
            return;
        }
        self.beat_at.store(now, Ordering::Relaxed);
        if let Err(e) = s
            .client
            .heartbeat(&s.queue, &s.group, &s.consumer, true)
            .await
        {
            tracing::debug!(error = %e, "heartbeat failed");
        }
    }

    /// Claims up to `budget` due timers (the reclaim loop's pass, done inline).
    async fn reclaim(&self, now: i64, lease_until: i64, budget: usize) -> Vec<Taken> {
        let s = &self.s;
        let mut next_look = i64::MAX;
        let due = super::reclaim::due_shards(s, now, &mut next_look).await;
        self.next_timer_ms.store(next_look, Ordering::Relaxed);
        let mut taken = Vec::new();
        for i in due {
            let left = budget - taken.len();
            if left == 0 {
                break;
            }
            let keys = &s.lanes[i];
            let Some((claimed, _, missing, _)) =
                super::reclaim::claim(s, keys, now, lease_until, left, &[]).await
            else {
                continue;
            };
            for (entry_id, owner, attempts) in missing {
                settle_missing(s, keys, &entry_id, &owner, attempts).await;
            }
            for (entry_id, fields, count) in claimed {
                s.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
                taken.push(to_taken(
                    s,
                    keys,
                    &entry_id,
                    Some(fields),
                    count,
                    lease_until,
                ));
            }
        }
        taken
    }

    /// Reads up to `budget` new entries, most urgent level first, rotating over shards.
    async fn read_new(&self, lease_until: i64, budget: usize) -> Result<Vec<Taken>> {
        let s = &self.s;
        let start = self.rotate.fetch_add(1, Ordering::Relaxed);
        let mut taken = Vec::new();
        for level in Priority::ALL {
            let lanes: Vec<usize> = (0..s.lanes.len())
                .filter(|&i| s.lanes[i].level == level)
                .collect();
            for k in 0..lanes.len() {
                let left = budget - taken.len();
                if left == 0 {
                    return Ok(taken);
                }
                let keys = &s.lanes[lanes[(start + k) % lanes.len()]];
                let r = scripts::read(
                    &mut s.client.connection(),
                    keys,
                    &s.group,
                    &s.consumer,
                    left,
                    lease_until,
                )
                .await?;
                if r.paused {
                    return Ok(taken);
                }
                if r.missing {
                    continue;
                }
                for (entry_id, fields) in entries_of(r.entries)? {
                    taken.push(to_taken(s, keys, &entry_id, fields, 1, lease_until));
                }
            }
        }
        Ok(taken)
    }

    /// What a worker does before its handler: dead-letters what cannot be handled, what
    /// expired and what was delivered too often; acknowledges another group's replay; the
    /// rest is handed out with a receipt.
    async fn hand_off(&self, t: Taken, lease_until: i64) -> Option<PullDelivery> {
        let s = &self.s;
        let Taken {
            delivery: d,
            for_group,
            bad,
            lease,
            expires_after_ms,
        } = t;
        if let Some(reason) = bad {
            settle_dead(s, &d, &reason, false).await;
            return None;
        }
        if let Some((late, limit)) =
            super::expire::past_limit(s, &d, for_group.is_some(), expires_after_ms).await
        {
            settle_expired(s, &d, late, limit).await;
            return None;
        }
        if let Some(g) = &for_group
            && *g != s.group
        {
            s.stats.skipped.fetch_add(1, Ordering::Relaxed);
            handled_metric(s, "skipped");
            let lane = LaneId::of(d.shard, d.priority);
            self.ack_lane(lane, &[(d.entry_id.clone(), d.attempt)])
                .await;
            return None;
        }
        if d.attempt > s.opts.max_attempts {
            settle_dead(s, &d, &exhausted(d.attempt), false).await;
            return None;
        }
        // A key at its slots per key (`key_concurrency`): parked, not handed out. The hold
        // lasts the lease; the caller's extend, ack and nack move it or give it back.
        let lease = match key_gate::admit(s, &d, lease, lease_until).await {
            key_gate::Admission::Run(lease, _hold) => lease,
            key_gate::Admission::Waits => return None,
        };
        // The lease is the caller's from here: this process extends nothing.
        lease.release();
        delivery_metrics(s, &d, for_group.is_some());
        let receipt = self.signer.sign(&Receipt {
            lane: LaneId::of(d.shard, d.priority),
            entry_id: d.entry_id.clone(),
            lease_until,
            attempt: d.attempt,
        });
        Some(PullDelivery {
            delivery: d,
            receipt,
            lease_until_ms: lease_until,
        })
    }
}
