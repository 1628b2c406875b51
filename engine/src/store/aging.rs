//! Priority aging: the supervisor's bounded statement that raises the priority of queued
//! steps one level per period they have waited, so that low priorities still progress under a
//! sustained load of higher ones.
//!
//! Each queued step keeps `aging_from`, the instant from which its wait counts toward its
//! next level: when it fell due, then each time aging raised it. A step that has waited `k`
//! whole periods since gains `k` levels (up to [`PRIORITY_MAX`]) and its mark moves `k`
//! periods on, so a level is gained once per period waited however often the statement runs.
//! Every write that queues a step sets the mark again (intake, a retry, an evaluation, an
//! operator action), with the step's priority from its run: what aging gave it does not
//! outlive its wait.

use super::leases::LeaderFence;
use super::row::Exec;
use super::{Backend, Store};
use crate::Result;
use crate::definition::PRIORITY_MAX;

impl Store {
    /// Raises the priority of up to `limit` queued steps that have waited at least one
    /// `period_ms` since their aging mark, oldest mark first, by one level per whole period
    /// waited (at most to [`PRIORITY_MAX`]), in one statement on the database clock, fenced
    /// by the leader lease. Reads the partial index `sagaflow_steps_aging`; on PostgreSQL,
    /// steps being claimed meanwhile are skipped. Returns how many steps were raised.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn step_age(&self, fence: &LeaderFence, period_ms: i64, limit: u32) -> Result<u64> {
        let sql = self.aging_sql();
        let values = vec![
            period_ms.max(1).into(),
            i64::from(limit).into(),
            fence.name.clone().into(),
            fence.holder.clone().into(),
            fence.term.into(),
        ];
        Ok(self.exec.execute(self.stmt(&sql, values)).await?)
    }

    /// The plan the database chooses for the aging statement, one line per row of its
    /// `EXPLAIN` (PostgreSQL, with sequential scans discouraged: whether the partial index
    /// applies at all, whatever the table's size) or `EXPLAIN QUERY PLAN` (SQLite), for
    /// tests that check it reads `sagaflow_steps_aging`. Changes nothing.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    #[doc(hidden)]
    pub async fn step_age_plan(&self) -> Result<Vec<String>> {
        let values = vec![
            60_000_i64.into(),
            1000_i64.into(),
            "lease".into(),
            "holder".into(),
            1_i64.into(),
        ];
        let txn = self.exec.begin().await?;
        if self.backend == Backend::Postgres {
            // The table of a test is small: without this PostgreSQL scans it, whatever the
            // indexes, and the plan would not show the index the test looks for.
            txn.execute(self.stmt("SET LOCAL enable_seqscan = off", vec![]))
                .await?;
        }
        let (explain, column) = self.dialect().explain;
        let sql = format!("{explain} {}", self.aging_sql());
        let rows = txn.query_all(self.stmt(&sql, values)).await;
        txn.rollback().await?;
        rows?
            .iter()
            .map(|r| r.try_get::<String>("", column).map_err(Into::into))
            .collect()
    }

    /// The aging statement: `$1` the period in milliseconds, `$2` the limit, `$3…$5` the
    /// lease. The inner `SELECT` repeats the predicate of `sagaflow_steps_aging` word for word
    /// (`priority < 1000` a literal, not a parameter), so that both planners read that index
    /// in its order and stop after `$2` entries.
    pub(super) fn aging_sql(&self) -> String {
        format!(
            "UPDATE sagaflow_steps AS s SET \
               priority = CASE WHEN s.priority + q.levels > {max} THEN {max} ELSE s.priority + q.levels END, \
               aging_from = s.aging_from + q.levels * $1 \
             FROM ( \
               SELECT id, ({{now}} - aging_from) / $1 AS levels FROM sagaflow_steps \
               WHERE state IN ('ready', 'compensation_ready') AND priority < {max} \
                 AND aging_from <= {{now}} - $1 \
               ORDER BY aging_from LIMIT $2 {lock}) AS q \
             WHERE s.id = q.id \
               AND EXISTS (SELECT 1 FROM sagaflow_leases WHERE name = $3 AND holder = $4 \
                 AND term = $5 AND expires_at > {{wall_now}})",
            max = PRIORITY_MAX,
            lock = self.claim_lock(),
        )
    }
}
