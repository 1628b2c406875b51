//! The storage seam: every SQL statement of sagaflow lives below this module.
//!
//! One [`Store`] over a sea-orm connection serves PostgreSQL and SQLite; the few statements
//! that differ per backend take their fragments from `postgres.rs` and `sqlite.rs`. The store
//! decides nothing: transitions are decided by [`crate::transition`] and persisted through a
//! [`StoreTx`] unit of work. Every
//! time is read from the database's clock (AT-2) and stored as epoch milliseconds. Every write
//! for a claimed step is fenced by `(id, state, attempt, locked_by)`: a late agent's write
//! matches no row (SAS-3).
//!
//! Files: this one holds [`Store`] and its backend tag; `sql.rs` builds statements for both
//! backends; `options.rs`, `open.rs` and `file.rs` configure, open and watch the database;
//! `tx.rs` is the unit of work and `plans.rs` writes decided plans through it; the tables
//! have `intake.rs`, `runs.rs`, `steps.rs` (claims, inputs, rescue listings),
//! `attempts.rs` (fenced attempt-end writes), `aging.rs` (priority aging), `instances.rs`, `coverage.rs` (workflows no live instance
//! runs),
//! `alerts.rs` and `leases.rs`;
//! `rows.rs` decodes rows.

mod aging;
mod alerts;
mod attempts;
mod conn;
mod coverage;
mod definitions;
mod file;
mod happened;
mod instances;
mod intake;
mod leases;
mod list;
mod lite;
mod open;
mod options;
mod outbox;
mod plans;
mod postgres;
mod resources;
mod rewrite;
mod row;
mod rows;
mod runs;
mod schedules;
mod sql;
mod sqlite;
mod stats;
mod steps;
mod tx;
mod views;
mod waits;
mod wake;

use std::sync::Arc;

use sea_orm::{DatabaseConnection, DbBackend, Statement};

pub use alerts::NewAlert;
pub use attempts::{DeadlineGuard, RescueCounts, StepFinish, WaitWrite};
pub use conn::{Db, Txn};
pub use coverage::Uncovered;
pub use definitions::PublishedDefinition;
pub use happened::Happened;
pub(crate) use happened::RunMoved;
pub use instances::{InstanceRow, Registered};
pub use intake::{NewRun, NewStep, RunInsertOutcome, RunStart};
pub use leases::{LeaderFence, LeaderProgress};
pub use list::{RUN_PAGE_DEFAULT, RUN_PAGE_MAX, RunOrder, RunPage, RunQuery, RunSummary};
pub use lite::{LiteDb, LiteTx};
pub use options::{
    ACQUIRE_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT, IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
    LOCK_TIMEOUT_DEFAULT, STATEMENT_TIMEOUT_DEFAULT, SqliteSync, StoreOptions, redact_url,
};
pub use outbox::{DeliveryRecord, DeliveryResult, PendingNotice, PendingPage};
pub use plans::{EvalApplied, PlanWrite, StepWrite};
pub use postgres::READY_CHANNEL;
pub use resources::{ResourceClaim, ResourceOutcomes};
pub use rewrite::{MigrationWrite, StepInsert, StepUpdate};
pub(crate) use row::from_row;
pub use row::{Cell, Exec, FromRow, LiteRow, Row};
pub use rows::{ClaimedStep, Damage, ExpiredStep, RunRow, RunView, StepRow, quote};
pub use schedules::{DueSchedule, DueSchedules};
pub use stats::{ActiveCount, FinishedCounts, Stats, WorkflowQueue};
pub use steps::StepInputs;
pub use tx::{RunSteps, StoreTx};
pub use waits::{EventDelivery, Park, WaitingStep};
pub use wake::Wake;

use sql::placeholders;

use crate::{Error, Result};

/// Connections of the PostgreSQL pool besides the completion writers': the wake-up listener,
/// the claim and evaluation loops, the supervisor, the submitter, and two for reads
/// (operators' and the application's queries).
pub const PG_POOL_BESIDE_WRITERS: u32 = 8;

/// Fewest and most completion writers the default picks.
pub const COMPLETION_WRITERS_RANGE: (usize, usize) = (2, 8);

/// Default number of completion writers (transactions writing results concurrently): one
/// per core of this machine, at least 2 and at most 8 ([`COMPLETION_WRITERS_RANGE`]).
///
/// On a 2-core machine running the engine and PostgreSQL, one writer per core was the best
/// of 1, 2, 4 and 8 (docs/benchmarks.md): one writer leaves the database idle while a batch
/// travels, more writers than cores make the transactions contend for the same CPUs. Two at
/// least, so one batch is written while the next is collected.
pub fn completion_writers_default() -> usize {
    let (min, max) = COMPLETION_WRITERS_RANGE;
    std::thread::available_parallelism()
        .map_or(min, std::num::NonZeroUsize::get)
        .clamp(min, max)
}

/// Default size of the PostgreSQL connection pool: one connection for each completion writer
/// ([`completion_writers_default`], one per core) and
/// [`PG_POOL_BESIDE_WRITERS`] for the rest; 10 on a 2-core machine. The pool opens
/// connections as they are needed, up to this size.
pub fn pg_pool_default() -> u32 {
    let writers = u32::try_from(completion_writers_default()).unwrap_or(8);
    PG_POOL_BESIDE_WRITERS + writers
}

