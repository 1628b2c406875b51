//! The SQLite fast path: the engine's own statements on one rusqlite connection, executed on
//! the calling task.
//!
//! The sqlx driver runs every SQLite statement on a worker thread of its own and hands the
//! statement over and its rows back through channels. A unit of work of the engine (a claim
//! batch, a completion batch with its next steps and history) is several statements, and in
//! our profiles those hand-offs (a thread woken and a task woken per statement) cost more
//! than SQLite's own work. SQLite is an in-process library that answers a statement in
//! microseconds: here a unit of work holds the connection for its whole transaction and runs
//! each statement directly, so a batch costs no hand-off at all.
//!
//! One connection, one writer: a unit of work waits for the connection asynchronously (a
//! `tokio` mutex, in arrival order) and then begins with `BEGIN IMMEDIATE`, taking the
//! file's write lock at once, so it never has to upgrade a read lock (which SQLite can
//! refuse mid-transaction). When another connection (another process, or an application's
//! own transaction through the sqlx pool) holds the write lock, SQLite answers `SQLITE_BUSY`
//! at once (its busy timeout is zero here) and the task waits asynchronously and retries, up
//! to the busy timeout: a locked file never blocks a runtime thread.
//!
//! Statements are prepared once and cached by their text (the engine's texts do not depend
//! on batch sizes). Values are bound and read as the sqlx driver binds and reads them (see
//! `value.rs`), so one file works with both, and errors keep their SQLite codes (see
//! `error.rs`).

mod error;
mod value;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as SyncMutex, MutexGuard as SyncGuard};
use std::time::Duration;

use rusqlite::OpenFlags;
use sea_orm::{DbErr, Statement};
use tokio::sync::{Mutex, OwnedMutexGuard};

use error::{Phase, db_err, is_busy};
use value::Param;

use super::row::{LiteRow, Row};

use super::SqliteSync;

/// Prepared statements kept per connection (the engine has well under a hundred texts).
const STATEMENT_CACHE: usize = 256;

/// The longest pause between two tries of a statement refused for a lock.
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(20);

/// The connection and what is known of its statements.
struct Conn {
    db: rusqlite::Connection,
    /// Result column names, per statement text.
    columns: HashMap<String, Arc<[String]>>,
}

/// A [`Conn`] that can be shared between tasks (rusqlite's connection is not `Sync`). Only
/// the holder of the outer async mutex touches it, so this lock is never contended.
struct Shared(SyncMutex<Conn>);

impl Shared {
    fn conn(&self) -> SyncGuard<'_, Conn> {
        // A panic while holding the lock leaves nothing half-done that matters here: every
        // statement is atomic in SQLite, and the transaction is rolled back on drop.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Read-only connections for queries outside transactions.
const READERS: usize = 2;

/// The fast path's connections (see the module documentation).
#[derive(Clone)]
pub struct LiteDb {
    /// The writer: every transaction, and every statement that writes.
    conn: Arc<Mutex<Shared>>,
    /// Readers: queries outside transactions that only read. In WAL mode they see the last
    /// commit and neither wait for the writer nor hold it up.
    readers: Arc<[Arc<Mutex<Shared>>]>,
    /// Which statement texts only read (learnt from the first reader that prepared them).
    read_only: Arc<SyncMutex<HashMap<String, bool>>>,
    next_reader: Arc<AtomicUsize>,
    busy_timeout: Duration,
}

impl std::fmt::Debug for LiteDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiteDb")
            .field("busy_timeout", &self.busy_timeout)
            .finish_non_exhaustive()
    }
}

impl LiteDb {
    /// Opens the database file (already created, migrated and in WAL mode).
    /// `read_only` as the database URL asked (`mode=ro`, `immutable`).
    pub(crate) fn open(
        path: &Path,
        read_only: bool,
        sync: SqliteSync,
        busy_timeout: Duration,
    ) -> Result<Self, DbErr> {
        let access = if read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE
        };
        let err = |e| db_err(Phase::Conn, e);
        let connect = |access: OpenFlags| -> Result<rusqlite::Connection, DbErr> {
            let db = rusqlite::Connection::open_with_flags(
                path,
                access | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(err)?;
            // Waits for locks are ours, asynchronous (see the module documentation).
            db.busy_timeout(Duration::ZERO).map_err(err)?;
            db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            Ok(db)
        };
        let shared = |db| {
            Mutex::new(Shared(SyncMutex::new(Conn {
                db,
                columns: HashMap::new(),
            })))
        };
        let writer = connect(access)?;
        let sync = match sync {
            SqliteSync::Full => "FULL",
            SqliteSync::Normal => "NORMAL",
        };
        writer
            .pragma_update(None, "synchronous", sync)
            .map_err(err)?;
        writer
            .pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        let writer = shared(writer);
        let readers = (0..READERS)
            .map(|_| connect(OpenFlags::SQLITE_OPEN_READ_ONLY).map(|c| Arc::new(shared(c))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            conn: Arc::new(writer),
            readers: readers.into(),
            read_only: Arc::default(),
            next_reader: Arc::default(),
            busy_timeout,
        })
    }

