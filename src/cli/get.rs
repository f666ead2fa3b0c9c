//! `delayq get QUEUE ID`: one order (exit 1 when not found).

use super::{Failure, Global, VerbResult, print_json};
use crate::service::admin::{self, Admin};

/// Runs the verb.
pub(super) async fn run(g: &Global, queue: &str, id: &str) -> VerbResult {
    admin::check_order_ref(queue, id)?;
    let a = Admin::connect(&g.redis_url, &g.namespace).await?;
    match a.get(queue, id).await? {
        Ok(o) => {
            print_json(&o);
            Ok(())
        }
        Err(nf) => Err(Failure::not_found(&nf)),
    }
}
