//! Maintenance services, scheduled with tokio-cron-scheduler, over every queue of the
//! registry (or a fixed list, for an application that wants that). Each is a method that
//! makes one pass and returns a typed report (what tests call directly); every pass is safe
//! to run in any number of processes at once, and feeds `delayq_maintenance_*`:
//!
//! - **trim** (`trim.lua`): trims each stream below the minimum over groups of (oldest
//!   pending id, last-delivered id), so the stream stays short under steady load and never
//!   loses an entry some group has not acknowledged. A pass (every 10 s) looks only at the
//!   shards this process dispatched into since a pass last found them clean (every group
//!   has read and acknowledged everything: `client::touched`); every [`FULL_TRIM_EVERY`] (15 min)
//!   a pass looks at every shard, for what other processes (replays, a library worker
//!   whose process runs no housekeeper) left. An idle queue costs no trim call;
//! - **dead letters**: deletes dead letters past the retention, then beyond the per-queue
//!   cap, in the same passes and over the same shards;
//! - **idle consumers** (`consumers.lua`): deletes consumers idle for long with nothing
//!   pending, and heartbeats older than an hour;
//! - **safety sweep** (every minute by default): probes each shard's earliest due time (one
//!   `ZRANGE 0 0` per shard, the reads of a pass pipelined, no dispatcher built) and
//!   dispatches only the queues with a shard due now, in addition to the dispatchers' own
//!   loops, so a missed wake-up can never stall dispatch; only over the queues the process
//!   dispatches ([`Housekeeper::sweep_only`]). Idle, it costs one read per shard per pass
//!   and no script call.
//!
//! tokio-cron-scheduler has one-second resolution, spawns jobs without overlap protection and
//! does not wait for running jobs on shutdown. So the fast dispatch path stays out of it,
//! every chore is idempotent, a chore still running when its next tick comes is skipped
//! (a per-chore lock taken with `try_lock`), and shutdown waits for running chores by taking
//! every lock.

use crate::engine::client::Client;
use crate::engine::error::{InvalidInput, RedisContext, Result};
use crate::engine::keys::QueueName;
pub use crate::engine::loops::chores::validate_cron;
pub(crate) use crate::engine::loops::chores::{Chore, run_chores};
use crate::engine::loops::dispatcher::{Dispatcher, DispatcherOptions};
use crate::engine::loops::supervisor::DispatchSelection;
use crate::engine::scripts;
use crate::engine::telemetry;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The safety sweep's default schedule: every minute. Idle, each pass costs one `ZRANGE` per
/// shard of the process's queues (pipelined), and no script call. It is the net under the
/// dispatchers (which the supervisor restarts when one stops, and which look at every idle
/// shard every `idle_poll` besides the wake-ups), so it can be slow.
pub const DEFAULT_SWEEP_CRON: &str = "0 * * * * *";

/// How often the trim chore looks at every shard, not only the ones this process
/// dispatched into (see the module documentation).
pub const FULL_TRIM_EVERY: Duration = Duration::from_secs(15 * 60);

/// Most shard probes in flight at once in one sweep pass.
const PROBE_CHUNK: usize = 1000;

/// Options of the [`Housekeeper`]; `[housekeeping]` in `serve`'s configuration (unset keys
/// keep the defaults). Cron expressions have six fields, seconds first, UTC.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct HousekeepingOptions {
    /// When to trim streams (default every 10 s: `*/10 * * * * *`; a pass calls only the
    /// shards this process dispatched into until they are clean, and every shard once every
    /// 15 minutes).
    pub trim_cron: String,
    /// When to delete idle consumers (default every 15 minutes: `0 */15 * * * *`).
    pub consumers_cron: String,
    /// A consumer idle this long with nothing pending is deleted (default `1h`).
    #[serde(with = "crate::engine::duration::human")]
    pub consumer_max_idle: Duration,
    /// When to run the safety sweep, a probe of each shard's earliest due time (default
    /// every minute: `0 * * * * *`, [`DEFAULT_SWEEP_CRON`]).
    pub sweep_cron: String,
    /// How long and how many dead letters are kept (`[dead]`, a table of its own in
    /// `serve`'s configuration).
    #[serde(skip)]
    pub dead: DeadLetterOptions,
}

