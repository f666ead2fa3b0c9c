//! Workers: one business handler = one consumer group on the queue's streams.
//!
//! A [`Worker`] takes new entries with `read.lua` (`XREADGROUP` plus a lease in the group's
//! timers ZSET, atomically) and waits for more with `XREAD ... BLOCK` on a connection of its
//! own (a blocking read would stall every command sharing a multiplexed connection, and the
//! redis crate's default 500 ms response timeout would cut it off). It runs the handler with a
//! concurrency limit and a timeout and settles each entry:
//!
//! - success: XACK and drop the timer (one pipeline), batched;
//! - retryable failure (error, panic, timeout): `retry.lua` sets the timer to the next attempt
//!   (backoff policy, or the handler's own retry-after); the entry stays pending;
//! - permanent failure, or the last attempt failed: `dead.lua` moves it to the dead-letter
//!   stream and acks it, atomically.
//!
//! While a handler runs, its lease is extended every third of the visibility timeout, so only
//! a dead consumer's entries come due. A reclaim loop claims due timers (`reclaim.lua`:
//! XCLAIM by id, O(log n) each): entries whose consumer died and retries whose backoff
//! elapsed. The pending list keeps the entry and its delivery count (= attempt number), so
//! attempts survive restarts.

mod ack;
mod block;
mod entry;
mod expire;
mod handler;
mod key_gate;
mod multi;
mod options;
mod plan;
mod pull;
mod reader;
mod receipt;
mod reclaim;
mod settle;

pub(crate) use entry::ensure_groups;
pub use handler::{
    Delivery, DeliveryFlag, Handler, HandlerError, HandlerResult, Hooks, NoHooks, WorkerStats,
};
pub use multi::{MAX_QUEUES_PER_HANDLER, MultiWorker, check_queues};
pub use options::WorkerOptions;
pub use pull::{
    DEFAULT_LEASE, Extended, MAX_LEASE, MAX_RECEIPTS, MAX_RECEIVE, MAX_WAIT, MIN_LEASE, Nack,
    PullDelivery, Puller, Settled, check_lease,
};

use crate::engine::client::Client;
use crate::engine::error::{Error, Result};
use crate::engine::keys::{QueueName, ShardKeys, validate_member_name};
use crate::engine::priority::Priority;
use crate::engine::retry::{Pacer, RetryPolicy, until_ok};
use entry::default_consumer_name;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Runs one handler as one consumer of one consumer group. See the module docs.
pub struct Worker<H> {
    shared: Arc<Shared<H>>,
}

/// What the worker's tasks share.
struct Shared<H> {
    client: Client,
    queue: QueueName,
    group: String,
    consumer: String,
    /// Every priority lane of every shard of the queue, shard by shard and most urgent
    /// first: the lane of shard `s` and level `p` is at [`LaneId::of`]`(s, p)`.
    lanes: Vec<ShardKeys>,
    handler: H,
    hooks: Arc<dyn Hooks>,
    /// Whether hooks were set: without them a delivery is moved into the handler, not
    /// copied for the hooks.
    has_hooks: bool,
    /// The group's metric handles, registered when the worker starts.
    metrics: std::sync::OnceLock<crate::engine::telemetry::GroupMetrics>,
    opts: WorkerOptions,
    stats: Arc<WorkerStats>,
    /// The entries this worker holds (running or waiting for a slot): their leases are
    /// extended. Each is owned by one [`entry::Lease`], held by the task that settles it.
    leases: Arc<entry::LeaseSet>,
    /// Cancelled when the worker stops taking entries: prefetched entries still waiting for
    /// a slot are then left to their lease instead of being started.
    stopping: CancellationToken,
    /// The group's pause flag and the queue's history retention, as this process last saw
    /// them.
    pause: crate::engine::flow::QueueWatch,
    /// Retries this worker set, for its reclaim loop.
    timer_hint: reclaim::TimerHint,
    /// A pull group's consumer: its retries (hand-backs) are announced on the shard's wake
    /// channel, since the receive that takes them may wait in another process.
    pull: bool,
    /// The group's slots per order key, when its options limit keys.
    key_gate: Option<key_gate::KeyGate>,
    /// Handler slots.
    sem: Arc<Semaphore>,
    /// Entries a reader may hold: handler slots plus prefetch.
    taken: Arc<Semaphore>,
    /// The epoch of the queue this worker joined (read when it joined): a read that finds
    /// no group in a queue of another epoch means the queue was deleted and created again,
    /// not that the group was deleted.
    epoch: std::sync::Mutex<Option<String>>,
    /// For one queue of a [`MultiWorker`]: the gate its readers pass before each read, and
    /// the queue's rank (0 = most urgent).
    gate: Option<(Arc<multi::Gate>, usize)>,
}

