//! `delayq serve --config FILE`: runs the service until SIGINT or SIGTERM, with its logs
//! and trace export set up from the configuration (`log_format`, `[telemetry]`).

use super::{Failure, VerbResult};
use std::path::Path;
use std::time::Duration;

/// How long the trace exporter may take at exit to send what is still queued (beyond it the
/// rest is dropped: a down collector never holds up a shutdown for long).
const EXPORT_AT_EXIT: Duration = Duration::from_secs(1);

/// Runs the verb.
pub(super) async fn run(config: &Path) -> VerbResult {
    let settings = match crate::service::config::load(config) {
        Ok(s) => s,
        Err(e) => {
            super::telemetry::init_plain();
            return Err(Failure::Invalid(e.to_string()));
        }
    };
    let telemetry = super::telemetry::init_serve(settings.log_format, &settings.telemetry)
        .map_err(Failure::Invalid)?;
    let cancel = crate::service::serve::shutdown_on_signals();
    let served = crate::service::serve::run(settings, cancel).await;
    telemetry.shutdown(EXPORT_AT_EXIT).await;
    served?;
    Ok(())
}
