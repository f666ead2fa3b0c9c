//! `delayq queue create|list|delete` and `delayq group delete`.

use super::{Global, QueueAction, VerbResult, print_json};
use crate::engine::admin::QueueSettings;
use crate::engine::duration::parse_duration;
use crate::engine::history::HistoryPolicy;
use crate::engine::keys::QueueName;
use crate::service::surface::{self, GroupDeleted, QueueDeleted};

/// Runs the verb.
pub(super) async fn run(g: &Global, action: QueueAction) -> VerbResult {
    match action {
        QueueAction::Create {
            queue,
            shards,
            history_retention,
            expires_after,
            dedup_window,
            cancel_on,
        } => {
            QueueName::new(&queue)?;
            let rules = cancel_on
                .iter()
                .map(|r| crate::engine::events::parse_rule(r))
                .collect::<Result<Vec<_>, _>>()?;
            crate::engine::events::validate_rules(&rules)?;
            let retention = history_retention
                .as_deref()
                .map(|t| parse_duration("--history-retention", t))
                .transpose()?;
            if let Some(r) = retention {
                HistoryPolicy::new(r)?;
            }
            let expires_after = expires_after
                .as_deref()
                .map(|t| parse_duration("--expires-after", t))
                .transpose()?;
            if let Some(e) = expires_after {
                crate::engine::expiry::check_queue_default(e)?;
            }
            let window = dedup_window
                .as_deref()
                .map(|t| parse_duration("--dedup-window", t))
                .transpose()?;
            if let Some(w) = window {
                crate::engine::time_rules::DedupWindow::new(w)?;
            }
            let settings = QueueSettings {
                shards: Some(shards),
                history_retention: retention,
                expires_after,
                dedup_window: window,
                cancel_on: (!rules.is_empty()).then_some(rules),
            };
            let admin = g.connect().await?.admin();
            print_json(&admin.create_queue_with(&queue, &settings).await?);
        }
        QueueAction::List => {
            for q in g.connect().await?.admin().list_queues().await? {
                print_json(&q);
            }
        }
        QueueAction::Pause { queue, group } => pause(g, &queue, group.as_deref(), true).await?,
        QueueAction::Resume { queue, group } => pause(g, &queue, group.as_deref(), false).await?,
        QueueAction::Delete { queue, force } => {
            QueueName::new(&queue)?;
            let held = g
                .connect()
                .await?
                .admin()
                .delete_queue(&queue, force)
                .await?;
            print_json(&QueueDeleted::new(&queue, held));
        }
    }
    Ok(())
}

/// `delayq group delete QUEUE GROUP [--force]`.
pub(super) async fn delete_group(g: &Global, queue: &str, group: &str, force: bool) -> VerbResult {
    surface::check_queue_group(queue, Some(group))?;
    let admin = g.connect().await?.admin();
    let pending = admin.delete_group(queue, group, force).await?;
    print_json(&GroupDeleted {
        queue,
        group,
        deleted: true,
        pending,
    });
    Ok(())
}

/// `delayq group keys QUEUE GROUP [--limit N] [--after KEY]`.
pub(super) async fn group_keys(
    g: &Global,
    queue: &str,
    group: &str,
    limit: Option<usize>,
    after: Option<&str>,
) -> VerbResult {
    surface::check_queue_group(queue, Some(group))?;
    let limit = crate::engine::admin::keys::keys_limit(limit)?;
    let admin = g.connect().await?.admin();
    print_json(&admin.group_keys(queue, group, limit, after).await?);
    Ok(())
}

/// `delayq queue pause|resume QUEUE [--group G]`.
async fn pause(g: &Global, queue: &str, group: Option<&str>, paused: bool) -> VerbResult {
    surface::check_queue_group(queue, group)?;
    let admin = g.connect().await?.admin();
    print_json(&admin.set_paused(queue, group, paused).await?);
    Ok(())
}
