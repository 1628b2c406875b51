//! Writing decided plans: the step transitions, run states, payloads, alerts and history that
//! the transition module decided for many runs, as a few bulk statements of the unit of work.

use std::collections::{BTreeMap, HashSet};

use sea_orm::Value;

use super::row::Exec;
use uuid::Uuid;

use super::alerts::{NewAlert, insert_alert};
use super::outbox::{insert_notice, run_notice};
use super::rows::FINAL_RUN_STATES;
use super::tx::{CHUNK, HistoryEntry, mark_dirty};
use super::{RunRow, StoreTx};
use crate::model::{Alert, RunFinished};
use crate::transition::Due;
pub use crate::transition::writes::{PlanWrite, StepWrite};
use crate::{Result, RunState, StepState};
use sagaflow_migrations::partitions::{RUN_KEYS, RUN_TABLE_COLUMNS, RUNS_DONE};

/// What an evaluation or operator action did.
#[derive(Debug, Clone)]
pub struct EvalApplied {
    /// The run before.
    pub before: RunRow,
    /// The run's state after.
    pub state: RunState,
    /// Steps made ready (forward or compensation) by this write.
    pub ready: usize,
    /// Guarded step writes that found the step moved on: the run was marked for another look.
    pub stale: usize,
    /// Alert raised, if any.
    pub alert: Option<Alert>,
}

/// What a move into the finished runs' table writes in the columns it may change: SQL
/// expressions over the deleted row (and the values joined to it).
struct Moved {
    state: &'static str,
    output: &'static str,
    error: &'static str,
    updated_at: &'static str,
    finished_at: &'static str,
}

/// The select list of a move into the finished runs' table, in `RUN_TABLE_COLUMNS`' order:
/// the moved row's columns as they are, but for those `set` gives, a released key and a
/// clean row.
fn moved_run(set: Moved) -> String {
    format!(
        "id, workflow, version, workflow_key, business_key, NULL, {}, input, {}, {}, FALSE, \
         created_at, {}, {}, failed_attempts, priority, start_at, notify, trace_parent, \
         trace_state, flow_key, parent_step, restarted_from, restarted_as",
        set.state, set.output, set.error, set.updated_at, set.finished_at
    )
}

