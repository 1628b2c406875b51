//! Who resolved an alert, and why.
//!
//! `resolved_by` holds who resolved it: the operator's actor (`cli:<name>`,
//! `api:<token name>`, `console:<token name>`, `operator` for the Rust API by default), or
//! `engine` when the engine resolved it because its cause went away. `resolution` holds
//! why: the operator's reason (for an action on a run, the action's name and its reason), or
//! the engine's words for what went away.
//!
//! Alerts already stored keep `NULL` in both, resolved or not.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const ALERT_COLUMNS: &[(&str, &str)] = &[("resolved_by", "TEXT NULL"), ("resolution", "TEXT NULL")];

const DOWN: &[&str] = &[
    "ALTER TABLE sagaflow_alerts DROP COLUMN resolution",
    "ALTER TABLE sagaflow_alerts DROP COLUMN resolved_by",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_alerts", ALERT_COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
