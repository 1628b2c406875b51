//! Applying planner decisions for many runs in one transaction.
//!
//! Throughput comes from doing per-batch what would otherwise be per-run: one guarded
//! `UPDATE … WHERE state = $from AND id IN (…) RETURNING id` per kind of transition, one
//! multi-row history insert, one statement per group of runs moving to the same state.

use std::collections::{BTreeMap, HashMap, HashSet};

use sea_orm::{ConnectionTrait, DatabaseTransaction, Value};
use uuid::Uuid;

use super::alerts::insert_alert;
use super::rows::{RUN_COLS, STEP_COLS};
use super::runs::{EvalApplied, PlanWrite};
use super::{RunRow, StepRow, Store, placeholders};
use crate::{Error, Result, RunState, StepState};

/// Rows per multi-row statement (well under both backends' bound-parameter limits).
const CHUNK: usize = 400;

/// One history row to insert.
#[derive(Debug, Clone)]
pub(super) struct HistoryEntry {
    pub(super) run_id: Uuid,
    pub(super) step: Option<String>,
    pub(super) event: String,
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
    pub(super) attempt: Option<i32>,
    pub(super) actor: String,
    pub(super) detail: Option<String>,
}

/// A plan function: what to write for one run given its steps.
pub type Planner<'a> = &'a (dyn Fn(&RunRow, &[StepRow]) -> Result<PlanWrite> + Sync);

