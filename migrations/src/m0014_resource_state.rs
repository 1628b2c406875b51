//! The state of a resource's batches and circuit breaker, kept with its limits so that every
//! instance of a fleet sees one batch and one breaker.
//!
//! - `batch_count` counts the attempts started in the current batch, and `batch_resume_at`
//!   (database clock, milliseconds) ends the pause after a full batch.
//! - `breaker_state` is `closed`, `open` or `half_open`, entered at `breaker_since`;
//!   `breaker_opened_at` is when it last left `closed` (what the alert on a breaker left open
//!   measures). `breaker_consecutive` counts the failures in a row, `breaker_calls` and
//!   `breaker_failed` the attempts and failures of the current window, which began at
//!   `breaker_window_at`.
//! - `breaker_on` says whether the limits in force have a breaker: the completion of an
//!   attempt adds to the counters only then, so that a resource without one never has its row
//!   written (or locked) by completions.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const COLUMNS: &[(&str, &str)] = &[
    ("batch_count", "BIGINT NOT NULL DEFAULT 0"),
    ("batch_resume_at", "BIGINT NOT NULL DEFAULT 0"),
    ("breaker_on", "BOOLEAN NOT NULL DEFAULT FALSE"),
    ("breaker_state", "TEXT NOT NULL DEFAULT 'closed'"),
    ("breaker_since", "BIGINT NOT NULL DEFAULT 0"),
    ("breaker_opened_at", "BIGINT NULL"),
    ("breaker_consecutive", "BIGINT NOT NULL DEFAULT 0"),
    ("breaker_calls", "BIGINT NOT NULL DEFAULT 0"),
    ("breaker_failed", "BIGINT NOT NULL DEFAULT 0"),
    ("breaker_window_at", "BIGINT NOT NULL DEFAULT 0"),
];

const DOWN: &[&str] = &[
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_window_at",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_failed",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_calls",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_consecutive",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_opened_at",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_since",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_state",
    "ALTER TABLE sagaflow_resources DROP COLUMN breaker_on",
    "ALTER TABLE sagaflow_resources DROP COLUMN batch_resume_at",
    "ALTER TABLE sagaflow_resources DROP COLUMN batch_count",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_resources", COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
