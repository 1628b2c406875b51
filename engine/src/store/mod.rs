//! The storage seam: every SQL statement of sagaflow lives below this module.
//!
//! One [`Store`] over a sea-orm connection serves PostgreSQL and SQLite. What differs in the
//! SQL text between them comes from one `Dialect` per backend, in `postgres.rs` and
//! `sqlite.rs`; a path that exists on one backend only (PostgreSQL's one-statement intake and
//! claim, its `NOTIFY`) is a strategy of its operation, chosen at one `if` on the backend. The
//! store decides nothing: transitions are decided by [`crate::transition`] and persisted
//! through a [`StoreTx`] unit of work, which only use cases commit; [`StoreTx::commit`]
//! returns what [`Happened`] for metrics to record. Every time is read from the database's
//! clock (AT-2) and stored as epoch milliseconds. Every write for a claimed step is fenced
//! by `(id, state, attempt, locked_by)`: a late agent's write matches no row (SAS-3).
//!
//! # Operations
//!
//! Every public operation, by the noun it works on; each name starts with its noun, and an
//! operation of more than four arguments takes a struct ([`Election`], [`ResourceAsk`],
//! [`ScheduleTick`]). A test (`engine/tests/layers.rs`) keeps this list whole and the names
//! noun-first.
//!
//! - connection and units of work: [`Store::open`], [`Store::open_replica`],
//!   [`Store::replica_lag`], [`Store::is_replica`], [`Store::wal_position`],
//!   [`Store::primary_moves`], [`Store::primary_split_brain`], [`Store::primary_looks`],
//!   [`Store::connect`],
//!   [`Store::from_connection`], [`Store::schema_migrate`], [`Store::connection`],
//!   [`Store::executor`], [`Store::backend`], [`Store::target`], [`Store::has_file`],
//!   [`Store::check_file`], [`Store::lost_or`], [`Store::now_ms`], [`Store::with_pause_hook`],
//!   [`Store::begin`]; [`StoreTx::commit`], [`StoreTx::commit_from`], [`StoreTx::rollback`],
//!   [`StoreTx::notify`], [`StoreTx::pause_point`]
//! - runs: [`Store::run_insert`], [`Store::run_insert_batch`], [`Store::run_insert_many`],
//!   [`Store::run_get`], [`Store::run_view`], [`Store::run_page`], [`Store::run_by_key`], [`Store::run_steps`],
//!   [`Store::run_history`], [`Store::run_history_after`], [`Store::run_list`], [`Store::run_list_dirty`],
//!   [`Store::run_child_of_step`], [`Store::run_count_by_state`],
//!   [`Store::run_unfinished_keys`], [`Store::runs_unfinished_page`],
//!   [`Store::runs_compensating_among`], [`Store::run_count_finished`],
//!   [`Store::run_purge_finished`], [`Store::run_purge_due`], [`Store::run_fill_finished`];
//!   in a unit of work
//!   [`StoreTx::runs_lock`], [`StoreTx::run_lock_for_action`], [`StoreTx::run_state_locked`],
//!   [`StoreTx::runs_mark_dirty`], [`StoreTx::run_set_aside`], [`StoreTx::run_set_input`],
//!   [`StoreTx::runs_unfinished_of`], [`StoreTx::run_migrate`], [`StoreTx::run_history`],
//!   [`StoreTx::run_lock_for_restart`], [`StoreTx::run_restart`]
//! - steps: [`Store::step_claim`], [`Store::step_claim_with_inputs`], [`Store::step_inputs`],
//!   [`Store::steps_read`], [`Store::step_deadlines`], [`Store::step_list_owned`],
//!   [`Store::step_list_rescuable`], [`Store::step_queue_depth`], [`Store::steps_waiting`],
//!   [`Store::steps_waiting_count`], [`Store::step_age`], [`Store::step_age_plan`],
//!   [`Store::step_set_progress`]; in a unit
//!   of work [`StoreTx::steps_lock`], [`StoreTx::steps_lock_ahead`], [`StoreTx::steps_park_of_paused`],
//!   [`StoreTx::steps_wake_due`]
//! - plans, attempts, fences, parks and waits (in a unit of work): [`StoreTx::plan_apply`],
//!   [`StoreTx::attempts_write`], [`StoreTx::fence_check`], [`StoreTx::parks_follow_up`],
//!   [`StoreTx::wait_deliver`]
//! - callbacks: [`Store::callback_register`], [`Store::callback_live_now`]; in a unit of work
//!   [`StoreTx::callback_live`]
//! - history: [`Store::history_event_counts`], [`Store::history_partitions_maintain`]; in a
//!   unit of work [`StoreTx::history_push`]
//! - alerts: [`Store::alert_insert`], [`Store::alert_insert_fenced`], [`Store::alert_list`],
//!   [`Store::alert_open_keys`], [`Store::alert_resolve`], [`Store::alert_resolve_key`],
//!   [`Store::alert_resolve_key_fenced`], [`Store::alert_resolve_stall`]
//! - notices to deliver: [`Store::outbox_pending`], [`Store::outbox_done`],
//!   [`Store::outbox_purge`], [`Store::delivery_record`], [`Store::delivery_list`],
//!   [`Store::delivery_counts`], [`Store::delivery_redeliver`]
//! - definitions and workflows: [`Store::definitions_publish`], [`Store::definition_list`],
//!   [`Store::definition_get`], [`Store::definition_latest`], [`Store::workflows_uncovered`]
//! - resources: [`Store::resources_publish`], [`Store::resource_list`],
//!   [`Store::resource_override`], [`Store::resource_claim`]
//! - schedules: [`Store::schedules_publish`], [`Store::schedule_list`],
//!   [`Store::schedule_get`], [`Store::schedules_due`], [`Store::schedule_advance`],
//!   [`Store::schedule_started`], [`Store::schedule_pause`], [`Store::schedule_resume`]
//! - instances: [`Store::instance_register`], [`Store::instance_heartbeat`],
//!   [`Store::instance_set_workflows`], [`Store::instance_stop`], [`Store::instance_list`],
//!   [`Store::instance_purge`]
//! - the leader's lease: [`Store::leader_try_elect`], [`Store::leader_try_elect_with`],
//!   [`Store::leader_renew`], [`Store::leader_release`], [`Store::leader_record_sweep`],
//!   [`Store::leader_progress`], [`Store::leader_current`]
//! - statistics: [`Store::stats`], [`Store::queue_by_workflow`]
//!
//! Files: one per noun (`runs.rs`, `intake.rs` and `list.rs` for runs; `steps.rs`,
//! `attempts.rs`, `aging.rs`, `waits.rs`, `rewrite.rs` for migrations, …); `sql.rs` builds
//! statements; `options.rs`, `open.rs`, `primary.rs` and `file.rs` configure, open and watch
//! the database (`primary.rs` follows the primary among several PostgreSQL servers);
//! `partitions.rs` makes and drops the history's day partitions on PostgreSQL;
//! `tx.rs` is the unit of work; `rows.rs` decodes rows.

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
mod partitions;
mod plans;
mod postgres;
mod primary;
mod resources;
mod restart;
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
pub use leases::{Election, LeaderFence, LeaderProgress};
pub use list::{RUN_PAGE_DEFAULT, RUN_PAGE_MAX, RunOrder, RunPage, RunQuery, RunSummary};
pub use lite::{LiteDb, LiteTx};
pub use options::{
    ACQUIRE_TIMEOUT_DEFAULT, CONNECT_TIMEOUT_DEFAULT, IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
    LOCK_TIMEOUT_DEFAULT, PRIMARY_CHECK_INTERVAL_DEFAULT, STATEMENT_TIMEOUT_DEFAULT, SqliteSync,
    StoreOptions, redact_url,
};
pub use outbox::{DeliveryRecord, DeliveryResult, DeliveryTry, PendingNotice, PendingPage};
pub use partitions::PartitionPass;
pub use plans::{EvalApplied, PlanWrite, StepWrite};
pub use postgres::READY_CHANNEL;
pub use resources::{ResourceAsk, ResourceClaim, ResourceOutcomes};
pub use restart::RestartWrite;
pub use rewrite::{MigrationWrite, StepInsert, StepUpdate};
pub(crate) use row::from_row;
pub use row::{Cell, Exec, FromRow, LiteRow, Row};
pub use rows::{ClaimedStep, Damage, ExpiredStep, RunRow, RunView, StepRow, quote};
pub use runs::RunDetail;
pub use schedules::{DueSchedule, DueSchedules, ScheduleTick};
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
    /// The watcher following the primary when the URL names standbys too.
    primary: Option<primary::Watcher>,
    /// Opened on a read replica ([`Store::open_replica`]): reads only, which may lag.
    replica: bool,
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
    /// [`Store::schema_migrate`]).
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
            primary: None,
            replica: false,
        })
    }

    /// Applies pending migrations.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn schema_migrate(&self) -> Result<()> {
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

    /// The tables a run's row can be in: the runs table and, on PostgreSQL, the finished
    /// runs' (migration `m0025`). Reads go through the view of both, `sagaflow_runs_all`.
    pub(crate) fn run_tables(&self) -> &'static [&'static str] {
        match self.backend {
            Backend::Postgres => &["sagaflow_runs", sagaflow_migrations::partitions::RUNS_DONE],
            Backend::Sqlite => &["sagaflow_runs"],
        }
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

    /// With a URL naming a primary and its standbys: a count that goes up each time the
    /// store's pool moves to another server (a promoted standby), for a holder of a long-lived
    /// connection to reconnect; `None` with one server.
    pub fn primary_moves(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.primary.as_ref().map(|w| w.moves.clone())
    }

    /// With a URL naming a primary and its standbys: the servers of its cluster accepting
    /// writes that the store's last look at every server found, when it found more than one
    /// (a split brain: a former primary on an older timeline counts, though the store
    /// refuses it), or that an earlier look found while one of them has not answered since;
    /// `None` otherwise, and with one server.
    pub fn primary_split_brain(&self) -> Option<String> {
        self.primary.as_ref().and_then(|w| w.pin.split_brain())
    }

    /// With a URL naming a primary and its standbys: how many looks at every server the
    /// store has taken (one at the open, then every tenth check of the primary and after
    /// each failed one); `None` with one server. For a test to wait on looks, not on time.
    pub fn primary_looks(&self) -> Option<u64> {
        self.primary.as_ref().map(|w| w.pin.looks())
    }

    /// The primary's current WAL position (`pg_current_wal_lsn()`), which a replica that has
    /// replayed up to it has caught up with ([`Store::replica_lag`]).
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::Config`] on SQLite, which has no WAL positions.
    pub async fn wal_position(&self) -> Result<String> {
        if self.backend != Backend::Postgres {
            return Err(Error::Config(
                "SQLite has no WAL position to replicate".into(),
            ));
        }
        let row = self
            .exec
            .query_one(self.stmt("SELECT pg_current_wal_lsn()::text AS lsn", vec![]))
            .await?;
        row.map(|r| r.try_get::<String>("", "lsn"))
            .transpose()?
            .ok_or_else(|| Error::corrupt("wal", "lsn", "no row"))
    }

    /// How far a store opened on a read replica ([`Store::open_replica`]) is behind the
    /// primary whose WAL position was `primary_lsn` ([`Store::wal_position`]) a moment ago:
    /// zero once it has replayed that far, else the time since the last transaction it
    /// replayed committed (by the two servers' clocks): an upper bound, since the primary
    /// may have been idle since. `None` on a store that is not a replica's.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn replica_lag(&self, primary_lsn: &str) -> Result<Option<std::time::Duration>> {
        if !self.replica {
            return Ok(None);
        }
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT CASE \
                   WHEN NOT pg_is_in_recovery() OR pg_last_wal_replay_lsn() >= CAST($1 AS pg_lsn) THEN 0 \
                   ELSE COALESCE((EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()) \
                         * 1000)::BIGINT, 0) END AS lag",
                vec![primary_lsn.into()],
            ))
            .await?;
        let ms = row
            .map(|r| r.try_get::<i64>("", "lag"))
            .transpose()?
            .ok_or_else(|| Error::corrupt("replica", "lag", "no row"))?;
        Ok(Some(std::time::Duration::from_millis(
            u64::try_from(ms).unwrap_or(0),
        )))
    }

    /// Whether this store reads a replica ([`Store::open_replica`]).
    pub fn is_replica(&self) -> bool {
        self.replica
    }

    /// The database's clock, read through `conn` (in a transaction, for example).
    pub(crate) async fn now_ms_in<C: Exec>(&self, conn: &C) -> Result<i64> {
        self.clock_ms(conn, "SELECT {now} AS now").await
    }

    /// The database's clock without a test clock's offset (`{wall_now}`): what judges
    /// whether a process is alive, and the time run ids are minted in.
    pub(crate) async fn wall_now_ms(&self) -> Result<i64> {
        self.clock_ms(&self.exec, "SELECT {wall_now} AS now").await
    }

    /// The column `now` of the one row `sql` reads.
    async fn clock_ms<C: Exec>(&self, conn: &C, sql: &str) -> Result<i64> {
        let row = conn.query_one(self.stmt(sql, vec![])).await?;
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
