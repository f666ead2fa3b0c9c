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

use crate::backoff::Backoff;
use crate::client::Client;
use crate::conn::Conn;
use crate::error::{Error, InvalidInput, RedisContext, Result};
use crate::keys::{QueueName, ShardKeys, validate_member_name};
use crate::scripts::{self, DeadArgs};
use futures_util::FutureExt;
use redis::Value;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Why an order was delivered with something unusual about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryFlag {
    /// The payload entry was missing when the order was dispatched (the HASH was tampered
    /// with); the payload is `null`.
    PayloadMissing,
    /// The stored payload did not carry the `<enqueued_ms>:` prefix (written by a producer
    /// that does not follow ARCHITECTURE.md); the payload is the raw stored value.
    BadEncoding,
    /// The payload in the stream is not valid JSON; `payload` holds it as a JSON string.
    InvalidJson,
}

/// One order handed to a handler.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Delivery {
    /// The queue.
    pub queue: String,
    /// The consumer group (the business handler).
    pub group: String,
    /// The order id.
    pub id: String,
    /// The payload that was scheduled.
    pub payload: serde_json::Value,
    /// When the order was due, unix ms.
    pub due_at_ms: i64,
    /// When it was (last) scheduled, unix ms, if known.
    pub enqueued_at_ms: Option<i64>,
    /// When the dispatcher moved it into the stream, unix ms (the stream entry id's time).
    pub dispatched_at_ms: i64,
    /// The stream entry id.
    pub entry_id: String,
    /// The shard the order lives in.
    pub shard: u16,
    /// Which delivery this is for this group, from 1.
    pub attempt: u32,
    /// Set when something about the order is unusual; it is delivered all the same.
    pub flag: Option<DeliveryFlag>,
}

/// How a handler failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Try again later (optionally not before `after`).
    #[error("retryable failure: {message}")]
    Retry {
        /// What went wrong.
        message: String,
        /// The handler's own wish for the next attempt's delay.
        after: Option<Duration>,
    },
    /// Will never succeed; do not retry.
    #[error("permanent failure: {message}")]
    Permanent {
        /// What went wrong.
        message: String,
    },
}

impl HandlerError {
    /// A retryable failure.
    pub fn retry(message: impl std::fmt::Display) -> Self {
        HandlerError::Retry {
            message: message.to_string(),
            after: None,
        }
    }

    /// A retryable failure with a delay of the handler's choosing.
    pub fn retry_after(message: impl std::fmt::Display, after: Duration) -> Self {
        HandlerError::Retry {
            message: message.to_string(),
            after: Some(after),
        }
    }

    /// A permanent failure.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        HandlerError::Permanent {
            message: message.to_string(),
        }
    }
}

/// What a handler returns.
pub type HandlerResult = std::result::Result<(), HandlerError>;

/// A business handler. Implemented for every `Fn(Delivery) -> impl Future<Output =
/// HandlerResult>`.
pub trait Handler: Send + Sync + 'static {
    /// Handles one delivery. Must be idempotent: delivery is at least once.
    fn handle(&self, delivery: Delivery) -> impl Future<Output = HandlerResult> + Send;
}

impl<F, Fut> Handler for F
where
    F: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send,
{
    fn handle(&self, delivery: Delivery) -> impl Future<Output = HandlerResult> + Send {
        self(delivery)
    }
}

/// Options of a [`Worker`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerOptions {
    /// Most handler calls running at once (default 16).
    pub concurrency: usize,
    /// A handler running longer than this has failed (default 30 s).
    pub handler_timeout: Duration,
    /// How long one blocking read waits (default 1 s). Shutdown waits for the read in flight.
    pub block: Duration,
    /// How long shutdown waits for in-flight handlers (default 30 s); those still running
    /// then are abandoned and their entries stay pending (reclaimed after their lease).
    pub shutdown_grace: Duration,
    /// The consumer name (default `<host>-<pid>-<random>`).
    pub consumer: Option<String>,
    /// Attempts before an order is dead-lettered (default 10).
    pub max_attempts: u32,
    /// Delay before each retry (default exponential 1 s .. 10 min with jitter).
    pub backoff: Backoff,
    /// An entry whose consumer stopped extending its lease this long ago is taken over by
    /// another consumer (default 30 s).
    pub visibility_timeout: Duration,
    /// Longest wait between two looks at the group's due timers (default 1 s); the loop also
    /// wakes at the earliest timer.
    pub reclaim_every: Duration,
    /// Entries taken ahead of free handler slots (default: three times `concurrency`).
    /// Under a backlog, each read then takes up to `concurrency + prefetch` entries (at most
    /// 1,000) instead of the few slots that just came free, so there are fewer round trips
    /// per entry (storm drain +25–35% measured, see docs/benchmarks.md). Prefetched entries
    /// are leased, and their leases extended, like running ones; they wait for a slot in
    /// this process. 0 turns it off.
    pub prefetch: Option<usize>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 16,
            handler_timeout: Duration::from_secs(30),
            block: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            consumer: None,
            max_attempts: 10,
            backoff: Backoff::default(),
            visibility_timeout: Duration::from_secs(30),
            reclaim_every: Duration::from_secs(1),
            prefetch: None,
        }
    }
}