    /// A reader, free if one is (else the next in turn, once it is).
    async fn reader(&self) -> OwnedMutexGuard<Shared> {
        if let Some(free) = self
            .readers
            .iter()
            .find_map(|r| Arc::clone(r).try_lock_owned().ok())
        {
            return free;
        }
        let i = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        Arc::clone(&self.readers[i]).lock_owned().await
    }

    /// Begins a read-only transaction on a reader: its reads see one snapshot of the file
    /// (WAL mode fixes it at the first read), and it neither waits for the writer nor holds
    /// it up. End it with a rollback.
    pub(crate) async fn begin_read(&self) -> Result<LiteTx, DbErr> {
        let guard = self.reader().await;
        retry_busy(self.busy_timeout, || guard.conn().control("BEGIN"))
            .await
            .map_err(|e| db_err(Phase::Conn, e))?;
        Ok(LiteTx {
            guard: Some(guard),
            busy_timeout: self.busy_timeout,
        })
    }

    /// Waits for the connection and begins a transaction holding the write lock.
    pub(crate) async fn begin(&self) -> Result<LiteTx, DbErr> {
        let guard = Arc::clone(&self.conn).lock_owned().await;
        retry_busy(self.busy_timeout, || {
            guard.conn().control("BEGIN IMMEDIATE")
        })
        .await
        .map_err(|e| db_err(Phase::Conn, e))?;
        Ok(LiteTx {
            guard: Some(guard),
            busy_timeout: self.busy_timeout,
        })
    }

    /// Runs one statement on its own (in autocommit mode).
    pub(crate) async fn execute(&self, stmt: &Statement) -> Result<u64, DbErr> {
        let guard = self.conn.lock().await;
        retry_busy(self.busy_timeout, || guard.conn().execute(stmt))
            .await
            .map_err(|e| db_err(Phase::Exec, e))
    }

    /// Runs statements without parameters on their own.
    pub(crate) async fn execute_unprepared(&self, sql: &str) -> Result<u64, DbErr> {
        let guard = self.conn.lock().await;
        retry_busy(self.busy_timeout, || guard.conn().batch(sql))
            .await
            .map_err(|e| db_err(Phase::Exec, e))
    }

    /// Runs one query on its own: on a reader when it only reads, else on the writer.
    pub(crate) async fn query(&self, stmt: &Statement) -> Result<Vec<Row>, DbErr> {
        let known = self.read_only_lock().get(stmt.sql.as_str()).copied();
        if known != Some(false) {
            let reader = self.reader().await;
            let rows = retry_busy(self.busy_timeout, || reader.conn().query_if_read_only(stmt))
                .await
                .map_err(|e| db_err(Phase::Query, e))?;
            if known.is_none() {
                self.read_only_lock()
                    .insert(stmt.sql.clone(), rows.is_some());
            }
            if let Some(rows) = rows {
                return Ok(rows);
            }
        }
        let guard = self.conn.lock().await;
        retry_busy(self.busy_timeout, || guard.conn().query(stmt))
            .await
            .map_err(|e| db_err(Phase::Query, e))
    }
}

impl LiteDb {
    fn read_only_lock(&self) -> SyncGuard<'_, HashMap<String, bool>> {
        self.read_only
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An open transaction of the fast path: it holds the connection until it commits, rolls
/// back or is dropped (which rolls back).
pub struct LiteTx {
    guard: Option<OwnedMutexGuard<Shared>>,
    busy_timeout: Duration,
}

impl std::fmt::Debug for LiteTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiteTx")
            .field("open", &self.guard.is_some())
            .finish()
    }
}

impl LiteTx {
    fn shared(&self) -> Result<&Shared, DbErr> {
        self.guard
            .as_deref()
            .ok_or_else(|| DbErr::Custom("the transaction is already finished".into()))
    }

    pub(crate) async fn execute(&self, stmt: &Statement) -> Result<u64, DbErr> {
        let shared = self.shared()?;
        retry_busy(self.busy_timeout, || shared.conn().execute(stmt))
            .await
            .map_err(|e| db_err(Phase::Exec, e))
    }

    pub(crate) async fn execute_unprepared(&self, sql: &str) -> Result<u64, DbErr> {
        let shared = self.shared()?;
        retry_busy(self.busy_timeout, || shared.conn().batch(sql))
            .await
            .map_err(|e| db_err(Phase::Exec, e))
    }

