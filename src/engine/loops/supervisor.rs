//! The supervisor: runs one dispatcher for every queue of the registry this process may
//! dispatch, starting and stopping them as queues are created and deleted.
//!
//! The registry is the source of truth for what runs. The supervisor reads the registry's
//! version (one `GET`) every [`SupervisorOptions::refresh`] and re-reads the queue list when
//! it changed, and in any case every [`SupervisorOptions::full_every`] (a change it could
//! have missed, e.g. a version key lost with a Redis restart). A queue created anywhere is
//! dispatched within `refresh` plus one read; a deleted one has its dispatcher stopped (it
//! finishes its current pass, which finds nothing: the delete fenced every shard first).
//! Dispatchers it starts never register their queue, so a deleted queue stays deleted.
//!
//! A dispatcher that stops on its own (a panic, or a refusal it does not retry) is started
//! again, after [`RetryPolicy::LOOP`]'s backoff (reset once it has run for
//! [`STABLE_AFTER`]), with a warning and `delayq_dispatcher_restarts_total{queue}`: its
//! queue never silently falls back to the safety sweep.

use crate::engine::client::Client;
use crate::engine::error::{InvalidInput, Result};
use crate::engine::keys::QueueName;
use crate::engine::loops::dispatcher::{Dispatcher, DispatcherOptions};
use crate::engine::retry::RetryPolicy;
use crate::engine::telemetry;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Which registered queues a process dispatches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DispatchSelection {
    /// Every registered queue (the default).
    #[default]
    All,
    /// Only these (those not registered are waited for).
    Only(Vec<QueueName>),
    /// None: this process only serves the API and runs handlers.
    None,
}

impl DispatchSelection {
    /// Whether `queue` is selected.
    pub fn includes(&self, queue: &str) -> bool {
        match self {
            DispatchSelection::All => true,
            DispatchSelection::Only(qs) => qs.iter().any(|q| q.as_str() == queue),
            DispatchSelection::None => false,
        }
    }
}

/// Options of a [`Supervisor`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SupervisorOptions {
    /// Which queues to dispatch (default all).
    pub dispatch: DispatchSelection,
    /// How often the registry's version is read (default 250 ms).
    pub refresh: Duration,
    /// How often the queue list is read even when the version did not change (default 60 s:
    /// every change bumps the version, and a version lost or rolled back with Redis' data
    /// reads as a change too).
    pub full_every: Duration,
    /// Every dispatcher's options.
    pub dispatcher: DispatcherOptions,
    /// Queues (name, shards) declared again when the registry is found empty with no
    /// version (Redis lost its data): `serve`'s configured queues. A queue deleted on
    /// purpose leaves a version behind and is not declared again.
    pub declare: Vec<(String, u16)>,
}

impl Default for SupervisorOptions {
    fn default() -> Self {
        SupervisorOptions {
            dispatch: DispatchSelection::All,
            refresh: Duration::from_millis(250),
            full_every: Duration::from_secs(60),
            dispatcher: DispatcherOptions::default(),
            declare: Vec::new(),
        }
    }
}

impl SupervisorOptions {
    /// Sets which queues to dispatch.
    pub fn dispatch(mut self, d: DispatchSelection) -> Self {
        self.dispatch = d;
        self
    }

    /// Sets the dispatchers' options.
    pub fn dispatcher(mut self, d: DispatcherOptions) -> Self {
        self.dispatcher = d;
        self
    }

    /// Sets the queues declared again after Redis lost its data.
    pub fn declare(mut self, queues: Vec<(String, u16)>) -> Self {
        self.declare = queues;
        self
    }

    /// Checks every option (the one place they are checked).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if self.refresh.is_zero() || self.refresh > Duration::from_secs(10) {
            return Err(InvalidInput::Option {
                name: "refresh",
                reason: "must be more than zero and at most 10s".into(),
            });
        }
        if self.full_every < self.refresh {
            return Err(InvalidInput::Option {
                name: "full_every",
                reason: "must be at least refresh".into(),
            });
        }
        self.dispatcher.validate()
    }
}

/// What one look at the registry changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SupervisorReport {
    /// Queues whose dispatcher was started.
    pub started: Vec<String>,
    /// Queues whose dispatcher was stopped (deleted, or no longer selected).
    pub stopped: Vec<String>,
    /// Queues dispatched after the look.
    pub running: usize,
}

/// A restarted dispatcher that has run this long without stopping starts its backoff over.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// One running dispatcher.
struct Running {
    shards: u16,
    stop: CancellationToken,
    /// `None` once it stopped on its own and its end was read (until it is started again).
    task: Option<JoinHandle<()>>,
    /// When it was last started.
    started: Instant,
    /// Restarts since it last ran for [`STABLE_AFTER`].
    restarts: u32,
    /// When it is started again (it stopped on its own).
    restart_at: Option<Instant>,
}

impl Running {
    /// Stops it and waits for its current pass.
    async fn stop(self) {
        self.stop.cancel();
        if let Some(t) = self.task {
            let _ = t.await;
        }
    }
}