impl WorkerOptions {
    /// Sets the concurrency.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Sets the handler timeout.
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = d;
        self
    }

    /// Sets the shutdown grace period.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// Sets the read block time.
    pub fn block(mut self, d: Duration) -> Self {
        self.block = d;
        self
    }

    /// Sets the consumer name.
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = Some(name.into());
        self
    }

    /// Sets the attempt limit.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Sets the backoff policy.
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// Sets the visibility timeout.
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.visibility_timeout = d;
        self
    }

    /// Sets the longest wait between reclaim looks.
    pub fn reclaim_every(mut self, d: Duration) -> Self {
        self.reclaim_every = d;
        self
    }

    /// Sets how many entries are taken ahead of free handler slots.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Handler slots plus prefetch: the most entries a reader holds at once.
    fn taken_limit(&self) -> usize {
        self.concurrency + self.prefetch.unwrap_or(3 * self.concurrency)
    }

    fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |name: &'static str, reason: &str| InvalidInput::Option {
            name,
            reason: reason.to_owned(),
        };
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err(bad("concurrency", "must be 1..=10000"));
        }
        if self.prefetch.is_some_and(|p| p > 10_000) {
            return Err(bad("prefetch", "must be 0..=10000"));
        }
        if self.block < Duration::from_millis(1) {
            return Err(bad("block", "must be at least 1 ms"));
        }
        if self.handler_timeout.is_zero() {
            return Err(bad("handler_timeout", "must be more than zero"));
        }
        if self.max_attempts == 0 {
            return Err(bad("max_attempts", "must be at least 1"));
        }
        if self.visibility_timeout < Duration::from_millis(30) {
            return Err(bad("visibility_timeout", "must be at least 30 ms"));
        }
        if self.reclaim_every.is_zero() {
            return Err(bad("reclaim_every", "must be more than zero"));
        }
        Ok(())
    }
}

/// Callbacks on each outcome, so applications can log, alert or compensate. They run on the
/// worker's task: keep them short (spawn for slow work).
pub trait Hooks: Send + Sync + 'static {
    /// The handler succeeded.
    fn on_success(&self, _delivery: &Delivery) {}
    /// An attempt failed; `retry_in` is the delay before the next one (`None`: dead-lettered).
    fn on_failure(&self, _delivery: &Delivery, _error: &str, _retry_in: Option<Duration>) {}
    /// The order was moved to the dead-letter stream.
    fn on_dead(&self, _delivery: &Delivery, _error: &str) {}
}

impl<T: Hooks> Hooks for Arc<T> {
    fn on_success(&self, d: &Delivery) {
        (**self).on_success(d);
    }
    fn on_failure(&self, d: &Delivery, error: &str, retry_in: Option<Duration>) {
        (**self).on_failure(d, error, retry_in);
    }
    fn on_dead(&self, d: &Delivery, error: &str) {
        (**self).on_dead(d, error);
    }
}

/// Hooks that do nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoHooks;

impl Hooks for NoHooks {}

/// Counters of one worker, readable while it runs.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Handler calls that succeeded.
    pub succeeded: AtomicU64,
    /// Handler calls that returned an error.
    pub failed: AtomicU64,
    /// Handler calls that panicked.
    pub panicked: AtomicU64,
    /// Handler calls that exceeded the timeout.
    pub timed_out: AtomicU64,
    /// Entries acknowledged.
    pub acked: AtomicU64,
    /// Retries scheduled.
    pub retried: AtomicU64,
    /// Entries moved to the dead-letter stream.
    pub dead_lettered: AtomicU64,
    /// Entries claimed from the timers (retries that came due, or a dead consumer's entries).
    pub reclaimed: AtomicU64,
    /// Entries addressed to another group (dead-letter replays) acknowledged unhandled.
    pub skipped: AtomicU64,
}

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
    shards: Vec<ShardKeys>,
    handler: H,
    hooks: Arc<dyn Hooks>,
    opts: WorkerOptions,
    stats: Arc<WorkerStats>,
    /// Entries being handled, by (shard, entry id): their leases are extended. A tokio mutex,
    /// held while a lease or retry command is sent, so an extension can never overwrite the
    /// retry time of an entry that just failed.
    in_flight: Mutex<HashSet<(u16, String)>>,
    /// Handler slots.
    sem: Arc<Semaphore>,
    /// Entries a reader may hold: handler slots plus prefetch.
    taken: Arc<Semaphore>,
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

