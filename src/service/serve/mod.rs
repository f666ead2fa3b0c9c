//! `delayq serve`: runs the supervisor (one dispatcher for every queue of the registry this
//! process dispatches), the maintenance services over the registry, one worker per
//! configured handler, the reconciliation job (when on) and the HTTP API, until cancelled;
//! then stops them all gracefully (in-flight handlers finish and are acknowledged).

mod replication_check;

use crate::engine::client::Client;
use crate::engine::loops::housekeeping::Housekeeper;
use crate::engine::loops::supervisor::{Supervisor, SupervisorOptions};
use crate::engine::retry::until_ok;
use crate::engine::worker::{MultiWorker, Puller, Worker};

/// Why `serve` stopped: the engine's error or the orders layer's (its database).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// From the engine (Redis, a refused input, ...).
    #[error(transparent)]
    Engine(#[from] crate::engine::error::Error),
    /// From the orders layer (its database, its migrations).
    #[error(transparent)]
    Orders(#[from] crate::orders::error::Error),
}

impl From<crate::engine::error::InvalidInput> for ServeError {
    fn from(e: crate::engine::error::InvalidInput) -> Self {
        ServeError::Engine(e.into())
    }
}

type Result<T, E = ServeError> = std::result::Result<T, E>;

/// A task of `serve`, its error made a [`ServeError`].
async fn served<E: Into<ServeError>>(
    task: impl std::future::Future<Output = std::result::Result<(), E>>,
) -> Result<()> {
    task.await.map_err(Into::into)
}
use crate::orders::close::OrderClose;
use crate::orders::db::Db;
use crate::orders::reconcile::Reconciler;
use crate::orders::repo::Orders;
use crate::service::config::{HandlerKind, Settings};
use crate::service::handlers::{Builtin, Webhook};
use crate::service::http::{AppState, app, server};
use crate::service::ui::timing::Timing;
use replication_check::warn_if_acknowledged_writes_unprotected;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Runs everything `settings` describes until `cancel` fires.
pub async fn run(settings: Settings, cancel: CancellationToken) -> Result<()> {
    let _ = crate::service::metrics::handle();
    crate::engine::trace::set_consumer_span(settings.telemetry.consumer_span);
    let cfg = &settings.config;
    // Bind first: a port in use is a start-up failure, not something to retry.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| crate::Error::Io {
            context: format!("binding the HTTP listener on {}", settings.listen),
            source,
        })?;
    let listener = Arc::new(listener);
    let bound = listener.local_addr().unwrap_or(settings.listen);
    tracing::info!(listen = %bound, "listening");
    tracing::info!(redis = %crate::engine::redact::url(&cfg.redis_url), "connecting to redis");
    // While Redis is awaited, the port answers: /healthz 200 (alive), /readyz 503.
    let warmup = cancel.child_token();
    let warm = tokio::spawn(server::serve(
        listener.clone(),
        server::starting_router(),
        settings.http.clone(),
        64,
        warmup.clone(),
        Duration::from_secs(1),
    ));
    let connected = tokio::time::timeout(
        settings.startup_timeout,
        until_ok("connecting to redis at start-up", &cancel, || {
            Client::connect_with(&cfg.redis_url, settings.client.clone())
        }),
    )
    .await;
    warmup.cancel();
    let _ = warm.await;
    let connected = match connected {
        Ok(c) => c?,
        Err(_) => {
            return Err(ServeError::Engine(crate::Error::Io {
                context: format!(
                    "redis at {} did not answer within startup_timeout ({})",
                    crate::engine::redact::url(&cfg.redis_url),
                    crate::engine::duration::format_duration(settings.startup_timeout)
                ),
                source: std::io::Error::from(std::io::ErrorKind::TimedOut),
            }));
        }
    };
    let Some(client) = connected else {
        return Ok(());
    };
    tracing::info!(
        redis = %crate::engine::redact::url(&cfg.redis_url),
        namespace = client.keyspace().namespace(),
        "connected to redis"
    );
    warn_if_acknowledged_writes_unprotected(&client).await;
    // Every queue of the configuration exists from now on: orders into it are accepted.
    for q in &settings.queues {
        match client.admin().create_queue(q, settings.client.shards).await {
            // Declared on the master; a replica has not confirmed it yet: not a reason to
            // refuse to start (the supervisor declares it again if Redis loses it).
            Err(e @ crate::engine::error::Error::NotReplicated { .. }) => {
                tracing::warn!(queue = %q, error = %e, "a configured queue is not confirmed by the replicas yet");
            }
            other => {
                other?;
            }
        }
        if let Some(r) = settings.history_retention {
            client.admin().set_history_retention(q, r).await?;
        }
        if let Some(e) = settings.expires_after {
            client.admin().set_expires_after(q, e).await?;
        }
        if let Some(w) = settings.dedup_window {
            client.admin().set_dedup_window(q, w).await?;
        }
    }
    for (q, rules) in settings.cancel_on.iter().flatten() {
        client.admin().set_cancel_on(q, rules).await?;
    }
    // The configured recurring schedules (created, or replaced by what the file says).
    let schedules = crate::engine::schedules::Schedules::new(&client);
    for s in &settings.schedules {
        let r = match schedules.upsert(s).await {
            // A configured window that has ended since: not a reason to refuse to start.
            Err(crate::engine::error::Error::Invalid(
                e @ crate::engine::error::InvalidInput::Option { name: "end", .. },
            )) => {
                tracing::warn!(queue = ?s.queue, schedule = ?s.id, error = %e, "a configured recurring schedule has ended: not declared");
                continue;
            }
            Err(e @ crate::engine::error::Error::NotReplicated { .. }) => {
                tracing::warn!(queue = ?s.queue, schedule = ?s.id, error = %e, "a configured recurring schedule is not confirmed by the replicas yet");
                continue;
            }
            other => other?,
        };
        tracing::info!(queue = ?r.queue, schedule = ?r.id, next_ms = ?r.next_ms, "recurring schedule declared");
    }
    if settings.reconciliation.is_some() && settings.history_retention == Some(Duration::ZERO) {
        tracing::warn!(
            "history_retention is 0s: reconciliation cannot tell an event on its way from a \
             lost one and may send close events again (the conditional close absorbs them)"
        );
    }
    if cfg.http.tokens.is_empty() {
        tracing::warn!("http.tokens is empty: the HTTP API is open to anyone who can reach it");
    }
    let mut tasks: JoinSet<Result<()>> = JoinSet::new();
    spawn_engine(&settings, &client, &cancel, &mut tasks).await?;
    spawn_handlers(&settings, &client, &cancel, &mut tasks).await?;
    // The dashboard's charts: fed by the same calls as the metrics, one per process.
    let timing = Arc::new(Timing::new(client.clock().clone()));
    if !crate::engine::telemetry::set_sink(timing.clone()) {
        tracing::warn!("a telemetry sink was already installed: the dashboard's charts stay empty");
    }
    let router = app(AppState::new(client.clone(), cfg.http.tokens.clone())
        .with_limits(settings.http.clone())
        .with_timing(timing)
        .with_shutdown(cancel.clone())
        .with_consumer_tokens(settings.consumer_tokens.clone())
        .with_pull_groups(pull_groups(&settings)));
    // Room kept outside the HTTP cap: Redis and database connections, files, and every
    // handler's outbound calls (webhooks), so a flood of inbound connections never starves
    // delivery.
    let outbound: usize = settings.handlers.iter().map(|h| h.worker.concurrency).sum();
    let reserve = 256 + 2 * u64::try_from(outbound).unwrap_or(u64::MAX / 4);
    let cap = server::connection_cap(settings.http.max_connections, reserve);
    tracing::info!(max_connections = cap, "HTTP connection cap");
    let (limits, shutdown, grace) = (
        settings.http.clone(),
        cancel.clone(),
        settings.shutdown_grace,
    );
    tasks.spawn(async move {
        server::serve(listener, router, limits, cap, shutdown, grace).await;
        Ok(())
    });
    tracing::info!(
        listen = %bound, queues = ?settings.queues, dispatch = ?settings.dispatch,
        handlers = settings.handlers.len(),
        "delayq serving"
    );
    wait_all(
        tasks,
        &cancel,
        settings.shutdown_grace + Duration::from_secs(1),
    )
    .await
}

