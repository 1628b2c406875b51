//! Forward attempts and compensation attempts counted apart.
//!
//! `attempt` stays the fencing token: every claim adds 1, whatever the phase, and it is never
//! reset. Beside it, the claim adds 1 to `forward_attempts` when it takes a `ready` step and to
//! `compensation_attempts` when it takes a `compensation_ready` one, so a step's first
//! compensation attempt is number 1 and an alert counts the attempts of the phase that failed.
//!
//! Rows of runs in flight when the migration runs get their counters from the history: every
//! compensation attempt that ended left one row leaving `compensating`, and a step still
//! `compensating` has one attempt in flight; the forward attempts are the remaining claims.

use sea_orm_migration::prelude::*;

use super::{add_columns_if_missing, run_all};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// Columns added to `sagaflow_steps` (each only when missing, so `up` can run again over a
/// half-applied state).
const STEP_COLUMNS: &[(&str, &str)] = &[
    ("forward_attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("compensation_attempts", "INTEGER NOT NULL DEFAULT 0"),
];

/// Splits the claims of existing rows (the same SQL on both backends). Only rows whose
/// counters are both still zero although they were claimed are written, so running it again
/// over its own result changes nothing. A count above the claims (a row edited by hand) is cut
/// to the claims.
const BACKFILL: &[&str] = &[r#"
    UPDATE sagaflow_steps AS s SET
        compensation_attempts = CASE WHEN c.n < c.attempt THEN c.n ELSE c.attempt END,
        forward_attempts = CASE WHEN c.n < c.attempt THEN c.attempt - c.n ELSE 0 END
    FROM (
        SELECT t.id, t.attempt,
            (SELECT COUNT(*) FROM sagaflow_history h
              WHERE h.run_id = t.run_id AND h.step = t.name AND h.from_state = 'compensating')
            + CASE WHEN t.state = 'compensating' THEN 1 ELSE 0 END AS n
        FROM sagaflow_steps t
        WHERE t.attempt > 0 AND t.forward_attempts = 0 AND t.compensation_attempts = 0
    ) AS c
    WHERE s.id = c.id"#];

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        add_columns_if_missing(manager, "sagaflow_steps", STEP_COLUMNS).await?;
        run_all(manager, BACKFILL, BACKFILL).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let drop = &[
            "ALTER TABLE sagaflow_steps DROP COLUMN compensation_attempts",
            "ALTER TABLE sagaflow_steps DROP COLUMN forward_attempts",
        ];
        run_all(manager, drop, drop).await
    }
}