/// A stream entry taken for handling.
struct Taken {
    delivery: Delivery,
    /// Set on dead-letter replays: only this group handles it.
    for_group: Option<String>,
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
        let queue = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        let consumer = opts.consumer.clone().unwrap_or_else(default_consumer_name);
        validate_member_name("consumer", &consumer)?;
        opts.validate()?;
        Ok(Worker {
            shared: Arc::new(Shared {
                shards: client.queue_keys(&queue),
                client: client.clone(),
                queue,
                group: group.to_owned(),
                consumer,
                handler,
                hooks: Arc::new(NoHooks),
                sem: Arc::new(Semaphore::new(opts.concurrency)),
                taken: Arc::new(Semaphore::new(opts.taken_limit())),
                opts,
                stats: Arc::new(WorkerStats::default()),
                in_flight: Mutex::new(HashSet::new()),
            }),
        })
    }

    /// Sets the hooks (before `run`).
    pub fn with_hooks(mut self, hooks: impl Hooks) -> Self {
        if let Some(s) = Arc::get_mut(&mut self.shared) {
            s.hooks = Arc::new(hooks);
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

    /// Creates the consumer group on every shard's stream (reading from the start of the
    /// stream, creating the stream if needed). Idempotent.
    pub async fn ensure_groups(&self) -> Result<()> {
        let s = &self.shared;
        ensure_groups(&mut s.client.connection(), &s.shards, &s.group).await
    }

    /// Runs until `cancel` fires, then stops reading, waits for in-flight handlers (up to
    /// the grace period), settles them, and returns. Redis failures are logged and retried;
    /// the worker does not give up on its own.
    pub async fn run(self, cancel: CancellationToken) -> Result<()> {
        let s = self.shared;
        loop {
            let attempt = async {
                s.client.ensure_queue(&s.queue, true).await?;
                ensure_groups(&mut s.client.connection(), &s.shards, &s.group).await
            };
            match attempt.await {
                Ok(()) => break,
                Err(e) if e.as_invalid().is_some() => return Err(e),
                Err(e) => {
                    tracing::warn!(queue = %s.queue, group = %s.group, error = %e, "worker start failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = cancel.cancelled() => return Ok(()),
                    }
                }
            }
        }
        tracing::info!(queue = %s.queue, group = %s.group, consumer = %s.consumer, "worker started");

        let (ack_tx, ack_rx) = mpsc::unbounded_channel::<(u16, String)>();
        let acker = tokio::spawn(ack_loop(s.clone(), ack_rx));
        // Background loops stop on their own token once handlers are done, or when this
        // future is dropped (the guard cancels it).
        let bg = CancellationToken::new();
        let _bg_guard = bg.clone().drop_guard();
        let leases = tokio::spawn(lease_loop(s.clone(), bg.clone()));
        // Readers and the reclaimer stop with `cancel`, or when this future is dropped.
        let reading = cancel.child_token();
        let _reading_guard = reading.clone().drop_guard();
        let reclaimer = {
            let (s, ack_tx, reading) = (s.clone(), ack_tx.clone(), reading.clone());
            tokio::spawn(async move { reclaim_loop(s, ack_tx, reading).await })
        };
        // One reader for every shard on one server (one multi-key XREAD); one reader per
        // shard on a cluster, where a multi-key read must stay in one slot.
        let shard_sets: Vec<Vec<ShardKeys>> = if s.client.is_cluster() {
            s.shards.iter().map(|k| vec![k.clone()]).collect()
        } else {
            vec![s.shards.clone()]
        };
        let readers: Vec<_> = shard_sets
            .into_iter()
            .map(|set| tokio::spawn(reader_loop(s.clone(), set, ack_tx.clone(), reading.clone())))
            .collect();
        reading.cancelled().await;

        // Shutdown: no more reads or reclaims; let in-flight handlers finish within the grace.
        let mut task_sets = Vec::new();
        for r in readers {
            if let Ok(set) = r.await {
                task_sets.push(set);
            }
        }
        let reclaimed_tasks = reclaimer.await.unwrap_or_default();
        let grace = tokio::time::timeout(s.opts.shutdown_grace, async {
            for set in task_sets.iter_mut() {
                while set.join_next().await.is_some() {}
            }
            for t in reclaimed_tasks {
                let _ = t.await;
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
        bg.cancel();
        let _ = leases.await;
        drop(ack_tx);
        if let Err(e) = acker.await {
            tracing::error!(error = %e, "ack task failed");
        }
        tracing::info!(queue = %s.queue, group = %s.group, "worker stopped");
        Ok(())
    }
}

/// Takes and handles new entries of `shards` until `cancel`; returns the handler tasks still
/// running (shutdown waits for them).
async fn reader_loop<H: Handler>(
    s: Arc<Shared<H>>,
    shards: Vec<ShardKeys>,
    ack_tx: mpsc::UnboundedSender<(u16, String)>,
    cancel: CancellationToken,
) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    let reader_timeout = s.opts.block + Duration::from_secs(10);
    let mut reader = loop {
        match s.client.dedicated_connection(reader_timeout).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(queue = %s.queue, error = %e, "reader connection failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = cancel.cancelled() => return tasks,
                }
            }
        }
    };
    let mut backoff = Duration::from_millis(100);
    // Which shards to read next (indexes into `shards`): all at first; then only those the
    // blocking wait reported new entries in, or whose last read came back full. Each shard's
    // last seen stream id, for the blocking wait.
    let mut to_read: Vec<usize> = (0..shards.len()).collect();
    let mut last_ids: Vec<String> = vec!["0-0".to_owned(); shards.len()];
    'read: loop {
        while tasks.try_join_next().is_some() {}
        if cancel.is_cancelled() {
            break 'read;
        }
        if to_read.is_empty() {
            // Nothing known to be waiting: block until a shard has a new entry (or the block
            // time passes: then look at every shard once, e.g. after a restart of Redis).
            match wait_for_new(&s, &shards, &mut reader, &last_ids).await {
                Ok(ready) if ready.is_empty() => to_read = (0..shards.len()).collect(),
                Ok(ready) => to_read = ready,
                Err(e) => {
                    tracing::warn!(queue = %s.queue, error = %e, "blocking read failed");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = cancel.cancelled() => break 'read,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    to_read = (0..shards.len()).collect();
                }
            }
            continue;
        }
        let first = tokio::select! {
            p = s.taken.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'read },
            _ = cancel.cancelled() => break 'read,
        };
        let mut permits = vec![first];
        while permits.len() < s.opts.taken_limit().min(1000) {
            match s.taken.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let count = permits.len();
        let reading: Vec<&ShardKeys> = to_read.iter().map(|&i| &shards[i]).collect();
        match take_new(&s, &reading, count).await {
            Ok((taken, reads)) => {
                backoff = Duration::from_millis(100);
                // Read again at once only the shards whose read came back full.
                let mut again = Vec::new();
                for (&i, (n, last)) in to_read.iter().zip(reads) {
                    last_ids[i] = last;
                    if n >= count {
                        again.push(i);
                    }
                }
                to_read = again;
                for t in taken {
                    let permit = match permits.pop() {
                        Some(p) => p,
                        None => match s.taken.clone().acquire_owned().await {
                            Ok(p) => p,
                            Err(_) => break 'read,
                        },
                    };
                    spawn_process(&mut tasks, &s, &ack_tx, t, permit).await;
                }
            }
            Err(e) => {
                drop(permits);
                to_read = (0..shards.len()).collect();
                if is_nogroup(&e) {
                    tracing::warn!(queue = %s.queue, group = %s.group, "consumer group vanished; recreating");
                    if let Err(e) =
                        ensure_groups(&mut s.client.connection(), &shards, &s.group).await
                    {
                        tracing::warn!(error = %e, "recreating the group failed");
                    }
                } else {
                    tracing::warn!(queue = %s.queue, group = %s.group, error = %e, retry_in = ?backoff, "read failed");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = cancel.cancelled() => break 'read,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    tasks
}

/// Takes up to `count` new entries from each of `shards` (leased atomically); returns them
/// and, per shard, how many it got and the stream's last id.
async fn take_new<H: Handler>(
    s: &Shared<H>,
    shards: &[&ShardKeys],
    count: usize,
) -> Result<(Vec<Taken>, Vec<(usize, String)>)> {
    let lease_until = s.client.now_ms() + ms(s.opts.visibility_timeout);
    let mut out = Vec::new();
    let mut reads = Vec::with_capacity(shards.len());
    // One read per shard, all in flight together on the multiplexed connection.
    let replies =
        futures_util::future::try_join_all(shards.iter().map(|keys| {
            let mut conn = s.client.connection();
            async move {
                scripts::read(&mut conn, keys, &s.group, &s.consumer, count, lease_until).await
            }
        }))
        .await?;
    for (keys, (entries, last)) in shards.iter().zip(replies) {
        let entries = entries_of(entries)?;
        let n = entries.len();
        for (entry_id, fields) in entries {
            if let Some(t) = to_taken(s, keys.shard, &entry_id, fields, 1) {
                out.push(t);
            }
        }
        reads.push((n, last));
    }
    Ok((out, reads))
}

/// Blocks (dedicated connection) until some shard's stream has an entry after `last_ids`, or
/// the block time passes; returns the indexes of the shards with new entries (empty on
/// timeout). Takes nothing: `read.lua` does.
async fn wait_for_new<H: Handler>(
    s: &Shared<H>,
    shards: &[ShardKeys],
    reader: &mut Conn,
    last_ids: &[String],
) -> Result<Vec<usize>> {
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT")
        .arg(1)
        .arg("BLOCK")
        .arg(ms(s.opts.block).max(1))
        .arg("STREAMS");
    for k in shards {
        cmd.arg(&k.stream);
    }
    cmd.arg(last_ids);
    let reply: Value = cmd
        .query_async(reader)
        .await
        .ctx("waiting for new entries (XREAD BLOCK)")?;
    let streams: Vec<(Value, Value)> = match reply {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|st| match st {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let v = kv.pop().unwrap_or(Value::Nil);
                    let k = kv.pop().unwrap_or(Value::Nil);
                    Some((k, v))
                }
                _ => None,
            })
            .collect(),
        Value::Map(kv) => kv,
        _ => Vec::new(),
    };
    Ok(streams
        .iter()
        .filter_map(|(k, _)| as_string(k))
        .filter_map(|key| shards.iter().position(|k| k.stream == key))
        .collect())
}

/// Turns a raw entry into a [`Taken`]; an entry without an order id is dead-lettered later
/// by the timers (it stays pending), and logged.
fn to_taken<H>(
    s: &Shared<H>,
    shard: u16,
    entry_id: &str,
    fields: Option<Vec<(String, String)>>,
    attempt: u32,
) -> Option<Taken> {
    let Some(fields) = fields else {
        tracing::warn!(entry = %entry_id, "entry deleted from the stream");
        return None;
    };
    let parsed = parse_delivery(&s.queue, &s.group, shard, entry_id, fields, attempt);
    if parsed.is_none() {
        tracing::error!(entry = %entry_id, "stream entry without an order id: left pending for inspection");
    }
    parsed
}

async fn spawn_process<H: Handler>(
    tasks: &mut JoinSet<()>,
    s: &Arc<Shared<H>>,
    ack_tx: &mpsc::UnboundedSender<(u16, String)>,
    t: Taken,
    permit: OwnedSemaphorePermit,
) {
    s.in_flight
        .lock()
        .await
        .insert((t.delivery.shard, t.delivery.entry_id.clone()));
    let (s, ack_tx) = (s.clone(), ack_tx.clone());
    tasks.spawn(async move {
        // `permit` holds the entry's place among those taken; wait for a handler slot.
        if let Ok(slot) = s.sem.clone().acquire_owned().await {
            process(&s, &ack_tx, t).await;
            drop(slot);
        }
        drop(permit);
    });
}

/// Handles one entry and settles it: ack, retry or dead letter.
async fn process<H: Handler>(
    s: &Shared<H>,
    ack_tx: &mpsc::UnboundedSender<(u16, String)>,
    t: Taken,
) {
    let key = (t.delivery.shard, t.delivery.entry_id.clone());
    if let Some(g) = &t.for_group
        && *g != s.group
    {
        // A dead-letter replay for another group: not ours to handle.
        s.stats.skipped.fetch_add(1, Ordering::Relaxed);
        handled_metric(s, "skipped");
        s.in_flight.lock().await.remove(&key);
        let _ = ack_tx.send(key);
        return;
    }
    let d = t.delivery;
    let late_s = (s.client.clock().now_us() - d.due_at_ms * 1000) as f64 / 1e6;
    metrics::histogram!("delayq_lateness_seconds", "queue" => s.queue.as_str().to_owned(), "group" => s.group.clone())
        .record(late_s.max(0.0));
    let outcome = if d.attempt > s.opts.max_attempts {
        // Delivered more often than allowed without a result: its consumers kept dying.
        Err(HandlerError::permanent(format!(
            "delivered {} times without a result (consumers crashed or lost their lease)",
            d.attempt
        )))
    } else {
        run_handler(&s.handler, d.clone(), s.opts.handler_timeout, &s.stats).await
    };
    match outcome {
        Ok(()) => {
            s.in_flight.lock().await.remove(&key);
            handled_metric(s, "success");
            s.hooks.on_success(&d);
            // The acker outlives every task; a closed channel means shutdown already gave up
            // on this entry, which then stays pending and is delivered again.
            let _ = ack_tx.send(key);
        }
        Err(HandlerError::Retry { message, after }) if d.attempt < s.opts.max_attempts => {
            let delay = after.unwrap_or_else(|| s.opts.backoff.delay(d.attempt));
            handled_metric(s, "retry");
            s.hooks.on_failure(&d, &message, Some(delay));
            let keys = &s.shards[usize::from(d.shard)];
            let mut in_flight = s.in_flight.lock().await;
            in_flight.remove(&key);
            let at = s.client.now_ms() + ms(delay);
            let (group, consumer, entry_id) = (&s.group, &s.consumer, d.entry_id.as_str());
            let r = with_retries("retry.lua", || {
                let mut conn = s.client.connection();
                async move { scripts::retry(&mut conn, keys, group, consumer, entry_id, at).await }
            })
            .await;
            drop(in_flight);
            match r {
                Ok(true) => {
                    s.stats.retried.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(id = %d.id, attempt = d.attempt, ?delay, "retry scheduled");
                }
                Ok(false) => tracing::debug!(id = %d.id, "entry taken over by another consumer"),
                // The lease stays as it was: the entry is retried when it runs out.
                Err(e) => tracing::warn!(id = %d.id, error = %e, "could not schedule the retry"),
            }
        }
        Err(e) => {
            let message = match &e {
                HandlerError::Retry { message, .. } | HandlerError::Permanent { message } => {
                    message.clone()
                }
            };
            s.hooks.on_failure(&d, &message, None);
            let keys = &s.shards[usize::from(d.shard)];
            s.in_flight.lock().await.remove(&key);
            let args = DeadArgs {
                group: &s.group,
                consumer: &s.consumer,
                entry_id: &d.entry_id,
                attempts: d.attempt,
                error: &message,
                now_ms: s.client.now_ms(),
            };
            let r = with_retries("dead.lua", || {
                let mut conn = s.client.connection();
                let args = &args;
                async move { scripts::dead_letter(&mut conn, keys, args).await }
            })
            .await;
            match r {
                Ok(true) => {
                    s.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    handled_metric(s, "dead");
                    metrics::counter!("delayq_dead_lettered_total", "queue" => s.queue.as_str().to_owned(), "group" => s.group.clone())
                        .increment(1);
                    tracing::warn!(id = %d.id, group = %s.group, attempts = d.attempt, error = %message, "dead-lettered");
                    s.hooks.on_dead(&d, &message);
                }
                Ok(false) => tracing::debug!(id = %d.id, "entry taken over by another consumer"),
                Err(e) => {
                    tracing::warn!(id = %d.id, error = %e, "could not dead-letter; it stays pending")
                }
            }
        }
    }
}

fn handled_metric<H>(s: &Shared<H>, outcome: &'static str) {
    metrics::counter!(
        "delayq_handled_total",
        "queue" => s.queue.as_str().to_owned(),
        "group" => s.group.clone(),
        "outcome" => outcome
    )
    .increment(1);
}

/// Runs `f` up to 5 times while it fails with a transient Redis error.
async fn with_retries<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut delay = Duration::from_millis(50);
    let mut attempt = 1;
    loop {
        match f().await {
            Err(e) if e.is_transient() && attempt < 5 => {
                tracing::warn!(%what, error = %e, ?delay, "retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Runs the handler once. Panics and timeouts count as retryable failures.
async fn run_handler<H: Handler>(
    handler: &H,
    delivery: Delivery,
    timeout: Duration,
    stats: &WorkerStats,
) -> HandlerResult {
    let id = delivery.id.clone();
    let fut = AssertUnwindSafe(handler.handle(delivery)).catch_unwind();
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(Ok(()))) => {
            stats.succeeded.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Ok(Ok(Err(e))) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%id, error = %e, "handler failed");
            Err(e)
        }
        Ok(Err(_)) => {
            stats.panicked.fetch_add(1, Ordering::Relaxed);
            tracing::error!(%id, "handler panicked");
            Err(HandlerError::retry("handler panicked"))
        }
        Err(_) => {
            stats.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%id, ?timeout, "handler timed out");
            Err(HandlerError::retry(format!(
                "handler timed out after {timeout:?}"
            )))
        }
    }
}

/// Acknowledges entries in batches until every sender is gone. A failed ack is retried; an
/// entry whose ack is finally given up on stays pending (delivered again, never lost).
async fn ack_loop<H>(s: Arc<Shared<H>>, mut rx: mpsc::UnboundedReceiver<(u16, String)>) {
    let mut buf = Vec::with_capacity(1024);
    while rx.recv_many(&mut buf, 1024).await > 0 {
        let mut by_shard: HashMap<u16, Vec<String>> = HashMap::new();
        for (shard, id) in buf.drain(..) {
            by_shard.entry(shard).or_default().push(id);
        }
        for (shard, ids) in by_shard {
            let keys = &s.shards[usize::from(shard)];
            let (group, ids, client) = (&s.group, &ids, &s.client);
            // XACK then drop the timers, pipelined (two plain commands cost less Redis time than
            // a script call; a crash between them only leaves a stale timer, which
            // reclaim.lua drops when it finds the entry no longer pending).
            let r = with_retries("XACK", || {
                let mut conn = client.connection();
                async move {
                    let (n, _): (u64, i64) = redis::pipe()
                        .cmd("XACK")
                        .arg(&keys.stream)
                        .arg(group)
                        .arg(ids)
                        .cmd("ZREM")
                        .arg(keys.timers(group))
                        .arg(ids)
                        .query_async(&mut conn)
                        .await
                        .ctx("acknowledging entries (XACK + ZREM)")?;
                    Ok(n)
                }
            })
            .await;
            match r {
                Ok(n) => {
                    s.stats.acked.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => tracing::error!(
                    error = %e, entries = ids.len(),
                    "ack failed; the entries stay pending and will be delivered again"
                ),
            }
        }
    }
}

/// Extends the leases of in-flight entries every third of the visibility timeout.
async fn lease_loop<H>(s: Arc<Shared<H>>, stop: CancellationToken) {
    let every = s.opts.visibility_timeout / 3;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
        let in_flight = s.in_flight.lock().await;
        if in_flight.is_empty() {
            continue;
        }
        let until = s.client.now_ms() + ms(s.opts.visibility_timeout);
        let mut by_shard: HashMap<u16, Vec<&str>> = HashMap::new();
        for (shard, id) in in_flight.iter() {
            by_shard.entry(*shard).or_default().push(id);
        }
        let mut conn = s.client.connection();
        for (shard, ids) in by_shard {
            // XX: only entries still leased; an acked or re-timed entry is left alone.
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(s.shards[usize::from(shard)].timers(&s.group))
                .arg("XX");
            for id in ids {
                cmd.arg(until).arg(id);
            }
            if let Err(e) = cmd.query_async::<i64>(&mut conn).await {
                tracing::warn!(error = %e, "extending leases failed; retrying next round");
            }
        }
    }
}

/// Claims due timers until `cancel`; returns the handles of the tasks it spawned so shutdown
/// can wait for them.
async fn reclaim_loop<H: Handler>(
    s: Arc<Shared<H>>,
    ack_tx: mpsc::UnboundedSender<(u16, String)>,
    cancel: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut handles: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut next_look = s.client.now_ms();
    loop {
        handles.retain(|h| !h.is_finished());
        let wait = u64::try_from(next_look - s.client.now_ms()).unwrap_or(0);
        if wait > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                _ = cancel.cancelled() => return handles,
            }
        }
        // Only claim what can be handled now.
        let first = tokio::select! {
            p = s.sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return handles },
            _ = cancel.cancelled() => return handles,
        };
        let mut permits = vec![first];
        while permits.len() < 100 {
            match s.sem.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        let now = s.client.now_ms();
        next_look = now + ms(s.opts.reclaim_every);
        for keys in &s.shards {
            if permits.is_empty() {
                next_look = now;
                break;
            }
            let lease_until = now + ms(s.opts.visibility_timeout);
            let mut conn = s.client.connection();
            let r = scripts::reclaim(
                &mut conn,
                keys,
                &s.group,
                &s.consumer,
                now,
                lease_until,
                permits.len(),
            )
            .await;
            let (claimed, next) = match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "reclaim failed");
                    continue;
                }
            };
            if let Some(n) = next {
                next_look = next_look.min(crate::scripts::score_to_ms(n));
            }
            let claimed = match claimed_entries(claimed) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "unexpected reclaim reply");
                    continue;
                }
            };
            if claimed.len() == permits.len() {
                next_look = now; // maybe more are due
            }
            for (entry_id, fields, count) in claimed {
                s.stats.reclaimed.fetch_add(1, Ordering::Relaxed);
                let Some(t) = to_taken(&s, keys.shard, &entry_id, Some(fields), count) else {
                    continue;
                };
                let Some(permit) = permits.pop() else { break };
                s.in_flight
                    .lock()
                    .await
                    .insert((keys.shard, entry_id.clone()));
                let (s2, ack_tx) = (s.clone(), ack_tx.clone());
                handles.push(tokio::spawn(async move {
                    process(&s2, &ack_tx, t).await;
                    drop(permit);
                }));
            }
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