/// The groups declared `kind = "pull"`, by (queue, group), with their options.
fn pull_groups(settings: &Settings) -> HashMap<(String, String), crate::service::http::PullGroup> {
    let mut out = HashMap::new();
    for h in &settings.handlers {
        if let HandlerKind::Pull { lease } = &h.kind {
            for q in &h.queues {
                out.insert(
                    (q.clone(), h.group.clone()),
                    crate::service::http::PullGroup {
                        opts: h.worker.clone(),
                        lease: *lease,
                    },
                );
            }
        }
    }
    out
}

/// The scheduler of recurring schedules, the supervisor (dispatchers following the registry)
/// and the maintenance services. The scheduler makes one pass first, so a tick that every
/// process missed is judged (taken back under `skip`) before a dispatcher could deliver it.
async fn spawn_engine(
    settings: &Settings,
    client: &Client,
    cancel: &CancellationToken,
    tasks: &mut JoinSet<Result<()>>,
) -> Result<()> {
    let scheduler = crate::engine::loops::scheduler::Scheduler::new(client);
    if let Err(e) = scheduler.pass().await {
        tracing::warn!(error = %e, "the first scheduler pass failed; the scheduler retries");
    }
    let stop = cancel.clone();
    tasks.spawn(async move {
        scheduler.run(stop).await;
        Ok(())
    });
    let supervisor = Supervisor::new(
        client,
        SupervisorOptions::default()
            .dispatch(settings.dispatch.clone())
            .dispatcher(settings.dispatcher.clone())
            .declare(
                settings
                    .queues
                    .iter()
                    .map(|q| (q.clone(), settings.client.shards))
                    .collect(),
            ),
    )?;
    tasks.spawn(served(supervisor.run(cancel.clone())));
    let housekeeper = Housekeeper::for_registry(client, settings.housekeeping.clone())?
        .sweep_only(settings.dispatch.clone());
    tasks.spawn(served(housekeeper.run(cancel.clone())));
    Ok(())
}

