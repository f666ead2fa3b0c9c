//! `delayq serve --config FILE`: runs the service until SIGINT or SIGTERM.

use super::{Failure, VerbResult};
use std::path::Path;

/// Runs the verb.
pub(super) async fn run(config: &Path) -> VerbResult {
    let settings =
        crate::service::config::load(config).map_err(|e| Failure::Invalid(e.to_string()))?;
    let cancel = crate::service::serve::shutdown_on_signals();
    crate::service::serve::run(settings, cancel).await?;
    Ok(())
}
