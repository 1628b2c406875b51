//! Flow control per remote resource.
//!
//! A step that declares the remote resource it calls (`payments-api`) carries its name in
//! `sagaflow_steps.resource`, and the run's flow key (a tenant, a customer) in `flow_key`,
//! both copied at intake like the priority. The limits of each resource live in
//! `sagaflow_resources`, one row per name, read and written by every instance of a fleet:
//! `defaults` holds the limits the application's code declares (written at each engine's
//! start), `override` those an operator set at run time (they win until cleared), and
//! `tat_us` the rate limiter's theoretical arrival time in microseconds of the database clock.
//!
//! Due steps of a resource are claimed through an index of their own, so that steps waiting
//! for a limit never lie in the path of the ordinary claim: the due-steps index now holds the
//! steps without a resource only, and a second one the steps with one, by resource. A third
//! counts the attempts in flight per resource and key, which is how a limit is kept: there is
//! no counter to drift when an instance dies mid-attempt.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const STEP_COLUMNS: &[(&str, &str)] = &[("resource", "TEXT NULL"), ("flow_key", "TEXT NULL")];
const RUN_COLUMNS: &[(&str, &str)] = &[("flow_key", "TEXT NULL")];

/// The same SQL on both backends. The due-steps index is dropped and created again, so that
/// running `up` over its own result leaves the same indexes.
const UP: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS sagaflow_resources (
        name TEXT PRIMARY KEY,
        defaults TEXT NOT NULL,
        override TEXT NULL,
        override_by TEXT NULL,
        override_reason TEXT NULL,
        tat_us BIGINT NOT NULL DEFAULT 0,
        updated_at BIGINT NOT NULL
    )",
    "DROP INDEX IF EXISTS sagaflow_steps_ready",
    "CREATE INDEX sagaflow_steps_ready ON sagaflow_steps (priority DESC, available_at) \
     WHERE state IN ('ready', 'compensation_ready') AND resource IS NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_resource_ready \
     ON sagaflow_steps (resource, priority DESC, available_at) \
     WHERE state IN ('ready', 'compensation_ready') AND resource IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_resource_running ON sagaflow_steps (resource, flow_key) \
     WHERE state IN ('running', 'compensating') AND resource IS NOT NULL",
];

/// The due-steps index of m0008, then the rest goes.
const DOWN: &[&str] = &[
    "DROP INDEX IF EXISTS sagaflow_steps_resource_running",
    "DROP INDEX IF EXISTS sagaflow_steps_resource_ready",
    "DROP INDEX IF EXISTS sagaflow_steps_ready",
    "CREATE INDEX sagaflow_steps_ready ON sagaflow_steps (priority DESC, available_at) \
     WHERE state IN ('ready', 'compensation_ready')",
    "DROP TABLE IF EXISTS sagaflow_resources",
    "ALTER TABLE sagaflow_runs DROP COLUMN flow_key",
    "ALTER TABLE sagaflow_steps DROP COLUMN flow_key",
    "ALTER TABLE sagaflow_steps DROP COLUMN resource",
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