/// How long and how many dead letters are kept (part of [`HousekeepingOptions`]); `[dead]`
/// in `serve`'s configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DeadLetterOptions {
    /// Dead letters older than this are deleted (default `14d`); trimmed with the streams.
    #[serde(with = "crate::engine::duration::human")]
    pub retention: Duration,
    /// At most this many dead letters are kept per queue (default 100,000; the oldest go
    /// first; split evenly between the queue's shards).
    pub max_per_queue: u64,
}

impl Default for DeadLetterOptions {
    fn default() -> Self {
        DeadLetterOptions {
            retention: Duration::from_secs(14 * 24 * 3600),
            max_per_queue: 100_000,
        }
    }
}

impl Default for HousekeepingOptions {
    fn default() -> Self {
        HousekeepingOptions {
            trim_cron: "*/10 * * * * *".into(),
            consumers_cron: "0 */15 * * * *".into(),
            consumer_max_idle: Duration::from_secs(3600),
            sweep_cron: DEFAULT_SWEEP_CRON.into(),
            dead: DeadLetterOptions::default(),
        }
    }
}

impl HousekeepingOptions {
    /// Checks every option (the one place they are checked).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        for (name, cron) in [
            ("trim_cron", &self.trim_cron),
            ("consumers_cron", &self.consumers_cron),
            ("sweep_cron", &self.sweep_cron),
        ] {
            validate_cron(name, cron)?;
        }
        if self.dead.max_per_queue == 0 {
            return Err(InvalidInput::Option {
                name: "dead_max_per_queue",
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }

    /// Sets when streams are trimmed.
    pub fn trim_cron(mut self, cron: impl Into<String>) -> Self {
        self.trim_cron = cron.into();
        self
    }

    /// Sets when idle consumers are deleted.
    pub fn consumers_cron(mut self, cron: impl Into<String>) -> Self {
        self.consumers_cron = cron.into();
        self
    }

    /// Sets how long a consumer must be idle before it is deleted.
    pub fn consumer_max_idle(mut self, d: Duration) -> Self {
        self.consumer_max_idle = d;
        self
    }

    /// Sets how long dead letters are kept.
    pub fn dead_retention(mut self, d: Duration) -> Self {
        self.dead.retention = d;
        self
    }

    /// Sets how many dead letters a queue keeps at most.
    pub fn dead_max_per_queue(mut self, n: u64) -> Self {
        self.dead.max_per_queue = n;
        self
    }

    /// Sets when the safety sweep runs.
    pub fn sweep_cron(mut self, cron: impl Into<String>) -> Self {
        self.sweep_cron = cron.into();
        self
    }
}

/// What a chore did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChoreReport {
    /// Stream entries trimmed, consumers deleted, or orders dispatched.
    pub count: u64,
}

/// See [`Housekeeper::last_full_trim`].
fn first_full_trim() -> Arc<std::sync::Mutex<Option<std::time::Instant>>> {
    let back = FULL_TRIM_EVERY.mul_f64(fastrand::f64());
    Arc::new(std::sync::Mutex::new(
        std::time::Instant::now().checked_sub(back),
    ))
}

/// A queue a pass tends, with the keys of every shard as registered.
type Tended = (QueueName, Vec<crate::engine::keys::ShardKeys>);

