//! Leader progress (LE-3): the lease row records when the leader's last sweep completed, on
//! the database clock. Each completed sweep writes it, fenced by the lease term; followers
//! read it to raise a `supervisor_stalled` alert when no leader has swept for too long. `NULL`
//! means no sweep is recorded yet; the next election sets it.

use sea_orm_migration::prelude::*;

use super::{add_column_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Re-runnable over its own result, as every migration (see the crate documentation).
        add_column_if_missing(manager, "sagaflow_leases", "last_sweep_at", "BIGINT NULL").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &["ALTER TABLE sagaflow_leases DROP COLUMN last_sweep_at"];
        run_all(manager, drop, drop).await
    }
}
