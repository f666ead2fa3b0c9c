//! Reconciliation, the compensation job: Redis is fast but the database is the system of
//! record. Every run (a tokio-cron-scheduler job, default every 30 s) finds orders still
//! `pending` whose `expires_at` passed more than `grace` ago and sends their close event to
//! the close group, in bounded batches paged by `(expires_at, id)`.
//!
//! It covers what no Redis setting can: the checkout service crashing between its database
//! commit and its schedule call, and Redis losing data (a restart without persistence, a
//! failover before replication, a `FLUSHALL`). It never multiplies events: through the
//! order history ([`Queues::redeliver`](crate::engine::admin::Queues::redeliver)), an order whose event is still scheduled, or
//! dispatched and not yet `done` or `dead` in the close group (backlogged, retrying), is
//! left alone. The event it sends (due now, payload `{"expires_at", "reconciled": true}`)
//! goes to the close group only, as a dead-letter replay does: the queue's other groups
//! never see it.

use crate::engine::admin::history::Redelivered;
use crate::engine::client::Client;
use crate::engine::error::InvalidInput;
use crate::engine::keys::{QueueName, validate_member_name};
use crate::engine::loops::housekeeping::{Chore, ChoreReport, run_chores, validate_cron};
use crate::engine::message::{NewOrder, When};
use crate::orders::error::Result;
use crate::orders::repo::Orders;
use serde::Serialize;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Options of the [`Reconciler`]; in `serve`'s configuration, keys of `[reconciliation]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct ReconcileOptions {
    /// When to run (six fields, seconds first, UTC; default every 30 s: `*/30 * * * * *`).
    pub cron: String,
    /// How long past its expiry a pending order must be before it is rescheduled (default
    /// `60s`), so orders whose events are on their way are not touched.
    #[serde(with = "crate::engine::duration::human")]
    pub grace: Duration,
    /// Orders per database query and per schedule call, 1..=1000 (default 500).
    pub batch: usize,
}

impl Default for ReconcileOptions {
    fn default() -> Self {
        ReconcileOptions {
            cron: "*/30 * * * * *".into(),
            grace: Duration::from_secs(60),
            batch: 500,
        }
    }
}

impl ReconcileOptions {
    /// Checks every option (the one place they are checked).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate_cron("cron", &self.cron)?;
        if !(1..=1000).contains(&self.batch) {
            return Err(InvalidInput::Option {
                name: "batch",
                reason: format!("must be 1..=1000, got {}", self.batch),
            });
        }
        Ok(())
    }

    /// Sets the schedule.
    pub fn cron(mut self, cron: impl Into<String>) -> Self {
        self.cron = cron.into();
        self
    }

    /// Sets the grace period.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Sets the batch size (1..=1000).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }
}

/// What one reconciliation run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReconcileReport {
    /// Overdue pending orders found.
    pub overdue: u64,
    /// Close events sent to the close group for them.
    pub sent: u64,
    /// Orders left alone: their event is still scheduled, or on its way in the close group.
    pub in_flight: u64,
}

/// Schedules the close event of every overdue pending order; see the module documentation.
#[derive(Debug, Clone)]
pub struct Reconciler {
    orders: Orders,
    client: Client,
    queue: QueueName,
    /// The close group: the only one that receives reconciliation events.
    group: String,
    opts: ReconcileOptions,
}

impl Reconciler {
    /// A reconciler of `orders` into consumer group `group` (the one closing orders) of
    /// `queue`.
    pub fn new(
        orders: Orders,
        client: &Client,
        queue: &str,
        group: &str,
        opts: ReconcileOptions,
    ) -> Result<Reconciler> {
        let queue = QueueName::new(queue)?;
        validate_member_name("group", group)?;
        opts.validate()?;
        Ok(Reconciler {
            orders,
            client: client.clone(),
            queue,
            group: group.to_owned(),
            opts,
        })
    }

    /// One run: pages through every overdue pending order.
    pub async fn run_once(&self) -> Result<ReconcileReport> {
        let now = self.client.now_ms();
        let grace = i64::try_from(self.opts.grace.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now.saturating_sub(grace);
        let mut report = ReconcileReport::default();
        let mut after: Option<(String, i64)> = None;
        loop {
            let page = self
                .orders
                .overdue(cutoff, after.as_ref(), self.opts.batch)
                .await?;
            let Some(last) = page.last().cloned() else {
                break;
            };
            let events: Vec<NewOrder> = page
                .iter()
                .map(|(id, expires_at)| {
                    NewOrder::new(
                        id.as_str(),
                        When::AtMs(now),
                        serde_json::json!({ "expires_at": expires_at, "reconciled": true }),
                    )
                })
                .collect();
            let out = self
                .client
                .admin()
                .redeliver(self.queue.as_str(), &self.group, &events)
                .await?;
            report.overdue += page.len() as u64;
            for o in out {
                match o {
                    Redelivered::Sent => report.sent += 1,
                    Redelivered::Scheduled | Redelivered::InFlight => report.in_flight += 1,
                }
            }
            if page.len() < self.opts.batch {
                break;
            }
            after = Some(last);
        }
        if report.sent > 0 {
            crate::engine::telemetry::reconciled(self.queue.as_str(), report.sent);
            tracing::warn!(
                queue = %self.queue, group = %self.group, overdue = report.overdue,
                sent = report.sent, "reconciliation sent close events that were missing from Redis"
            );
        }
        Ok(report)
    }

    /// Runs on the cron schedule until `cancel`; waits for a running pass on shutdown.
    pub async fn run(self, cancel: CancellationToken) -> Result<()> {
        let cron = self.opts.cron.clone();
        let this = std::sync::Arc::new(self);
        let chore = Chore::new("reconcile", cron, move || {
            let this = this.clone();
            async move {
                let r = this.run_once().await?;
                Ok::<_, crate::orders::error::Error>(ChoreReport { count: r.sent })
            }
        });
        Ok(run_chores(vec![chore], cancel).await?)
    }
}
