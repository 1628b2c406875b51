//! Recurring schedules.
//!
//! `sagaflow_schedules` holds one row per schedule the application's code declares (written
//! at each engine's start: the code is the truth), read by the supervisor leader, which fires
//! the due ones. `next_tick_at` is the next tick to fire in epoch milliseconds of the
//! database clock; firing moves it with a conditional update, so that one tick is fired once
//! whichever leader finds it due. `paused` with `paused_by` and `paused_reason` is an
//! operator's pause; `missed` is the missed-tick policy (`skip`, `fire_once`,
//! `fire_all:<max>`). The partial index holds the schedules that can fire, by next tick.

use sea_orm_migration::prelude::*;

use super::run_all;

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The same SQL on both backends.
const UP: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS sagaflow_schedules (
        name TEXT PRIMARY KEY,
        workflow TEXT NOT NULL,
        expression TEXT NOT NULL,
        zone TEXT NOT NULL,
        input TEXT NOT NULL,
        missed TEXT NOT NULL,
        next_tick_at BIGINT NOT NULL,
        last_fired_at BIGINT NULL,
        last_run_id TEXT NULL,
        paused BOOLEAN NOT NULL DEFAULT FALSE,
        paused_by TEXT NULL,
        paused_reason TEXT NULL,
        updated_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS sagaflow_schedules_due ON sagaflow_schedules (next_tick_at) \
     WHERE NOT paused",
];

const DOWN: &[&str] = &[
    "DROP INDEX IF EXISTS sagaflow_schedules_due",
    "DROP TABLE IF EXISTS sagaflow_schedules",
];

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
