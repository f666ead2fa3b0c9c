//! Configuration errors: [`ConfigError`] (a key and what is wrong with it), and the helpers
//! that blame a library or parse error on the config key it came from.

use crate::engine::duration::parse_duration;
use crate::engine::error::InvalidInput;
use std::time::Duration;

/// A configuration problem: the key and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config error: {}{cause}", key.as_deref().map(|k| format!("{k}: ")).unwrap_or_default())]
pub struct ConfigError {
    /// The key (`handlers[1].visibility_timeout`), when one is to blame.
    pub key: Option<String>,
    /// What is wrong.
    pub cause: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn at(key: impl Into<String>, cause: impl std::fmt::Display) -> Self {
        ConfigError {
            key: Some(key.into()),
            cause: cause.to_string(),
        }
    }

    /// An error about the file as a whole.
    pub fn whole(cause: impl std::fmt::Display) -> Self {
        ConfigError {
            key: None,
            cause: cause.to_string(),
        }
    }
}

/// Maps a library option error to the config key it came from: `prefix.<key>`, where the
/// library's option name is renamed through `renames` (library name, config key) when they
/// differ. Any other input error is blamed on `whole` (or the prefix).
pub(crate) fn lib_err<'a>(
    prefix: &'a str,
    renames: &'a [(&'a str, &'a str)],
) -> impl Fn(InvalidInput) -> ConfigError + 'a {
    move |e| match e {
        InvalidInput::Option { name, reason } => {
            let key = renames
                .iter()
                .find(|(lib, _)| *lib == name)
                .map_or(name, |(_, cfg)| cfg);
            ConfigError::at(join(prefix, key), reason)
        }
        other => ConfigError::at(prefix, other),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Blames a value's parse error on `key` (an option error's reason alone, else the error).
pub(crate) fn at_key(key: &str) -> impl Fn(InvalidInput) -> ConfigError + '_ {
    move |e| match e {
        InvalidInput::Option { reason, .. } => ConfigError::at(key, reason),
        other => ConfigError::at(key, other),
    }
}

/// Parses an optional duration under `key`.
pub(crate) fn duration(key: &str, v: Option<&str>) -> Result<Option<Duration>, ConfigError> {
    v.map(|v| parse_duration("duration", v).map_err(at_key(key)))
        .transpose()
}

/// A figment error as a [`ConfigError`] naming its key, with no value in it: a mistyped
/// token, secret or URL must not be echoed to the terminal or the logs.
pub(super) fn figment_error(e: figment::Error) -> ConfigError {
    use figment::error::{Actual, Kind};
    let kind_of = |a: &Actual| -> String {
        match a {
            Actual::Bool(_) => "a boolean".into(),
            Actual::Unsigned(_) | Actual::Signed(_) => "an integer".into(),
            Actual::Float(_) => "a float".into(),
            Actual::Char(_) | Actual::Str(_) => "a string".into(),
            Actual::Bytes(_) => "bytes".into(),
            Actual::Seq => "a list".into(),
            Actual::Map => "a table".into(),
            other => format!("{other}"),
        }
    };
    let cause = match &e.kind {
        Kind::InvalidType(a, expected) => format!("found {}, expected {expected}", kind_of(a)),
        Kind::InvalidValue(a, expected) => {
            format!("invalid {}, expected {expected}", kind_of(a))
        }
        Kind::UnknownField(f, known) => format!(
            "unknown key {f:?} (known: {})",
            super::embed::known(&e.path, known).join(", ")
        ),
        Kind::Message(m) => crate::engine::redact::text(m.lines().next().unwrap_or_default()),
        other => crate::engine::redact::text(&other.to_string()),
    };
    let key = super::embed::path(&e.path, matches!(e.kind, Kind::Message(_)));
    if key.is_empty() {
        ConfigError::whole(cause)
    } else {
        ConfigError::at(key, cause)
    }
}
