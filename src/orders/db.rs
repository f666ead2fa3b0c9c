//! The orders database: PostgreSQL (`postgres://`, the production target) or SQLite
//! (`sqlite://file`, zero set-up). One schema (`migrations/`, embedded in the binary) and one
//! set of queries serve both: timestamps are unix milliseconds in `BIGINT` columns and every
//! query uses `$N` placeholders, which both drivers accept.

use crate::engine::error::InvalidInput;
use crate::engine::redact;
use crate::orders::error::{Error, Result};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
use std::time::Duration;

/// The orders schema, embedded from `migrations/`.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a query waits for a pooled connection before failing (a retryable error).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool on the orders database.
#[derive(Debug, Clone)]
pub enum Db {
    /// PostgreSQL.
    Postgres(PgPool),
    /// SQLite (WAL journal, 5 s busy timeout).
    Sqlite(SqlitePool),
}

/// Runs `$body` with `$pool` bound to the concrete pool of `$db` (one query text, two
/// drivers).
macro_rules! with_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            $crate::orders::db::Db::Postgres($pool) => $body,
            $crate::orders::db::Db::Sqlite($pool) => $body,
        }
    };
}
pub(crate) use with_pool;

impl Db {
    /// A pool on `url` that connects on first use, so a database that is down at start-up
    /// is a retryable failure of the first query, not a start-up failure. A SQLite file that
    /// does not exist is created.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Db> {
        let max = max_connections.max(1);
        match scheme(url)? {
            Backend::Postgres => {
                let opts = PgConnectOptions::from_str(url).map_err(|e| bad_url(url, e))?;
                Ok(Db::Postgres(
                    PgPoolOptions::new()
                        .max_connections(max)
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .connect_lazy_with(opts),
                ))
            }
            Backend::Sqlite => {
                let opts = SqliteConnectOptions::from_str(url)
                    .map_err(|e| bad_url(url, e))?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    // WAL + NORMAL: a commit is durable once the WAL is synced at checkpoint;
                    // the database is never corrupted. Use PostgreSQL for production.
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(5));
                // An in-memory database exists once per connection: keep one.
                let max = if url.contains(":memory:") { 1 } else { max };
                Ok(Db::Sqlite(
                    SqlitePoolOptions::new()
                        .max_connections(max)
                        .acquire_timeout(ACQUIRE_TIMEOUT)
                        .connect_lazy_with(opts),
                ))
            }
        }
    }

    /// A pool on `url`, checked by opening one connection now.
    pub async fn connect(url: &str) -> Result<Db> {
        let db = Db::connect_lazy(url, 8)?;
        with_pool!(&db, p => p.acquire().await.map(drop)).map_err(db_err("connecting"))?;
        Ok(db)
    }

    /// Opens one connection to tell a refused login from an unreachable server: wrong
    /// credentials (or an unknown role) are an error, since waiting will not fix them; an
    /// unreachable or slow server is only logged, and its first queries are retried.
    pub async fn check_credentials(&self) -> Result<()> {
        let r = tokio::time::timeout(ACQUIRE_TIMEOUT, async {
            with_pool!(self, p => p.acquire().await.map(drop))
        })
        .await;
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if is_auth_failure(&e) => Err(db_err(
                "logging in to the orders database (wrong login, or no such database)",
            )(e)),
            Ok(Err(e)) => {
                tracing::warn!(error = %redact::text(&e.to_string()), "the orders database is not reachable yet; its queries will be retried");
                Ok(())
            }
            Err(_) => {
                tracing::warn!(
                    "the orders database did not answer within 5 s; its queries will be retried"
                );
                Ok(())
            }
        }
    }

    /// Applies the embedded migrations that are not applied yet (idempotent). Refuses a
    /// database on which an applied migration differs from the embedded one.
    pub async fn migrate(&self) -> Result<()> {
        with_pool!(self, p => MIGRATOR.run(p).await).map_err(|e| Error::Migrate(Box::new(e)))
    }

    /// `postgres` or `sqlite`.
    pub fn backend(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
        }
    }

    /// Closes the pool (waits for connections in use to be returned).
    pub async fn close(&self) {
        with_pool!(self, p => p.close().await)
    }
}

enum Backend {
    Postgres,
    Sqlite,
}

/// Checks that `url` is a database URL delayq can use, without connecting.
pub fn check_url(url: &str) -> Result<()> {
    match scheme(url)? {
        Backend::Postgres => PgConnectOptions::from_str(url).map(drop),
        Backend::Sqlite => SqliteConnectOptions::from_str(url).map(drop),
    }
    .map_err(|e| bad_url(url, e))
}

fn scheme(url: &str) -> Result<Backend, InvalidInput> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Backend::Postgres)
    } else if url.starts_with("sqlite:") {
        Ok(Backend::Sqlite)
    } else {
        Err(InvalidInput::Option {
            name: "database_url",
            reason: format!(
                "{:?} is not a postgres://, postgresql:// or sqlite: URL",
                redact::url(url)
            ),
        })
    }
}

fn bad_url(url: &str, e: sqlx::Error) -> Error {
    InvalidInput::Option {
        name: "database_url",
        reason: format!("{:?}: {}", redact::url(url), redact::text(&e.to_string())),
    }
    .into()
}

/// True for a refused login: PostgreSQL's SQLSTATE class 28 (invalid authorization:
/// wrong password, unknown role).
/// A refusal that waiting will not fix: a login refused (class 28) or a database that does
/// not exist (3D000, `invalid_catalog_name`).
fn is_auth_failure(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d)
        if d.code().is_some_and(|c| c.starts_with("28") || c == "3D000"))
}

/// Maps a sqlx error to [`Error::Database`] with `context`.
pub(crate) fn db_err(context: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |source| Error::Database { context, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_redacted() {
        assert!(matches!(
            Db::connect_lazy("mysql://x", 1),
            Err(Error::Engine(crate::Error::Invalid(InvalidInput::Option {
                name: "database_url",
                ..
            })))
        ));
        let e = Db::connect_lazy("mysql://app:s3cret@db/x", 1).unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }
}
