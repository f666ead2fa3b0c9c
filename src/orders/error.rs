//! The orders layer's errors: the engine's, wrapped ([`Error::Engine`]), and the database's
//! own. The engine's [`Error`](crate::Error) knows nothing of SQL.

use crate::engine::error::InvalidInput;

/// The result type of the orders layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the orders layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine's error (Redis, a rejected input, ...), as it was.
    #[error(transparent)]
    Engine(#[from] crate::engine::error::Error),
    /// The orders database failed or could not be reached while doing `context`.
    #[error("database error while {context}: {source}")]
    Database {
        /// What delayq was doing.
        context: &'static str,
        /// The error from sqlx.
        #[source]
        source: sqlx::Error,
    },
    /// Applying the orders schema failed, or the database holds an applied migration that
    /// differs from the embedded one.
    #[error("migrating the orders database: {0}")]
    Migrate(#[source] Box<sqlx::migrate::MigrateError>),
    /// An order's row kept changing while delayq tried to change it (concurrent writers);
    /// retrying the call is safe.
    #[error("{context}: order {id:?} kept changing under concurrent updates")]
    Contention {
        /// What delayq was doing.
        context: &'static str,
        /// The order id.
        id: String,
    },
    /// The orders database holds a value delayq does not know (e.g. an unknown status).
    #[error("unexpected value in the orders database while {context}: {detail}")]
    Data {
        /// What delayq was doing.
        context: &'static str,
        /// What was unexpected.
        detail: String,
    },
}

impl From<InvalidInput> for Error {
    fn from(e: InvalidInput) -> Self {
        Error::Engine(e.into())
    }
}

impl Error {
    /// The input error, when this is one.
    pub fn as_invalid(&self) -> Option<&InvalidInput> {
        match self {
            Error::Engine(e) => e.as_invalid(),
            _ => None,
        }
    }

    /// The engine's error, when this is one.
    pub fn as_engine(&self) -> Option<&crate::engine::error::Error> {
        match self {
            Error::Engine(e) => Some(e),
            _ => None,
        }
    }
}