    pub(crate) async fn query(&self, stmt: &Statement) -> Result<Vec<Row>, DbErr> {
        let shared = self.shared()?;
        retry_busy(self.busy_timeout, || shared.conn().query(stmt))
            .await
            .map_err(|e| db_err(Phase::Query, e))
    }

    /// Commits. A commit refused for a lock is retried (the transaction stays open until it
    /// succeeds); any other failure rolls back.
    pub(crate) async fn commit(mut self) -> Result<(), DbErr> {
        let shared = self.shared()?;
        retry_busy(self.busy_timeout, || shared.conn().control("COMMIT"))
            .await
            .map_err(|e| db_err(Phase::Exec, e))?;
        self.guard = None;
        Ok(())
    }

    /// Rolls back.
    pub(crate) fn rollback(mut self) -> Result<(), DbErr> {
        self.finish_rollback()
    }

    fn finish_rollback(&mut self) -> Result<(), DbErr> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let conn = guard.conn();
        if conn.db.is_autocommit() {
            // SQLite already rolled back (some errors end the transaction themselves).
            return Ok(());
        }
        conn.control("ROLLBACK")
            .map(drop)
            .map_err(|e| db_err(Phase::Exec, e))
    }
}

impl Drop for LiteTx {
    fn drop(&mut self) {
        if let Err(e) = self.finish_rollback() {
            tracing::warn!(error = %e, "rolling back an abandoned SQLite transaction failed");
        }
    }
}

/// Runs `f` until SQLite stops answering `SQLITE_BUSY`, pausing (asynchronously, with
/// growing pauses) between tries, for at most `timeout`.
async fn retry_busy<T>(
    timeout: Duration,
    mut f: impl FnMut() -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_micros(250);
    loop {
        match f() {
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BUSY_PAUSE_MAX);
            }
            other => return other,
        }
    }
}

impl Conn {
    /// A transaction's `BEGIN`, `COMMIT` or `ROLLBACK`, prepared once.
    fn control(&self, sql: &str) -> rusqlite::Result<u64> {
        self.db.prepare_cached(sql)?.raw_execute()?;
        Ok(0)
    }

    /// Statements without parameters, run in order.
    fn batch(&self, sql: &str) -> rusqlite::Result<u64> {
        self.db.execute_batch(sql)?;
        Ok(self.db.changes())
    }

    fn prepare<'c>(
        &'c mut self,
        stmt: &Statement,
    ) -> rusqlite::Result<(rusqlite::CachedStatement<'c>, Arc<[String]>)> {
        let Self { db, columns } = self;
        let mut st = db.prepare_cached(&stmt.sql)?;
        let values = stmt.values.as_ref().map_or(&[][..], |v| &v.0[..]);
        if st.parameter_count() != values.len() {
            return Err(rusqlite::Error::InvalidParameterCount(
                values.len(),
                st.parameter_count(),
            ));
        }
        for (i, v) in values.iter().enumerate() {
            st.raw_bind_parameter(i + 1, Param(v))?;
        }
        let cols = match columns.get(stmt.sql.as_str()) {
            Some(c) => Arc::clone(c),
            None => {
                let c: Arc<[String]> = st.column_names().iter().map(|&n| n.to_owned()).collect();
                columns.insert(stmt.sql.clone(), Arc::clone(&c));
                c
            }
        };
        Ok((st, cols))
    }

    fn execute(&mut self, stmt: &Statement) -> rusqlite::Result<u64> {
        {
            // Stepped to the end: a statement may return rows (`RETURNING`) nobody reads.
            let (mut st, _) = self.prepare(stmt)?;
            let mut rows = st.raw_query();
            while rows.next()?.is_some() {}
        }
        Ok(self.db.changes())
    }

    /// [`Conn::query`] if the statement only reads; `None` (and nothing run) if it writes.
    fn query_if_read_only(&mut self, stmt: &Statement) -> rusqlite::Result<Option<Vec<Row>>> {
        if !self.db.prepare_cached(&stmt.sql)?.readonly() {
            return Ok(None);
        }
        self.query(stmt).map(Some)
    }

    fn query(&mut self, stmt: &Statement) -> rusqlite::Result<Vec<Row>> {
        let (mut st, columns) = self.prepare(stmt)?;
        let mut rows = st.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let values = (0..columns.len())
                .map(|i| row.get::<_, rusqlite::types::Value>(i))
                .collect::<rusqlite::Result<_>>()?;
            out.push(Row::Lite(LiteRow::new(Arc::clone(&columns), values)));
        }
        Ok(out)
    }
}
