//! `delayq dead list|replay|purge QUEUE ...`.

use super::{DeadAction, Global, VerbResult, json_line, print_json};
use crate::service::surface::{self, Purged, Replayed};

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
            surface::check_queue_group(&queue, group.as_deref())?;
            let client = g.connect().await?;
            let limit = surface::dead_limit(Some(limit))?;
            let page = client
                .admin()
                .dead_page(&queue, group.as_deref(), after.as_deref(), limit)
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
            surface::check_queue_group(&queue, group.as_deref())?;
            let sel = surface::selection(all, entry_ids)?;
            let admin = g.connect().await?.admin();
            let group = group.as_deref();
            if replay {
                let replayed = admin.dead_replay(&queue, group, &sel).await?;
                print_json(&Replayed { replayed });
            } else {
                let purged = admin.dead_purge(&queue, group, &sel).await?;
                print_json(&Purged { purged });
            }
            Ok(())
        }
    }
}
