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
use super::{Backend, RunRow, StepRow, Store};
use crate::{Error, Result, RunState, StepState};

/// Rows per batch statement (bounds the size of one array or JSON parameter).
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

/// A run's new state with its payload, for one bulk update.
struct RunPayload {
    id: Uuid,
    state: RunState,
    output: Option<String>,
    error: Option<String>,
    release_key: bool,
}

/// A plan function: what to write for one run given its steps.
pub type Planner<'a> = &'a (dyn Fn(&RunRow, &[StepRow]) -> Result<PlanWrite> + Sync);

impl Store {
    pub(super) async fn history_insert_many<C: ConnectionTrait>(
        &self,
        conn: &C,
        entries: &[HistoryEntry],
    ) -> Result<()> {
        const COLS: [(&str, &str); 8] = [
            ("run_id", "uuid"),
            ("step", "text"),
            ("event", "text"),
            ("from_state", "text"),
            ("to_state", "text"),
            ("attempt", "integer"),
            ("actor", "text"),
            ("detail", "text"),
        ];
        for chunk in entries.chunks(CHUNK) {
            let rows = chunk
                .iter()
                .map(|e| {
                    vec![
                        e.run_id.into(),
                        e.step.clone().into(),
                        e.event.clone().into(),
                        e.from.clone().into(),
                        e.to.clone().into(),
                        e.attempt.into(),
                        e.actor.clone().into(),
                        e.detail.clone().into(),
                    ]
                })
                .collect();
            let (source, values) = self.rows_source(1, &COLS, rows)?;
            let sql = format!(
                "INSERT INTO sagaflow_history (run_id, step, event, from_state, to_state, attempt, actor, detail, at) \
                 SELECT v.run_id, v.step, v.event, v.from_state, v.to_state, v.attempt, v.actor, v.detail, {{now}} \
                 FROM {source}"
            );
            conn.execute_raw(self.stmt(&sql, values)).await?;
        }
        Ok(())
    }

