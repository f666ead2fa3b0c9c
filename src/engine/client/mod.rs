//! The producer API: schedule, cancel, reschedule and read orders.
//!
//! A [`Client`] is cheap to clone (an `Arc`); all clones share one multiplexed, self-healing
//! connection ([`Conn`]: one server or a cluster), the clock, and the wake-up signals of
//! dispatchers running in this process.

mod batch;
pub(crate) mod catalog;
mod deletion;
mod durable;
mod durable_call;
pub mod events;
mod options;
mod replicas;
mod schedule;
pub mod tags;
mod touched;

pub(crate) use catalog::HEARTBEAT_KEPT_MS;
pub use catalog::{HEARTBEAT_EVERY, QueueCreated};
pub use options::{
    ClientOptions, DEFAULT_MAX_GROUPS, DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_MAX_QUEUES, Durability,
    MAX_SHARDS,
};

use crate::engine::clock::{Clock, RedisClock};
use crate::engine::conn::{Conn, RedisTarget};
use crate::engine::error::{RedisContext, Result};
use crate::engine::keys::{Keyspace, QueueName, ShardKeys, shard_of, validate_id};
use crate::engine::message::{
    CancelOutcome, RescheduleOutcome, ScheduledOrder, When, decode_stored,
};
use crate::engine::priority::Priority;
use crate::engine::scripts::{self};
use crate::engine::telemetry;
use crate::engine::wake::WakeRegistry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A handle on one Redis (and one key namespace) for producing and administering orders.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// How schedules are acknowledged (per client handle: see [`Client::with_durability`]).
    durability: Durability,
}

struct Inner {
    /// Opens new connections (workers need dedicated ones for blocking reads).
    redis: RedisTarget,
    /// The shared multiplexed connection; reconnects by itself.
    conn: Conn,
    keyspace: Keyspace,
    opts: ClientOptions,
    clock: Arc<dyn Clock>,
    /// The Redis clock when `clock` is one, so long-running loops can re-sync it.
    redis_clock: Option<Arc<RedisClock>>,
    /// Wakes this process's dispatchers when an earlier order is scheduled.
    wake: WakeRegistry,
    /// Hears other processes' wake-ups for this process's dispatchers (`engine::listen`).
    listener: crate::engine::listen::Listener,
    /// Which process dispatches which shard (`engine::roster`).
    roster: crate::engine::roster::Roster,
    /// What the server said it is at connect (`None`: it refused `INFO`).
    server: Option<crate::engine::version::ServerInfo>,
    /// The connections durable schedules use (`WAIT` blocks its connection, so they get
    /// their own), opened on first use and replaced after a write on one broke or ran out of
    /// time.
    durable_conns: durable::DurableConns,
    /// Shard counts and epochs of queues this client found in the registry (or
    /// registered); an entry is dropped when a script says the queue changed.
    pub(crate) known_queues: Mutex<HashMap<String, catalog::QueueRef>>,
    /// Shards whose streams this process wrote to and that the trim chore has not yet
    /// found clean (see [`crate::engine::loops::housekeeping`]).
    pub(crate) touched: touched::Touched,
    /// Lengths of sealed history buckets, so a stats call's work does not grow with the
    /// retention (see [`crate::engine::history_counts`]).
    history_counts: crate::engine::history_counts::HistoryCounts,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("namespace", &self.inner.keyspace.namespace())
            .field("shards", &self.inner.opts.shards)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects with default options. `url` is `redis://[user:pass@]host:port[/db]`, or
    /// `rediss://` for TLS.
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// Connects with `opts`, using the Redis server's clock.
    pub async fn connect_with(url: &str, opts: ClientOptions) -> Result<Client> {
        Self::build(url, opts, None).await
    }

    /// Connects with `opts` and a clock of the caller's (tests).
    pub async fn connect_with_clock(
        url: &str,
        opts: ClientOptions,
        clock: Arc<dyn Clock>,
    ) -> Result<Client> {
        Self::build(url, opts, Some(clock)).await
    }

