//! `delayq cancel QUEUE ID` (exit 1 when not found).

use super::{Failure, Global, VerbResult, print_json};
use crate::engine::message::CancelOutcome;
use crate::service::surface::{self, Outcome};

/// Runs the verb.
pub(super) async fn run(g: &Global, queue: &str, id: &str) -> VerbResult {
    surface::check_order_ref(queue, id)?;
    let outcome = g.connect().await?.cancel(queue, id).await?;
    match outcome {
        CancelOutcome::Cancelled => {
            print_json(&Outcome { outcome });
            Ok(())
        }
        CancelOutcome::NotFound => Err(Failure::not_found(&Outcome { outcome })),
    }
}
