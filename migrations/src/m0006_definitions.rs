//! Published workflow definitions: every engine records, on start, the workflows it runs
//! (name, version, step graph, policies, input schema) as a JSON description, so that a
//! console or an HTTP client can draw and validate them without the application's code. One
//! row per `name@version`; the description is the engine's JSON text, compared as text.

use sea_orm_migration::prelude::*;

use super::run_all;

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const BOTH: &[&str] = &[r#"CREATE TABLE IF NOT EXISTS sagaflow_definitions (
        workflow_key TEXT PRIMARY KEY NOT NULL,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        description TEXT NOT NULL,
        published_by TEXT NOT NULL,
        published_at BIGINT NOT NULL
    )"#];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // Re-runnable over its own result, as every migration (see the crate documentation).
        run_all(manager, BOTH, BOTH).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &["DROP TABLE sagaflow_definitions"];
        run_all(manager, drop, drop).await
    }
}
