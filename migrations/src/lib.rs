//! Schema migrations of sagaflow.
//!
//! The engine runs [`migrate`] on start: [`Migrator::up`] under a lock that serialises
//! concurrent starts (call [`migrate`], not `Migrator::up`, to keep that lock). Applied
//! migrations are recorded in the table [`MIGRATION_TABLE`], never in sea-orm's default
//! `seaql_migrations`, so an embedding application can keep its own migrator on the same
//! database. Only forward migrations are offered: `fresh()`/`refresh()` would drop every
//! table of the host database and are not re-exported.
//!
//! Migrations are plain SQL per backend. They never import the engine's entity structs, so an
//! old migration keeps meaning what it meant when it shipped.
//!
//! # Concurrent starts
//!
//! Several engines may start at once on a fresh database: [`migrate`] serialises them. It
//! runs every pending migration, and the bookkeeping in [`MIGRATION_TABLE`], in **one
//! transaction** that first takes a database-wide lock:
//!
//! - on PostgreSQL, the transaction-level advisory lock [`MIGRATION_LOCK_KEY`]
//!   (`pg_advisory_xact_lock`), released by the commit or rollback, so it can never outlive
//!   the transaction or be left on a pooled connection;
//! - on SQLite, the database's write lock (`BEGIN IMMEDIATE`).
//!
//! An engine that finds the lock taken waits for it (up to [`MIGRATION_LOCK_WAIT`]; on
//! SQLite by trying again while the lock is busy), then sees the migrations the first engine committed and has
//! nothing left to apply. DDL is transactional on both backends, so a failed or interrupted
//! start leaves no migration half-applied; each migration is written to be re-runnable all
//! the same (`IF NOT EXISTS`, `IF EXISTS`, columns added only when missing), so a schema
//! half-applied by an older release cannot wedge a start either.
//!
//! Because every migration runs inside that transaction, a migration must not use
//! statements that PostgreSQL refuses in a transaction block (`CREATE INDEX CONCURRENTLY`,
//! `VACUUM`, …) and must not opt out with `use_transaction() == Some(false)` expecting to
//! run outside one.

use std::sync::{Arc, Mutex};

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{
    DatabaseTransaction, DbBackend, SqliteTransactionMode, Statement, TransactionOptions,
    TransactionTrait,
};

mod m0001_initial;
mod m0002_hot_path;
mod m0003_outcomes_and_instances;
mod m0004_leader_progress;
mod m0005_attempts_apart;
mod m0006_definitions;
mod m0007_run_list;
mod m0008_start_and_priority;
mod m0009_run_totals;
mod m0010_outbox;
mod m0011_trace_context;
mod m0012_alert_resolution;
mod m0013_resources;
mod m0014_resource_state;
mod m0015_retry_lane_and_aging;
mod m0016_waits;
mod m0017_schedules;
mod m0018_instance_workflows;
mod m0019_secrets;
mod m0020_history_folds;
mod m0021_compensation_share;
mod m0022_restarts;
mod m0023_step_progress;
mod m0024_history_partitions;
mod m0025_finished_runs;
pub mod partitions;

/// Name of the table that records applied sagaflow migrations.
pub const MIGRATION_TABLE: &str = "sagaflow_migrations";

/// Key of the PostgreSQL advisory lock held while [`migrate`] runs: the ASCII bytes of
/// `sagaflow` read as a big-endian 64-bit integer (`0x7361_6761_666c_6f77`). Advisory locks
/// are per database, so engines of different databases on one server never wait for each
/// other. An application that uses advisory locks itself should keep clear of this key.
pub const MIGRATION_LOCK_KEY: i64 = 0x7361_6761_666c_6f77;

/// How long a start on PostgreSQL waits for the migration lock (another engine migrating)
/// and for the locks its own migrations need, before it fails.
pub const MIGRATION_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Applies sagaflow's schema migrations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m0001_initial::Migration),
            Box::new(m0002_hot_path::Migration),
            Box::new(m0003_outcomes_and_instances::Migration),
            Box::new(m0004_leader_progress::Migration),
            Box::new(m0005_attempts_apart::Migration),
            Box::new(m0006_definitions::Migration),
            Box::new(m0007_run_list::Migration),
            Box::new(m0008_start_and_priority::Migration),
            Box::new(m0009_run_totals::Migration),
            Box::new(m0010_outbox::Migration),
            Box::new(m0011_trace_context::Migration),
            Box::new(m0012_alert_resolution::Migration),
            Box::new(m0013_resources::Migration),
            Box::new(m0014_resource_state::Migration),
            Box::new(m0015_retry_lane_and_aging::Migration),
            Box::new(m0016_waits::Migration),
            Box::new(m0017_schedules::Migration),
            Box::new(m0018_instance_workflows::Migration),
            Box::new(m0019_secrets::Migration),
            Box::new(m0020_history_folds::Migration),
            Box::new(m0021_compensation_share::Migration),
            Box::new(m0022_restarts::Migration),
            Box::new(m0023_step_progress::Migration),
            Box::new(m0024_history_partitions::Migration),
            Box::new(m0025_finished_runs::Migration),
        ]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(MIGRATION_TABLE).into_iden()
    }
}

