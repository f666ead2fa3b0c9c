//! `delayq serve`: runs the dispatcher of every configured queue, the housekeeping chores,
//! one worker per configured handler, the reconciliation job (when on) and the HTTP API,
//! until cancelled; then stops them all
//! gracefully (in-flight handlers finish and are acknowledged).

use crate::engine::client::{Client, ClientOptions};
use crate::engine::dispatcher::{Dispatcher, DispatcherOptions};
use crate::engine::housekeeping::{Housekeeper, HousekeepingOptions};
use crate::engine::worker::{Worker, WorkerOptions};
use crate::error::Result;
use crate::orders::close::OrderClose;
use crate::orders::db::Db;
use crate::orders::reconcile::Reconciler;
use crate::orders::repo::Orders;
use crate::service::config::{HandlerKind, Settings};
use crate::service::handlers::{Builtin, Webhook};
use crate::service::http::{AppState, app};
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Runs everything `settings` describes until `cancel` fires.
pub async fn run(settings: Settings, cancel: CancellationToken) -> Result<()> {
    let _ = crate::service::metrics::handle();
    let cfg = &settings.config;
    let opts = ClientOptions::default()
        .namespace(cfg.namespace.clone())
        .shards(cfg.shards)
        .max_payload_bytes(cfg.max_payload_bytes)
        .durability(if cfg.durability == "replicated" {
            crate::engine::client::Durability::replicated()
        } else {
            crate::engine::client::Durability::Leader
        });
    // Bind first: a port in use is a start-up failure, not something to retry.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|source| crate::Error::Io {
            context: format!("binding the HTTP listener on {}", settings.listen),
            source,
        })?;
    let client = loop {
        match Client::connect_with(&cfg.redis_url, opts.clone()).await {
            Ok(c) => break c,
            Err(e) if e.as_invalid().is_some() => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "redis unreachable at start-up; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = cancel.cancelled() => return Ok(()),
                }
            }
        }
    };
    if cfg.http.tokens.is_empty() {
        tracing::warn!("http.tokens is empty: the HTTP API is open to anyone who can reach it");
    }

    let mut tasks: JoinSet<Result<()>> = JoinSet::new();
    for q in &settings.queues {
        let d = Dispatcher::new(
            &client,
            q,
            DispatcherOptions::default()
                .batch(cfg.dispatcher.batch)
                .max_idle(settings.max_idle),
        )?;
        let c = cancel.clone();
        tasks.spawn(async move {
            d.run(c).await;
            Ok(())
        });
    }
    let queues: Vec<&str> = settings.queues.iter().map(String::as_str).collect();
    let hk = &cfg.housekeeping;
    let housekeeper = Housekeeper::new(
        &client,
        &queues,
        HousekeepingOptions::default()
            .trim_cron(hk.trim_cron.clone())
            .consumers_cron(hk.consumers_cron.clone())
            .sweep_cron(hk.sweep_cron.clone())
            .consumer_max_idle(settings.consumer_max_idle),
    )?;
    tasks.spawn(housekeeper.run(cancel.clone()));
    // One pool per orders database, shared by its handlers and the reconciliation job.
    let mut dbs: HashMap<String, Db> = HashMap::new();
    let mut db_for = |url: &str, conns: usize| -> Result<Orders> {
        if let Some(db) = dbs.get(url) {
            return Ok(Orders::new(db.clone()));
        }
        let db = Db::connect_lazy(url, u32::try_from(conns.clamp(2, 64)).unwrap_or(8))?;
        dbs.insert(url.to_owned(), db.clone());
        Ok(Orders::new(db))
    };
    for h in &settings.handlers {
        let handler = match &h.kind {
            HandlerKind::Webhook { url, secret } => {
                Builtin::Webhook(Webhook::new(url, secret.as_deref(), h.timeout)?)
            }
            HandlerKind::Log => Builtin::Log,
            HandlerKind::OrderClose { database_url } => Builtin::OrderClose(OrderClose::new(
                db_for(database_url, h.concurrency)?,
                &client,
            )),
        };
        let wopts = WorkerOptions {
            prefetch: h.prefetch,
            ..WorkerOptions::default()
        };
        let w = Worker::new(
            &client,
            &h.queue,
            &h.group,
            handler,
            wopts
                .concurrency(h.concurrency)
                .handler_timeout(h.timeout)
                .max_attempts(h.max_attempts)
                .backoff(h.backoff)
                .visibility_timeout(h.visibility_timeout),
        )?;
        tasks.spawn(w.run(cancel.clone()));
    }
    if let Some(r) = &settings.reconciliation {
        let reconciler = Reconciler::new(
            db_for(&r.database_url, 2)?,
            &client,
            &r.queue,
            r.options.clone(),
        )?;
        tasks.spawn(reconciler.run(cancel.clone()));
    }
    let router = app(
        AppState::new(client.clone(), cfg.http.tokens.clone()),
        cfg.http.max_body_bytes,
    );
    let shutdown = cancel.clone();
    tasks.spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .map_err(|source| crate::Error::Io {
                context: "serving HTTP".into(),
                source,
            })
    });
    tracing::info!(
        listen = %settings.listen, queues = ?settings.queues, handlers = settings.handlers.len(),
        "delayq serving"
    );
    let mut first_err = None;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "a component failed; stopping");
                cancel.cancel();
                first_err.get_or_insert(e);
            }
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