/// One lane of the queue: a shard's stream of one priority level, by its place in
/// [`Shared::lanes`] (shard by shard, most urgent first). Leases, receipts and ack batches
/// name lanes, never shards: stream entry ids are unique per stream, and a shard has three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct LaneId(u16);

impl LaneId {
    /// The lane of shard `shard` and level `p`.
    pub(super) fn of(shard: u16, p: Priority) -> Self {
        // At most MAX_SHARDS (1024) shards of 3 lanes: fits.
        // The rank is 0..=2 (`Priority::rank`, the one mapping of levels to indexes).
        LaneId(shard * 3 + u16::try_from(p.rank()).unwrap_or(0))
    }

    /// A lane number as a receipt carries it, when the queue (of `lanes` lanes) has it.
    pub(super) fn checked(n: u16, lanes: usize) -> Option<Self> {
        (usize::from(n) < lanes).then_some(LaneId(n))
    }

    /// Its place in [`Shared::lanes`].
    pub(super) fn index(self) -> usize {
        usize::from(self.0)
    }

    /// The number a receipt carries.
    pub(super) fn number(self) -> u16 {
        self.0
    }
}

impl<H> Shared<H> {
    /// What a worker (or a [`Puller`]) of group `group` on `queue` shares, with the
    /// arguments checked.
    fn new(
        client: &Client,
        queue: &str,
        group: &str,
        handler: H,
        opts: WorkerOptions,
    ) -> Result<Self> {
        let queue = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        let consumer = opts.consumer.clone().unwrap_or_else(default_consumer_name);
        validate_member_name("consumer", &consumer)?;
        opts.validate()?;
        let pause = crate::engine::flow::QueueWatch::new(queue.clone(), Some(group.to_owned()));
        let key_gate = key_gate::KeyGate::new(client.keyspace().key_slots(&queue, group), &opts);
        Ok(Shared {
            key_gate,
            lanes: client
                .queue_keys(&queue)
                .iter()
                .flat_map(ShardKeys::lanes)
                .collect(),
            client: client.clone(),
            queue,
            group: group.to_owned(),
            consumer,
            handler,
            hooks: Arc::new(NoHooks),
            has_hooks: false,
            metrics: std::sync::OnceLock::new(),
            timer_hint: reclaim::TimerHint::default(),
            pull: false,
            sem: Arc::new(Semaphore::new(opts.concurrency)),
            taken: Arc::new(Semaphore::new(opts.taken_limit())),
            opts,
            stats: Arc::new(WorkerStats::default()),
            leases: Arc::default(),
            stopping: CancellationToken::new(),
            pause,
            epoch: std::sync::Mutex::new(None),
            gate: None,
        })
    }

    /// The keys of shard `shard`'s lane of level `p`.
    fn lane(&self, shard: u16, p: Priority) -> &ShardKeys {
        &self.lanes[LaneId::of(shard, p).index()]
    }

    /// Reads the queue's epoch afresh and keeps it as the one this worker joined.
    async fn remember_epoch(&self) {
        self.client.forget(&self.queue);
        let epoch = match self.client.lookup(&self.queue).await {
            Ok(r) => r.map(|r| r.epoch),
            Err(e) => {
                tracing::debug!(queue = %self.queue, error = %e, "reading the queue's epoch failed");
                None
            }
        };
        *self.epoch_lock() = epoch;
    }

    /// Whether the queue is gone, or is not the one this worker joined (deleted and created
    /// again since): read afresh. False when it cannot be told (Redis failing).
    async fn queue_replaced(&self) -> bool {
        self.client.forget(&self.queue);
        match self.client.lookup(&self.queue).await {
            Ok(None) => true,
            Ok(Some(r)) => self
                .epoch_lock()
                .as_ref()
                .is_some_and(|joined| *joined != r.epoch),
            Err(_) => false,
        }
    }

    fn epoch_lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.epoch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The group's metric handles.
    fn metrics(&self) -> &crate::engine::telemetry::GroupMetrics {
        self.metrics.get_or_init(|| {
            crate::engine::telemetry::GroupMetrics::new(self.queue.as_str(), &self.group)
        })
    }
}

impl<H> std::fmt::Debug for Worker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.shared.queue)
            .field("group", &self.shared.group)
            .field("consumer", &self.shared.consumer)
            .finish_non_exhaustive()
    }
}

impl<H: Handler> Worker<H> {
    /// A worker running `handler` as group `group` on `queue`.
    pub fn new(
        client: &Client,
        queue: &str,
        group: &str,
        handler: H,
        opts: WorkerOptions,
    ) -> Result<Self> {
        Ok(Worker {
            shared: Arc::new(Shared::new(client, queue, group, handler, opts)?),
        })
    }

