//! Parked steps: what a waiting step waits for, the events kept for runs, and the link from
//! a child run to the step of its parent that started it.
//!
//! - `sagaflow_steps.wait` holds, as JSON, what a step parked in the `waiting` state waits
//!   for (a timer, a named event, a callback, a child run) and, once woken, what woke it; it
//!   is cleared when the step's next attempt ends. `wait_key` is what deliveries look the
//!   step up by: the SHA-256 of a callback token, or `child:<run id>`.
//! - The partial index `sagaflow_steps_waiting` holds the steps with a stored wait (the
//!   parked ones, and the few resuming after one) by due time, so the leader's timer pass
//!   reads only the steps whose time came.
//! - `sagaflow_events` keeps named events sent to a run (by id or business key) until a step
//!   waits for them: an event that arrives before its step waits is not lost.
//! - `sagaflow_runs.parent_step` is the row id of the parent's step that started a child
//!   run; the child's end wakes that step.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const STEP_COLUMNS: &[(&str, &str)] = &[("wait", "TEXT NULL"), ("wait_key", "TEXT NULL")];
const RUN_COLUMNS: &[(&str, &str)] = &[("parent_step", "BIGINT NULL")];

const TABLES: &str = r#"CREATE TABLE IF NOT EXISTS sagaflow_events (
        id {serial},
        run_id {uuid} NOT NULL,
        name TEXT NOT NULL,
        payload TEXT NOT NULL,
        actor TEXT NOT NULL,
        received_at BIGINT NOT NULL,
        consumed_at BIGINT NULL,
        step_id BIGINT NULL
    )"#;

const INDEXES: &[&str] = &[
    // Keyed on `wait`, not on `state = 'waiting'`: SQLite would otherwise plan every
    // statement that compares `state` with a bound value anew at each execution, to see
    // whether the value matches the index's predicate (the evaluator's writes do).
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_waiting ON sagaflow_steps (available_at) \
     WHERE wait IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_wait_key ON sagaflow_steps (wait_key) \
     WHERE wait_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_events_kept ON sagaflow_events (run_id, name, id) \
     WHERE consumed_at IS NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_parent ON sagaflow_runs (parent_step) \
     WHERE parent_step IS NOT NULL",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_steps", STEP_COLUMNS).await?;
        add_columns_if_missing(manager, "sagaflow_runs", RUN_COLUMNS).await?;
        let pg = TABLES
            .replace("{uuid}", "UUID")
            .replace("{serial}", "BIGSERIAL PRIMARY KEY");
        let lite = TABLES
            .replace("{uuid}", "BLOB")
            .replace("{serial}", "INTEGER PRIMARY KEY AUTOINCREMENT");
        run_all(manager, &[&pg], &[&lite]).await?;
        run_all(manager, INDEXES, INDEXES).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &[
            "DROP INDEX IF EXISTS sagaflow_runs_parent",
            "DROP INDEX IF EXISTS sagaflow_steps_wait_key",
            "DROP INDEX IF EXISTS sagaflow_steps_waiting",
            "DROP TABLE sagaflow_events",
            "ALTER TABLE sagaflow_runs DROP COLUMN parent_step",
            "ALTER TABLE sagaflow_steps DROP COLUMN wait_key",
            "ALTER TABLE sagaflow_steps DROP COLUMN wait",
        ];
        run_all(manager, drop, drop).await
    }
}
