//! A start time and a priority for every run.
//!
//! `priority` (higher is claimed first, 0 by default) is stored on the run and copied onto
//! each of its step rows at intake, so that the claim orders due steps by it without a join.
//! `start_at` records when a run was asked to start, on the database clock, for a run started
//! later; its first steps are inserted with that due time.
//!
//! The index of due steps is recreated in the claim's order, `(priority DESC, available_at)`,
//! so that the claim still reads its batch as the first entries of one partial index.
//!
//! Rows already stored take the defaults: priority 0 (the claim order among them is as
//! before, oldest due first) and no scheduled start.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const RUN_COLUMNS: &[(&str, &str)] = &[
    ("priority", "INTEGER NOT NULL DEFAULT 0"),
    ("start_at", "BIGINT NULL"),
];

const STEP_COLUMNS: &[(&str, &str)] = &[("priority", "INTEGER NOT NULL DEFAULT 0")];

/// The due-steps index in the claim's order (the same SQL on both backends). Dropped and
/// created again, so that running `up` over its own result leaves the same index.
const UP: &[&str] = &[
    "DROP INDEX IF EXISTS sagaflow_steps_ready",
    "CREATE INDEX sagaflow_steps_ready ON sagaflow_steps (priority DESC, available_at) \
     WHERE state IN ('ready', 'compensation_ready')",
];

/// The index of m0001, then the columns go.
const DOWN: &[&str] = &[
    "DROP INDEX IF EXISTS sagaflow_steps_ready",
    "CREATE INDEX sagaflow_steps_ready ON sagaflow_steps (available_at) \
     WHERE state IN ('ready', 'compensation_ready')",
    "ALTER TABLE sagaflow_steps DROP COLUMN priority",
    "ALTER TABLE sagaflow_runs DROP COLUMN start_at",
    "ALTER TABLE sagaflow_runs DROP COLUMN priority",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_runs", RUN_COLUMNS).await?;
        add_columns_if_missing(manager, "sagaflow_steps", STEP_COLUMNS).await?;
        run_all(manager, UP, UP).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
