//! A table of finished runs on PostgreSQL (issue 32): a run that ends for good and is not a
//! child run leaves `sagaflow_runs` for [`RUNS_DONE`], range-partitioned on `id` by the same
//! UTC days of run start as the history (see [`crate::partitions`]), so that retention drops
//! a day of finished runs with the day of their history instead of deleting them row by row,
//! and the hot table holds the runs that are not finished.
//!
//! A finished run may keep its business key (the default key policy keeps it while the run
//! is retained), so the intake's arbiter can no longer be the runs table's unique index: it
//! is [`RUN_KEYS`], one row per key held, filled here from the runs that hold one.
//!
//! [`RUNS_ALL`] is every run, for reads: on PostgreSQL both tables (`UNION ALL`), on SQLite,
//! which keeps one table and row deletes, `sagaflow_runs` alone.
//!
//! The finished table has the runs table's columns in their order (a run moves with
//! `DELETE … RETURNING` into `INSERT`): a migration that adds a column to one adds it to
//! the other and makes the view again. The suite checks that the three agree.
//!
//! Runs that finished before this migration stay where they are; retention deletes them row
//! by row as before.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement};

use crate::execute;
use crate::partitions::{
    HISTORY_PARTITION_SPAN_MS, RUN_KEYS, RUNS_ALL, RUNS_DONE, RUNS_DONE_DEFAULT_PARTITION,
    next_span, partition_create,
};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The indexes of the finished runs: those of the run list (m0007), a run by business key
/// (m0003) and the retention's look at when a day's runs finished. Child runs (a parent step
/// may still undo them) never move here, and the keys a run holds are in [`RUN_KEYS`], so the
/// intake's unique index, the evaluator's and the children's are not needed.
const DONE_INDEXES: &[&str] = &[
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_created ON sagaflow_runs_done (created_at, id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_workflow_created \
     ON sagaflow_runs_done (workflow, created_at, id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_state_created \
     ON sagaflow_runs_done (state, created_at, id)",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_key_created \
     ON sagaflow_runs_done (business_key, created_at, id) WHERE business_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_failed \
     ON sagaflow_runs_done (failed_attempts, created_at, id) WHERE failed_attempts > 0",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_business_key \
     ON sagaflow_runs_done (workflow, business_key) WHERE business_key IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS sagaflow_runs_done_finished ON sagaflow_runs_done (finished_at)",
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return execute(
                manager,
                &format!("CREATE VIEW IF NOT EXISTS {RUNS_ALL} AS SELECT * FROM sagaflow_runs"),
            )
            .await;
        }
        let mut statements = vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {RUNS_DONE} (LIKE sagaflow_runs INCLUDING DEFAULTS, \
                 CONSTRAINT sagaflow_runs_done_pkey PRIMARY KEY (id)) PARTITION BY RANGE (id)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {RUNS_DONE_DEFAULT_PARTITION} PARTITION OF {RUNS_DONE} DEFAULT"
            ),
        ];
        statements.extend(DONE_INDEXES.iter().map(|s| (*s).to_owned()));
        statements.extend([
            format!(
                "CREATE TABLE IF NOT EXISTS {RUN_KEYS} (workflow TEXT NOT NULL, \
                 business_key TEXT NOT NULL, run_id UUID NOT NULL, \
                 CONSTRAINT sagaflow_run_keys_pkey PRIMARY KEY (workflow, business_key))"
            ),
            format!("CREATE INDEX IF NOT EXISTS sagaflow_run_keys_run ON {RUN_KEYS} (run_id)"),
            format!(
                "INSERT INTO {RUN_KEYS} (workflow, business_key, run_id) \
                 SELECT workflow, active_key, id FROM sagaflow_runs WHERE active_key IS NOT NULL \
                 ON CONFLICT (workflow, business_key) DO NOTHING"
            ),
        ]);
        let now = db_now_ms(manager).await?;
        let mut day = next_span(now) - HISTORY_PARTITION_SPAN_MS;
        while day < now + 2 * HISTORY_PARTITION_SPAN_MS {
            statements.push(partition_create(RUNS_DONE, day));
            day += HISTORY_PARTITION_SPAN_MS;
        }
        statements.push(format!(
            "CREATE OR REPLACE VIEW {RUNS_ALL} AS \
             SELECT * FROM sagaflow_runs UNION ALL SELECT * FROM {RUNS_DONE}"
        ));
        for sql in &statements {
            execute(manager, sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        execute(manager, &format!("DROP VIEW IF EXISTS {RUNS_ALL}")).await?;
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let statements = [
            format!("INSERT INTO sagaflow_runs SELECT * FROM {RUNS_DONE}"),
            format!("DROP TABLE {RUNS_DONE}"),
            // The keys of finished runs back on their rows, for the unique index.
            format!(
                "UPDATE sagaflow_runs AS r SET active_key = k.business_key FROM {RUN_KEYS} AS k \
                 WHERE k.run_id = r.id AND r.active_key IS NULL"
            ),
            format!("DROP TABLE {RUN_KEYS}"),
        ];
        for sql in &statements {
            execute(manager, sql).await?;
        }
        Ok(())
    }
}

/// The database's clock (AT-2), in epoch milliseconds.
async fn db_now_ms(manager: &SchemaManager<'_>) -> Result<i64, DbErr> {
    let row = manager
        .get_connection()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT AS v",
        ))
        .await?
        .ok_or_else(|| DbErr::Migration("the database did not tell its time".into()))?;
    row.try_get("", "v")
}