/// Runs the maintenance services for every registered queue (or a fixed set).
#[derive(Debug, Clone)]
pub struct Housekeeper {
    client: Client,
    /// `None`: every queue of the registry, read at each pass.
    queues: Option<Vec<QueueName>>,
    opts: HousekeepingOptions,
    /// The queues the safety sweep dispatches (the process's dispatch selection).
    sweep: DispatchSelection,
    /// When the trim chore last looked at every shard, or as if it had: a new housekeeper
    /// makes its first full pass at a random point of its first [`FULL_TRIM_EVERY`], so
    /// processes started together (or restarted) do not all pass at once.
    last_full_trim: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl Housekeeper {
    /// A housekeeper for `queues` only.
    pub fn new(client: &Client, queues: &[&str], opts: HousekeepingOptions) -> Result<Self> {
        let queues = queues
            .iter()
            .map(|q| QueueName::new(q))
            .collect::<Result<Vec<_>, _>>()?;
        opts.validate()?;
        Ok(Housekeeper {
            client: client.clone(),
            queues: Some(queues),
            opts,
            sweep: DispatchSelection::All,
            last_full_trim: first_full_trim(),
        })
    }

    /// A housekeeper for every queue of the registry (what `delayq serve` runs): a queue
    /// created anywhere is tended from the next pass on.
    pub fn for_registry(client: &Client, opts: HousekeepingOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Housekeeper {
            client: client.clone(),
            queues: None,
            opts,
            sweep: DispatchSelection::All,
            last_full_trim: first_full_trim(),
        })
    }

    /// Restricts the safety sweep to the queues of `selection` (a process told to dispatch
    /// only some queues, or none, sweeps only those); the other chores tend every queue.
    pub fn sweep_only(mut self, selection: DispatchSelection) -> Self {
        self.sweep = selection;
        self
    }

    /// The queues to tend now, each with the keys of every shard as registered (queues
    /// not registered, yet or any more, are left out).
    async fn queues(&self) -> Result<Vec<Tended>> {
        match &self.queues {
            None => self
                .client
                .admin()
                .list_queues()
                .await?
                .into_iter()
                .map(|q| {
                    let name = QueueName::new(&q.queue)?;
                    let keys = self.client.keyspace().shards(&name, q.shards);
                    Ok((name, keys))
                })
                .collect(),
            Some(list) => {
                let mut out = Vec::new();
                for q in list {
                    match self.client.registered_keys(q).await {
                        Err(crate::Error::QueueNotFound { .. }) => {}
                        other => out.push((q.clone(), other?)),
                    }
                }
                Ok(out)
            }
        }
    }

    /// Trims every shard stream of every queue once; returns the entries removed.
    pub async fn trim(&self) -> Result<ChoreReport> {
        self.trim_streams(&self.queues().await?).await
    }

    /// Trims the shards this process dispatched into since a pass last found them clean
    /// (what the trim chore does between its full passes); returns the entries removed. With
    /// none, it makes no Redis call at all.
    pub async fn trim_dispatched(&self) -> Result<ChoreReport> {
        if self.client.touched().is_empty() {
            return Ok(ChoreReport { count: 0 });
        }
        let queues = self.trim_targets(self.queues().await?, false);
        self.trim_streams(&queues).await
    }

    /// [`trim`](Housekeeper::trim) over `queues` (read once per pass). A shard that is not
    /// clean afterwards (some group has not read or acknowledged everything) is looked at
    /// again by the next pass.
    async fn trim_streams(&self, queues: &[Tended]) -> Result<ChoreReport> {
        let touched = self.client.touched();
        let mut count = 0;
        for (_, keys) in queues {
            for k in keys {
                // Taken before the call, so a dispatch during it marks the shard again.
                touched.clear(k);
                match scripts::trim(&mut self.client.connection(), k).await {
                    Ok(t) => {
                        count += t.removed;
                        if !t.clean {
                            touched.mark(k);
                        }
                    }
                    Err(e) => {
                        touched.mark(k);
                        return Err(e);
                    }
                }
            }
        }
        Ok(ChoreReport { count })
    }

    /// The shards a trim pass looks at: every shard of `queues` when `full` (and the
    /// touched set forgets shards of queues that are gone), else the touched ones.
    fn trim_targets(&self, queues: Vec<Tended>, full: bool) -> Vec<Tended> {
        let touched = self.client.touched();
        if full {
            let live = queues
                .iter()
                .flat_map(|(_, keys)| keys.iter().map(|k| k.tag.as_str()))
                .collect();
            touched.retain(&live);
            return queues;
        }
        queues
            .into_iter()
            .filter_map(|(q, keys)| {
                let keys: Vec<_> = keys.into_iter().filter(|k| touched.contains(k)).collect();
                (!keys.is_empty()).then_some((q, keys))
            })
            .collect()
    }

