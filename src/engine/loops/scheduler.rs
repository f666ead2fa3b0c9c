//! [`Scheduler`]: the loop every `serve` process runs over the namespace's schedules.

use crate::engine::client::Client;
use crate::engine::error::Result;
use crate::engine::schedules::Schedules;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The longest a scheduler sleeps between passes (it wakes earlier for an earlier tick).
const MAX_SLEEP: Duration = Duration::from_secs(1);

/// The loop every `serve` process runs: a pass whenever a schedule's next tick is due (at
/// most a second apart), until cancelled. Errors are logged and retried.
pub struct Scheduler {
    schedules: Schedules,
}

impl Scheduler {
    /// A scheduler for the namespace of `client`.
    pub fn new(client: &Client) -> Self {
        Scheduler {
            schedules: Schedules::new(client),
        }
    }

    /// One pass (what `serve` runs before it starts dispatching).
    pub async fn pass(&self) -> Result<(u64, u64)> {
        self.schedules.adopt_earlier_records().await?;
        self.schedules.pass().await
    }

    /// Runs until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        let mut failures = 0u32;
        let mut adopted = false;
        while !cancel.is_cancelled() {
            if !adopted {
                adopted = self.schedules.adopt_earlier_records().await.is_ok();
            }
            let wait = match self.schedules.pass_counting_failures().await {
                // A schedule that cannot advance stays due: not again at once.
                Ok((_, _, failed)) if failed > 0 => MAX_SLEEP,
                Ok(_) => {
                    failures = 0;
                    match self.schedules.earliest().await {
                        Ok(Some(at)) => {
                            let ms = (at - self.schedules.client.now_ms()).max(5);
                            Duration::from_millis(u64::try_from(ms).unwrap_or(0)).min(MAX_SLEEP)
                        }
                        _ => MAX_SLEEP,
                    }
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, failures, "the scheduler pass failed; retrying");
                    }
                    MAX_SLEEP
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = cancel.cancelled() => break,
            }
        }
    }
}
