//! `delayq event NAME --data JSON [--id ID]` (issue 43 item 4): posts an event; prints how
//! many orders it cancelled (exit 0, also for a duplicate).

use super::{Failure, Global, VerbResult, print_json};
use crate::engine::client::events::Event;

/// Runs the verb: the event is checked before connecting (exit 2 on bad input).
pub(super) async fn run(g: &Global, name: &str, data: &str, id: Option<String>) -> VerbResult {
    let data: serde_json::Value = serde_json::from_str(data)
        .map_err(|e| Failure::Invalid(format!("--data: not JSON: {e}")))?;
    let event = Event {
        name: name.to_owned(),
        data,
        id,
    };
    event.validate()?;
    print_json(&g.connect().await?.post_event(&event).await?);
    Ok(())
}
