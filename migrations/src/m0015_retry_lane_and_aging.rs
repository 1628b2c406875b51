//! A retry priority and an aging mark for every step.
//!
//! `retry_priority` is the priority a step is queued at after an attempt that did not
//! succeed: its run's priority moved by its workflow's retry lane, copied at intake like the
//! priority. `aging_from` is the instant from which a queued step's wait counts toward its
//! next priority level (when it fell due, then each time the supervisor's aging raised it).
//!
//! The partial index `sagaflow_steps_aging` holds the queued steps that can still gain a
//! level, in the order aging takes them (longest waiting first), so that each aging pass
//! reads only the steps it raises. Steps at the highest priority (1000) leave it.
//!
//! Rows already stored are backfilled: the retry priority is the step's priority (the lane
//! of every workflow so far is `same`), and a queued step's wait counts from when it fell
//! due.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const STEP_COLUMNS: &[(&str, &str)] = &[
    ("retry_priority", "INTEGER NOT NULL DEFAULT 0"),
    ("aging_from", "BIGINT NULL"),
];

/// The same SQL on both backends.
const UP: &[&str] = &[
    "UPDATE sagaflow_steps SET retry_priority = priority, aging_from = available_at",
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_aging ON sagaflow_steps (aging_from) \
     WHERE state IN ('ready', 'compensation_ready') AND priority < 1000",
];

const DOWN: &[&str] = &[
    "DROP INDEX IF EXISTS sagaflow_steps_aging",
    "ALTER TABLE sagaflow_steps DROP COLUMN aging_from",
    "ALTER TABLE sagaflow_steps DROP COLUMN retry_priority",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_steps", STEP_COLUMNS).await?;
        run_all(manager, UP, UP).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