impl Store {
    pub(super) async fn history_insert_many<C: ConnectionTrait>(
        &self,
        conn: &C,
        entries: &[HistoryEntry],
    ) -> Result<()> {
        for chunk in entries.chunks(CHUNK) {
            let mut sql = String::from(
                "INSERT INTO sagaflow_history (run_id, step, event, from_state, to_state, attempt, actor, detail, at) VALUES ",
            );
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * 8);
            for (i, e) in chunk.iter().enumerate() {
                let b = i * 8 + 1;
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!(
                    "(${b}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, {{now}})",
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6,
                    b + 7
                ));
                values.extend([
                    e.run_id.into(),
                    e.step.clone().into(),
                    e.event.clone().into(),
                    e.from.clone().into(),
                    e.to.clone().into(),
                    e.attempt.into(),
                    e.actor.clone().into(),
                    e.detail.clone().into(),
                ]);
            }
            conn.execute_raw(self.stmt(&sql, values)).await?;
        }
        Ok(())
    }

    /// Locks runs (sorted by id: the lock order every transaction follows) and returns them.
    /// With `only_dirty`, only runs marked for evaluation are taken (and unmarked).
    pub(super) async fn lock_runs(
        &self,
        txn: &DatabaseTransaction,
        ids: &[Uuid],
        only_dirty: bool,
    ) -> Result<Vec<RunRow>> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let sql = format!(
                "UPDATE sagaflow_runs SET dirty = FALSE WHERE id IN ({}){} RETURNING {RUN_COLS}",
                placeholders(1, chunk.len()),
                if only_dirty { " AND dirty" } else { "" }
            );
            let rows = txn
                .query_all_raw(self.stmt(&sql, chunk.iter().map(|&i| i.into()).collect()))
                .await?;
            for r in &rows {
                out.push(RunRow::decode(r)?);
            }
        }
        Ok(out)
    }

    /// The steps of many runs, grouped by run.
    pub(super) async fn steps_of<C: ConnectionTrait>(
        &self,
        conn: &C,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, Vec<StepRow>>> {
        let mut out: HashMap<Uuid, Vec<StepRow>> = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT {STEP_COLS} FROM sagaflow_steps WHERE run_id IN ({}) ORDER BY id",
                placeholders(1, chunk.len())
            );
            let rows = conn
                .query_all_raw(self.stmt(&sql, chunk.iter().map(|&i| i.into()).collect()))
                .await?;
            for r in &rows {
                let s = StepRow::decode(r)?;
                out.entry(s.run_id).or_default().push(s);
            }
        }
        Ok(out)
    }

    /// Plans and applies every locked run. A run whose plan fails (corrupt data, unknown
    /// version) is left marked for evaluation and reported in the second vector.
    pub(super) async fn evaluate_locked(
        &self,
        txn: &DatabaseTransaction,
        runs: Vec<RunRow>,
        actor: &str,
        plan: Planner<'_>,
    ) -> Result<(Vec<EvalApplied>, Vec<(Uuid, Error)>)> {
        let ids: Vec<Uuid> = runs.iter().map(|r| r.id).collect();
        let mut steps = self.steps_of(txn, &ids).await?;
        let mut plans = Vec::with_capacity(runs.len());
        let mut failed = Vec::new();
        for run in runs {
            let s = steps.remove(&run.id).unwrap_or_default();
            match plan(&run, &s) {
                Ok(p) => plans.push((run, p)),
                Err(e) => failed.push((run.id, e)),
            }
        }
        if !failed.is_empty() {
            let ids: Vec<Uuid> = failed.iter().map(|(id, _)| *id).collect();
            self.mark_dirty(txn, &ids).await?;
        }
        let applied = self.apply_plans(txn, plans, actor).await?;
        Ok((applied, failed))
    }

    /// Marks runs for another evaluation.
    pub(super) async fn mark_dirty<C: ConnectionTrait>(
        &self,
        conn: &C,
        ids: &[Uuid],
    ) -> Result<()> {
        for chunk in ids.chunks(CHUNK) {
            let sql = format!(
                "UPDATE sagaflow_runs SET dirty = TRUE, updated_at = {{now}} WHERE id IN ({})",
                placeholders(1, chunk.len())
            );
            conn.execute_raw(self.stmt(&sql, chunk.iter().map(|&i| i.into()).collect()))
                .await?;
        }
        Ok(())
    }

    /// Writes the plans of many runs (all locked by the caller's transaction).
    pub(super) async fn apply_plans(
        &self,
        txn: &DatabaseTransaction,
        plans: Vec<(RunRow, PlanWrite)>,
        actor: &str,
    ) -> Result<Vec<EvalApplied>> {
        // 1. Step transitions, grouped by (from, to); RETURNING tells which guards held.
        let mut groups: BTreeMap<(StepState, StepState), Vec<i64>> = BTreeMap::new();
        for (_, p) in &plans {
            for s in &p.steps {
                groups.entry((s.from, s.to)).or_default().push(s.id);
            }
        }
        let mut moved: HashSet<i64> = HashSet::new();
        for ((from, to), ids) in &groups {
            let extra = match to {
                StepState::Ready | StepState::CompensationReady => {
                    ", available_at = {now}, failure_count = 0, deadline_ms = initial_deadline_ms"
                }
                _ => ", available_at = NULL",
            };
            for chunk in ids.chunks(CHUNK) {
                let sql = format!(
                    "UPDATE sagaflow_steps SET state = $1, updated_at = {{now}}{extra} \
                     WHERE state = $2 AND id IN ({}) RETURNING id",
                    placeholders(3, chunk.len())
                );
                let mut values: Vec<Value> = vec![to.as_str().into(), from.as_str().into()];
                values.extend(chunk.iter().map(|&i| Value::from(i)));
                for r in txn.query_all_raw(self.stmt(&sql, values)).await? {
                    moved.insert(r.try_get::<i64>("", "id")?);
                }
            }
        }

        // 2. Per run: what moved, the run's new state, history.
        let mut history = Vec::new();
        let mut out = Vec::with_capacity(plans.len());
        let mut same_state: BTreeMap<RunState, Vec<Uuid>> = BTreeMap::new();
        let mut finished: Vec<Uuid> = Vec::new();
        let mut stale_runs: Vec<Uuid> = Vec::new();
        let mut alerts = Vec::new();
        let mut with_payload: Vec<(Uuid, RunState, Option<String>, Option<String>)> = Vec::new();
        for (before, write) in plans {
            let id = before.id;
            let (mut ready, mut stale) = (0, 0);
            for s in &write.steps {
                if !moved.contains(&s.id) {
                    stale += 1;
                    continue;
                }
                if matches!(s.to, StepState::Ready | StepState::CompensationReady) {
                    ready += 1;
                }
                history.push(HistoryEntry {
                    run_id: id,
                    step: Some(s.name.clone()),
                    event: "state".into(),
                    from: Some(s.from.as_str().into()),
                    to: Some(s.to.as_str().into()),
                    attempt: None,
                    actor: actor.into(),
                    detail: None,
                });
            }
            let state = write.run_state.unwrap_or(before.state);
            if write.run_output.is_some() || write.run_error.is_some() {
                with_payload.push((id, state, write.run_output.clone(), write.run_error.clone()));
            } else if state != before.state {
                same_state.entry(state).or_default().push(id);
            }
            if state.is_final() && state != before.state {
                finished.push(id);
            }
            if state != before.state || write.event.starts_with("operator") {
                history.push(HistoryEntry {
                    run_id: id,
                    step: None,
                    event: if write.event.is_empty() {
                        "state"
                    } else {
                        write.event
                    }
                    .into(),
                    from: Some(before.state.as_str().into()),
                    to: Some(state.as_str().into()),
                    attempt: None,
                    actor: actor.into(),
                    detail: write.detail.clone(),
                });
            }
            if stale > 0 {
                stale_runs.push(id);
            }
            if write.resolve_alerts {
                self.alert_resolve_run(txn, id).await?;
            }
            if let Some(a) = write.alert {
                alerts.push((out.len(), a));
            }
            out.push(EvalApplied {
                before,
                state,
                ready,
                stale,
                alert: None,
            });
        }
        self.runs_set_payload(txn, &with_payload).await?;
        for (state, ids) in &same_state {
            for chunk in ids.chunks(CHUNK) {
                let sql = format!(
                    "UPDATE sagaflow_runs SET state = $1, updated_at = {{now}}{} WHERE id IN ({})",
                    if state.is_final() {
                        ", finished_at = {now}, active_key = NULL"
                    } else {
                        ""
                    },
                    placeholders(2, chunk.len())
                );
                let mut values: Vec<Value> = vec![state.as_str().into()];
                values.extend(chunk.iter().map(|&i| Value::from(i)));
                txn.execute_raw(self.stmt(&sql, values)).await?;
            }
        }
        // AT-5: a finished run's steps leave the hot table; history and the run row keep them.
        for chunk in finished.chunks(CHUNK) {
            let sql = format!(
                "DELETE FROM sagaflow_steps WHERE run_id IN ({})",
                placeholders(1, chunk.len())
            );
            txn.execute_raw(self.stmt(&sql, chunk.iter().map(|&i| i.into()).collect()))
                .await?;
        }
        self.mark_dirty(txn, &stale_runs).await?;
        self.history_insert_many(txn, &history).await?;
        for (i, a) in alerts {
            out[i].alert = insert_alert(self, txn, &a).await?;
        }
        if out.iter().any(|a| a.ready > 0) {
            self.notify_ready(txn).await?;
        }
        Ok(out)
    }

    /// Sets state, output and error of many runs in one statement per chunk.
    async fn runs_set_payload(
        &self,
        txn: &DatabaseTransaction,
        runs: &[(Uuid, RunState, Option<String>, Option<String>)],
    ) -> Result<()> {
        const COLS: [&str; 5] = ["UUID", "TEXT", "TEXT", "TEXT", "BOOLEAN"];
        for chunk in runs.chunks(CHUNK) {
            let mut values: Vec<Value> = Vec::with_capacity(chunk.len() * COLS.len());
            for (id, state, output, error) in chunk {
                values.extend([
                    (*id).into(),
                    state.as_str().into(),
                    output.clone().into(),
                    error.clone().into(),
                    state.is_final().into(),
                ]);
            }
            let sql = format!(
                "UPDATE sagaflow_runs AS r SET state = v.state, output = COALESCE(v.output, r.output), \
                   error = COALESCE(v.error, r.error), updated_at = {{now}}, \
                   finished_at = CASE WHEN v.fin THEN {{now}} ELSE r.finished_at END, \
                   active_key = CASE WHEN v.fin THEN NULL ELSE r.active_key END \
                 FROM (SELECT column1 AS vid, column2 AS state, column3 AS output, column4 AS error, \
                         column5 AS fin FROM (VALUES {}) AS t) AS v \
                 WHERE r.id = v.vid",
                self.values_rows(&COLS, chunk.len())
            );
            txn.execute_raw(self.stmt(&sql, values)).await?;
        }
        Ok(())
    }
}
