//! One history row per unit of work's change of a run, not one per transition.
//!
//! `sagaflow_history.then_states` holds the state changes that were decided in the same unit
//! of work as the row's own event, by the same actor, and that carry nothing of their own (no
//! attempt, no detail): the successors a completion made ready, the run's move to `running`
//! or `completed`. They are a JSON array of `[step, from, to]` triples (`step` is `null` for
//! the run), and reading the row gives them back as events of their own, after the row's
//! event and at its time. A three-step saga writes four history rows instead of eight.
//! Rows written before this migration keep `NULL` and read as they did.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const HISTORY_COLUMNS: &[(&str, &str)] = &[("then_states", "TEXT NULL")];

const DOWN: &[&str] = &["ALTER TABLE sagaflow_history DROP COLUMN then_states"];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_history", HISTORY_COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, DOWN, DOWN).await
    }
}
