//! A resource's capacity kept for compensation attempts (`ResourceLimits::compensation_share`).
//!
//! - `comp_tat_us` on `sagaflow_resources` is the theoretical arrival time of the compensation
//!   attempts' own rate limiter, when a share splits the rate (`tat_us` is then the forward
//!   attempts'); 0 otherwise.
//! - `sagaflow_steps_resource_undo` holds the due compensations of steps with a resource, so
//!   that a claim serving the compensations' share reads them without stepping over every
//!   forward step queued before them. Forward sagas add no entry to it.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const COLUMNS: &[(&str, &str)] = &[("comp_tat_us", "BIGINT NOT NULL DEFAULT 0")];

const UP: &[&str] = &["CREATE INDEX IF NOT EXISTS sagaflow_steps_resource_undo \
     ON sagaflow_steps (resource, priority DESC, available_at) \
     WHERE state = 'compensation_ready' AND resource IS NOT NULL"];

const DOWN: &[&str] = &[
    "DROP INDEX IF EXISTS sagaflow_steps_resource_undo",
    "ALTER TABLE sagaflow_resources DROP COLUMN comp_tat_us",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_resources", COLUMNS).await?;
        run_all(manager, UP, UP).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
