//! Databases for tests: a fresh SQLite file, or a fresh PostgreSQL database on the server
//! named by `SAGAFLOW_PG_URL`, one per test, so tests run in parallel without seeing each
//! other's steps. When `SAGAFLOW_REQUIRE_PG=1` or `CI=true`, a missing or unreachable
//! PostgreSQL fails the test instead of skipping it.

use sagaflow::Uuid;
use sagaflow::sea_orm::{ConnectionTrait, Database};

/// A database for one scenario.
#[derive(Debug)]
pub struct TestDb {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Connection URL.
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

fn pg_required() -> bool {
    std::env::var("SAGAFLOW_REQUIRE_PG").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A fresh SQLite file in a temporary directory.
///
/// # Panics
/// When no temporary directory can be created.
pub fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("sagaflow.db").display()
    );
    TestDb {
        backend: "sqlite",
        url,
        _dir: Some(dir),
    }
}

/// A fresh PostgreSQL database, or `None` when PostgreSQL is not configured (and not
/// required).
///
/// # Panics
/// When PostgreSQL is required but not configured or unreachable.
pub async fn postgres_db() -> Option<TestDb> {
    let Ok(admin) = std::env::var("SAGAFLOW_PG_URL") else {
        assert!(
            !pg_required(),
            "SAGAFLOW_PG_URL is not set but PostgreSQL is required (CI / SAGAFLOW_REQUIRE_PG)"
        );
        eprintln!(
            "note: SAGAFLOW_PG_URL not set; skipping the PostgreSQL variant (run scripts/test.sh)"
        );
        return None;
    };
    let name = format!("sagaflow_t_{}", Uuid::new_v4().simple());
    let conn = match Database::connect(admin.as_str()).await {
        Ok(c) => c,
        Err(e) => panic!("PostgreSQL at SAGAFLOW_PG_URL is unreachable: {e}"),
    };
    conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create test database");
    let _ = conn.close().await;
    let (base, _) = admin
        .rsplit_once('/')
        .expect("SAGAFLOW_PG_URL must end with /<database>");
    Some(TestDb {
        backend: "postgres",
        url: format!("{base}/{name}"),
        _dir: None,
    })
}

/// SQLite, then PostgreSQL when available.
pub async fn backends() -> Vec<TestDb> {
    let mut v = vec![sqlite_db()];
    v.extend(postgres_db().await);
    v
}
