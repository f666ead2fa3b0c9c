//! `delayq queue create|list|delete`.

use super::{Global, QueueAction, VerbResult, print_json};
use crate::engine::keys::QueueName;
use crate::service::admin::Admin;

/// Runs the verb.
pub(super) async fn run(g: &Global, action: QueueAction) -> VerbResult {
    match action {
        QueueAction::Create { queue, shards } => {
            QueueName::new(&queue)?;
            let a = Admin::connect(&g.redis_url, &g.namespace).await?;
            print_json(&a.create_queue(&queue, Some(shards)).await?);
        }
        QueueAction::List => {
            let a = Admin::connect(&g.redis_url, &g.namespace).await?;
            for q in a.list_queues().await? {
                print_json(&q);
            }
        }
        QueueAction::Delete { queue, force } => {
            QueueName::new(&queue)?;
            let a = Admin::connect(&g.redis_url, &g.namespace).await?;
            print_json(&a.delete_queue(&queue, force).await?);
        }
    }
    Ok(())
}