    async fn build(
        url: &str,
        opts: ClientOptions,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<Client> {
        opts.validate()?;
        let keyspace = Keyspace::new(&opts.namespace)?;
        let redis = RedisTarget::open_with(url, opts.tls.as_ref())?;
        let mut conn = redis
            .connect(opts.response_timeout, opts.connect_timeout)
            .await
            .ctx("connecting")?;
        let server = crate::engine::version::check(&mut conn).await?;
        let (clock, redis_clock): (Arc<dyn Clock>, _) = match clock {
            Some(c) => (c, None),
            None => {
                let rc = Arc::new(RedisClock::new(&mut conn).await?);
                (rc.clone(), Some(rc))
            }
        };
        let durability = opts.durability;
        let listener = crate::engine::listen::Listener::new(
            redis.clone(),
            opts.response_timeout,
            opts.connect_timeout,
            server.is_none_or(|s| s.has_spublish()),
        );
        let roster = crate::engine::roster::Roster::new(
            keyspace.dispatchers(),
            crate::engine::roster::process_name(),
        );
        Ok(Client {
            durability,
            inner: Arc::new(Inner {
                roster,
                redis,
                conn,
                keyspace,
                opts,
                clock,
                redis_clock,
                wake: WakeRegistry::default(),
                listener,
                server,
                durable_conns: durable::DurableConns::default(),
                known_queues: Mutex::new(HashMap::new()),
                touched: Default::default(),
                history_counts: Default::default(),
            }),
        })
    }

    /// Cancels a scheduled order (e.g. the customer paid). `NotFound` when it was never
    /// scheduled, was already cancelled, or was already dispatched. With the queue's history
    /// on, the order's history then answers `cancelled` (by id, at the Redis time).
    pub async fn cancel(&self, queue: &str, id: &str) -> Result<CancelOutcome> {
        let queue = QueueName::new(queue)?;
        validate_id(id)?;
        let keys = self.shard_keys(&queue, shard_of(id, self.shards_of(&queue).await?));
        // The cancellation is recorded in the order history by the script itself.
        let policy = crate::engine::flow::queue_flags(self, &queue, None)
            .await?
            .history;
        let record = policy.cancel_target(&keys, self.now_ms());
        let cancelled = match self.durable_wait() {
            None => {
                let mut conn = self.inner.conn.clone();
                scripts::cancel(&mut conn, &keys, id, &record).await?
            }
            Some(wait) => {
                let inv = scripts::cancel_invocation(&keys, id, &record);
                self.replicated_script(inv, "cancelling an order (cancel.lua)", wait)
                    .await?
                    == 1
            }
        };
        Ok(if cancelled {
            telemetry::cancelled(queue.as_str());
            CancelOutcome::Cancelled
        } else {
            CancelOutcome::NotFound
        })
    }

    /// Moves a scheduled order to a new due time, keeping its payload and priority.
    pub async fn reschedule(
        &self,
        queue: &str,
        id: &str,
        when: impl Into<When>,
    ) -> Result<RescheduleOutcome> {
        self.reschedule_with(queue, id, when, None).await
    }

    /// Moves a scheduled order to a new due time, keeping its payload; `priority` given:
    /// the order gets that level too (both change together, or neither).
    pub async fn reschedule_with(
        &self,
        queue: &str,
        id: &str,
        when: impl Into<When>,
        priority: Option<Priority>,
    ) -> Result<RescheduleOutcome> {
        let queue = QueueName::new(queue)?;
        validate_id(id)?;
        let due = when.into().resolve(self.now_ms())?;
        let keys = self.shard_keys(&queue, shard_of(id, self.shards_of(&queue).await?));
        let rescheduled = match self.durable_wait() {
            None => {
                let mut conn = self.inner.conn.clone();
                scripts::reschedule(&mut conn, &keys, id, due, priority).await?
            }
            Some(wait) => {
                let inv = scripts::reschedule_invocation(&keys, id, due, priority);
                self.replicated_script(inv, "rescheduling an order (reschedule.lua)", wait)
                    .await?
                    == 1
            }
        };
        if rescheduled {
            self.inner.wake.scheduled(queue.as_str(), due);
            Ok(RescheduleOutcome::Rescheduled)
        } else {
            Ok(RescheduleOutcome::NotFound)
        }
    }

    /// Reads a scheduled order: its due time, payload and priority. `None` when it is not
    /// scheduled.
    pub async fn get(&self, queue: &str, id: &str) -> Result<Option<ScheduledOrder>> {
        let queue = QueueName::new(queue)?;
        validate_id(id)?;
        let keys = self.shard_keys(&queue, shard_of(id, self.shards_of(&queue).await?));
        let mut conn = self.inner.conn.clone();
        let (score, raw, priority, debounce) =
            scripts::get(&mut conn, self.server(), &keys, id).await?;
        let Some(score) = score else { return Ok(None) };
        let key = raw
            .as_deref()
            .and_then(crate::engine::order_key::of_stored)
            .map(str::to_owned);
        let (enqueued_at_ms, payload) = match raw.as_deref().map(decode_stored) {
            Some((enq, json)) => (
                enq,
                serde_json::from_str(json).unwrap_or(serde_json::Value::String(json.to_owned())),
            ),
            None => (None, serde_json::Value::Null),
        };
        let tags = raw
            .as_deref()
            .map(crate::engine::tags::of_stored)
            .unwrap_or_default();
        Ok(Some(ScheduledOrder {
            id: id.to_owned(),
            due_at_ms: crate::engine::reply::score_to_ms(score),
            enqueued_at_ms,
            payload,
            priority,
            debounce,
            tags,
            key,
        }))
    }

    /// Names of the registered queues of this namespace, sorted.
    pub async fn queues(&self) -> Result<Vec<String>> {
        let mut conn = self.inner.conn.clone();
        let mut names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.queues_key())
            .query_async(&mut conn)
            .await
            .ctx("listing queues")?;
        names.sort();
        Ok(names)
    }

