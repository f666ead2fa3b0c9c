//! A queue created with its settings in one call (the CLI's `queue create` flags, the HTTP
//! API's create body): every setting is checked before anything is written, then the queue
//! is registered and each given setting stored.

use super::Queues;
use crate::engine::client::QueueCreated;
use crate::engine::error::{InvalidInput, Result};
use crate::engine::events::CancelRule;
use crate::engine::history::HistoryPolicy;
use std::time::Duration;

/// What to set on a queue as it is created; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueSettings {
    /// Its shard count: 1 for a new queue when `None`; an existing queue keeps its own.
    pub shards: Option<u16>,
    /// How long the history of its dispatched orders is kept (zero: none).
    pub history_retention: Option<Duration>,
    /// Its default `expires_after` (zero clears it).
    pub expires_after: Option<Duration>,
    /// Its dedup window after dispatch (zero: off).
    pub dedup_window: Option<Duration>,
    /// Its cancel-on-event rules (empty removes them).
    pub cancel_on: Option<Vec<CancelRule>>,
}

impl QueueSettings {
    /// Checks every given setting by its own rule (nothing is written).
    pub fn validate(&self) -> Result<(), InvalidInput> {
        if let Some(rules) = &self.cancel_on {
            crate::engine::events::validate_rules(rules)?;
        }
        if let Some(r) = self.history_retention {
            HistoryPolicy::new(r)?;
        }
        if let Some(e) = self.expires_after {
            crate::engine::expiry::check_queue_default(e)?;
        }
        if let Some(w) = self.dedup_window {
            crate::engine::time_rules::DedupWindow::new(w)?;
        }
        Ok(())
    }
}

impl Queues {
    /// Registers `queue` ([`Queues::create_queue`]; idempotent, another shard count than
    /// the registered one is refused) and stores each given setting, all checked first.
    pub async fn create_queue_with(
        &self,
        queue: &str,
        settings: &QueueSettings,
    ) -> Result<QueueCreated> {
        settings.validate()?;
        let shards = match settings.shards {
            Some(n) => n,
            None => self
                .queue_info(queue)
                .await?
                .map_or(1, |existing| existing.shards),
        };
        let created = self.create_queue(queue, shards).await?;
        if let Some(r) = settings.history_retention {
            self.set_history_retention(queue, r).await?;
        }
        if let Some(e) = settings.expires_after {
            self.set_expires_after(queue, e).await?;
        }
        if let Some(w) = settings.dedup_window {
            self.set_dedup_window(queue, w).await?;
        }
        if let Some(rules) = &settings.cancel_on {
            self.set_cancel_on(queue, rules).await?;
        }
        Ok(created)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each setting is checked by its own rule and a refusal names it; nothing given is
    /// nothing to check.
    #[test]
    fn every_given_setting_is_checked_by_its_own_rule() {
        assert_eq!(QueueSettings::default().validate(), Ok(()));
        let ok = QueueSettings {
            shards: Some(4),
            history_retention: Some(Duration::from_secs(3600)),
            expires_after: Some(Duration::ZERO),
            dedup_window: Some(Duration::ZERO),
            cancel_on: Some(Vec::new()),
        };
        assert_eq!(ok.validate(), Ok(()));
        let year = Duration::from_secs(86_400 * 365 * 20);
        for (bad, name) in [
            (
                QueueSettings {
                    history_retention: Some(year),
                    ..ok.clone()
                },
                "history_retention",
            ),
            (
                QueueSettings {
                    expires_after: Some(year),
                    ..ok.clone()
                },
                "expires_after",
            ),
            (
                QueueSettings {
                    dedup_window: Some(year),
                    ..ok.clone()
                },
                "dedup_window",
            ),
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.to_string().contains(name), "{name}: {e}");
        }
    }
}
