//! The history checker at the end of a test: [`check_history`] reads a test database with
//! [`sagaflow::check::check`] and fails the test with the report when a run breaks an
//! invariant of the engine.

use sagaflow::Engine;
use sagaflow::check::CheckReport;
use sagaflow::sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::db::TestDb;
use crate::harness::SagaTest;

/// Checks every run of `db` (see [`sagaflow::check`]) and returns the report when it is
/// clean. Engines may still run on it: the check reads one snapshot.
///
/// # Panics
/// With the report, when a run breaks an invariant; when the database cannot be read.
pub async fn check_history(db: &TestDb) -> CheckReport {
    let mut options = ConnectOptions::new(db.url.clone());
    options.sqlx_logging(false).max_connections(1);
    let conn = Database::connect(options)
        .await
        .unwrap_or_else(|e| panic!("history check on {}: cannot connect: {e}", db.backend));
    let report = checked(&conn, db.backend).await;
    let _ = conn.close().await;
    report
}

/// [`check_history`] over the database of `engine`, through its connection pool.
///
/// # Panics
/// As [`check_history`].
pub async fn check_engine_history(engine: &Engine) -> CheckReport {
    checked(engine.connection(), &format!("{:?}", engine.backend())).await
}

async fn checked(conn: &DatabaseConnection, backend: &str) -> CheckReport {
    let report = sagaflow::check::check(conn)
        .await
        .unwrap_or_else(|e| panic!("history check on {backend}: cannot read: {e}"));
    assert!(
        report.is_clean(),
        "history check on {backend} found violations:\n{report}"
    );
    report
}

impl SagaTest {
    /// [`check_history`] over the harness's database.
    ///
    /// # Panics
    /// As [`check_history`].
    pub async fn check_history(&self) -> CheckReport {
        check_engine_history(self.engine()).await
    }
}
