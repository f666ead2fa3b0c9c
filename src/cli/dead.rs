//! `delayq dead list|replay|purge QUEUE ...`.

use super::{DeadAction, Global, VerbResult, json_line, print_json};
use crate::service::admin::{self, Admin};

/// Runs the verb.
pub(super) async fn run(g: &Global, action: DeadAction) -> VerbResult {
    let replay = matches!(action, DeadAction::Replay { .. });
    match action {
        DeadAction::List {
            queue,
            group,
            limit,
            after,
            json,
        } => {
            admin::check_queue_group(&queue, group.as_deref())?;
            let a = Admin::connect(&g.redis_url, &g.namespace).await?;
            let page = a
                .dead_list(&queue, group.as_deref(), after.as_deref(), Some(limit))
                .await?;
            if let Some(next) = &page.next {
                eprintln!("more: the next page starts with --after {next}");
            }
            for d in page.dead_letters {
                if json {
                    outln!("{}", json_line(&d));
                } else {
                    outln!(
                        "{}  {}  group={}  attempts={}  error={}",
                        d.entry_id,
                        d.id,
                        d.group,
                        d.attempts,
                        d.last_error
                    );
                }
            }
            Ok(())
        }
        DeadAction::Replay {
            queue,
            group,
            all,
            entry_ids,
        }
        | DeadAction::Purge {
            queue,
            group,
            all,
            entry_ids,
        } => {
            admin::check_queue_group(&queue, group.as_deref())?;
            let sel = admin::selection(all, entry_ids)?;
            let a = Admin::connect(&g.redis_url, &g.namespace).await?;
            if replay {
                print_json(&a.dead_replay(&queue, group.as_deref(), &sel).await?);
            } else {
                print_json(&a.dead_purge(&queue, group.as_deref(), &sel).await?);
            }
            Ok(())
        }
    }
}