    /// Deletes dead letters past the retention, then the oldest beyond the per-queue cap;
    /// returns how many. Counted in `delayq_dead_trimmed_total{queue}`.
    pub async fn trim_dead(&self) -> Result<ChoreReport> {
        self.trim_dead_letters(&self.queues().await?).await
    }

    /// [`trim_dead`](Housekeeper::trim_dead) over `queues` (read once per pass).
    async fn trim_dead_letters(&self, queues: &[Tended]) -> Result<ChoreReport> {
        let retention = i64::try_from(self.opts.dead.retention.as_millis()).unwrap_or(i64::MAX);
        let min_id = self.client.now_ms().saturating_sub(retention).max(0);
        let mut count = 0;
        for (q, keys) in queues {
            if keys.is_empty() {
                continue;
            }
            // The cap split exactly between the shards (the first ones take the remainder),
            // so a queue keeps at most `dead.max_per_queue` in all.
            let shards = u64::try_from(keys.len()).unwrap_or(1).max(1);
            let (base, extra) = (
                self.opts.dead.max_per_queue / shards,
                self.opts.dead.max_per_queue % shards,
            );
            let mut trimmed = 0;
            for (i, k) in keys.iter().enumerate() {
                let cap = base + u64::from(u64::try_from(i).unwrap_or(u64::MAX) < extra);
                let (a, b): (u64, u64) = redis::pipe()
                    .cmd("XTRIM")
                    .arg(&k.dead)
                    .arg("MINID")
                    .arg(min_id)
                    .cmd("XTRIM")
                    .arg(&k.dead)
                    .arg("MAXLEN")
                    .arg(cap)
                    .query_async(&mut self.client.connection())
                    .await
                    .ctx("trimming dead letters (XTRIM)")?;
                trimmed += a + b;
            }
            if trimmed > 0 {
                crate::engine::telemetry::dead_trimmed(q.as_str(), trimmed);
            }
            count += trimmed;
        }
        Ok(ChoreReport { count })
    }

    /// Deletes idle consumers with nothing pending once, and heartbeats older than an
    /// hour; returns how many consumers.
    pub async fn remove_idle_consumers(&self) -> Result<ChoreReport> {
        let idle = i64::try_from(self.opts.consumer_max_idle.as_millis()).unwrap_or(i64::MAX);
        let mut count = 0;
        for (q, keys) in self.queues().await? {
            for k in keys {
                count +=
                    scripts::remove_idle_consumers(&mut self.client.connection(), &k, idle).await?;
            }
            let _: i64 = redis::cmd("ZREMRANGEBYSCORE")
                .arg(self.client.keyspace().alive(&q))
                .arg("-inf")
                .arg(self.client.now_ms() - crate::engine::client::HEARTBEAT_KEPT_MS)
                .query_async(&mut self.client.connection())
                .await
                .ctx("pruning heartbeats")?;
        }
        Ok(ChoreReport { count })
    }

    /// Probes every shard of the queues of the sweep's selection
    /// ([`sweep_only`](Housekeeper::sweep_only)) and runs the dispatch script over those
    /// with a shard due now until nothing is due; returns the orders moved.
    pub async fn sweep(&self) -> Result<ChoreReport> {
        self.sweep_until(&CancellationToken::new()).await
    }

    /// [`sweep`](Housekeeper::sweep), stopping between dispatch passes once `cancel` fires.
    async fn sweep_until(&self, cancel: &CancellationToken) -> Result<ChoreReport> {
        let mut count = 0;
        // Deletes that were cut off are finished by any process, whatever it dispatches.
        self.client.finish_deletions().await?;
        if self.sweep == DispatchSelection::None {
            return Ok(ChoreReport { count });
        }
        let mut queues = self.queues().await?;
        queues.retain(|(q, _)| self.sweep.includes(q.as_str()));
        let due = self.probe(&queues).await?;
        for ((q, keys), due) in queues.into_iter().zip(due) {
            if cancel.is_cancelled() {
                break;
            }
            if !due {
                continue;
            }
            let shards = u16::try_from(keys.len()).unwrap_or(1);
            let d = Dispatcher::for_registered(
                &self.client,
                q.as_str(),
                shards,
                DispatcherOptions::default(),
            )?;
            count += d.drain_until(cancel).await?.moved as u64;
        }
        Ok(ChoreReport { count })
    }

