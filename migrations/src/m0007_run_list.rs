//! Listing runs: a count of failed attempts per run, and the indexes that let a console page
//! through a million runs by keyset without scanning.
//!
//! `failed_attempts` counts the attempts of the run's steps (forward and compensation) that
//! ended without success: failures, timeouts and interruptions. It is added to when such an
//! attempt end is written, so the happy path writes nothing more, and it survives the run
//! (step rows leave the hot table when a run finishes). Operators sort by it to triage.
//!
//! Each index ends in `(created_at, id)`, the keyset of "newest first": one per filter a list
//! narrows by (none, workflow, state, business key), and a partial one over the runs that had
//! a failed attempt, for "most failed attempts first".
//!
//! Runs in the database when the migration runs get their count from the history, where every
//! such attempt end left one row.
//!
//! `sagaflow_throughput` counts finished runs per ten seconds, so that "runs finished in the
//! last 15 minutes" is a sum over at most a few hundred rows rather than a count over every
//! run that finished in that time (at 1,000 runs a second, 900,000 index entries). Each
//! transaction that finishes runs adds its count to one of sixteen rows of the current ten
//! seconds (`slot`), so that concurrent writers seldom wait for each other's row.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const RUN_COLUMNS: &[(&str, &str)] = &[("failed_attempts", "INTEGER NOT NULL DEFAULT 0")];

/// Backfill (only rows still at zero that have such history, so it can run again), then the
/// indexes. The same SQL on both backends.
const BOTH: &[&str] = &[
    r#"UPDATE sagaflow_runs SET failed_attempts = (
           SELECT COUNT(*) FROM sagaflow_history h
            WHERE h.run_id = sagaflow_runs.id AND h.step IS NOT NULL
              AND h.event IN ('retry', 'timeout', 'interrupted', 'failed'))
       WHERE failed_attempts = 0 AND EXISTS (
           SELECT 1 FROM sagaflow_history h
            WHERE h.run_id = sagaflow_runs.id AND h.step IS NOT NULL
              AND h.event IN ('retry', 'timeout', 'interrupted', 'failed'))"#,
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_created ON sagaflow_runs (created_at, id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_workflow_created ON sagaflow_runs (workflow, created_at, id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_state_created ON sagaflow_runs (state, created_at, id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_key_created ON sagaflow_runs (business_key, created_at, id) \
     WHERE business_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_failed ON sagaflow_runs (failed_attempts, created_at, id) \
     WHERE failed_attempts > 0",
    r#"CREATE TABLE IF NOT EXISTS sagaflow_throughput (
        bucket BIGINT NOT NULL,
        slot INTEGER NOT NULL,
        finished BIGINT NOT NULL,
        PRIMARY KEY (bucket, slot)
    )"#,
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_runs", RUN_COLUMNS).await?;
        run_all(manager, BOTH, BOTH).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &[
            "DROP TABLE sagaflow_throughput",
            "DROP INDEX sagaflow_runs_failed",
            "DROP INDEX sagaflow_runs_key_created",
            "DROP INDEX sagaflow_runs_state_created",
            "DROP INDEX sagaflow_runs_workflow_created",
            "DROP INDEX sagaflow_runs_created",
            "ALTER TABLE sagaflow_runs DROP COLUMN failed_attempts",
        ];
        run_all(manager, drop, drop).await
    }
}
