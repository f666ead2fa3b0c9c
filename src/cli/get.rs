//! `delayq get QUEUE ID`: one order (exit 1 when not found).

use super::{Failure, Global, VerbResult, print_json};
use crate::service::surface;
use serde::Serialize;

/// Runs the verb.
pub(super) async fn run(g: &Global, queue: &str, id: &str) -> VerbResult {
    surface::check_order_ref(queue, id)?;
    match g.connect().await?.admin().history(queue, id).await? {
        Some(o) => {
            print_json(&o);
            Ok(())
        }
        None => Err(Failure::not_found(&NotFound {
            queue,
            id,
            outcome: "not_found",
        })),
    }
}

/// The line printed for an order that is not there (the HTTP API answers 404 instead).
#[derive(Serialize)]
struct NotFound<'a> {
    queue: &'a str,
    id: &'a str,
    /// Always `not_found`.
    outcome: &'static str,
}