/// One worker per configured handler, and the reconciliation job; handlers on one orders
/// database share one pool. A database that refuses the configured login stops start-up
/// (waiting will not fix it); one that is unreachable is retried by its queries.
/// A `[[handlers]]` entry's worker: over one queue, or over several.
enum Runner {
    One(Worker<Builtin>),
    Many(MultiWorker<Builtin>),
}

async fn spawn_handlers(
    settings: &Settings,
    client: &Client,
    cancel: &CancellationToken,
    tasks: &mut JoinSet<Result<()>>,
) -> Result<()> {
    let mut dbs: HashMap<String, Db> = HashMap::new();
    let mut db_for = |url: &str, conns: usize| -> Result<Orders> {
        if let Some(db) = dbs.get(url) {
            return Ok(Orders::new(db.clone()));
        }
        let db = Db::connect_lazy(url, u32::try_from(conns.clamp(2, 64)).unwrap_or(8))?;
        dbs.insert(url.to_owned(), db.clone());
        Ok(Orders::new(db))
    };
    let mut workers = Vec::new();
    for h in &settings.handlers {
        // Every process records what consumes the group, so pulls of a handler's group are
        // refused and the statistics show the kind.
        for queue in &h.queues {
            let q = crate::engine::keys::QueueName::new(queue)?;
            client.register(&q).await?;
            client
                .admin()
                .declare_group_kind(queue, &h.group, h.kind.name())
                .await?;
            if matches!(h.kind, HandlerKind::Pull { .. }) {
                // Listed from now on (statistics, dashboard), before the first receive.
                let opts = h
                    .worker
                    .clone()
                    .consumer(crate::service::http::PULL_CONSUMER);
                Puller::new(client, queue, &h.group, opts)?
                    .ensure_groups()
                    .await?;
            }
        }
        let handler = match &h.kind {
            // Consumed over HTTP: no worker here.
            HandlerKind::Pull { .. } => continue,
            HandlerKind::Webhook { url, secrets } => Builtin::Webhook(Webhook::new(
                url,
                secrets,
                h.worker.handler_timeout,
                client.clock().clone(),
            )?),
            HandlerKind::Log => Builtin::Log,
            HandlerKind::OrderClose { database_url } => Builtin::OrderClose(OrderClose::new(
                db_for(database_url, h.worker.concurrency)?,
                client,
            )),
        };
        workers.push(if let [queue] = h.queues.as_slice() {
            Runner::One(Worker::new(
                client,
                queue,
                &h.group,
                handler,
                h.worker.clone(),
            )?)
        } else {
            let queues: Vec<&str> = h.queues.iter().map(String::as_str).collect();
            Runner::Many(MultiWorker::new(
                client,
                &queues,
                &h.group,
                handler,
                h.worker.clone(),
                h.queue_mode.clone(),
            )?)
        });
    }
    let mut reconciler = None;
    if let Some(r) = &settings.reconciliation {
        // Its close group must exist: created by a handler of this configuration, or
        // already there. Without it every run would send every overdue order again.
        let ours = settings
            .handlers
            .iter()
            .any(|h| h.queues.contains(&r.queue) && h.group == r.group);
        if !ours {
            let stats = client.admin().stats(&r.queue).await?;
            if !stats.groups.iter().any(|g| g.group == r.group) {
                return Err(crate::engine::error::InvalidInput::Option {
                    name: "reconciliation.group",
                    reason: format!(
                        "queue {:?} has no consumer group {:?}: start its order-close handler first, or name an existing group",
                        r.queue, r.group
                    ),
                }
                .into());
            }
        }
        let orders = db_for(&r.database_url, 2)?;
        reconciler = Some(Reconciler::new(
            orders,
            client,
            &r.queue,
            &r.group,
            r.options.clone(),
        )?);
    }
    for db in dbs.values() {
        db.check_credentials().await?;
    }
    for w in workers {
        match w {
            Runner::One(w) => tasks.spawn(served(w.run(cancel.clone()))),
            Runner::Many(w) => tasks.spawn(served(w.run(cancel.clone()))),
        };
    }
    if let Some(r) = reconciler {
        tasks.spawn(served(r.run(cancel.clone())));
    }
    Ok(())
}

