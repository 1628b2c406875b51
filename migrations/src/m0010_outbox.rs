//! The outbox of notices: alerts and run-finished notifications, delivered at least once.
//!
//! A notice is inserted by the transaction that made the change it tells of (the alert's own
//! insert, or the transaction that finishes a run whose start asked for a notification), so
//! no notice is ever lost between a commit and its delivery. The supervisor leader delivers
//! each pending notice to every configured sink and records, per notice and sink, the
//! attempts, the next try and the outcome in `sagaflow_deliveries`; a notice is `done` once
//! every sink delivered it or gave up on it (`dead`). `dedupe_id` travels with every delivery,
//! so a receiver recognises the same notice delivered twice (after a leader died between
//! sending and recording).
//!
//! `sagaflow_runs.notify` records whether a run's finish is to be notified.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

const RUN_COLUMNS: &[(&str, &str)] = &[("notify", "BOOLEAN NOT NULL DEFAULT FALSE")];

const TABLES: &str = r#"CREATE TABLE IF NOT EXISTS sagaflow_outbox (
        id {serial},
        dedupe_id TEXT NOT NULL,
        topic TEXT NOT NULL,
        alert_id BIGINT NULL,
        run_id {uuid} NULL,
        body TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        done_at BIGINT NULL
    )"#;

const INDEXES: &[&str] = &[
    "CREATE UNIQUE INDEX IF NOT EXISTS sagaflow_outbox_dedupe ON sagaflow_outbox (dedupe_id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_outbox_pending ON sagaflow_outbox (id) WHERE done_at IS NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_outbox_done ON sagaflow_outbox (done_at) WHERE done_at IS NOT NULL",
    r#"CREATE TABLE IF NOT EXISTS sagaflow_deliveries (
        outbox_id BIGINT NOT NULL,
        sink TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at BIGINT NOT NULL,
        last_error TEXT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (outbox_id, sink)
    )"#,
    "CREATE INDEX IF NOT EXISTS sagaflow_deliveries_dead ON sagaflow_deliveries (updated_at) WHERE state = 'dead'",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_runs", RUN_COLUMNS).await?;
        let pg = TABLES
            .replace("{uuid}", "UUID")
            .replace("{serial}", "BIGSERIAL PRIMARY KEY");
        let lite = TABLES
            .replace("{uuid}", "BLOB")
            .replace("{serial}", "INTEGER PRIMARY KEY AUTOINCREMENT");
        run_all(manager, &[&pg], &[&lite]).await?;
        run_all(manager, INDEXES, INDEXES).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &[
            "DROP TABLE sagaflow_deliveries",
            "DROP TABLE sagaflow_outbox",
            "ALTER TABLE sagaflow_runs DROP COLUMN notify",
        ];
        run_all(manager, drop, drop).await
    }
}
