//! Live progress (`StepContext::progress`): `progress` on `sagaflow_steps` holds the latest
//! progress the attempt in flight reported (JSON), written only while that attempt holds the
//! step. Never indexed: it is read with its step. Rows written before read `NULL`.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const COLUMNS: &[(&str, &str)] = &[("progress", "TEXT NULL")];

const DOWN: &[&str] = &["ALTER TABLE sagaflow_steps DROP COLUMN progress"];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_steps", COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
