//! Rewriting a run's stored data by hand: an operator's corrected input, and the move of an
//! in-flight run to another version of its workflow. The transition module decides what
//! changes; these statements only write it, in the caller's unit of work, on a run it
//! locked.

use sea_orm::Value;
use uuid::Uuid;

use super::row::Exec;
use super::rows::RUN_COLS;
use super::tx::{HistoryEntry, RunSteps, read_steps};
use super::{RunRow, Store, StoreTx};
use crate::Result;
pub use crate::transition::writes::{MigrationWrite, StepInsert, StepUpdate};

impl Store {
    /// A page of the unfinished runs of `name@version` (`key`) by id (so roughly oldest
    /// first), after run `after`, at most `limit`; read without a transaction or a lock (a
    /// dry run decides nothing it writes).
    ///
    /// # Errors
    /// [`crate::Error::Db`]; [`crate::Error::CorruptRow`] for a run row that does not decode.
    pub async fn runs_unfinished_page(
        &self,
        key: &str,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<RunRow>> {
        let (cond, mut values): (&str, Vec<Value>) = match after {
            Some(a) => (" AND id > $3", vec![a.into()]),
            None => ("", vec![]),
        };
        values.insert(0, i64::from(limit).into());
        values.insert(0, key.into());
        let sql = format!(
            "SELECT {RUN_COLS} FROM sagaflow_runs WHERE workflow_key = $1 AND finished_at IS NULL\
             {cond} ORDER BY id LIMIT $2"
        );
        let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
        rows.iter().map(RunRow::decode).collect()
    }

    /// The steps of runs `ids`, read without a transaction or a lock (see
    /// [`StoreTx::steps_lock`] for the locked read).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn steps_read(&self, ids: &[Uuid]) -> Result<RunSteps> {
        read_steps(self, &self.exec, ids, "").await
    }
}

impl StoreTx<'_> {
    /// Replaces the stored input of run `id` (locked by this transaction).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn run_set_input(&mut self, id: Uuid, input: &str) -> Result<()> {
        let s = self.store;
        let sql = "UPDATE sagaflow_runs SET input = $1, updated_at = {now} WHERE id = $2";
        let values: Vec<Value> = vec![input.into(), id.into()];
        self.txn.execute(s.stmt(sql, values)).await?;
        Ok(())
    }

    /// Records an event of run `id` (of no step) in its history, written at commit.
    pub fn history_push(&mut self, id: Uuid, event: &str, actor: &str, detail: Option<String>) {
        self.history.push(HistoryEntry {
            run_id: id,
            step: None,
            event: event.to_owned(),
            from: None,
            to: None,
            attempt: None,
            actor: actor.to_owned(),
            detail,
        });
    }
}

impl StoreTx<'_> {
    /// The unfinished runs of `name@version` (`key`), oldest first.
    ///
    /// # Errors
    /// [`crate::Error::Db`]; [`crate::Error::CorruptRow`] for a run row that does not decode.
    pub async fn runs_unfinished_of(&self, key: &str) -> Result<Vec<RunRow>> {
        let s = self.store;
        let sql = format!(
            "SELECT {RUN_COLS} FROM sagaflow_runs WHERE workflow_key = $1 AND finished_at IS NULL \
             ORDER BY created_at, id"
        );
        let rows = self.txn.query_all(s.stmt(&sql, vec![key.into()])).await?;
        rows.iter().map(RunRow::decode).collect()
    }

    /// Ends the unit of work without writing anything.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn rollback(self) -> Result<()> {
        self.txn.rollback().await?;
        Ok(())
    }

    /// Writes a decided migration of a run this transaction locked: the run re-pinned to the
    /// new version, its kept steps rewritten (a step whose state changes is no longer
    /// queued: the evaluation the lock asked for queues it again if it is due), its dropped
    /// steps deleted, its new steps inserted.
    ///
    /// Every step write is guarded by the state and fencing token the migration was decided
    /// from. Returns `false` when one missed (a step moved after it was read): the caller
    /// must then roll the unit of work back and decide again.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn run_migrate(&mut self, w: &MigrationWrite) -> Result<bool> {
        let s = self.store;
        let sql = "UPDATE sagaflow_runs SET version = $1, workflow_key = $2, input = COALESCE($3, input), \
                   updated_at = {now} WHERE id = $4";
        let values: Vec<Value> = vec![
            w.version.into(),
            w.workflow_key.clone().into(),
            w.input.clone().into(),
            w.run_id.into(),
        ];
        self.txn.execute(s.stmt(sql, values)).await?;
        for u in &w.update {
            let sql = "UPDATE sagaflow_steps SET workflow_key = $1, \
                       available_at = CASE WHEN state = $2 THEN available_at ELSE NULL END, \
                       aging_from = CASE WHEN state = $2 THEN aging_from ELSE NULL END, \
                       state = $2, output = $3, updated_at = {now} \
                       WHERE id = $4 AND state = $5 AND attempt = $6";
            let values: Vec<Value> = vec![
                w.workflow_key.clone().into(),
                u.state.as_str().into(),
                u.output.clone().into(),
                u.id.into(),
                u.from.as_str().into(),
                u.attempt.into(),
            ];
            if self.txn.execute(s.stmt(sql, values)).await? == 0 {
                return Ok(false);
            }
        }
        for (id, from, attempt) in &w.delete {
            let sql = "DELETE FROM sagaflow_steps WHERE id = $1 AND state = $2 AND attempt = $3";
            let values: Vec<Value> = vec![(*id).into(), from.as_str().into(), (*attempt).into()];
            if self.txn.execute(s.stmt(sql, values)).await? == 0 {
                return Ok(false);
            }
        }
        for i in &w.insert {
            // Priority and flow key from the run; the retry priority its other steps have.
            let sql = "INSERT INTO sagaflow_steps (run_id, workflow_key, name, state, max_failures, \
                       max_interruptions, deadline_ms, initial_deadline_ms, deadline_cap_ms, \
                       idempotency_key, output, updated_at, priority, retry_priority, resource, flow_key) \
                       SELECT r.id, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10, {now}, r.priority, \
                       COALESCE((SELECT MIN(o.retry_priority) FROM sagaflow_steps AS o WHERE o.run_id = r.id), r.priority), \
                       $11, r.flow_key FROM sagaflow_runs AS r WHERE r.id = $1";
            let n = &i.step;
            let values: Vec<Value> = vec![
                w.run_id.into(),
                w.workflow_key.clone().into(),
                n.name.clone().into(),
                i.state.as_str().into(),
                n.max_failures.into(),
                n.max_interruptions.into(),
                n.deadline_ms.into(),
                n.deadline_cap_ms.into(),
                n.idempotency_key.clone().into(),
                i.output.clone().into(),
                n.resource.clone().into(),
            ];
            self.txn.execute(s.stmt(sql, values)).await?;
        }
        Ok(true)
    }
}
