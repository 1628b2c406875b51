//! Finished runs per workflow and final state, counted as they finish.
//!
//! An overview shows how many runs of each workflow completed or were compensated. Counting
//! them reads every retained finished run (a million index entries on a busy database), so
//! the transaction that finishes runs adds them to `sagaflow_run_totals` instead, and the
//! retention sweep takes the runs it deletes off again: the totals are those of the runs
//! still retained. As in `sagaflow_throughput`, each transaction adds to one of sixteen
//! `slot`s, so that concurrent writers seldom wait for each other's row; a read sums them.
//!
//! Runs already finished when the migration runs are counted into slot 0.

use sea_orm_migration::prelude::*;

use super::run_all;

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The table, then the backfill (which adds nothing where a row exists, so it can run
/// again). The same SQL on both backends.
const BOTH: &[&str] = &[
    r#"CREATE TABLE IF NOT EXISTS sagaflow_run_totals (
        workflow TEXT NOT NULL,
        state TEXT NOT NULL,
        slot INTEGER NOT NULL,
        runs BIGINT NOT NULL,
        PRIMARY KEY (workflow, state, slot)
    )"#,
    r#"INSERT INTO sagaflow_run_totals (workflow, state, slot, runs)
       SELECT workflow, state, 0, COUNT(*) FROM sagaflow_runs
        WHERE finished_at IS NOT NULL GROUP BY workflow, state
       ON CONFLICT (workflow, state, slot) DO NOTHING"#,
];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_all(manager, BOTH, BOTH).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &["DROP TABLE sagaflow_run_totals"];
        run_all(manager, drop, drop).await
    }
}
