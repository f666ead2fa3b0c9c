//! The producer API: schedule, cancel, reschedule and read orders.
//!
//! A [`Client`] is cheap to clone (an `Arc`); all clones share one multiplexed, self-healing
//! connection ([`Conn`]: one server or a cluster), the clock, and the wake-up signals of
//! dispatchers running in this process.

use crate::engine::clock::{Clock, RedisClock};
use crate::engine::conn::{Conn, RedisTarget};
use crate::engine::keys::{Keyspace, QueueName, ShardKeys, shard_of, validate_id};
use crate::engine::message::{
    CancelOutcome, Mode, NewOrder, RescheduleOutcome, ScheduleOutcome, Scheduled, ScheduledOrder,
    When, decode_stored,
};
use crate::engine::scripts::{self, EnqueueArg};
use crate::engine::telemetry;
use crate::engine::wake::WakeRegistry;
use crate::error::{Error, InvalidInput, RedisContext, Result};
use futures_util::future::try_join_all;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most shards a queue may have.
pub const MAX_SHARDS: u16 = 1024;
/// Default payload limit: 64 KiB of JSON text.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Most orders per enqueue script call: amortises the ~15 µs fixed cost of a script call
/// while keeping each call short (Redis runs one script at a time).
const ENQUEUE_CHUNK_ORDERS: usize = 500;
/// Most payload bytes per enqueue script call.
const ENQUEUE_CHUNK_BYTES: usize = 1 << 20;

/// Options of a [`Client`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Prefix of every key (default `dq`).
    pub namespace: String,
    /// Shards per queue (default 1). Every process using a queue must agree on it.
    pub shards: u16,
    /// Largest accepted payload, bytes of JSON text (default 64 KiB).
    pub max_payload_bytes: usize,
    /// How long a command may wait for its reply (default 10 s).
    pub response_timeout: Duration,
    /// How long connecting may take (default 5 s).
    pub connect_timeout: Duration,
    /// When a schedule counts as done (default [`Durability::Leader`]).
    pub durability: Durability,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            namespace: "dq".into(),
            shards: 1,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            response_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            durability: Durability::Leader,
        }
    }
}

impl ClientOptions {
    /// Sets the key namespace.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// Sets the number of shards per queue (1..=1024).
    pub fn shards(mut self, shards: u16) -> Self {
        self.shards = shards;
        self
    }

    /// Sets the durability of schedules.
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Sets the payload limit in bytes.
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Checks every option (the one place they are checked).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        Keyspace::new(&self.namespace)?;
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(InvalidInput::Option {
                name: "shards",
                reason: format!("must be 1..={MAX_SHARDS}, got {}", self.shards),
            });
        }
        if self.max_payload_bytes == 0 {
            return Err(InvalidInput::Option {
                name: "max_payload_bytes",
                reason: "must be at least 1".into(),
            });
        }
        if self.response_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(InvalidInput::Option {
                name: "timeout",
                reason: "response and connect timeouts must be more than zero".into(),
            });
        }
        Ok(())
    }
}

/// A handle on one Redis (and one key namespace) for producing and administering orders.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// How schedules are acknowledged (per client handle: see [`Client::with_durability`]).
    durability: Durability,
}

/// When a schedule counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// As soon as the leader (master) has it. Fast; a failover or a crash of a master without
    /// persistence can lose it (see ARCHITECTURE.md, "Durability").
    #[default]
    Leader,
    /// Only once `replicas` replicas confirm it (`WAIT`), within `timeout`; otherwise the call
    /// fails with [`Error::NotReplicated`](crate::Error::NotReplicated) and the order, already
    /// on the leader, may still fire.
    Replicated {
        /// Replicas that must confirm.
        replicas: u32,
        /// How long to wait for them.
        timeout: Duration,
    },
}