    /// "Now" from this client's clock (the Redis server's, by default), unix ms.
    pub fn now_ms(&self) -> i64 {
        self.inner.clock.now_ms()
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    /// Re-anchors the Redis clock on `TIME` (no-op for a clock supplied by the caller).
    pub async fn sync_clock(&self) -> Result<()> {
        self.sync_clock_if_older(std::time::Duration::ZERO).await
    }

    /// [`sync_clock`](Client::sync_clock) unless the clock was anchored less than `age`
    /// ago: every dispatcher of a process shares the client's clock, so one `TIME` serves
    /// them all.
    pub(crate) async fn sync_clock_if_older(&self, age: std::time::Duration) -> Result<()> {
        if let Some(rc) = &self.inner.redis_clock {
            if !age.is_zero() && rc.age() < age {
                return Ok(());
            }
            let mut conn = self.inner.conn.clone();
            rc.sync(&mut conn).await?;
        }
        Ok(())
    }

    /// Deletes every key of this client's namespace (`{<ns>:*` and `{<ns>}:*`) with `SCAN`,
    /// never `KEYS`, and `UNLINK`, so a large shared Redis is not blocked. For throwaway namespaces (demo,
    /// bench, examples); returns how many keys were deleted. On a cluster it covers the node
    /// the SCAN reaches.
    pub async fn delete_namespace(&self) -> Result<u64> {
        let mut conn = self.inner.conn.clone();
        let mut deleted = 0;
        self.inner_known().clear();
        for pattern in self.inner.keyspace.namespace_patterns() {
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await
                    .ctx("listing the namespace's keys (SCAN)")?;
                // UNLINK: a large stream or hash is freed off Redis' main thread (a DEL
                // of a 100,000-entry stream held it for 26–40 ms at the end of a bench).
                for k in keys {
                    let n: u64 = redis::cmd("UNLINK")
                        .arg(&k)
                        .query_async(&mut conn)
                        .await
                        .ctx("deleting the namespace's keys")?;
                    deleted += n;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(deleted)
    }

    /// A handle on the same client whose schedules have durability `d` (cheap: shares the
    /// connections).
    pub fn with_durability(&self, d: Durability) -> Client {
        Client {
            inner: self.inner.clone(),
            durability: d,
        }
    }

    /// The server this client connected to, as `INFO server` described it at connect
    /// (`None` when it refused `INFO`).
    pub fn server(&self) -> Option<crate::engine::version::ServerInfo> {
        self.inner.server
    }

    /// The options this client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// The key namespace.
    pub fn keyspace(&self) -> &Keyspace {
        &self.inner.keyspace
    }

    /// The shards whose streams this process wrote to since the trim chore last found
    /// them clean.
    pub(crate) fn touched(&self) -> &touched::Touched {
        &self.inner.touched
    }

    /// This process's cache of sealed history buckets' lengths (the stats' `history`).
    pub(crate) fn history_counts(&self) -> &crate::engine::history_counts::HistoryCounts {
        &self.inner.history_counts
    }

    /// The keys of every shard of `queue`, with this client's configured shard count (the
    /// count dispatchers and workers register a queue with). Producer and admin calls use
    /// the count in the registry instead.
    pub fn queue_keys(&self, queue: &QueueName) -> Vec<ShardKeys> {
        self.inner.keyspace.shards(queue, self.inner.opts.shards)
    }

    /// A clone of the shared multiplexed connection (for admin commands and tests).
    pub fn connection(&self) -> Conn {
        self.inner.conn.clone()
    }

    /// Opens a new, dedicated connection whose replies may take up to `response_timeout`
    /// (blocking reads must neither share a multiplexed connection nor hit the default
    /// 500 ms timeout).
    pub(crate) async fn dedicated_connection(&self, response_timeout: Duration) -> Result<Conn> {
        self.inner
            .redis
            .connect(response_timeout, self.inner.opts.connect_timeout)
            .await
            .ctx("opening a dedicated connection")
    }

    /// True when connected to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.redis.is_cluster()
    }

    /// The shard counts this client knows (see `registry`).
    pub(crate) fn inner_known(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, catalog::QueueRef>> {
        self.inner
            .known_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) -> &WakeRegistry {
        &self.inner.wake
    }

    pub(crate) fn listener(&self) -> &crate::engine::listen::Listener {
        &self.inner.listener
    }

    pub(crate) fn roster(&self) -> &crate::engine::roster::Roster {
        &self.inner.roster
    }

    /// How many queues have an in-process wake-up signal (held by a dispatcher or reader
    /// of this client): for tests of its bound.
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn wake_signals_for_test(&self) -> usize {
        self.inner.wake.len()
    }

    /// Test hook: the running dispatcher of `queue` made from this client panics at its
    /// next turn (a supervisor starts it again).
    #[cfg(feature = "test-util")]
    #[doc(hidden)]
    pub fn kill_dispatchers_for_test(&self, queue: &str) {
        let w = self.inner.wake.get(queue);
        w.kill.store(true, std::sync::atomic::Ordering::SeqCst);
        w.notify.notify_one();
    }

    pub(crate) fn shard_keys(&self, queue: &QueueName, shard: u16) -> ShardKeys {
        self.inner.keyspace.shard(queue, shard)
    }

    pub(crate) fn queues_key(&self) -> String {
        self.inner.keyspace.queues()
    }

    /// The HASH recording a queue's settings (`shards`, `epoch`, ...): its registry record.
    pub fn queue_meta_key(&self, queue: &QueueName) -> String {
        self.inner.keyspace.queue_record(queue)
    }
}
