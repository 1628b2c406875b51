//! What each engine instance runs.
//!
//! `sagaflow_instances.workflows` holds the `name@version` keys of the workflow definitions an
//! instance has registered, as a JSON array of strings, written when it registers and again
//! whenever a definition is registered or unregistered on it while it runs. The supervisor
//! leader reads it to tell when due steps of a workflow wait for an instance that can run
//! them. Instances registered by an older release keep `NULL`: what they run is unknown.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const INSTANCE_COLUMNS: &[(&str, &str)] = &[("workflows", "TEXT NULL")];

const DOWN: &[&str] = &["ALTER TABLE sagaflow_instances DROP COLUMN workflows"];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_instances", INSTANCE_COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