/// Which database is behind the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// SQLite (a file; one writer at a time).
    Sqlite,
}

/// The state store (SAS-1): runs, steps, history, alerts and leases.
#[derive(Clone)]
pub struct Store {
    /// The sea-orm pool: migrations, and applications' own transactions
    /// ([`Store::connection`]).
    db: DatabaseConnection,
    /// Where the store's own statements run: the pool, or the SQLite fast path.
    exec: conn::Db,
    backend: Backend,
    /// The database, without password (for errors and `Debug`).
    target: Arc<str>,
    /// The SQLite file opened, to notice it deleted or replaced.
    file: Option<Arc<file::FileIdentity>>,
    /// A test clock's offset, added to `{now}` (tests only).
    clock: Option<crate::clock::TestClock>,
    /// Pause points armed by a test (see [`crate::interleave`]).
    pauses: Option<Arc<crate::interleave::PauseHook>>,
    /// The key that signs callback tokens, read (or created) once.
    callback_key: Arc<tokio::sync::OnceCell<crate::wait::CallbackKey>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the connection: the driver's options print the password.
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// sagaflow acts on a commit as soon as it is acknowledged (it claims the next step, calls
    /// the next service). With `synchronous_commit = off`, a PostgreSQL crash can lose commits
    /// that were acknowledged, and a run can then be compensated although a later step already
    /// took effect. Say so loudly; the setting is the operator's to change.
    async fn warn_if_commits_are_asynchronous(&self) {
        let setting = self
            .exec
            .query_one(Statement::from_string(
                DbBackend::Postgres,
                "SHOW synchronous_commit",
            ))
            .await
            .ok()
            .flatten()
            .and_then(|r| r.try_get::<String>("", "synchronous_commit").ok());
        if setting.as_deref() == Some("off") {
            tracing::warn!(
                "PostgreSQL runs with synchronous_commit=off: a server crash can lose commits \
                 sagaflow already acted on; its guarantees assume synchronous_commit=on"
            );
        }
    }

    /// Wraps an existing connection (schema must already be migrated; see
    /// [`Store::migrate`]).
    ///
    /// # Errors
    /// [`Error::Config`] for a backend other than PostgreSQL or SQLite.
    pub fn from_connection(db: DatabaseConnection) -> Result<Self> {
        let backend = match db.get_database_backend() {
            DbBackend::Postgres => Backend::Postgres,
            DbBackend::Sqlite => Backend::Sqlite,
            other => return Err(Error::Config(format!("unsupported backend {other:?}"))),
        };
        Ok(Self {
            exec: conn::Db::Pool(db.clone()),
            db,
            backend,
            target: Arc::from("(an existing connection)"),
            file: None,
            clock: None,
            pauses: None,
            callback_key: Arc::default(),
        })
    }

    /// Applies pending migrations.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn migrate(&self) -> Result<()> {
        sagaflow_migrations::migrate(&self.db).await?;
        Ok(())
    }

    /// The underlying connection pool (to begin transactions that include a run start).
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Where the store's own statements run (the SQLite fast path on a file).
    pub fn executor(&self) -> &Db {
        &self.exec
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// This store with pause points a test armed (see [`crate::interleave`]): its units of
    /// work stop where the hook holds them. Never used outside tests.
    #[doc(hidden)]
    #[must_use]
    pub fn with_pause_hook(mut self, hook: Arc<crate::interleave::PauseHook>) -> Self {
        self.pauses = Some(hook);
        self
    }

    /// Stops while a test's hook holds the answer of a forward attempt of `step`.
    pub(crate) async fn pause_answer(&self, step: &str) {
        if let Some(h) = &self.pauses {
            h.reach_answer(step).await;
        }
    }

    /// Stops at `point` of `unit` when a test's hook holds it.
    pub(crate) async fn pause_point(
        &self,
        unit: crate::interleave::Unit,
        point: crate::interleave::Point,
    ) {
        if let Some(h) = &self.pauses {
            h.reach(unit, point).await;
        }
    }

    /// The database's clock, in epoch milliseconds.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn now_ms(&self) -> Result<i64> {
        self.now_ms_in(&self.exec).await
    }

    /// The database's clock, read through `conn` (in a transaction, for example).
    pub(crate) async fn now_ms_in<C: Exec>(&self, conn: &C) -> Result<i64> {
        let row = conn
            .query_one(self.stmt("SELECT {now} AS now", vec![]))
            .await?;
        row.map(|r| r.try_get::<i64>("", "now"))
            .transpose()?
            .ok_or_else(|| Error::corrupt("clock", "now", "no row"))
    }

    /// On PostgreSQL, notifies listening engines that steps are ready; delivered when the
    /// surrounding transaction commits (and dropped if it rolls back). A no-op on SQLite,
    /// where one file has one process writing at a time and the local wake-up suffices.
    pub(crate) async fn notify_ready<C: Exec>(&self, conn: &C) -> Result<()> {
        if self.backend == Backend::Postgres {
            conn.execute_unprepared(&format!("NOTIFY {}", postgres::READY_CHANNEL))
                .await?;
        }
        Ok(())
    }
}
