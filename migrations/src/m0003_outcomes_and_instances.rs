//! Interruptions, engine instances and business-key lookups.
//!
//! - Steps count **interruptions** (attempts lost with their engine instance: a crash, a
//!   frozen process, a shutdown) apart from failures, with their own cap.
//! - **Instances** heartbeat on the database clock; the supervisor leader releases the
//!   in-flight work of an instance whose heartbeat went stale instead of waiting out each
//!   step's deadline, and may take over the leader lease such an instance held.
//! - Runs are found by `(workflow, business_key)` whether active or finished: a business key
//!   stays taken for as long as its workflow's key policy says (by default, while the run is
//!   retained).

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// Columns added to `sagaflow_steps` (each only when missing, so `up` can run again over a
/// half-applied state).
const STEP_COLUMNS: &[(&str, &str)] = &[
    ("interruptions", "INTEGER NOT NULL DEFAULT 0"),
    ("max_interruptions", "INTEGER NOT NULL DEFAULT 5"),
];

const BOTH: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS sagaflow_instances (
        id TEXT PRIMARY KEY NOT NULL,
        incarnation TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        heartbeat_at BIGINT NOT NULL,
        stopped_at BIGINT NULL
    )"#,
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_business_key ON sagaflow_runs (workflow, business_key) \
     WHERE business_key IS NOT NULL",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_steps", STEP_COLUMNS).await?;
        run_all(manager, BOTH, BOTH).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &[
            "DROP INDEX sagaflow_runs_business_key",
            "DROP TABLE sagaflow_instances",
            "ALTER TABLE sagaflow_steps DROP COLUMN max_interruptions",
            "ALTER TABLE sagaflow_steps DROP COLUMN interruptions",
        ];
        run_all(manager, drop, drop).await
    }
}