/// Creates `group` on each shard's stream from id 0 with MKSTREAM; an existing group is fine.
pub(crate) async fn ensure_groups(
    conn: &mut Conn,
    shards: &[ShardKeys],
    group: &str,
) -> Result<()> {
    for s in shards {
        let r: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&s.stream)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(conn)
            .await;
        match r {
            Ok(()) => tracing::info!(stream = %s.stream, %group, "consumer group created"),
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e).ctx("creating the consumer group (XGROUP CREATE)"),
        }
    }
    Ok(())
}

fn is_nogroup(e: &Error) -> bool {
    matches!(e, Error::Redis { source, .. } if source.code() == Some("NOGROUP"))
}

fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// Builds a [`Taken`] from a stream entry's fields; `None` when it has no order id.
fn parse_delivery(
    queue: &QueueName,
    group: &str,
    shard: u16,
    entry_id: &str,
    fields: Vec<(String, String)>,
    attempt: u32,
) -> Option<Taken> {
    let mut id = None;
    let mut due = None;
    let mut data = None;
    let mut flag = None;
    let mut for_group = None;
    for (f, v) in fields {
        match f.as_str() {
            "id" => id = Some(v),
            "due_ms" => due = v.parse::<f64>().ok().map(crate::scripts::score_to_ms),
            "data" => data = Some(v),
            "flag" if v == "payload_missing" => flag = Some(DeliveryFlag::PayloadMissing),
            "for_group" => for_group = Some(v),
            _ => {}
        }
    }
    let (enq, text) = match &data {
        Some(d) => match crate::order::decode_stored(d) {
            (Some(enq), json) => (Some(enq), json),
            (None, raw) => {
                flag = flag.or(Some(DeliveryFlag::BadEncoding));
                (None, raw)
            }
        },
        None => (None, "null"),
    };
    let payload = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => {
            flag = flag.or(Some(DeliveryFlag::InvalidJson));
            serde_json::Value::String(text.to_owned())
        }
    };
    let dispatched_at_ms = entry_id
        .split_once('-')
        .and_then(|(ms, _)| ms.parse().ok())
        .unwrap_or(0);
    let delivery = Delivery {
        queue: queue.as_str().to_owned(),
        group: group.to_owned(),
        id: id?,
        payload,
        due_at_ms: due.unwrap_or(dispatched_at_ms),
        enqueued_at_ms: enq,
        dispatched_at_ms,
        entry_id: entry_id.to_owned(),
        shard,
        attempt,
        flag,
    };
    Some(Taken {
        delivery,
        for_group,
    })
}

