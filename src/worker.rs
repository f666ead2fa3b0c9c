//! Workers: one business handler = one consumer group on the queue's streams.
//!
//! A [`Worker`] reads with `XREADGROUP ... BLOCK` on a connection of its own (a blocking read
//! would stall every command sharing a multiplexed connection, and the redis crate's default
//! 500 ms response timeout would cut it off), runs the handler with a concurrency limit and
//! a timeout, and acknowledges (`XACK`, batched) each entry whose handler succeeded. A handler
//! that fails, panics or times out leaves its entry pending in the group.

use crate::client::Client;
use crate::error::{Error, InvalidInput, RedisContext, Result};
use crate::keys::{QueueName, ShardKeys, validate_member_name};
use futures_util::FutureExt;
use redis::Value;
use redis::aio::ConnectionManager;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
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
    /// How long one `XREADGROUP` blocks (default 1 s). Shutdown waits for the read in flight,
    /// so this also bounds how long stopping takes before in-flight handlers are awaited.
    pub block: Duration,
    /// How long shutdown waits for in-flight handlers (default 30 s); those still running
    /// then are abandoned and their entries stay pending.
    pub shutdown_grace: Duration,
    /// The consumer name (default `<host>-<pid>-<random>`).
    pub consumer: Option<String>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 16,
            handler_timeout: Duration::from_secs(30),
            block: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(30),
            consumer: None,
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
}

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
}

/// Runs one handler as one consumer of one consumer group. See the module docs.
pub struct Worker<H> {
    client: Client,
    queue: QueueName,
    group: String,
    consumer: String,
    shards: Vec<ShardKeys>,
    handler: Arc<H>,
    opts: WorkerOptions,
    stats: Arc<WorkerStats>,
}

