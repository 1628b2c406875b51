//! The writes of a restart from a step, as the operator's unit of work decided them
//! (`crate::transition::restart`): the store persists them and decides nothing.

use uuid::Uuid;

use super::row::Exec;
use super::rows::RUN_COLS;
use super::tx::HistoryEntry;
use super::{NewRun, RunInsertOutcome, RunRow, StoreTx};
use crate::model::HistoryKind;
use crate::transition::restart::Reused;
use crate::{Error, Result};

/// What a restart writes, beside the new run's rows.
#[derive(Debug)]
pub struct RestartWrite<'a> {
    /// The run restarted from.
    pub source: Uuid,
    /// The new run, as a start would insert it.
    pub new: &'a NewRun,
    /// The steps the new run takes over as completed.
    pub reused: &'a [Reused],
    /// Who restarts it.
    pub actor: &'a str,
    /// The history detail of the source's `operator_restart` line (JSON object).
    pub source_detail: String,
    /// The history detail of the new run's `restarted_from` line (JSON object).
    pub new_detail: String,
    /// Why the source's open alerts are resolved.
    pub resolution: String,
}

impl StoreTx<'_> {
    /// Locks the source of a restart; returns it and the run it was restarted as, if any.
    /// The first statement is a write, which takes the run's row lock on PostgreSQL and the
    /// write lock on SQLite: two restarts of one run, or a restart and another operator
    /// action, are serialised.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_lock_for_restart(
        &mut self,
        id: Uuid,
    ) -> Result<Option<(RunRow, Option<Uuid>)>> {
        let sql = format!(
            "UPDATE sagaflow_runs SET restarted_as = restarted_as WHERE id = $1 \
             RETURNING {RUN_COLS}, restarted_as"
        );
        let row = match self
            .txn
            .query_one(self.store.stmt(&sql, vec![id.into()]))
            .await?
        {
            Some(row) => row,
            None => match self.run_finished_locked(id, ", restarted_as").await? {
                Some(row) => row,
                None => return Ok(None),
            },
        };
        let run = RunRow::decode(&row)?;
        let restarted_as: Option<Uuid> = row.try_get("", "restarted_as")?;
        Ok(Some((run, restarted_as)))
    }

    /// Writes a restart: the source gives up its business key, the new run is inserted (not
    /// when a run holds that key: the outcome says which, and the caller rolls back), its
    /// reused steps are stored completed with the source's outputs and idempotency keys, the
    /// two runs are linked, the source's open alerts are resolved, both histories get their
    /// line, and the new run is marked for evaluation (its next steps are queued by it).
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`] when the source was linked meanwhile (its lock
    /// is held: it cannot have been).
    pub async fn run_restart(&mut self, w: &RestartWrite<'_>) -> Result<RunInsertOutcome> {
        let s = self.store;
        s_exec(
            self,
            "UPDATE sagaflow_runs SET active_key = NULL WHERE id = $1",
            vec![w.source.into()],
        )
        .await?;
        if s.backend() == crate::Backend::Postgres {
            s_exec(
                self,
                "DELETE FROM sagaflow_run_keys WHERE run_id = $1",
                vec![w.source.into()],
            )
            .await?;
        }
        let outcome = s.run_insert(&self.txn, w.new).await?;
        if !matches!(outcome, RunInsertOutcome::Inserted(_)) {
            return Ok(outcome);
        }
        let new = w.new.id;
        for r in w.reused {
            s_exec(
                self,
                "UPDATE sagaflow_steps SET state = 'completed', output = $3, idempotency_key = $4, \
                 available_at = NULL, aging_from = NULL, updated_at = {now} \
                 WHERE run_id = $1 AND name = $2",
                vec![
                    new.into(),
                    r.name.clone().into(),
                    r.output.clone().into(),
                    r.idempotency_key.clone().into(),
                ],
            )
            .await?;
        }
        s_exec(
            self,
            "UPDATE sagaflow_runs SET restarted_from = $2, dirty = TRUE WHERE id = $1",
            vec![new.into(), w.source.into()],
        )
        .await?;
        // The source is in the runs table or, finished on PostgreSQL, in the
        // finished runs' (its lock was taken where it is).
        let mut linked = 0;
        for table in s.run_tables() {
            linked += s_exec(
                self,
                &format!(
                    "UPDATE {table} SET restarted_as = $2, updated_at = {{now}} \
                     WHERE id = $1 AND restarted_as IS NULL"
                ),
                vec![w.source.into(), new.into()],
            )
            .await?;
        }
        if linked != 1 {
            return Err(Error::corrupt(
                "sagaflow_runs",
                w.source,
                "restarted twice under one lock",
            ));
        }
        s.alert_resolve_run(&self.txn, w.source, w.actor, Some(&w.resolution))
            .await?;
        self.history.push(HistoryEntry {
            run_id: w.source,
            step: None,
            event: HistoryKind::OperatorRestart.as_ref().to_owned(),
            from: None,
            to: None,
            attempt: None,
            actor: w.actor.to_owned(),
            detail: Some(w.source_detail.clone()),
        });
        self.history.push(HistoryEntry {
            run_id: new,
            step: None,
            event: HistoryKind::RestartedFrom.as_ref().to_owned(),
            from: None,
            to: None,
            attempt: None,
            actor: w.actor.to_owned(),
            detail: Some(w.new_detail.clone()),
        });
        self.notify = true;
        Ok(outcome)
    }
}

/// Runs one statement of the unit of work; returns the rows it changed.
async fn s_exec(tx: &StoreTx<'_>, sql: &str, values: Vec<sea_orm::Value>) -> Result<u64> {
    Ok(tx.txn.execute(tx.store.stmt(sql, values)).await?)
}