    /// For each queue, whether one of its shards has an order due now: one `ZRANGE 0 0` per
    /// shard, sent together (at most [`PROBE_CHUNK`] in flight; the multiplexed connection
    /// pipelines them, and a cluster routes each to its node).
    async fn probe(&self, queues: &[Tended]) -> Result<Vec<bool>> {
        let now = self.client.now_ms();
        let shards: Vec<(usize, &crate::engine::keys::ShardKeys)> = queues
            .iter()
            .enumerate()
            .flat_map(|(i, (_, keys))| keys.iter().map(move |k| (i, k)))
            .collect();
        let mut due = vec![false; queues.len()];
        for chunk in shards.chunks(PROBE_CHUNK) {
            let firsts = futures_util::future::try_join_all(chunk.iter().map(|(_, k)| {
                let mut conn = self.client.connection();
                async move {
                    let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(&k.due)
                        .arg(0)
                        .arg(0)
                        .arg("WITHSCORES")
                        .query_async(&mut conn)
                        .await
                        .ctx("probing a shard's earliest due time")?;
                    Ok::<_, crate::engine::error::Error>(first)
                }
            }))
            .await?;
            for ((i, _), first) in chunk.iter().zip(firsts) {
                if first.first().is_some_and(|(_, score)| *score <= now as f64) {
                    due[*i] = true;
                }
            }
        }
        Ok(due)
    }

    /// One pass of the trim chore: the streams and dead letters of the shards this process
    /// dispatched into (nothing at all, not even a registry read, when there are none), or
    /// of every shard once every [`FULL_TRIM_EVERY`].
    async fn trim_pass(&self) -> Result<ChoreReport> {
        let full = {
            let mut last = self
                .last_full_trim
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let due = last.is_none_or(|t| t.elapsed() >= FULL_TRIM_EVERY);
            if due {
                *last = Some(std::time::Instant::now());
            }
            due
        };
        if !full && self.client.touched().is_empty() {
            telemetry::maintenance_pass("trim", true, &[("entries", 0), ("dead_letters", 0)]);
            return Ok(ChoreReport { count: 0 });
        }
        // One read of the registry for both passes.
        let queues = match self.queues().await {
            Ok(q) => self.trim_targets(q, full),
            Err(e) => {
                telemetry::maintenance_pass("trim", false, &[]);
                return Err(e);
            }
        };
        let streams = self.trim_streams(&queues).await;
        let dead = self.trim_dead_letters(&queues).await;
        let (s, d) = (
            streams.as_ref().map_or(0, |r| r.count),
            dead.as_ref().map_or(0, |r| r.count),
        );
        telemetry::maintenance_pass(
            "trim",
            streams.is_ok() && dead.is_ok(),
            &[("entries", s), ("dead_letters", d)],
        );
        streams.and(dead).map(|_| ChoreReport { count: s + d })
    }

    /// Schedules the chores and runs them until `cancel`; then waits for running chores.
    pub async fn run(self, cancel: CancellationToken) -> Result<()> {
        let this = Arc::new(self);
        let mut chores = Vec::new();
        for (name, cron) in [
            ("trim", this.opts.trim_cron.clone()),
            ("consumers", this.opts.consumers_cron.clone()),
            ("sweep", this.opts.sweep_cron.clone()),
        ] {
            let (this, cancel) = (this.clone(), cancel.clone());
            chores.push(Chore::new(name, cron, move || {
                let (this, cancel) = (this.clone(), cancel.clone());
                async move {
                    let (r, what) = match name {
                        "trim" => return this.trim_pass().await,
                        "consumers" => (this.remove_idle_consumers().await, "consumers"),
                        _ => (this.sweep_until(&cancel).await, "orders"),
                    };
                    telemetry::maintenance_pass(
                        name,
                        r.is_ok(),
                        &[(what, r.as_ref().map_or(0, |r| r.count))],
                    );
                    r
                }
            }));
        }
        run_chores(chores, cancel).await
    }
}
