//! Orders databases for tests: a SQLite file in a temp dir, or a PostgreSQL database of
//! our own (created on the server at `DELAYQ_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`, and dropped afterwards). PostgreSQL is
//! required: a test fails when it is unreachable, unless `DELAYQ_SKIP_POSTGRES=1` is set
//! (then the PostgreSQL half of a test is skipped, with a line on stderr).

use delayq::orders::db::Db;
use sqlx::Connection;
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

pub struct TestDb {
    pub url: String,
    pub backend: &'static str,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

fn admin_url() -> String {
    std::env::var("DELAYQ_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

impl TestDb {
    /// A SQLite database file that does not exist yet.
    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("orders.db").display());
        TestDb {
            url,
            backend: "sqlite",
            _dir: Some(dir),
            pg: None,
        }
    }

    /// An empty PostgreSQL database of our own; `None` only with `DELAYQ_SKIP_POSTGRES=1`.
    pub async fn postgres() -> Option<TestDb> {
        if std::env::var("DELAYQ_SKIP_POSTGRES").as_deref() == Ok("1") {
            eprintln!("DELAYQ_SKIP_POSTGRES=1: the PostgreSQL half of this test is skipped");
            return None;
        }
        let admin = admin_url();
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is required by the tests and is not reachable at {admin}: {e}. \
                 Start it, point DELAYQ_TEST_POSTGRES_URL at one, or set DELAYQ_SKIP_POSTGRES=1"
                )
            });
        let name = format!(
            "delayq_test_{}_{}_{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst),
            fastrand::u32(..)
        );
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.ok();
        let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
        Some(TestDb {
            url: format!("{base}/{name}"),
            backend: "postgres",
            _dir: None,
            pg: Some((admin, name)),
        })
    }

    /// SQLite, then PostgreSQL.
    pub async fn all() -> Vec<TestDb> {
        let mut v = vec![TestDb::sqlite()];
        v.extend(TestDb::postgres().await);
        v
    }

    /// A migrated pool on this database.
    pub async fn migrated(&self) -> Db {
        let db = Db::connect(&self.url).await.unwrap();
        db.migrate().await.unwrap();
        db
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin, name)) = self.pg.take() else {
            return;
        };
        // Drop is synchronous: drop the database from a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut c).await;
                }
            })
        })
        .join();
    }
}

/// Runs one statement on `db`; the rows it affected.
pub async fn exec(db: &Db, sql: &'static str) -> Result<u64, sqlx::Error> {
    match db {
        Db::Postgres(p) => sqlx::query(sql).execute(p).await.map(|r| r.rows_affected()),
        Db::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|r| r.rows_affected()),
    }
}