/// Waits for every component; the first failure stops the others. Once cancelled, waits at
/// most `grace` more, then aborts what is left (workers have given up on their handlers by
/// then; anything else still running, such as a connection that never finishes its
/// request, is cut off), so shutdown is bounded whatever the backlog.
async fn wait_all(
    mut tasks: JoinSet<Result<()>>,
    cancel: &CancellationToken,
    grace: Duration,
) -> Result<()> {
    let mut first_err = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let next = match deadline {
            None => tokio::select! {
                r = tasks.join_next() => r,
                _ = cancel.cancelled() => {
                    deadline = Some(tokio::time::Instant::now() + grace);
                    continue;
                }
            },
            Some(d) => match tokio::time::timeout_at(d, tasks.join_next()).await {
                Ok(r) => r,
                Err(_) => {
                    tracing::warn!(
                        left = tasks.len(),
                        "shutdown grace over; stopping what is left"
                    );
                    tasks.abort_all();
                    break;
                }
            },
        };
        let Some(r) = next else { break };
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "a component failed; stopping");
                cancel.cancel();
                first_err.get_or_insert(e);
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                tracing::error!(error = %e, "a component panicked; stopping");
                cancel.cancel();
            }
        }
    }
    tracing::info!("delayq stopped");
    first_err.map_or(Ok(()), Err)
}

/// A token cancelled on SIGINT (Ctrl-C) or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = ctrl_c.await;
                        t.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}
