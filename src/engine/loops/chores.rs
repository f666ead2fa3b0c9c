//! Cron-scheduled chores (tokio-cron-scheduler): a named job per cron expression, a tick
//! skipped while the previous run of the same chore still runs, and shutdown that waits for
//! running chores. The housekeeper's chores and the orders reconciler run through it.

use crate::engine::error::{InvalidInput, Result};
use crate::engine::loops::housekeeping::ChoreReport;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::Mutex;
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;

/// Why a chore's run failed (only displayed: the chore runs again on its next tick). Chores
/// of other layers (the orders reconciler) bring their own error types.
type ChoreError = Box<dyn std::error::Error + Send + Sync>;

type ChoreFn =
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<ChoreReport, ChoreError>> + Send>> + Send + Sync;

/// A named job on a cron schedule.
pub(crate) struct Chore {
    name: &'static str,
    cron: String,
    run: Arc<ChoreFn>,
}

impl Chore {
    /// `run` on `cron` (six fields, seconds first).
    pub(crate) fn new<F, Fut, E>(name: &'static str, cron: String, run: F) -> Chore
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ChoreReport, E>> + Send + 'static,
        E: std::error::Error + Send + Sync + 'static,
    {
        let run = Arc::new(run);
        Chore {
            name,
            cron,
            run: Arc::new(move || {
                let run = run.clone();
                Box::pin(async move { run().await.map_err(|e| Box::new(e) as ChoreError) })
            }),
        }
    }
}

/// Runs `chores` on their schedules (tokio-cron-scheduler) until `cancel`, then waits for
/// the running ones. A chore still running when its next tick comes skips that tick.
pub(crate) async fn run_chores(chores: Vec<Chore>, cancel: CancellationToken) -> Result<()> {
    let mut sched = JobScheduler::new().await.map_err(sched_err)?;
    let mut locks = Vec::new();
    for chore in chores {
        let lock = Arc::new(Mutex::new(()));
        locks.push(lock.clone());
        let (name, run) = (chore.name, chore.run);
        let job = Job::new_async(chore.cron.as_str(), move |_id, _sched| {
            let (run, lock) = (run.clone(), lock.clone());
            Box::pin(async move {
                // Skip this tick if the previous run is still going.
                let Ok(_guard) = lock.try_lock() else {
                    tracing::debug!(chore = name, "still running; tick skipped");
                    return;
                };
                match run().await {
                    Ok(rep) if rep.count > 0 => {
                        tracing::info!(chore = name, count = rep.count, "housekeeping")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(chore = name, error = %e, "housekeeping failed"),
                }
            }) as Pin<Box<dyn Future<Output = ()> + Send>>
        })
        .map_err(sched_err)?;
        sched.add(job).await.map_err(sched_err)?;
    }
    sched.start().await.map_err(sched_err)?;
    cancel.cancelled().await;
    if let Err(e) = sched.shutdown().await {
        tracing::warn!(error = %e, "scheduler shutdown");
    }
    for l in locks {
        let _ = l.lock().await;
    }
    Ok(())
}

/// Checks a six-field cron expression (seconds first).
pub fn validate_cron(name: &'static str, cron: &str) -> Result<(), InvalidInput> {
    let fields = cron.split_whitespace().count();
    if fields != 6 {
        return Err(InvalidInput::Option {
            name,
            reason: format!(
                "{cron:?} has {fields} fields; six are needed, seconds first (e.g. \"*/10 * * * * *\")"
            ),
        });
    }
    Job::new_async(cron, |_, _| Box::pin(async {})).map_err(|e| InvalidInput::Option {
        name,
        reason: format!("{cron:?} is not a valid cron expression: {e}"),
    })?;
    Ok(())
}

fn sched_err(e: tokio_cron_scheduler::JobSchedulerError) -> crate::Error {
    crate::Error::Scheduler {
        context: "running the cron scheduler",
        detail: e.to_string(),
    }
}