/// Brings the database schema up to date, one engine at a time.
///
/// Applies every pending migration in one transaction under a database-wide lock (see
/// [Concurrent starts](crate#concurrent-starts)): engines starting at the same moment on a
/// fresh database wait for one another instead of failing, and all of them start.
///
/// # Errors
/// Any database error raised while taking the lock or applying a migration (nothing is
/// applied then); on SQLite, `database is locked` when another process holds the write lock
/// for longer than [`MIGRATION_LOCK_WAIT`].
pub async fn migrate(db: &sea_orm_migration::sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    apply(db).await.map(drop)
}

/// Brings the database schema up to date as [`migrate`] does, and names the migrations it
/// applied (none when the schema was up to date), oldest first.
///
/// # Errors
/// As [`migrate`].
pub async fn apply(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<Vec<String>, DbErr> {
    let txn = begin_locked(db).await?;
    let pending = pending_names(&txn).await?;
    Migrator::up(&txn, None).await?;
    txn.commit().await?;
    Ok(pending)
}

/// Where a database's schema stands against this release's migrations, read without
/// changing anything (not even creating [`MIGRATION_TABLE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaStatus {
    /// Migrations of this release the database lacks, oldest first.
    pub pending: Vec<String>,
    /// Migrations recorded as applied that this release does not know: a newer release
    /// migrated the database.
    pub unknown: Vec<String>,
}

impl SchemaStatus {
    /// Whether the schema is exactly this release's.
    pub fn is_current(&self) -> bool {
        self.pending.is_empty() && self.unknown.is_empty()
    }
}

/// Reads which migrations the database lacks, and which it has that this release does not
/// know, without writing anything.
///
/// # Errors
/// Any database error of the reads.
pub async fn status(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<SchemaStatus, DbErr> {
    let manager = SchemaManager::new(db);
    let applied: Vec<String> = if manager.has_table(MIGRATION_TABLE).await? {
        let rows = db
            .query_all_raw(Statement::from_string(
                db.get_database_backend(),
                format!("SELECT version FROM {MIGRATION_TABLE}"),
            ))
            .await?;
        rows.iter()
            .map(|r| r.try_get::<String>("", "version"))
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let known: Vec<String> = Migrator::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    Ok(SchemaStatus {
        pending: known
            .iter()
            .filter(|k| !applied.contains(k))
            .cloned()
            .collect(),
        unknown: applied.into_iter().filter(|a| !known.contains(a)).collect(),
    })
}

/// One pending migration and the SQL statements it would execute.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlannedMigration {
    /// Its name (as recorded in [`MIGRATION_TABLE`] once applied).
    pub name: String,
    /// The statements it executes on this database, in order. Statements that a migration
    /// makes conditional on the schema (a column added only when missing) are listed only
    /// when they would run.
    pub statements: Vec<String>,
}

tokio::task_local! {
    /// Where [`execute`] records the statements it runs, during [`plan`].
    static RECORDER: Arc<Mutex<Vec<String>>>;
}

/// The names of the migrations `txn`'s database lacks, oldest first.
async fn pending_names(txn: &DatabaseTransaction) -> Result<Vec<String>, DbErr> {
    Ok(Migrator::get_pending_migrations(txn)
        .await?
        .iter()
        .map(|m| m.name().to_owned())
        .collect())
}

/// The SQL that [`migrate`] would execute on this database, changing nothing: the pending
/// migrations are applied in one transaction, under the same lock, each statement recorded,
/// and the transaction is rolled back. The bookkeeping rows of [`MIGRATION_TABLE`] are not
/// listed.
///
/// # Errors
/// As [`migrate`]; nothing is applied either way.
pub async fn plan(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<Vec<PlannedMigration>, DbErr> {
    let txn = begin_locked(db).await?;
    let pending = pending_names(&txn).await?;
    let mut planned = Vec::with_capacity(pending.len());
    for name in pending {
        let recorded = Arc::new(Mutex::new(Vec::new()));
        RECORDER
            .scope(recorded.clone(), Migrator::up(&txn, Some(1)))
            .await?;
        let statements = std::mem::take(&mut *recorded.lock().unwrap_or_else(|e| e.into_inner()));
        planned.push(PlannedMigration { name, statements });
    }
    txn.rollback().await?;
    Ok(planned)
}

/// Begins the transaction migrations run in, holding the database-wide migration lock (see
/// [Concurrent starts](crate#concurrent-starts)).
async fn begin_locked(
    db: &sea_orm_migration::sea_orm::DatabaseConnection,
) -> Result<DatabaseTransaction, DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            let txn = db.begin().await?;
            // The engine's sessions stop waiting for a lock after a few seconds and for a
            // statement after half a minute; a start waiting for another engine's migrations,
            // or a migration rewriting a large table, is allowed longer, in this transaction
            // only.
            txn.execute_unprepared(&format!(
                "SET LOCAL lock_timeout = '{}s'; SET LOCAL statement_timeout = 0",
                MIGRATION_LOCK_WAIT.as_secs()
            ))
            .await?;
            txn.execute_unprepared(&format!(
                "SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
            ))
            .await?;
            Ok(txn)
        }
        // A deferred transaction would take the write lock only at its first write, and
        // SQLite cannot wait for a lock upgrade from a stale read snapshot (it fails with
        // SQLITE_BUSY at once); `BEGIN IMMEDIATE` waits for the write lock up front.
        //
        // Each attempt waits up to the connection's busy timeout, polling the lock. Another
        // process that writes without pause (an engine claiming and completing steps) can
        // win the lock at every poll for longer than that, so a start tries again, with
        // growing pauses, for as long as PostgreSQL's start waits for its lock.
        DbBackend::Sqlite => {
            let deadline = tokio::time::Instant::now() + MIGRATION_LOCK_WAIT;
            let mut pause = std::time::Duration::from_millis(5);
            loop {
                let begun = db
                    .begin_with_options(TransactionOptions {
                        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                        ..TransactionOptions::default()
                    })
                    .await;
                match begun {
                    Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_millis(200));
                    }
                    other => return other,
                }
            }
        }
        other => Err(DbErr::Migration(format!(
            "sagaflow does not support the {other:?} backend"
        ))),
    }
}

