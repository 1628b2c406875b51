//! Secrets the engines of one database share.
//!
//! `sagaflow_secrets` holds one row per named secret, created by the first engine that needs
//! it (`INSERT … ON CONFLICT DO NOTHING`, so engines starting together agree on one value)
//! and read once per engine. `callback_mac` is the key that signs callback tokens, so that
//! a forged token is refused without a database read. The value is never part of a
//! migration's statements, which the dry run prints: the engine generates it.

use sea_orm_migration::prelude::*;

use super::run_all;

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The same SQL on both backends.
const UP: &[&str] = &["CREATE TABLE IF NOT EXISTS sagaflow_secrets (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        created_at BIGINT NOT NULL
    )"];

const DOWN: &[&str] = &["DROP TABLE IF EXISTS sagaflow_secrets"];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, UP, UP).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
