//! The initial schema: runs, steps, history, alerts and leases.
//!
//! Every time column is a BIGINT of milliseconds since the Unix epoch, written from the
//! database's clock (AT-2). The hot table is `sagaflow_steps`: it holds only the steps of
//! unfinished runs, and its two partial indexes serve the claim (ready steps by due time) and
//! the supervisor sweep (running steps by deadline).

use sea_orm_migration::prelude::*;

use crate::run_all;

pub(crate) struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m0001_initial"
    }
}

/// The schema, written once. `{uuid}` and `{serial}` are replaced per backend: PostgreSQL
/// has a native UUID and BIGSERIAL; SQLite stores UUIDs as 16-byte BLOBs and numbers rows
/// with INTEGER PRIMARY KEY AUTOINCREMENT. Every statement is `IF NOT EXISTS`, so a run over
/// a half-created schema completes it.
const SCHEMA: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS sagaflow_runs (
        id {uuid} PRIMARY KEY NOT NULL,
        workflow TEXT NOT NULL,
        version INTEGER NOT NULL,
        workflow_key TEXT NOT NULL,
        business_key TEXT NULL,
        active_key TEXT NULL,
        state TEXT NOT NULL,
        input TEXT NOT NULL,
        output TEXT NULL,
        error TEXT NULL,
        dirty BOOLEAN NOT NULL DEFAULT FALSE,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        finished_at BIGINT NULL
    )"#,
    "CREATE UNIQUE INDEX IF NOT EXISTS sagaflow_runs_active_key ON sagaflow_runs (workflow, active_key)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_dirty ON sagaflow_runs (workflow_key, updated_at) WHERE dirty",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_finished ON sagaflow_runs (finished_at) WHERE finished_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_unfinished ON sagaflow_runs (workflow_key) WHERE finished_at IS NULL",
    r#"CREATE TABLE IF NOT EXISTS sagaflow_steps (
        id {serial},
        run_id {uuid} NOT NULL REFERENCES sagaflow_runs (id) ON DELETE CASCADE,
        workflow_key TEXT NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        locked_by TEXT NULL,
        complete_by BIGINT NULL,
        available_at BIGINT NULL,
        attempt INTEGER NOT NULL DEFAULT 0,
        failure_count INTEGER NOT NULL DEFAULT 0,
        maybe_applied BOOLEAN NOT NULL DEFAULT FALSE,
        max_failures INTEGER NOT NULL,
        deadline_ms BIGINT NOT NULL,
        initial_deadline_ms BIGINT NOT NULL,
        deadline_cap_ms BIGINT NOT NULL,
        idempotency_key TEXT NOT NULL,
        output TEXT NULL,
        error TEXT NULL,
        updated_at BIGINT NOT NULL,
        UNIQUE (run_id, name)
    )"#,
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_ready ON sagaflow_steps (available_at) WHERE state IN ('ready', 'compensation_ready')",
    "CREATE INDEX IF NOT EXISTS sagaflow_steps_running ON sagaflow_steps (complete_by) WHERE state IN ('running', 'compensating')",
    r#"CREATE TABLE IF NOT EXISTS sagaflow_history (
        id {serial},
        run_id {uuid} NOT NULL,
        step TEXT NULL,
        event TEXT NOT NULL,
        from_state TEXT NULL,
        to_state TEXT NULL,
        attempt INTEGER NULL,
        actor TEXT NOT NULL,
        detail TEXT NULL,
        at BIGINT NOT NULL
    )"#,
    "CREATE INDEX IF NOT EXISTS sagaflow_history_run ON sagaflow_history (run_id, id)",
    r#"CREATE TABLE IF NOT EXISTS sagaflow_alerts (
        id {serial},
        run_id {uuid} NULL,
        step TEXT NULL,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        actions TEXT NOT NULL,
        open_key TEXT NULL,
        created_at BIGINT NOT NULL,
        resolved_at BIGINT NULL
    )"#,
    "CREATE UNIQUE INDEX IF NOT EXISTS sagaflow_alerts_open_key ON sagaflow_alerts (open_key)",
    "CREATE INDEX IF NOT EXISTS sagaflow_alerts_run ON sagaflow_alerts (run_id)",
    r#"CREATE TABLE IF NOT EXISTS sagaflow_leases (
        name TEXT PRIMARY KEY NOT NULL,
        holder TEXT NULL,
        term BIGINT NOT NULL DEFAULT 0,
        expires_at BIGINT NOT NULL DEFAULT 0
    )"#,
];

fn render(uuid: &str, serial: &str) -> Vec<String> {
    SCHEMA
        .iter()
        .map(|s| s.replace("{uuid}", uuid).replace("{serial}", serial))
        .collect()
}

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let postgres = render("UUID", "BIGSERIAL PRIMARY KEY");
        let sqlite = render("BLOB", "INTEGER PRIMARY KEY AUTOINCREMENT");
        let (pg, lite): (Vec<&str>, Vec<&str>) = (
            postgres.iter().map(String::as_str).collect(),
            sqlite.iter().map(String::as_str).collect(),
        );
        run_all(manager, &pg, &lite).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &[
            "DROP TABLE sagaflow_leases",
            "DROP TABLE sagaflow_alerts",
            "DROP TABLE sagaflow_history",
            "DROP TABLE sagaflow_steps",
            "DROP TABLE sagaflow_runs",
        ];
        run_all(manager, drop, drop).await
    }
}
