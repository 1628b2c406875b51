//! Hot-path tuning from profiling the order-saga benchmark on PostgreSQL: fewer index writes
//! per run and per history row, room for in-place (HOT) run updates, and autovacuum settings
//! for tables that behave like queues.

use sea_orm_migration::prelude::*;

use super::run_all;

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// Both backends: the dirty-run index no longer holds `updated_at`, which every run update
/// changes (an indexed column that changes rules out PostgreSQL's in-place HOT update; the
/// few dirty runs are sorted at read time instead).
///
/// Every statement of `up` can run again over its own result (`IF EXISTS`, `IF NOT EXISTS`,
/// settings), so a half-applied run of it is completed, not wedged.
const DIRTY_INDEX: [&str; 2] = [
    "DROP INDEX IF EXISTS sagaflow_runs_dirty",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_dirty ON sagaflow_runs (workflow_key) WHERE dirty",
];

const POSTGRES: &[&str] = &[
    // Free space on each page lets a run's state change stay on its page (HOT: no index writes).
    "ALTER TABLE sagaflow_runs SET (fillfactor = 85, autovacuum_vacuum_scale_factor = 0.02, \
     autovacuum_analyze_scale_factor = 0.02)",
    // Steps are a queue: few live rows, many dead versions. Vacuum and analyze by row count,
    // not by a fraction of a table whose live size is near zero.
    "ALTER TABLE sagaflow_steps SET (autovacuum_vacuum_scale_factor = 0, \
     autovacuum_vacuum_threshold = 2000, autovacuum_analyze_scale_factor = 0, \
     autovacuum_analyze_threshold = 2000)",
    // A run has a handful of steps, and its history a few dozen rows per run: say so, rather
    // than let ANALYZE guess the number of distinct runs from a sample of a queue table taken
    // at a random moment. A low guess makes `run_id = ANY(…)` look unselective and turns
    // every per-batch lookup into a sequential scan (seen in profiles; milliseconds each).
    "ALTER TABLE sagaflow_steps ALTER COLUMN run_id SET (n_distinct = -0.25)",
    "ALTER TABLE sagaflow_history ALTER COLUMN run_id SET (n_distinct = -0.05)",
    // The foreign key from steps to runs cost half of every step insert (a per-row trigger
    // that also locks the run row). Steps are written only by the engine, in the statement
    // or transaction that writes their run, and leave with the run's completion; a step
    // whose run row is missing is failed at its claim as a corrupt row and never runs.
    "ALTER TABLE sagaflow_steps DROP CONSTRAINT IF EXISTS sagaflow_steps_run_id_fkey",
    // History is read by run only: one index, (run_id, id), serves as the primary key.
    "ALTER TABLE sagaflow_history DROP CONSTRAINT IF EXISTS sagaflow_history_pkey",
    "DROP INDEX IF EXISTS sagaflow_history_run",
    "ALTER TABLE sagaflow_history ADD CONSTRAINT sagaflow_history_pkey PRIMARY KEY (run_id, id)",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let pg: Vec<&str> = DIRTY_INDEX.iter().chain(POSTGRES).copied().collect();
        run_all(manager, &pg, &DIRTY_INDEX).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let index = [
            "DROP INDEX sagaflow_runs_dirty",
            "CREATE INDEX sagaflow_runs_dirty ON sagaflow_runs (workflow_key, updated_at) WHERE dirty",
        ];
        let pg: Vec<&str> = index
            .iter()
            .copied()
            .chain([
                "ALTER TABLE sagaflow_runs RESET (fillfactor, autovacuum_vacuum_scale_factor, \
                 autovacuum_analyze_scale_factor)",
                "ALTER TABLE sagaflow_steps RESET (autovacuum_vacuum_scale_factor, \
                 autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, \
                 autovacuum_analyze_threshold)",
                "ALTER TABLE sagaflow_steps ALTER COLUMN run_id RESET (n_distinct)",
                "ALTER TABLE sagaflow_history ALTER COLUMN run_id RESET (n_distinct)",
                "ALTER TABLE sagaflow_history DROP CONSTRAINT sagaflow_history_pkey",
                "ALTER TABLE sagaflow_history ADD PRIMARY KEY (id)",
                "ALTER TABLE sagaflow_steps ADD CONSTRAINT sagaflow_steps_run_id_fkey \
                 FOREIGN KEY (run_id) REFERENCES sagaflow_runs (id) ON DELETE CASCADE",
                "CREATE INDEX sagaflow_history_run ON sagaflow_history (run_id, id)",
            ])
            .collect();
        run_all(manager, &pg, &index).await
    }
}