    /// Locks runs (sorted by id: the lock order every transaction follows) and returns them.
    /// With `only_dirty`, only runs marked for evaluation are taken (and unmarked).
    ///
    /// PostgreSQL takes the row locks with `SELECT … ORDER BY id FOR UPDATE`, which locks in
    /// id order and writes no new row version; only runs that were marked get an `UPDATE`.
    /// SQLite's first write takes the database's write lock, so there the lock is the
    /// unmarking `UPDATE` itself.
    pub(super) async fn lock_runs(
        &self,
        txn: &DatabaseTransaction,
        ids: &[Uuid],
        only_dirty: bool,
    ) -> Result<Vec<RunRow>> {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let only = if only_dirty { " AND dirty" } else { "" };
        let mut out = Vec::with_capacity(ids.len());
        let mut marked = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let (cond, values) = self.in_list("id", 1, chunk)?;
            let sql = match self.backend {
                Backend::Postgres => format!(
                    "SELECT {RUN_COLS}, dirty FROM sagaflow_runs WHERE {cond}{only} ORDER BY id FOR UPDATE"
                ),
                Backend::Sqlite => format!(
                    "UPDATE sagaflow_runs SET dirty = FALSE WHERE {cond}{only} RETURNING {RUN_COLS}, FALSE AS dirty"
                ),
            };
            for r in &txn.query_all_raw(self.stmt(&sql, values)).await? {
                let run = RunRow::decode(r)?;
                if r.try_get::<bool>("", "dirty")? {
                    marked.push(run.id);
                }
                out.push(run);
            }
        }
        for chunk in marked.chunks(CHUNK) {
            let (cond, values) = self.in_list("id", 1, chunk)?;
            let sql = format!("UPDATE sagaflow_runs SET dirty = FALSE WHERE {cond}");
            txn.execute_raw(self.stmt(&sql, values)).await?;
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
            let (cond, values) = self.in_list("run_id", 1, chunk)?;
            // No `ORDER BY id` here: it would invite a walk of the whole primary key in
            // id order instead of a lookup by run. Each run's steps are sorted below.
            let sql = format!("SELECT {STEP_COLS} FROM sagaflow_steps WHERE {cond}");
            let rows = conn.query_all_raw(self.stmt(&sql, values)).await?;
            for r in &rows {
                let s = StepRow::decode(r)?;
                out.entry(s.run_id).or_default().push(s);
            }
        }
        for steps in out.values_mut() {
            steps.sort_unstable_by_key(|s| s.id);
        }
        Ok(out)
    }

    /// Plans and applies every locked run. A run whose plan fails (corrupt data, unknown
    /// version) is left marked for evaluation and reported in the second vector. `history`
    /// holds entries the caller already has for this transaction: they are written first, in
    /// the same statement as the evaluation's own.
    pub(super) async fn evaluate_locked(
        &self,
        txn: &DatabaseTransaction,
        runs: Vec<RunRow>,
        actor: &str,
        plan: Planner<'_>,
        history: Vec<HistoryEntry>,
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
        let applied = self.apply_plans(txn, plans, actor, history).await?;
        Ok((applied, failed))
    }

    /// Marks runs for another evaluation.
    pub(super) async fn mark_dirty<C: ConnectionTrait>(
        &self,
        conn: &C,
        ids: &[Uuid],
    ) -> Result<()> {
        for chunk in ids.chunks(CHUNK) {
            let (cond, values) = self.in_list("id", 1, chunk)?;
            let sql =
                format!("UPDATE sagaflow_runs SET dirty = TRUE, updated_at = {{now}} WHERE {cond}");
            conn.execute_raw(self.stmt(&sql, values)).await?;
        }
        Ok(())
    }

    /// Writes the plans of many runs (all locked by the caller's transaction), after the
    /// caller's `history` entries.
    pub(super) async fn apply_plans(
        &self,
        txn: &DatabaseTransaction,
        plans: Vec<(RunRow, PlanWrite)>,
        actor: &str,
        mut history: Vec<HistoryEntry>,
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
                let (cond, ids) = self.in_list("id", 3, chunk)?;
                let sql = format!(
                    "UPDATE sagaflow_steps SET state = $1, updated_at = {{now}}{extra} \
                     WHERE state = $2 AND {cond} RETURNING id"
                );
                let mut values: Vec<Value> = vec![to.as_str().into(), from.as_str().into()];
                values.extend(ids);
                for r in txn.query_all_raw(self.stmt(&sql, values)).await? {
                    moved.insert(r.try_get::<i64>("", "id")?);
                }
            }
        }

        // 2. Per run: what moved, the run's new state, history.
        let mut out = Vec::with_capacity(plans.len());
        let mut same_state: BTreeMap<(RunState, bool), Vec<Uuid>> = BTreeMap::new();
        let mut finished: Vec<Uuid> = Vec::new();
        let mut stale_runs: Vec<Uuid> = Vec::new();
        let mut alerts = Vec::new();
        let mut with_payload: Vec<RunPayload> = Vec::new();
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
            let release_key = write.release_key && state.is_final();
            if write.run_output.is_some() || write.run_error.is_some() {
                with_payload.push(RunPayload {
                    id,
                    state,
                    output: write.run_output.clone(),
                    error: write.run_error.clone(),
                    release_key,
                });
            } else if state != before.state {
                same_state.entry((state, release_key)).or_default().push(id);
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
        for ((state, release_key), ids) in &same_state {
            for chunk in ids.chunks(CHUNK) {
                let (cond, ids) = self.in_list("id", 2, chunk)?;
                let sql = format!(
                    "UPDATE sagaflow_runs SET state = $1, updated_at = {{now}}{}{} WHERE {cond}",
                    if state.is_final() {
                        ", finished_at = {now}"
                    } else {
                        ""
                    },
                    if *release_key {
                        ", active_key = NULL"
                    } else {
                        ""
                    },
                );
                let mut values: Vec<Value> = vec![state.as_str().into()];
                values.extend(ids);
                txn.execute_raw(self.stmt(&sql, values)).await?;
            }
        }
        // AT-5: a finished run's steps leave the hot table; history and the run row keep them.
        for chunk in finished.chunks(CHUNK) {
            let (cond, values) = self.in_list("run_id", 1, chunk)?;
            let sql = format!("DELETE FROM sagaflow_steps WHERE {cond}");
            txn.execute_raw(self.stmt(&sql, values)).await?;
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
    async fn runs_set_payload(&self, txn: &DatabaseTransaction, runs: &[RunPayload]) -> Result<()> {
        const COLS: [(&str, &str); 6] = [
            ("vid", "uuid"),
            ("state", "text"),
            ("output", "text"),
            ("error", "text"),
            ("fin", "boolean"),
            ("rel", "boolean"),
        ];
        for chunk in runs.chunks(CHUNK) {
            let rows = chunk
                .iter()
                .map(|r| {
                    vec![
                        r.id.into(),
                        r.state.as_str().into(),
                        r.output.clone().into(),
                        r.error.clone().into(),
                        r.state.is_final().into(),
                        r.release_key.into(),
                    ]
                })
                .collect();
            let (source, values) = self.rows_source(1, &COLS, rows)?;
            let sql = format!(
                "UPDATE sagaflow_runs AS r SET state = v.state, output = COALESCE(v.output, r.output), \
                   error = COALESCE(v.error, r.error), updated_at = {{now}}, \
                   finished_at = CASE WHEN v.fin THEN {{now}} ELSE r.finished_at END, \
                   active_key = CASE WHEN v.rel THEN NULL ELSE r.active_key END \
                 FROM {source} WHERE r.id = v.vid"
            );
            txn.execute_raw(self.stmt(&sql, values)).await?;
        }
        Ok(())
    }
}