/// `<host>-<pid>-<random hex>`: unique per process start.
fn default_consumer_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.len() <= 64 && !s.chars().any(char::is_control))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    let rand = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    format!("{host}-{}-{:06x}", std::process::id(), rand & 0xff_ffff)
}

/// A stream entry's fields, in order.
pub(crate) type Fields = Vec<(String, String)>;
/// A stream entry: its id and fields (`None` when the entry was deleted).
pub(crate) type RawEntry = (String, Option<Fields>);

/// Entries of one stream (`[[id, [f, v, ...] | nil], ...]`), as in `read.lua`'s reply.
pub(crate) fn entries_of(v: Value) -> Result<Vec<RawEntry>> {
    let Value::Array(items) = v else {
        return Ok(Vec::new());
    };
    items
        .into_iter()
        .map(|e| {
            let Value::Array(parts) = e else {
                return Err(Error::Protocol {
                    context: "parsing stream entries",
                    detail: format!("entry {e:?}"),
                });
            };
            let mut parts = parts.into_iter();
            let id = parts
                .next()
                .as_ref()
                .and_then(as_string)
                .ok_or(Error::Protocol {
                    context: "parsing stream entries",
                    detail: "entry without id".into(),
                })?;
            Ok((id, parts.next().and_then(field_pairs)))
        })
        .collect()
}

