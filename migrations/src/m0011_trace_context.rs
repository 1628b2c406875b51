//! The W3C trace context of every run.
//!
//! `trace_parent` holds the run's `traceparent` (`00-<trace id>-<parent id>-<flags>`): the
//! one given at its start, or a new trace generated for it; `trace_state` the `tracestate`
//! given with it. Every attempt of the run's steps belongs to that trace, whichever instance
//! runs it. The claim reads both with the run's input, which it reads already, so step rows
//! carry no copy.
//!
//! Runs already stored keep `NULL`: their attempts read the run id as the trace id.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const RUN_COLUMNS: &[(&str, &str)] = &[("trace_parent", "TEXT NULL"), ("trace_state", "TEXT NULL")];

const DOWN: &[&str] = &[
    "ALTER TABLE sagaflow_runs DROP COLUMN trace_state",
    "ALTER TABLE sagaflow_runs DROP COLUMN trace_parent",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_runs", RUN_COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
