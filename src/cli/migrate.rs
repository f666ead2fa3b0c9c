//! `delayq migrate --database-url URL`: applies the embedded orders schema.

use super::{VerbResult, print_json};
use crate::engine::redact;
use crate::orders::db::{Db, MIGRATOR, check_url};
use serde_json::json;

/// Runs the verb.
pub(super) async fn run(database_url: &str) -> VerbResult {
    check_url(database_url)?;
    let db = Db::connect(database_url).await?;
    let r = db.migrate().await;
    db.close().await;
    r?;
    let version = MIGRATOR.iter().map(|m| m.version).max();
    print_json(&json!({"outcome": "migrated", "backend": db.backend(),
                       "database": redact::url(database_url), "version": version}));
    Ok(())
}