    /// This worker as queue `rank` of a [`MultiWorker`]: it shares `sem` and `taken` with
    /// the other queues' workers and reads when `gate` lets it (before `run`).
    fn share_budget(
        mut self,
        sem: Arc<Semaphore>,
        taken: Arc<Semaphore>,
        gate: Arc<multi::Gate>,
        rank: usize,
    ) -> Self {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.sem = sem;
            s.taken = taken;
            s.gate = Some((gate, rank));
        }
        self
    }

    /// Sets the hooks (before `run`).
    pub fn with_hooks(mut self, hooks: impl Hooks) -> Self {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.hooks = Arc::new(hooks);
            s.has_hooks = true;
        }
        self
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.shared.stats.clone()
    }

    /// The consumer name.
    pub fn consumer(&self) -> &str {
        &self.shared.consumer
    }

    /// Registers the queue (with the client's shard count, as `run` does) and creates the
    /// consumer group on every shard's stream when it is new (reading from the start of the
    /// stream, creating the stream if needed). Idempotent.
    pub async fn ensure_groups(&self) -> Result<()> {
        let s = &self.shared;
        s.client.register(&s.queue).await?;
        ensure_groups(&s.client, &s.queue, &s.lanes, &s.group, false).await
    }

    /// Runs until `cancel` fires, then stops reading, waits for in-flight handlers (up to
    /// the grace period), settles them, and returns. Redis failures are logged and retried;
    /// the worker does not give up on its own.
    pub async fn run(self, cancel: CancellationToken) -> Result<()> {
        let s = self.shared;
        // Registered now, after the application installed its metrics recorder.
        let _ = s.metrics();
        if !start(&s, &cancel).await? {
            return Ok(());
        }
        tracing::info!(queue = %s.queue, group = %s.group, consumer = %s.consumer, "worker started");

        let (ack_tx, ack_rx) = mpsc::unbounded_channel::<settle::Acked>();
        let acker = tokio::spawn(settle::ack_loop(s.clone(), ack_rx));
        // Background loops stop on their own token once handlers are done, or when this
        // future is dropped (the guard cancels it).
        let bg = CancellationToken::new();
        let _bg_guard = bg.clone().drop_guard();
        let leases = tokio::spawn(entry::lease_loop(s.clone(), bg.clone()));
        let beats = tokio::spawn(heartbeat_loop(s.clone(), bg.clone()));
        // Readers and the reclaimer stop with `cancel`, or when this future is dropped.
        let reading = cancel.child_token();
        let _reading_guard = reading.clone().drop_guard();
        let reclaimer = {
            let (s, ack_tx, reading) = (s.clone(), ack_tx.clone(), reading.clone());
            tokio::spawn(async move { reclaim::reclaim_loop(s, ack_tx, reading).await })
        };
        let readers = spawn_readers(&s, &ack_tx, &reading);
        reading.cancelled().await;
        s.stopping.cancel();

        // Shutdown: no more reads or reclaims; let in-flight handlers finish within the grace.
        let mut task_sets = Vec::new();
        for r in readers {
            if let Ok(set) = r.await {
                task_sets.push(set);
            }
        }
        if let Ok(set) = reclaimer.await {
            task_sets.push(set);
        }
        finish_in_flight(&s, task_sets).await;
        bg.cancel();
        let _ = leases.await;
        let _ = beats.await;
        drop(ack_tx);
        if let Err(e) = acker.await {
            tracing::error!(error = %e, "ack task failed");
        }
        tracing::info!(queue = %s.queue, group = %s.group, "worker stopped");
        Ok(())
    }
}