/// Runs a dispatcher for every selected queue of the registry. See the module docs.
pub struct Supervisor {
    client: Client,
    opts: SupervisorOptions,
    running: BTreeMap<String, Running>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("dispatch", &self.opts.dispatch)
            .field("running", &self.running.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Supervisor {
    /// A supervisor over `client`'s namespace.
    pub fn new(client: &Client, opts: SupervisorOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Supervisor {
            client: client.clone(),
            opts,
            running: BTreeMap::new(),
        })
    }

    /// Reads the registry once and starts or stops dispatchers to match it. The
    /// dispatchers run until `cancel` fires or their queue goes.
    pub async fn run_once(&mut self, cancel: &CancellationToken) -> Result<SupervisorReport> {
        let queues = self.client.admin().list_queues().await?;
        let mut report = SupervisorReport::default();
        let wanted: BTreeMap<String, u16> = queues
            .into_iter()
            .filter(|q| self.opts.dispatch.includes(&q.queue))
            .map(|q| (q.queue, q.shards))
            .collect();
        let gone: Vec<String> = self
            .running
            .iter()
            .filter(|(q, r)| wanted.get(*q) != Some(&r.shards))
            .map(|(q, _)| q.clone())
            .collect();
        for q in gone {
            if let Some(r) = self.running.remove(&q) {
                r.stop().await;
                tracing::info!(queue = %q, "queue gone from the registry: dispatcher stopped");
                report.stopped.push(q);
            }
        }
        for (q, shards) in wanted {
            if self.running.contains_key(&q) || cancel.is_cancelled() {
                continue;
            }
            let d =
                Dispatcher::for_registered(&self.client, &q, shards, self.opts.dispatcher.clone())?;
            let stop = cancel.child_token();
            let task = Some(tokio::spawn(d.run(stop.clone())));
            self.running.insert(
                q.clone(),
                Running {
                    shards,
                    stop,
                    task,
                    started: Instant::now(),
                    restarts: 0,
                    restart_at: None,
                },
            );
            report.started.push(q);
        }
        report.running = self.running.len();
        telemetry::supervised_queues(report.running);
        Ok(report)
    }

    /// Starts again the dispatchers that stopped on their own (not by `cancel` or a
    /// deletion), each after its backoff: the first time one is seen stopped it is logged
    /// and its restart time set; once that time has come it is started and counted.
    fn restart_stopped(&mut self, cancel: &CancellationToken) {
        if cancel.is_cancelled() {
            return;
        }
        for (q, r) in &mut self.running {
            if r.stop.is_cancelled() {
                continue;
            }
            if let Some(task) = r.task.take_if(|t| t.is_finished()) {
                use futures_util::FutureExt;
                let how = match task.now_or_never() {
                    Some(Err(e)) if e.is_panic() => "panicked",
                    _ => "stopped on its own",
                };
                if r.started.elapsed() >= STABLE_AFTER {
                    r.restarts = 0;
                }
                let policy = RetryPolicy::LOOP;
                let delay = policy
                    .first
                    .saturating_mul(1u32 << r.restarts.min(16))
                    .min(policy.max);
                tracing::warn!(queue = %q, restart_in = ?delay, restarts = r.restarts, "the queue's dispatcher {how}: starting it again");
                r.restart_at = Some(Instant::now() + delay);
            }
            if r.task.is_some() || r.restart_at.is_some_and(|t| t > Instant::now()) {
                continue;
            }
            match Dispatcher::for_registered(
                &self.client,
                q,
                r.shards,
                self.opts.dispatcher.clone(),
            ) {
                Ok(d) => {
                    r.task = Some(tokio::spawn(d.run(r.stop.clone())));
                    r.started = Instant::now();
                    r.restarts = r.restarts.saturating_add(1);
                    r.restart_at = None;
                    telemetry::dispatcher_restarted(q);
                    tracing::info!(queue = %q, restarts = r.restarts, "dispatcher started again");
                }
                Err(e) => {
                    tracing::error!(queue = %q, error = %e, "starting the dispatcher again failed");
                    r.restart_at = Some(Instant::now() + RetryPolicy::LOOP.max);
                }
            }
        }
    }

    /// The queues dispatched now.
    pub fn running(&self) -> Vec<String> {
        self.running.keys().cloned().collect()
    }

    /// Watches the registry until `cancel` fires, then stops every dispatcher (each ends
    /// its current pass). Redis errors are logged; the loop never gives up.
    pub async fn run(mut self, cancel: CancellationToken) -> Result<()> {
        let mut seen: Option<i64> = None;
        let mut last_full: Option<Instant> = None;
        tracing::info!(dispatch = ?self.opts.dispatch, "supervisor started");
        while !cancel.is_cancelled() {
            let mut version = self.client.registry_version().await;
            if matches!(version, Ok(0)) && !self.opts.declare.is_empty() {
                // No version at all: Redis lost its data (a delete leaves one behind).
                tracing::warn!(
                    "the registry is gone (did Redis lose its data?): declaring the configured queues again"
                );
                for (q, shards) in self.opts.declare.clone() {
                    if let Err(e) = self.client.admin().create_queue(&q, shards).await {
                        tracing::warn!(queue = %q, error = %e, "declaring the queue failed");
                    }
                }
                version = self.client.registry_version().await;
            }
            let changed = match &version {
                Ok(v) => seen != Some(*v),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the registry version failed");
                    false
                }
            };
            let stale = last_full.is_none_or(|t| t.elapsed() >= self.opts.full_every);
            if changed || stale {
                match self.run_once(&cancel).await {
                    Ok(r) => {
                        if !r.started.is_empty() || !r.stopped.is_empty() {
                            tracing::info!(started = ?r.started, stopped = ?r.stopped, running = r.running, "dispatchers follow the registry");
                        }
                        seen = version.ok();
                        last_full = Some(Instant::now());
                    }
                    Err(e) => tracing::warn!(error = %e, "reading the registry failed"),
                }
            }
            self.restart_stopped(&cancel);
            tokio::select! {
                _ = tokio::time::sleep(self.opts.refresh) => {}
                _ = cancel.cancelled() => {}
            }
        }
        for (_, r) in std::mem::take(&mut self.running) {
            r.stop().await;
        }
        telemetry::supervised_queues(0);
        tracing::info!("supervisor stopped");
        Ok(())
    }
}
