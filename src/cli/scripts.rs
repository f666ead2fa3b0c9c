//! `delayq scripts export DIR`: the Lua scripts as every supported server runs them (see
//! [`crate::engine::scripts::all`]), so the SDKs
//! of other languages can vendor them and check that their copies have not drifted.

use super::{Failure, ScriptsAction, VerbResult, print_json};
use serde::Serialize;

/// One exported script.
#[derive(Serialize)]
struct Exported {
    script: &'static str,
    sha1: String,
    bytes: usize,
}

/// Runs the verb.
pub(super) fn run(action: ScriptsAction) -> VerbResult {
    match action {
        ScriptsAction::Export { dir } => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| Failure::Runtime(format!("cannot create {}: {e}", dir.display())))?;
            for (name, text) in crate::engine::scripts::all() {
                let path = dir.join(format!("{name}.lua"));
                std::fs::write(&path, text).map_err(|e| {
                    Failure::Runtime(format!("cannot write {}: {e}", path.display()))
                })?;
                print_json(&Exported {
                    script: name,
                    sha1: crate::engine::scripts::sha1_of(text),
                    bytes: text.len(),
                });
            }
            Ok(())
        }
    }
}