impl<H> std::fmt::Debug for Worker<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.queue)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
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
        let queue = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        let consumer = opts.consumer.clone().unwrap_or_else(default_consumer_name);
        validate_member_name("consumer", &consumer)?;
        if opts.concurrency == 0 {
            return Err(InvalidInput::Option {
                name: "concurrency",
                reason: "must be at least 1".into(),
            }
            .into());
        }
        if opts.block < Duration::from_millis(1) || opts.handler_timeout.is_zero() {
            return Err(InvalidInput::Option {
                name: "block",
                reason: "block and handler_timeout must be at least 1 ms".into(),
            }
            .into());
        }
        Ok(Worker {
            shards: client.queue_keys(&queue),
            client: client.clone(),
            queue,
            group: group.to_owned(),
            consumer,
            handler: Arc::new(handler),
            opts,
            stats: Arc::new(WorkerStats::default()),
        })
    }

    /// The worker's counters.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// The consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Creates the consumer group on every shard's stream (reading from the start of the
    /// stream, creating the stream if needed). Idempotent.
    pub async fn ensure_groups(&self) -> Result<()> {
        ensure_groups(&mut self.client.connection(), &self.shards, &self.group).await
    }

    /// Runs until `cancel` fires, then stops reading, waits for in-flight handlers (up to
    /// the grace period), acknowledges those that succeeded, and returns. Redis failures
    /// are logged and retried; the worker does not give up on its own.
    pub async fn run(self, cancel: CancellationToken) -> Result<()> {
        let reader_timeout = self.opts.block + Duration::from_secs(10);
        let mut reader = loop {
            let attempt = async {
                self.ensure_groups().await?;
                self.client.dedicated_connection(reader_timeout).await
            };
            match attempt.await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(queue = %self.queue, group = %self.group, error = %e, "worker start failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        _ = cancel.cancelled() => return Ok(()),
                    }
                }
            }
        };
        tracing::info!(queue = %self.queue, group = %self.group, consumer = %self.consumer, "worker started");

        let (ack_tx, ack_rx) = mpsc::unbounded_channel::<(u16, String)>();
        let acker = tokio::spawn(ack_loop(
            self.client.connection(),
            self.shards.clone(),
            self.group.clone(),
            ack_rx,
            self.stats.clone(),
        ));
        let sem = Arc::new(Semaphore::new(self.opts.concurrency));
        let mut tasks = JoinSet::new();
        let mut backoff = Duration::from_millis(100);

        'read: loop {
            while tasks.try_join_next().is_some() {}
            let first = tokio::select! {
                p = sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'read },
                _ = cancel.cancelled() => break 'read,
            };
            let mut permits = vec![first];
            while permits.len() < self.opts.concurrency {
                match sem.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            let entries = match self.read(&mut reader, permits.len()).await {
                Ok(e) => {
                    backoff = Duration::from_millis(100);
                    e
                }
                Err(e) => {
                    drop(permits);
                    if is_nogroup(&e) {
                        tracing::warn!(queue = %self.queue, group = %self.group, "consumer group vanished; recreating");
                        if let Err(e) = self.ensure_groups().await {
                            tracing::warn!(error = %e, "recreating the group failed");
                        }
                    } else {
                        tracing::warn!(queue = %self.queue, group = %self.group, error = %e, retry_in = ?backoff, "read failed");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = cancel.cancelled() => break 'read,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            for delivery in entries {
                // Multi-shard reads may return more entries than permits: wait for more.
                let permit = match permits.pop() {
                    Some(p) => p,
                    None => match sem.clone().acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => break 'read,
                    },
                };
                let handler = self.handler.clone();
                let stats = self.stats.clone();
                let ack_tx = ack_tx.clone();
                let timeout = self.opts.handler_timeout;
                tasks.spawn(async move {
                    let shard = delivery.shard;
                    let entry_id = delivery.entry_id.clone();
                    let id = delivery.id.clone();
                    let ok = run_handler(&*handler, delivery, timeout, &stats).await;
                    if ok {
                        // The acker outlives every task; a closed channel means shutdown
                        // already gave up on this entry, which then stays pending.
                        let _ = ack_tx.send((shard, entry_id));
                    } else {
                        tracing::debug!(%id, "handler failed; entry left pending");
                    }
                    drop(permit);
                });
            }
        }

        // Shutdown: no more reads; let in-flight handlers finish within the grace period.
        let grace = tokio::time::timeout(self.opts.shutdown_grace, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if grace.is_err() {
            tracing::warn!(
                queue = %self.queue, group = %self.group, abandoned = tasks.len(),
                "shutdown grace period over; abandoned handlers stay pending"
            );
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        drop(ack_tx);
        if let Err(e) = acker.await {
            tracing::error!(error = %e, "ack task failed");
        }
        tracing::info!(queue = %self.queue, group = %self.group, "worker stopped");
        Ok(())
    }

    /// One `XREADGROUP ... >` over every shard.
    async fn read(&self, conn: &mut ConnectionManager, count: usize) -> Result<Vec<Delivery>> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(u64::try_from(self.opts.block.as_millis()).unwrap_or(1000))
            .arg("STREAMS");
        for s in &self.shards {
            cmd.arg(&s.stream);
        }
        for _ in &self.shards {
            cmd.arg(">");
        }
        let reply: Value = cmd
            .query_async(conn)
            .await
            .ctx("reading the stream (XREADGROUP)")?;
        let mut out = Vec::new();
        for (stream, entries) in stream_reply(reply)? {
            let Some(shard) = self.shards.iter().find(|s| s.stream == stream) else {
                continue;
            };
            for (entry_id, fields) in entries {
                match fields {
                    Some(f) => {
                        match parse_delivery(&self.queue, &self.group, shard.shard, &entry_id, f) {
                            Some(d) => out.push(d),
                            None => tracing::error!(
                                stream = %stream, entry = %entry_id,
                                "stream entry without an order id: left pending for inspection"
                            ),
                        }
                    }
                    None => {
                        tracing::warn!(stream = %stream, entry = %entry_id, "entry deleted from the stream")
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Runs the handler once; true on success. Panics and timeouts count as failures.
async fn run_handler<H: Handler>(
    handler: &H,
    delivery: Delivery,
    timeout: Duration,
    stats: &WorkerStats,
) -> bool {
    let id = delivery.id.clone();
    let fut = AssertUnwindSafe(handler.handle(delivery)).catch_unwind();
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(Ok(()))) => {
            stats.succeeded.fetch_add(1, Ordering::Relaxed);
            true
        }
        Ok(Ok(Err(e))) => {
            stats.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%id, error = %e, "handler failed");
            false
        }
        Ok(Err(_)) => {
            stats.panicked.fetch_add(1, Ordering::Relaxed);
            tracing::error!(%id, "handler panicked");
            false
        }
        Err(_) => {
            stats.timed_out.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%id, ?timeout, "handler timed out");
            false
        }
    }
}

/// Acknowledges entries in batches until every sender is gone. A failed XACK is retried;
/// an entry whose ack is finally given up on stays pending (delivered again, never lost).
async fn ack_loop(
    mut conn: ConnectionManager,
    shards: Vec<ShardKeys>,
    group: String,
    mut rx: mpsc::UnboundedReceiver<(u16, String)>,
    stats: Arc<WorkerStats>,
) {
    let mut buf = Vec::with_capacity(1024);
    while rx.recv_many(&mut buf, 1024).await > 0 {
        let mut by_shard: HashMap<u16, Vec<String>> = HashMap::new();
        for (shard, id) in buf.drain(..) {
            by_shard.entry(shard).or_default().push(id);
        }
        for (shard, ids) in by_shard {
            let Some(keys) = shards.iter().find(|k| k.shard == shard) else {
                continue;
            };
            let mut delay = Duration::from_millis(50);
            for attempt in 1..=8 {
                let r: redis::RedisResult<u64> = redis::cmd("XACK")
                    .arg(&keys.stream)
                    .arg(&group)
                    .arg(&ids)
                    .query_async(&mut conn)
                    .await;
                match r {
                    Ok(n) => {
                        stats.acked.fetch_add(n, Ordering::Relaxed);
                        break;
                    }
                    Err(e) if attempt < 8 => {
                        tracing::warn!(error = %e, ?delay, "XACK failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(2));
                    }
                    Err(e) => tracing::error!(
                        error = %e, entries = ids.len(),
                        "XACK failed; the entries stay pending and will be delivered again"
                    ),
                }
            }
        }
    }
}

/// Creates `group` on each shard's stream from id 0 with MKSTREAM; an existing group is fine.
pub(crate) async fn ensure_groups(
    conn: &mut ConnectionManager,
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

/// Entries of a stream reply: (stream key, [(entry id, fields or None if deleted)]).
type StreamEntries = Vec<(String, Vec<(String, Option<Vec<(String, String)>>)>)>;

/// Parses an XREAD/XREADGROUP reply (RESP2 arrays or RESP3 maps; nil = nothing).
pub(crate) fn stream_reply(v: Value) -> Result<StreamEntries> {
    let bad = |detail: String| Error::Protocol {
        context: "parsing a stream reply",
        detail,
    };
    let streams: Vec<(Value, Value)> = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::Array(mut kv) if kv.len() == 2 => {
                    let entries = kv.pop().unwrap_or(Value::Nil);
                    let key = kv.pop().unwrap_or(Value::Nil);
                    Ok((key, entries))
                }
                other => Err(bad(format!("stream item {other:?}"))),
            })
            .collect::<Result<_>>()?,
        Value::Map(kv) => kv,
        other => return Err(bad(format!("reply {other:?}"))),
    };
    let mut out = Vec::with_capacity(streams.len());
    for (key, entries) in streams {
        let key = as_string(&key).ok_or_else(|| bad("stream key".into()))?;
        let Value::Array(entries) = entries else {
            out.push((key, Vec::new()));
            continue;
        };
        let mut list = Vec::with_capacity(entries.len());
        for e in entries {
            let Value::Array(parts) = e else {
                return Err(bad("stream entry".into()));
            };
            let mut parts = parts.into_iter();
            let id = parts
                .next()
                .as_ref()
                .and_then(as_string)
                .ok_or_else(|| bad("entry id".into()))?;
            let fields = match parts.next() {
                Some(Value::Array(fv)) => {
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
                Some(Value::Map(fv)) => Some(
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
            };
            list.push((id, fields));
        }
        out.push((key, list));
    }
    Ok(out)
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

/// Builds a [`Delivery`] from a stream entry's fields; `None` when it has no order id.
pub(crate) fn parse_delivery(
    queue: &QueueName,
    group: &str,
    shard: u16,
    entry_id: &str,
    fields: Vec<(String, String)>,
) -> Option<Delivery> {
    let mut id = None;
    let mut due = None;
    let mut data = None;
    let mut flag = None;
    for (f, v) in fields {
        match f.as_str() {
            "id" => id = Some(v),
            "due_ms" => due = v.parse::<f64>().ok().map(crate::scripts::score_to_ms),
            "data" => data = Some(v),
            "flag" if v == "payload_missing" => flag = Some(DeliveryFlag::PayloadMissing),
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
    Some(Delivery {
        queue: queue.as_str().to_owned(),
        group: group.to_owned(),
        id: id?,
        payload,
        due_at_ms: due.unwrap_or(dispatched_at_ms),
        enqueued_at_ms: enq,
        dispatched_at_ms,
        entry_id: entry_id.to_owned(),
        shard,
        attempt: 1,
        flag,
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