/// Registers the queue and joins the group (retrying Redis failures). A queue deleted
/// between the two (or one this client still believed in) is registered again, as a
/// starting worker does: a delete racing the start never stops the worker. False when
/// `cancel` fired first.
async fn start<H>(s: &Shared<H>, cancel: &CancellationToken) -> Result<bool> {
    let mut pacer = Pacer::new(RetryPolicy::LOOP);
    loop {
        let started = until_ok("starting the worker", cancel, || async {
            s.client.register(&s.queue).await?;
            ensure_groups(&s.client, &s.queue, &s.lanes, &s.group, false).await
        })
        .await;
        match started {
            Ok(Some(())) => {
                s.remember_epoch().await;
                return Ok(true);
            }
            Ok(None) => return Ok(false),
            Err(e @ Error::QueueNotFound { .. }) => {
                tracing::warn!(queue = %s.queue, group = %s.group, error = %e,
                    retry_in = ?pacer.next_delay(), "the queue was deleted while the worker started; registering it again");
                s.client.forget(&s.queue);
                if !pacer.wait(Some(cancel)).await {
                    return Ok(false);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The worker's queue was deleted (a read found neither its group nor the queue): stops
/// reading it and waits, polling the registry with a bounded backoff (at most
/// [`RetryPolicy::LOOP`]'s ceiling between looks) and observing `cancel`, until the queue
/// exists again with this worker's shard count; then joins the group (created from the
/// start of the new, empty queue's streams). Logs one warning when the wait starts and one
/// line when it ends. False when `cancel` fired first.
async fn wait_for_queue<H>(s: &Shared<H>, cancel: &CancellationToken) -> bool {
    tracing::warn!(queue = %s.queue, group = %s.group,
        "the queue was deleted: this worker stops reading it until it is created again");
    let mut pacer = Pacer::new(RetryPolicy::LOOP);
    let shards = s.client.options().shards;
    let mut mismatch_told = false;
    let back = loop {
        s.client.forget(&s.queue);
        match s.client.lookup(&s.queue).await {
            Ok(Some(r)) if r.shards == shards => {
                match ensure_groups(&s.client, &s.queue, &s.lanes, &s.group, false).await {
                    Ok(()) => {
                        *s.epoch_lock() = Some(r.epoch);
                        break true;
                    }
                    // Deleted again meanwhile: keep waiting.
                    Err(Error::QueueNotFound { .. }) => {}
                    Err(e) => tracing::debug!(queue = %s.queue, group = %s.group, error = %e,
                        "joining the re-created queue failed; retrying"),
                }
            }
            Ok(Some(r)) => {
                if !std::mem::replace(&mut mismatch_told, true) {
                    tracing::warn!(queue = %s.queue, group = %s.group, existing = r.shards, wanted = shards,
                        "the queue was created again with another shard count: this worker keeps waiting");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(queue = %s.queue, error = %e, "looking the queue up failed"),
        }
        if !pacer.wait(Some(cancel)).await {
            break false;
        }
    };
    if back {
        tracing::info!(queue = %s.queue, group = %s.group, "the queue exists again: the worker goes on reading it");
    }
    back
}

/// Says this consumer is alive every [`HEARTBEAT_EVERY`](crate::engine::client::HEARTBEAT_EVERY)
/// until `stop`, then that it stopped (stats and `delete_group` tell a quiet group from an
/// abandoned one by it).
async fn heartbeat_loop<H>(s: Arc<Shared<H>>, stop: CancellationToken) {
    loop {
        if let Err(e) = s
            .client
            .heartbeat(&s.queue, &s.group, &s.consumer, true)
            .await
        {
            tracing::debug!(error = %e, "heartbeat failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(crate::engine::client::HEARTBEAT_EVERY) => {}
            _ = stop.cancelled() => break,
        }
    }
    if let Err(e) = s
        .client
        .heartbeat(&s.queue, &s.group, &s.consumer, false)
        .await
    {
        tracing::debug!(error = %e, "last heartbeat failed");
    }
}

/// One reader for every lane of every shard on one server (one multi-key XREAD); one reader
/// per shard (its three lanes) on a cluster, where a multi-key read must stay in one slot.
fn spawn_readers<H: Handler>(
    s: &Arc<Shared<H>>,
    ack_tx: &settle::AckSender,
    reading: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<JoinSet<()>>> {
    let shard_sets: Vec<Vec<ShardKeys>> = if s.client.is_cluster() {
        s.lanes.chunks(3).map(<[ShardKeys]>::to_vec).collect()
    } else {
        vec![s.lanes.clone()]
    };
    shard_sets
        .into_iter()
        .map(|set| {
            tokio::spawn(reader::reader_loop(
                s.clone(),
                set,
                ack_tx.clone(),
                reading.clone(),
            ))
        })
        .collect()
}

/// Waits up to the shutdown grace for the handlers still running; aborts the rest (their
/// entries stay pending and are reclaimed once their lease runs out).
async fn finish_in_flight<H>(s: &Shared<H>, mut task_sets: Vec<JoinSet<()>>) {
    let grace = tokio::time::timeout(s.opts.shutdown_grace, async {
        for set in task_sets.iter_mut() {
            while set.join_next().await.is_some() {}
        }
    })
    .await;
    if grace.is_err() {
        let abandoned: usize = task_sets.iter().map(JoinSet::len).sum();
        tracing::warn!(
            queue = %s.queue, group = %s.group, abandoned,
            "shutdown grace period over; abandoned handlers stay pending"
        );
        for set in task_sets.iter_mut() {
            set.abort_all();
            while set.join_next().await.is_some() {}
        }
    }
}
