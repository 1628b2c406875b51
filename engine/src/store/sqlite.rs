//! SQLite-specific SQL, and the switch of a database file to WAL.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

/// The database clock in epoch milliseconds (julianday keeps sub-second precision).
pub(super) const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// SQLite has one writer at a time: the claim's UPDATE is atomic without a row lock clause.
pub(super) const CLAIM_LOCK: &str = "";

/// How long a start keeps trying to switch the database file to WAL while other processes
/// hold it.
pub(super) const WAL_SWITCH_WAIT: Duration = Duration::from_secs(10);

/// Puts the database file in WAL journaling.
///
/// The mode is stored in the file, so this is a no-op once any process has done it. Switching
/// takes an exclusive lock that SQLite does not wait for (its busy timeout does not apply):
/// when several engines start at once on a new file, all but one can get `SQLITE_BUSY` here.
/// Those retry, with short growing pauses, for at most [`WAL_SWITCH_WAIT`].
pub(super) async fn enable_wal(db: &DatabaseConnection) -> Result<(), DbErr> {
    let deadline = tokio::time::Instant::now() + WAL_SWITCH_WAIT;
    let mut pause = Duration::from_millis(5);
    loop {
        match db.execute_unprepared("PRAGMA journal_mode=WAL").await {
            Ok(_) => return Ok(()),
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "database file busy; retrying the switch to WAL");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether SQLite refused for a lock held by another connection (`SQLITE_BUSY`, or one of
/// its extended codes).
fn is_busy(e: &DbErr) -> bool {
    const SQLITE_BUSY: i32 = 5;
    crate::Error::from(e.clone())
        .sqlite_code()
        .is_some_and(|c| c & 0xff == SQLITE_BUSY)
}