/// Whether SQLite refused for a lock another connection holds (`SQLITE_BUSY`, or one of its
/// extended codes).
fn is_busy(e: &DbErr) -> bool {
    use sea_orm_migration::sea_orm::RuntimeErr;
    const SQLITE_BUSY: i64 = 5;
    let (DbErr::Conn(RuntimeErr::SqlxError(err))
    | DbErr::Exec(RuntimeErr::SqlxError(err))
    | DbErr::Query(RuntimeErr::SqlxError(err))) = e
    else {
        return false;
    };
    err.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i64>().ok())
        .is_some_and(|c| c & 0xff == SQLITE_BUSY)
}

/// Executes one statement of a migration (recorded while [`plan`] runs).
async fn execute(manager: &SchemaManager<'_>, sql: &str) -> Result<(), DbErr> {
    // Outside `plan` there is no recorder, and nothing is recorded.
    let _ = RECORDER.try_with(|r| {
        r.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(sql.to_owned());
    });
    manager.get_connection().execute_unprepared(sql).await?;
    Ok(())
}

/// Runs a list of SQL statements, choosing the PostgreSQL or SQLite variant.
async fn run_all(
    manager: &SchemaManager<'_>,
    postgres: &[&str],
    sqlite: &[&str],
) -> Result<(), DbErr> {
    let stmts = match manager.get_database_backend() {
        DbBackend::Postgres => postgres,
        DbBackend::Sqlite => sqlite,
        other => {
            return Err(DbErr::Migration(format!(
                "sagaflow does not support the {other:?} backend"
            )));
        }
    };
    for sql in stmts {
        execute(manager, sql).await?;
    }
    Ok(())
}

/// Adds each `(column, definition)` to a table unless it is there already (see
/// [`add_column_if_missing`]).
async fn add_columns_if_missing(
    manager: &SchemaManager<'_>,
    table: &str,
    columns: &[(&str, &str)],
) -> Result<(), DbErr> {
    for (column, definition) in columns {
        add_column_if_missing(manager, table, column, definition).await?;
    }
    Ok(())
}

/// Adds a column to a table unless it is there already (SQLite has no
/// `ADD COLUMN IF NOT EXISTS`). Check and change are safe together under [`migrate`]'s lock.
async fn add_column_if_missing(
    manager: &SchemaManager<'_>,
    table: &str,
    column: &str,
    definition: &str,
) -> Result<(), DbErr> {
    if manager.has_column(table, column).await? {
        return Ok(());
    }
    execute(
        manager,
        &format!("ALTER TABLE {table} ADD COLUMN {column} {definition}"),
    )
    .await
}