/// `reclaim.lua`'s claimed entries: (entry id, fields, delivery count).
fn claimed_entries(v: Value) -> Result<Vec<(String, Fields, u32)>> {
    let Value::Array(items) = v else {
        return Ok(Vec::new());
    };
    let bad = || Error::Protocol {
        context: "parsing reclaimed entries",
        detail: "unexpected shape".into(),
    };
    items
        .into_iter()
        .map(|e| {
            let Value::Array(parts) = e else {
                return Err(bad());
            };
            let mut parts = parts.into_iter();
            let id = parts.next().as_ref().and_then(as_string).ok_or_else(bad)?;
            let fields = parts.next().and_then(field_pairs).ok_or_else(bad)?;
            let count = match parts.next() {
                Some(Value::Int(n)) => u32::try_from(n).unwrap_or(u32::MAX),
                _ => 1,
            };
            Ok((id, fields, count))
        })
        .collect()
}

fn field_pairs(v: Value) -> Option<Vec<(String, String)>> {
    match v {
        Value::Array(fv) => {
            let mut pairs = Vec::with_capacity(fv.len() / 2);
            let mut it = fv.iter();
            while let (Some(f), Some(v)) = (it.next(), it.next()) {
                pairs.push((
                    as_string(f).unwrap_or_default(),
                    as_string(v).unwrap_or_default(),
                ));
            }
            Some(pairs)
        }
        Value::Map(fv) => Some(
            fv.iter()
                .map(|(f, v)| {
                    (
                        as_string(f).unwrap_or_default(),
                        as_string(v).unwrap_or_default(),
                    )
                })
                .collect(),
        ),
        _ => None,
    }
}
