//! Restarts from a step (`Operator::restart_from`): a run started from another one, and the
//! run it was started from, each name the other.
//!
//! - `restarted_from` on `sagaflow_runs`: the run this one was restarted from.
//! - `restarted_as` on `sagaflow_runs`: the run this one was restarted as; set once (a run is
//!   restarted at most once: the next restart starts from the newer run), and an operator
//!   action on a run so replaced is refused.
//!
//! Both are read by id only, to show the link: no index.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const PG: &[(&str, &str)] = &[
    ("restarted_from", "UUID NULL"),
    ("restarted_as", "UUID NULL"),
];
const SQLITE: &[(&str, &str)] = &[
    ("restarted_from", "BLOB NULL"),
    ("restarted_as", "BLOB NULL"),
];

const DOWN: &[&str] = &[
    "ALTER TABLE sagaflow_runs DROP COLUMN restarted_as",
    "ALTER TABLE sagaflow_runs DROP COLUMN restarted_from",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let columns = match manager.get_database_backend() {
            DbBackend::Postgres => PG,
            _ => SQLITE,
        };
        add_columns_if_missing(manager, "sagaflow_runs", columns).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