/// A boolean column of a bulk write of payloads: its name, and how a run gives its value.
type PayloadFlag = (&'static str, fn(&RunPayload) -> bool);

/// A run's new state with its payload, for one bulk update.
struct RunPayload {
    id: Uuid,
    state: RunState,
    output: Option<String>,
    error: Option<String>,
    release_key: bool,
    /// The run's error is cleared (a move only: the bulk update keeps its own rule).
    clear_error: bool,
}

impl StoreTx<'_> {
    /// Writes decided plans of many runs (all locked by this transaction).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn plan_apply(
        &mut self,
        plans: Vec<(RunRow, PlanWrite)>,
        actor: &str,
    ) -> Result<Vec<EvalApplied>> {
        let s = self.store;
        // 1. Step transitions, grouped by (from, to, effects); RETURNING tells which guards held.
        let mut groups: BTreeMap<(StepState, StepState, bool, bool), Vec<i64>> = BTreeMap::new();
        for (_, p) in &plans {
            for w in &p.steps {
                let due_now = w.effects.due != Due::Never;
                groups
                    .entry((w.from, w.to, w.effects.reset, due_now))
                    .or_default()
                    .push(w.id);
            }
        }
        let mut moved: HashSet<i64> = HashSet::new();
        for ((from, to, reset, due_now), ids) in &groups {
            // A step queued afresh (its dependencies met, its compensation due, an operator's
            // retry or release) takes its run's priority again, whatever a retry lane or
            // aging made of it, and waits toward aging from now.
            let extra = format!(
                "{}{}",
                if *due_now && *to == StepState::CompensationReady {
                    // An attempt lost with its instance keeps its deadline (see
                    // `complete_by` in the rescue): until then it may still act, and its
                    // compensation must not run before it.
                    ", available_at = CASE WHEN complete_by > {now} THEN complete_by ELSE {now} END, \
                     aging_from = {now}, priority = \
                     (SELECT r.priority FROM sagaflow_runs AS r WHERE r.id = sagaflow_steps.run_id)"
                } else if *due_now {
                    ", available_at = {now}, aging_from = {now}, priority = \
                     (SELECT r.priority FROM sagaflow_runs AS r WHERE r.id = sagaflow_steps.run_id)"
                } else {
                    ", available_at = NULL, aging_from = NULL"
                },
                if *reset {
                    ", failure_count = 0, interruptions = 0, deadline_ms = initial_deadline_ms"
                } else {
                    ""
                },
            );
            for chunk in ids.chunks(CHUNK) {
                let (cond, ids) = s.in_list("id", 3, chunk)?;
                let sql = format!(
                    "UPDATE sagaflow_steps SET state = $1, updated_at = {{now}}{extra} \
                     WHERE state = $2 AND {cond} RETURNING id"
                );
                let mut values: Vec<Value> = vec![to.as_str().into(), from.as_str().into()];
                values.extend(ids);
                for r in self.txn.query_all(s.stmt(&sql, values)).await? {
                    moved.insert(r.try_get::<i64>("", "id")?);
                }
            }
        }

        // Steps that start afresh (a rollback): a new idempotency key, nothing of before.
        for (_, p) in &plans {
            for w in p.steps.iter().filter(|w| moved.contains(&w.id)) {
                let Some(key) = &w.key else { continue };
                let sql = "UPDATE sagaflow_steps SET idempotency_key = $1, output = NULL, error = NULL, \
                           maybe_applied = FALSE WHERE id = $2";
                self.txn
                    .execute(s.stmt(sql, vec![key.clone().into(), w.id.into()]))
                    .await?;
            }
        }

        // Deadlines an operator extended: only while the same attempt is in flight.
        for (_, p) in &plans {
            for &(id, attempt) in &p.extend {
                let sql = "UPDATE sagaflow_steps SET complete_by = complete_by + $1, updated_at = {now} \
                           WHERE id = $2 AND attempt = $3 AND state IN ('running', 'compensating')";
                let values = vec![p.extend_ms.into(), id.into(), attempt.into()];
                self.txn.execute(s.stmt(sql, values)).await?;
            }
        }

        // 2. Per run: what moved, the run's new state, history.
        let mut out = Vec::with_capacity(plans.len());
        let mut same_state: BTreeMap<(RunState, bool, bool), Vec<Uuid>> = BTreeMap::new();
        let mut finished: Vec<Uuid> = Vec::new();
        let mut ended: Vec<(Uuid, RunState, Option<String>)> = Vec::new();
        let mut totals: BTreeMap<(String, RunState), i64> = BTreeMap::new();
        let mut stale_runs: Vec<Uuid> = Vec::new();
        let mut alerts: Vec<(usize, NewAlert)> = Vec::new();
        let mut resolve: Vec<(Uuid, Option<String>)> = Vec::new();
        let mut with_payload: Vec<RunPayload> = Vec::new();
        // Runs that leave the runs table for the finished ones (PostgreSQL).
        let mut moving: Vec<RunPayload> = Vec::new();
        // Runs whose end releases their business key (the key table's rows, PostgreSQL).
        let mut released: Vec<Uuid> = Vec::new();
        let mut notices: Vec<RunFinished> = Vec::new();
        for (before, mut write) in plans {
            let id = before.id;
            let stale = write
                .steps
                .iter()
                .filter(|w| !moved.contains(&w.id))
                .count();
            if stale > 0 {
                // A step moved after the plan read it: the plan no longer describes the rows.
                // Nothing of it that the rows could contradict is written (the run keeps its
                // state, no alert, no finish); the run is marked and planned again. The
                // units of work lock the rows they plan from, so this is a last line.
                tracing::warn!(
                    run_id = %id,
                    stale,
                    "a guarded step write missed: the run is planned again"
                );
                write = PlanWrite {
                    steps: write.steps,
                    ..PlanWrite::default()
                };
            }
            let mut ready = 0;
            for w in &write.steps {
                if !moved.contains(&w.id) {
                    continue;
                }
                if w.effects.due != Due::Never {
                    ready += 1;
                }
                self.history.push(HistoryEntry {
                    run_id: id,
                    step: Some(w.name.clone()),
                    event: "state".into(),
                    from: Some(w.from.as_str().into()),
                    to: Some(w.to.as_str().into()),
                    attempt: None,
                    actor: actor.into(),
                    detail: None,
                });
            }
            let state = write.run_state.unwrap_or(before.state);
            let release_key = write.release_key && state.is_final();
            if release_key && before.business_key.is_some() {
                released.push(id);
            }
            if moves_on_end(s, &before, state) {
                moving.push(RunPayload {
                    id,
                    state,
                    output: write.run_output.clone(),
                    error: write.run_error.clone(),
                    release_key,
                    clear_error: write.clear_error
                        && write.run_output.is_none()
                        && write.run_error.is_none(),
                });
            } else if write.run_output.is_some() || write.run_error.is_some() {
                with_payload.push(RunPayload {
                    id,
                    state,
                    output: write.run_output.clone(),
                    error: write.run_error.clone(),
                    release_key,
                    clear_error: false,
                });
            } else if state != before.state || write.clear_error {
                same_state
                    .entry((state, release_key, write.clear_error))
                    .or_default()
                    .push(id);
            }
            if state.is_final() && state != before.state {
                finished.push(id);
                if before.parent_step.is_some() {
                    ended.push((id, state, write.run_output.clone()));
                }
                *totals.entry((before.workflow.clone(), state)).or_default() += 1;
                if before.notify {
                    notices.push(finished_notice(&before, &write, state));
                }
            }
            if state != before.state || write.audited {
                let event = if write.event.is_empty() {
                    "state"
                } else {
                    write.event
                };
                self.history.push(HistoryEntry {
                    run_id: id,
                    step: None,
                    event: event.into(),
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
                resolve.push((id, write.resolution.clone()));
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
        for (id, resolution) in resolve {
            s.alert_resolve_run(&self.txn, id, actor, resolution.as_deref())
                .await?;
        }
        self.runs_set_payload(&with_payload).await?;
        for ((state, release_key, clear_error), ids) in &same_state {
            for chunk in ids.chunks(CHUNK) {
                let (cond, ids) = s.in_list("id", 2, chunk)?;
                let sql = format!(
                    "UPDATE sagaflow_runs SET state = $1, updated_at = {{now}}{}{}{} WHERE {cond}",
                    // A run reopened from a final state (a completed child its parent
                    // compensates) is unfinished again: retention must not take it.
                    if state.is_final() {
                        ", finished_at = {now}"
                    } else {
                        ", finished_at = NULL"
                    },
                    if *release_key {
                        ", active_key = NULL"
                    } else {
                        ""
                    },
                    if *clear_error { ", error = NULL" } else { "" },
                );
                let mut values: Vec<Value> = vec![state.as_str().into()];
                values.extend(ids);
                self.txn.execute(s.stmt(&sql, values)).await?;
            }
        }
        // A child run's end wakes its parent's step; a completed child keeps its steps (its
        // parent may yet compensate it).
        let parents = if ended.is_empty() {
            super::waits::Parents::default()
        } else {
            self.wake_parents(&ended, actor).await?
        };
        finished.retain(|id| !parents.kept.contains(id));
        mark_dirty(s, &self.txn, &stale_runs).await?;
        self.runs_move_finished(&moving).await?;
        // A child whose parent has no step left to undo it moves as it is, like any run.
        if s.backend() == crate::Backend::Postgres {
            self.runs_move_as_is(&parents.orphans).await?;
        }
        self.steps_leave(finished).await?;
        if s.backend() == crate::Backend::Postgres {
            for chunk in released.chunks(CHUNK) {
                let (cond, values) = s.in_list("run_id", 1, chunk)?;
                let sql = format!("DELETE FROM {RUN_KEYS} WHERE {cond}");
                self.txn.execute(s.stmt(&sql, values)).await?;
            }
        }
        for (i, a) in alerts {
            out[i].alert = insert_alert(s, &self.txn, &a).await?;
        }
        if !notices.is_empty() {
            let now = s.now_ms_in(&self.txn).await?;
            for run in notices {
                let id = run.id;
                insert_notice(s, &self.txn, None, Some(id), &run_notice(run, now)).await?;
            }
        }
        if out.iter().any(|a| a.ready > 0) {
            self.notify = true;
        }
        // Last, so that the counter row is the last lock this transaction takes.
        super::stats::count_finished(s, &self.txn, &totals).await?;
        Ok(out)
    }

    /// Ends runs by moving their rows from the runs table into the finished ones with their
    /// final state, output and error: one `DELETE … RETURNING` into an `INSERT` per chunk,
    /// which writes no new version of the live row (an update would, and index it). The runs
    /// are locked by this unit of work; a unit that waited for one of them finds no row when
    /// it gets the lock and reads the run again from the finished table.
    async fn runs_move_finished(&self, runs: &[RunPayload]) -> Result<()> {
        self.per_payload_chunk(runs, &[("clr", |r| r.clear_error)], |source| {
            format!(
                "WITH m AS (DELETE FROM sagaflow_runs AS r USING {source} WHERE r.id = v.vid \
                   RETURNING r.*, v.state AS v_state, v.output AS v_output, v.error AS v_error, \
                   v.clr AS v_clr) \
                 INSERT INTO {RUNS_DONE} ({RUN_TABLE_COLUMNS}) SELECT {} FROM m",
                moved_run(Moved {
                    state: "v_state",
                    output: "COALESCE(v_output, output)",
                    error: "CASE WHEN v_clr THEN NULL ELSE COALESCE(v_error, error) END",
                    updated_at: "{now}",
                    finished_at: "{now}",
                })
            )
        })
        .await
    }

    /// AT-5: deletes the steps of `runs`, which finished for good (history and the run row
    /// keep them), and those of the child runs this frees. A completed child keeps its steps
    /// and stays in the runs table while its parent's step may compensate it; once that step
    /// is gone nothing can reopen the child: its steps go too and, on PostgreSQL, it moves to
    /// the finished runs' table as it is. Down the generations: the steps' delete returns
    /// whether each step has a child (found on the partial index of `parent_step`), and only
    /// the steps that have one are looked up for their finished children (a lookup after
    /// every delete cost SQLite 5 % more instructions per saga). A freed child's steps are
    /// deleted without a lock taken first: on PostgreSQL a grandchild's end that held one
    /// (see [`StoreTx::wake_parents`]) has committed when the delete gets it, which reads it
    /// as of its start, running; the lookup, a statement of its own, reads it final.
    async fn steps_leave(&self, runs: Vec<Uuid>) -> Result<()> {
        let s = self.store;
        let postgres = s.backend() == crate::Backend::Postgres;
        let mut runs = runs;
        while !runs.is_empty() {
            let mut freed: Vec<Uuid> = Vec::new();
            // Steps with a child; a step may have more than one (a child that released its
            // key, then a retry that started another).
            let mut parents: Vec<i64> = Vec::new();
            for chunk in runs.chunks(CHUNK) {
                let (cond, values) = s.in_list("run_id", 1, chunk)?;
                let sql = format!(
                    "DELETE FROM sagaflow_steps WHERE {cond} RETURNING id, (SELECT c.id \
                     FROM sagaflow_runs AS c WHERE c.parent_step = sagaflow_steps.id \
                     LIMIT 1) AS child"
                );
                for r in self.txn.query_all(s.stmt(&sql, values)).await? {
                    if r.try_get::<Option<Uuid>>("", "child")?.is_some() {
                        parents.push(r.try_get("", "id")?);
                    }
                }
            }
            for chunk in parents.chunks(CHUNK) {
                let (cond, values) = s.in_list("parent_step", 1, chunk)?;
                let sql = format!(
                    "SELECT id FROM sagaflow_runs WHERE {cond} \
                     AND state IN {FINAL_RUN_STATES}"
                );
                for r in self.txn.query_all(s.stmt(&sql, values)).await? {
                    freed.push(r.try_get("", "id")?);
                }
            }
            if postgres {
                freed = self.runs_move_as_is(&freed).await?;
            }
            runs = freed;
        }
        Ok(())
    }

    /// Moves finished runs (`runs`, locked or freed by this unit of work) from the runs table
    /// into the finished ones as they are, with their `finished_at`; a run no longer final
    /// when the statement gets its row stays. Returns the runs moved.
    async fn runs_move_as_is(&self, runs: &[Uuid]) -> Result<Vec<Uuid>> {
        let s = self.store;
        let mut moved = Vec::with_capacity(runs.len());
        for chunk in runs.chunks(CHUNK) {
            let (cond, values) = s.in_list("id", 1, chunk)?;
            let sql = format!(
                "WITH m AS (DELETE FROM sagaflow_runs WHERE {cond} \
                   AND state IN {FINAL_RUN_STATES} RETURNING *) \
                 INSERT INTO {RUNS_DONE} ({RUN_TABLE_COLUMNS}) SELECT {} FROM m RETURNING id",
                moved_run(Moved {
                    state: "state",
                    output: "output",
                    error: "error",
                    updated_at: "updated_at",
                    finished_at: "finished_at",
                })
            );
            for r in self.txn.query_all(s.stmt(&sql, values)).await? {
                moved.push(r.try_get("", "id")?);
            }
        }
        Ok(moved)
    }

    /// Sets state, output and error of many runs in one statement per chunk.
    async fn runs_set_payload(&self, runs: &[RunPayload]) -> Result<()> {
        let flags: [PayloadFlag; 2] = [("fin", |r| r.state.is_final()), ("rel", |r| r.release_key)];
        self.per_payload_chunk(runs, &flags, |source| {
            format!(
                "UPDATE sagaflow_runs AS r SET state = v.state, output = COALESCE(v.output, r.output), \
                   error = COALESCE(v.error, r.error), updated_at = {{now}}, \
                   finished_at = CASE WHEN v.fin THEN {{now}} ELSE NULL END, \
                   active_key = CASE WHEN v.rel THEN NULL ELSE r.active_key END \
                 FROM {source} WHERE r.id = v.vid"
            )
        })
        .await
    }

    /// Runs the statement `sql_of(source)` once per chunk of `runs`, where `source` is a row
    /// source `v` of their ids (`vid`), new states, outputs and errors, and the flags
    /// `flags` names, each read from a run by its function.
    async fn per_payload_chunk(
        &self,
        runs: &[RunPayload],
        flags: &[PayloadFlag],
        sql_of: impl Fn(&str) -> String,
    ) -> Result<()> {
        let mut cols = vec![
            ("vid", "uuid"),
            ("state", "text"),
            ("output", "text"),
            ("error", "text"),
        ];
        cols.extend(flags.iter().map(|(name, _)| (*name, "boolean")));
        let s = self.store;
        for chunk in runs.chunks(CHUNK) {
            let rows = chunk
                .iter()
                .map(|r| {
                    let mut row: Vec<Value> = vec![
                        r.id.into(),
                        r.state.as_str().into(),
                        r.output.clone().into(),
                        r.error.clone().into(),
                    ];
                    row.extend(flags.iter().map(|(_, flag)| flag(r).into()));
                    row
                })
                .collect();
            let (source, values) = s.rows_source(1, &cols, rows)?;
            self.txn.execute(s.stmt(&sql_of(&source), values)).await?;
        }
        Ok(())
    }
}

/// Whether a run that `before` was and now ends in `state` leaves the runs table for the
/// finished ones ([`RUNS_DONE`], PostgreSQL only): it ended for good just now and no parent
/// step may undo it (a child run stays, for its parent's compensation, and moves once its
/// parent's steps are gone: [`StoreTx::steps_leave`]). A business key it keeps stays taken
/// in the key table ([`RUN_KEYS`]), the intake's arbiter there.
fn moves_on_end(s: &super::Store, before: &RunRow, state: RunState) -> bool {
    s.backend() == crate::Backend::Postgres
        && state.is_final()
        && state != before.state
        && before.parent_step.is_none()
}

/// What the `run_finished` notice of a run that `write` finishes in `state` says.
fn finished_notice(before: &RunRow, write: &PlanWrite, state: RunState) -> RunFinished {
    // Stored JSON; text that is not JSON (a damaged row) travels as a string.
    let json = |text: Option<&String>| {
        text.map(|t| {
            serde_json::from_str(t).unwrap_or_else(|_| serde_json::Value::String(t.clone()))
        })
    };
    RunFinished {
        id: before.id,
        workflow: before.workflow.clone(),
        version: before.version,
        business_key: before.business_key.clone(),
        state,
        output: json(write.run_output.as_ref().or(before.output.as_ref())),
        // A cleared error (a resume, a cancel that came too late) is not the run's any more.
        error: json(match (&write.run_error, write.clear_error) {
            (Some(e), _) => Some(e),
            (None, true) => None,
            (None, false) => before.error.as_ref(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{Moved, RUN_TABLE_COLUMNS, moved_run};

    /// The move's select list gives every column of the runs' tables, in their order.
    #[test]
    fn a_moved_run_has_every_column_in_its_place() {
        let list = moved_run(Moved {
            state: "S",
            output: "O",
            error: "E",
            updated_at: "U",
            finished_at: "F",
        });
        let values: Vec<&str> = list.split(", ").map(str::trim).collect();
        let columns: Vec<&str> = RUN_TABLE_COLUMNS.split(", ").map(str::trim).collect();
        assert_eq!(values.len(), columns.len(), "{list}");
        let set = [
            ("active_key", "NULL"),
            ("state", "S"),
            ("output", "O"),
            ("error", "E"),
            ("dirty", "FALSE"),
            ("updated_at", "U"),
            ("finished_at", "F"),
        ];
        for (column, value) in columns.iter().zip(&values) {
            let expected = set
                .iter()
                .find(|(c, _)| c == column)
                .map_or(*column, |(_, v)| *v);
            assert_eq!(*value, expected, "column {column} in {list}");
        }
    }
}