impl Durability {
    /// One replica within one second.
    pub fn replicated() -> Self {
        Durability::Replicated {
            replicas: 1,
            timeout: Duration::from_secs(1),
        }
    }
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
    /// The connection durable schedules use: `WAIT` blocks its connection, so it gets its own,
    /// opened on first use, one durable batch at a time.
    durable_conn: tokio::sync::Mutex<Option<Conn>>,
    /// Queues already recorded in the `<ns>:queues` set by this client.
    /// Shard counts of queues this client found in the registry (or registered).
    pub(crate) known_queues: Mutex<HashMap<String, u16>>,
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
        let redis = RedisTarget::open(url)?;
        let mut conn = redis
            .connect(opts.response_timeout, opts.connect_timeout)
            .await
            .ctx("connecting")?;
        let (clock, redis_clock): (Arc<dyn Clock>, _) = match clock {
            Some(c) => (c, None),
            None => {
                let rc = Arc::new(RedisClock::new(&mut conn).await?);
                (rc.clone(), Some(rc))
            }
        };
        let durability = opts.durability;
        Ok(Client {
            durability,
            inner: Arc::new(Inner {
                redis,
                conn,
                keyspace,
                opts,
                clock,
                redis_clock,
                wake: WakeRegistry::default(),
                durable_conn: tokio::sync::Mutex::new(None),
                known_queues: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Schedules one order (upsert: a known id gets the new due time and payload).
    pub async fn schedule(
        &self,
        queue: &str,
        id: &str,
        when: impl Into<When>,
        payload: impl Into<crate::Payload>,
    ) -> Result<Scheduled> {
        self.schedule_with(queue, NewOrder::new(id, when, payload), Mode::Upsert)
            .await
    }

    /// Schedules one order with an explicit [`Mode`].
    pub async fn schedule_with(
        &self,
        queue: &str,
        order: NewOrder,
        mode: Mode,
    ) -> Result<Scheduled> {
        let mut out = self
            .schedule_many(queue, std::slice::from_ref(&order), mode)
            .await
            .map_err(|e| match e {
                // A single order's error names no batch index.
                Error::Invalid(InvalidInput::InBatch { source, .. }) => Error::Invalid(*source),
                other => other,
            })?;
        out.pop().ok_or(Error::Reply {
            context: "scheduling an order",
            detail: "no outcome".into(),
        })
    }

    /// Schedules a batch. The whole batch is validated first: one invalid order refuses the
    /// batch ([`InvalidInput::InBatch`] names its index) and nothing is written. Orders are
    /// sent many per script call; each order is atomic, and a batch interrupted by a Redis
    /// failure may be partly applied (scheduling is idempotent: retry it).
    ///
    /// Returns one result per order, in order. An id repeated in one batch is applied in
    /// order (the last upsert wins).
    pub async fn schedule_many(
        &self,
        queue: &str,
        orders: &[NewOrder],
        mode: Mode,
    ) -> Result<Vec<Scheduled>> {
        let queue = QueueName::new(queue)?;
        let now = self.now_ms();
        let dues = orders
            .iter()
            .enumerate()
            .map(|(index, o)| {
                o.validate(now, self.inner.opts.max_payload_bytes)
                    .map_err(|e| InvalidInput::InBatch {
                        index,
                        source: Box::new(e),
                    })
            })
            .collect::<Result<Vec<i64>, InvalidInput>>()?;
        let shards = self.shards_of(&queue).await?;
        if orders.is_empty() {
            return Ok(Vec::new());
        }
        let calls = self.plan_enqueue(&queue, shards, orders);
        let outcomes = self
            .enqueue_calls(&calls, orders, &dues, now, mode == Mode::IfAbsent)
            .await?;
        let mut results: Vec<Option<ScheduleOutcome>> = vec![None; orders.len()];
        for ((_, idxs), outs) in calls.iter().zip(outcomes) {
            for (&i, o) in idxs.iter().zip(outs) {
                results[i] = Some(o);
            }
        }
        let written =
            |o: &Option<ScheduleOutcome>| o.is_some_and(|o| o != ScheduleOutcome::Unchanged);
        let earliest = results
            .iter()
            .zip(&dues)
            .filter(|(o, _)| written(o))
            .map(|(_, &d)| d)
            .min();
        if let Some(due) = earliest {
            self.inner.wake.scheduled(queue.as_str(), due);
        }
        telemetry::scheduled(
            queue.as_str(),
            results.iter().filter(|o| written(o)).count() as u64,
        );
        results
            .into_iter()
            .zip(orders.iter().zip(dues))
            .map(|(o, (order, due))| {
                Ok(Scheduled {
                    id: order.id.clone(),
                    due_at_ms: due,
                    outcome: o.ok_or(Error::Reply {
                        context: "scheduling orders",
                        detail: "an order got no outcome".into(),
                    })?,
                })
            })
            .collect()
    }

    /// Groups a batch by shard (keeping batch order within a shard) and cuts it into script
    /// calls of at most [`ENQUEUE_CHUNK_ORDERS`] orders and [`ENQUEUE_CHUNK_BYTES`] bytes.
    fn plan_enqueue(
        &self,
        queue: &QueueName,
        shards: u16,
        orders: &[NewOrder],
    ) -> Vec<(ShardKeys, Vec<usize>)> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); usize::from(shards)];
        for (i, o) in orders.iter().enumerate() {
            by_shard[usize::from(shard_of(&o.id, shards))].push(i);
        }
        let mut calls = Vec::new();
        for (shard, idxs) in by_shard.iter().enumerate() {
            let keys = self.shard_keys(queue, u16::try_from(shard).unwrap_or(0));
            let mut start = 0;
            while start < idxs.len() {
                let mut end = start;
                let mut bytes = 0;
                while end < idxs.len()
                    && end - start < ENQUEUE_CHUNK_ORDERS
                    && (end == start
                        || bytes + orders[idxs[end]].payload.len() <= ENQUEUE_CHUNK_BYTES)
                {
                    bytes += orders[idxs[end]].payload.len();
                    end += 1;
                }
                calls.push((keys.clone(), idxs[start..end].to_vec()));
                start = end;
            }
        }
        calls
    }

    /// Runs the planned enqueue calls, in flight together; with durable schedules, on a
    /// connection of their own followed by `WAIT` on every shard written.
    async fn enqueue_calls(
        &self,
        calls: &[(ShardKeys, Vec<usize>)],
        orders: &[NewOrder],
        dues: &[i64],
        now: i64,
        if_absent: bool,
    ) -> Result<Vec<Vec<ScheduleOutcome>>> {
        let mut durable_guard = match self.durability {
            Durability::Leader => None,
            Durability::Replicated { .. } => {
                let mut g = self.inner.durable_conn.lock().await;
                if g.is_none() {
                    *g = Some(self.dedicated_connection(Duration::from_secs(60)).await?);
                }
                Some(g)
            }
        };
        let base_conn = match durable_guard.as_ref().and_then(|g| g.as_ref()) {
            Some(c) => c.clone(),
            None => self.inner.conn.clone(),
        };
        let outcomes = try_join_all(calls.iter().map(|(keys, idxs)| {
            let mut conn = base_conn.clone();
            let args: Vec<EnqueueArg<'_>> = idxs
                .iter()
                .map(|&i| EnqueueArg {
                    id: &orders[i].id,
                    due_ms: dues[i],
                    payload: orders[i].payload.as_str(),
                })
                .collect();
            async move { scripts::enqueue(&mut conn, keys, if_absent, now, &args).await }
        }))
        .await?;
        if let (Durability::Replicated { replicas, timeout }, Some(g)) =
            (self.durability, durable_guard.as_mut())
            && let Some(conn) = g.as_mut()
        {
            wait_replicated(conn, calls, replicas, timeout).await?;
        }
        Ok(outcomes)
    }

    /// Cancels a scheduled order (e.g. the customer paid). `NotFound` when it was never
    /// scheduled, was already cancelled, or was already dispatched.
    pub async fn cancel(&self, queue: &str, id: &str) -> Result<CancelOutcome> {
        let queue = QueueName::new(queue)?;
        validate_id(id)?;
        let keys = self.shard_keys(&queue, shard_of(id, self.shards_of(&queue).await?));
        let mut conn = self.inner.conn.clone();
        Ok(if scripts::cancel(&mut conn, &keys, id).await? {
            telemetry::cancelled(queue.as_str());
            CancelOutcome::Cancelled
        } else {
            CancelOutcome::NotFound
        })
    }

    /// Moves a scheduled order to a new due time, keeping its payload.
    pub async fn reschedule(
        &self,
        queue: &str,
        id: &str,
        when: impl Into<When>,
    ) -> Result<RescheduleOutcome> {
        let queue = QueueName::new(queue)?;
        validate_id(id)?;
        let due = when.into().resolve(self.now_ms())?;
        let keys = self.shard_keys(&queue, shard_of(id, self.shards_of(&queue).await?));
        let mut conn = self.inner.conn.clone();
        if scripts::reschedule(&mut conn, &keys, id, due).await? {
            self.inner.wake.scheduled(queue.as_str(), due);
            Ok(RescheduleOutcome::Rescheduled)
        } else {
            Ok(RescheduleOutcome::NotFound)
        }
    }

    /// Reads a scheduled order: its due time and payload. `None` when it is not scheduled.
    pub async fn get(&self, queue: &str, id: &str) -> Result<Option<ScheduledOrder>> {
        let queue = QueueName::new(queue)?;
        validate_id(id)?;
        let keys = self.shard_keys(&queue, shard_of(id, self.shards_of(&queue).await?));
        let mut conn = self.inner.conn.clone();
        let (score, raw) = scripts::get(&mut conn, &keys, id).await?;
        let Some(score) = score else { return Ok(None) };
        let (enqueued_at_ms, payload) = match raw.as_deref().map(decode_stored) {
            Some((enq, json)) => (
                enq,
                serde_json::from_str(json).unwrap_or(serde_json::Value::String(json.to_owned())),
            ),
            None => (None, serde_json::Value::Null),
        };
        Ok(Some(ScheduledOrder {
            id: id.to_owned(),
            due_at_ms: scripts::score_to_ms(score),
            enqueued_at_ms,
            payload,
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
        if let Some(rc) = &self.inner.redis_clock {
            let mut conn = self.inner.conn.clone();
            rc.sync(&mut conn).await?;
        }
        Ok(())
    }

    /// Deletes every key of this client's namespace (`{<ns>:*` and `{<ns>}:*`) with `SCAN`,
    /// never `KEYS`, so a large shared Redis is not blocked. For throwaway namespaces (demo,
    /// bench, examples); returns how many keys were deleted. On a cluster it covers the node
    /// the SCAN reaches.
    pub async fn delete_namespace(&self) -> Result<u64> {
        let ns = self.inner.keyspace.namespace();
        let mut conn = self.inner.conn.clone();
        let mut deleted = 0;
        self.inner_known().clear();
        for pattern in [format!("{{{ns}:*"), format!("{{{ns}}}:*")] {
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
                for k in keys {
                    let n: u64 = redis::cmd("DEL")
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

    /// The options this client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// The key namespace.
    pub fn keyspace(&self) -> &Keyspace {
        &self.inner.keyspace
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
    pub(crate) fn inner_known(&self) -> std::sync::MutexGuard<'_, HashMap<String, u16>> {
        self.inner
            .known_queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) -> &WakeRegistry {
        &self.inner.wake
    }

    pub(crate) fn shard_keys(&self, queue: &QueueName, shard: u16) -> ShardKeys {
        self.inner.keyspace.shard(queue, shard)
    }

    pub(crate) fn queues_key(&self) -> String {
        format!("{{{}}}:queues", self.inner.keyspace.namespace())
    }

    /// The HASH recording a queue's settings (`shards`), fixed when the queue is first used.
    pub fn queue_meta_key(&self, queue: &QueueName) -> String {
        format!("{{{}}}:queue:{}", self.inner.keyspace.namespace(), queue)
    }
}

/// `WAIT` on the node of every shard written (each shard lives on its own node in a
/// cluster); fails with [`Error::NotReplicated`] when fewer than `replicas` confirmed.
async fn wait_replicated(
    conn: &mut Conn,
    calls: &[(ShardKeys, Vec<usize>)],
    replicas: u32,
    timeout: Duration,
) -> Result<()> {
    let mut acked = u32::MAX;
    let mut waited = HashSet::new();
    for (keys, _) in calls {
        if waited.insert(keys.shard) {
            let n = conn
                .wait_for_replicas(
                    &keys.due,
                    replicas,
                    u64::try_from(timeout.as_millis()).unwrap_or(1000).max(1),
                )
                .await
                .ctx("waiting for replicas (WAIT)")?;
            acked = acked.min(n);
        }
    }
    if acked < replicas {
        return Err(Error::NotReplicated {
            acked,
            wanted: replicas,
            timeout,
        });
    }
    Ok(())
}
