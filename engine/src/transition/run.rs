//! The evaluator: given a run and its steps, decide what moves next, through the run table
//! of `run_rules.rs`.
//!
//! Forward: a `NotStarted` step becomes `Ready` when all its dependencies are `Completed`;
//! the run completes when every step has.
//!
//! Failure: a `Failed` step makes the run unwind, unless nothing can be undone safely: the
//! failure came after the pivot completed, or from a retriable step, or a pivot may have
//! taken effect (*maybe applied*), or a step was interrupted more often than its cap (a
//! poison step). Then the run stops in `Error` with an alert.
//!
//! Unwinding (reverse topological order): steps that never acted are dropped; a step whose
//! effect happened (`Completed`) or may have happened (*maybe applied*: an attempt with an
//! unknown outcome, a timeout or an interruption) is compensated once every step that
//! depends on it is settled. Its compensation sees no output when the forward step never
//! answered, and must find out (replay the forward call under
//! [`StepContext::forward_idempotency_key`](crate::StepContext::forward_idempotency_key)) or
//! fail, which stops the run in `Error` rather than leaving a silent inconsistency.
//! Running steps are waited for. The run is `Compensated` when nothing is left to undo, or
//! `Error` when a compensation failed for good.

use super::pause;
use super::run_rules::{OPERATOR_ACTIONS, PAUSED_ACTIONS, RunTrigger, listed, run_rule};
use super::step::{Trigger, step_rule};
use super::writes::{NewAlert, PlanWrite, StepWrite};
use crate::RunState::{
    Compensated, Compensating, Completed, Error as RunError, Paused, Pending, Running,
};
use crate::definition::{OnFailure, StepKind, Workflow};
use crate::rows::{RunRow, StepRow};
use crate::{AlertKind, Error, Result, RunState, StepState};

/// The member of the history detail of a run's `rolled_back` transition that holds the new
/// idempotency key of each step it started afresh.
pub const ROLLED_BACK_KEYS: &str = "keys";

/// A step write through the table: `None` when the edge does not exist.
pub(crate) fn step_write(row: &StepRow, on: Trigger) -> Option<StepWrite> {
    step_rule(row.state, on).map(|r| StepWrite {
        id: row.id,
        name: row.name.clone(),
        from: row.state,
        to: r.to,
        effects: r.effects,
        // Unique among the keys the step was called under: its claims so far only grow,
        // and a key is only used by a claim.
        key: r
            .effects
            .rekey
            .then(|| format!("{}:{}:{}", row.run_id, row.name, row.attempt)),
    })
}

/// Sets the run's next state through the run table.
pub(crate) fn move_run(plan: &mut PlanWrite, from: RunState, on: RunTrigger) -> Result<()> {
    let r = run_rule(from, on).ok_or_else(|| {
        Error::Config(format!(
            "internal: no run transition from {from} on {}",
            on.as_str()
        ))
    })?;
    plan.run_state = Some(r.to);
    plan.trigger = Some(on);
    Ok(())
}

/// Whether a step was interrupted more often than its cap allows.
fn is_poison(r: &StepRow) -> bool {
    matches!(r.state, StepState::Failed | StepState::CompensationFailed)
        && r.interruptions > r.max_interruptions
}

/// Decides the writes that advance `run`.
///
/// # Errors
/// [`Error::CorruptRow`] when the stored steps do not match the definition.
pub fn plan(wf: &Workflow, run: &RunRow, rows: &[StepRow]) -> Result<PlanWrite> {
    let mut plan = Plan::new(wf, run, rows)?.advance()?;
    if let Some(state) = plan.run_state {
        plan.release_key = wf.key_policy().releases_key(state);
    }
    Ok(plan)
}

/// One evaluation: the steps by position, their current (planned) states, and the writes.
struct Plan<'a> {
    wf: &'a Workflow,
    run: &'a RunRow,
    rows: Vec<&'a StepRow>,
    states: Vec<StepState>,
    out: PlanWrite,
    /// While the run rolls back to a step: that step and those it depends on, which stay.
    kept: std::collections::BTreeSet<usize>,
}

impl<'a> Plan<'a> {
    fn new(wf: &'a Workflow, run: &'a RunRow, rows: &'a [StepRow]) -> Result<Self> {
        let mut by_pos: Vec<Option<&StepRow>> = vec![None; wf.steps.len()];
        for r in rows {
            let i = wf.position(&r.name).ok_or_else(|| {
                Error::corrupt(
                    "sagaflow_steps",
                    r.id,
                    format!("step `{}` is not in workflow {}", r.name, wf.key()),
                )
            })?;
            by_pos[i] = Some(r);
        }
        let missing = by_pos.iter().position(Option::is_none);
        let rows: Vec<&StepRow> = by_pos.into_iter().flatten().collect();
        if let Some(i) = missing {
            if run.state.is_final() {
                return Ok(Self {
                    wf,
                    run,
                    states: Vec::new(),
                    rows: Vec::new(),
                    out: PlanWrite::default(),
                    kept: std::collections::BTreeSet::new(),
                });
            }
            return Err(Error::corrupt(
                "sagaflow_runs",
                run.id,
                format!("step `{}` has no row", wf.steps[i].name),
            ));
        }
        // A rollback keeps its step and those it depends on; a step the workflow no longer
        // has (a migration between) keeps nothing, and the run unwinds as a compensate.
        let kept = run
            .error
            .as_deref()
            .filter(|_| run.state == Compensating)
            .and_then(super::operator::rollback_target)
            .and_then(|to| wf.position(&to))
            .map(|at| super::operator::kept(wf, at))
            .unwrap_or_default();
        Ok(Self {
            wf,
            run,
            states: rows.iter().map(|r| r.state).collect(),
            rows,
            out: PlanWrite::default(),
            kept,
        })
    }

    fn set(&mut self, i: usize, on: Trigger) {
        if let Some(w) = step_write(self.rows[i], on) {
            self.states[i] = w.to;
            self.out.steps.push(w);
        }
    }

    fn stop(mut self, on: RunTrigger, step: usize, reason: String) -> Result<PlanWrite> {
        let from = self.out.run_state.unwrap_or(self.run.state);
        move_run(&mut self.out, from, on)?;
        let row = self.rows[step];
        self.out.run_error = row.error.clone();
        let kind = run_rule(from, on)
            .and_then(|r| r.alert)
            .map_or(AlertKind::RunError, AlertKind::named);
        self.out.alert = Some(run_alert(
            self.run,
            kind,
            &self.wf.steps[step].name,
            row,
            reason,
        ));
        Ok(self.out)
    }

    fn advance(self) -> Result<PlanWrite> {
        if self.rows.is_empty() {
            return Ok(self.out);
        }
        if let Some(p) = (0..self.rows.len()).find(|&i| is_poison(self.rows[i]))
            && !matches!(self.run.state, RunError | Completed | Compensated | Paused)
        {
            let name = &self.wf.steps[p].name;
            let reason = format!(
                "step `{name}` was interrupted {} times (its engine instance died or stopped \
                 during each attempt), more than its cap of {}; it may crash its process: fix \
                 the cause, then retry it or compensate",
                self.rows[p].interruptions, self.rows[p].max_interruptions
            );
            return self.stop(RunTrigger::PoisonStep, p, reason);
        }
        match self.run.state {
            Pending | Running => self.forward(),
            Compensating => self.unwind(),
            Paused => Ok(self.hold()),
            Completed | Compensated | RunError => Ok(self.out),
        }
    }

    fn forward(mut self) -> Result<PlanWrite> {
        let n = self.states.len();
        if let Some(f) = (0..n).find(|&i| self.states[i] == StepState::Failed) {
            let steps = &self.wf.steps;
            let pivot_done = (0..n).any(|i| {
                steps[i].kind == StepKind::Pivot && self.states[i] == StepState::Completed
            });
            let uncertain_pivot = (0..n).find(|&i| {
                steps[i].kind == StepKind::Pivot
                    && self.rows[i].maybe_applied
                    && self.states[i] != StepState::Completed
            });
            if let Some(p) = uncertain_pivot {
                // The point of no return may have been passed: compensating could undo a saga
                // whose pivot took effect. Retrying under the same idempotency key tells
                // which; an operator decides.
                let name = &steps[p].name;
                let reason = format!(
                    "pivot `{name}` may have taken effect (an attempt's outcome is unknown); \
                     retry it to learn the outcome (same idempotency key) or compensate"
                );
                return self.stop(RunTrigger::PivotMaybeApplied, p, reason);
            }
            // A pivot in flight (its attempt running, or waiting for its callback or event)
            // may be passing the point of no return right now: unwinding must not start
            // under it, or its effect would stand in a run that ends `compensated`. The run
            // waits for the pivot to settle: completed, the failure is one after the pivot;
            // failed, the run unwinds.
            if (0..n).any(|i| {
                steps[i].kind == StepKind::Pivot
                    && matches!(self.states[i], StepState::Running | StepState::Waiting)
            }) {
                return Ok(self.out);
            }
            let name = &steps[f].name;
            if pivot_done {
                let reason = format!(
                    "step `{name}` failed after the point of no return; the saga cannot be compensated"
                );
                return self.stop(RunTrigger::FailedAfterPivot, f, reason);
            }
            if steps[f].kind == StepKind::Retriable {
                let reason = format!(
                    "retriable step `{name}` failed; retriable steps are never compensated"
                );
                return self.stop(RunTrigger::RetriableFailed, f, reason);
            }
            let timed_out = self.rows[f]
                .error
                .as_deref()
                .and_then(|e| serde_json::from_str::<crate::StepError>(e).ok())
                .is_some_and(|e| e.code == crate::wait::WAIT_TIMED_OUT);
            let on_timeout = match steps[f].wait.as_ref() {
                Some(crate::wait::StepWait::Event(w)) if timed_out => Some(w.on_timeout.clone()),
                _ => None,
            };
            if on_timeout == Some(crate::wait::OnTimeout::Fail) {
                let reason = format!(
                    "step `{name}` waited for its event in vain; retry it to wait again, or compensate"
                );
                return self.stop(RunTrigger::WaitTimedOut, f, reason);
            }
            if self.wf.on_failure() == OnFailure::Pause
                && on_timeout != Some(crate::wait::OnTimeout::Compensate)
            {
                return self.park_on_failure(f);
            }
            self.out.run_error = self.rows[f].error.clone();
            let from = self.out.run_state.unwrap_or(self.run.state);
            move_run(&mut self.out, from, RunTrigger::StepFailed)?;
            return self.unwind();
        }
        for i in 0..n {
            if self.states[i] == StepState::NotStarted
                && self.wf.steps[i]
                    .deps
                    .iter()
                    .all(|&d| self.states[d] == StepState::Completed)
            {
                self.set(i, Trigger::DependenciesMet);
            }
        }
        if self.states.iter().all(|&s| s == StepState::Completed) {
            let mut out = serde_json::Map::new();
            for (i, r) in self.rows.iter().enumerate() {
                let v = match r.output.as_deref() {
                    Some(o) => serde_json::from_str(o).map_err(|e| {
                        Error::corrupt("sagaflow_steps", self.wf.steps[i].name.clone(), e)
                    })?,
                    None => serde_json::Value::Null,
                };
                out.insert(self.wf.steps[i].name.clone(), v);
            }
            let from = self.out.run_state.unwrap_or(self.run.state);
            move_run(&mut self.out, from, RunTrigger::AllCompleted)?;
            self.out.run_output = Some(serde_json::Value::Object(out).to_string());
        } else if self.run.state == Pending {
            move_run(&mut self.out, Pending, RunTrigger::Progressed)?;
        }
        Ok(self.out)
    }

    /// A paused run: nothing moves on, and steps that became due (a retry written by a
    /// completion, a step re-queued by the supervisor) are parked.
    fn hold(mut self) -> PlanWrite {
        let parked = pause::park(self.rows.iter().copied());
        self.out.steps.extend(parked);
        self.out
    }

    /// Step `f` failed where the run would start compensating, and its workflow parks such
    /// runs: the run is paused with an alert, its queued steps parked, the failure kept.
    fn park_on_failure(mut self, f: usize) -> Result<PlanWrite> {
        let name = &self.wf.steps[f].name;
        let reason = format!(
            "step `{name}` failed and workflow {} pauses instead of compensating: fix the \
             cause and resume (the failed step is retried), or compensate",
            self.wf.key()
        );
        let row = self.rows[f];
        let message = format!("paused before compensating: step `{name}` failed");
        self.out.run_error = Some(pause::envelope(&message, false, row.error.as_deref()));
        let parked = pause::park(self.rows.iter().copied());
        self.out.steps.extend(parked);
        let from = self.out.run_state.unwrap_or(self.run.state);
        move_run(&mut self.out, from, RunTrigger::StepFailedPaused)?;
        let kind = run_rule(from, RunTrigger::StepFailedPaused)
            .and_then(|r| r.alert)
            .map_or(AlertKind::RunError, AlertKind::named);
        let mut alert = run_alert(self.run, kind, name, row, reason);
        alert.actions = listed(&PAUSED_ACTIONS);
        alert.open_key = Some(format!("run_paused:{}", self.run.id));
        self.out.alert = Some(alert);
        Ok(self.out)
    }

    /// Whether step `i` has an effect to undo: it completed, or an attempt may have acted,
    /// and it is a compensatable step with a compensation.
    fn needs_undo(&self, i: usize) -> bool {
        if self.kept.contains(&i) {
            return false;
        }
        let def = &self.wf.steps[i];
        let acted = match self.states[i] {
            StepState::Completed => true,
            StepState::Failed | StepState::Ready | StepState::Waiting => self.rows[i].maybe_applied,
            _ => false,
        };
        acted && def.kind == StepKind::Compensatable && def.compensation.is_some()
    }

    /// A cancelled run whose pivot completed goes forward again: its error (the cancel) is
    /// cleared, the steps after the pivot are queued, and it completes when they have.
    fn cancel_too_late(mut self, pivot: &str) -> Result<PlanWrite> {
        let from = self.out.run_state.unwrap_or(self.run.state);
        move_run(&mut self.out, from, RunTrigger::CancelTooLate)?;
        self.out.clear_error = true;
        self.out.run_error = None;
        self.out.detail = Some(
            serde_json::json!({
                "reason": format!("pivot `{pivot}` completed: the cancel came after the point of no return"),
            })
            .to_string(),
        );
        self.forward()
    }

    fn unwind(mut self) -> Result<PlanWrite> {
        let n = self.states.len();
        if let Some(f) = (0..n).find(|&i| self.states[i] == StepState::CompensationFailed) {
            let name = &self.wf.steps[f].name;
            let reason = format!(
                "the compensation of step `{name}` failed (terminally or at its threshold)"
            );
            let from = self.out.run_state.unwrap_or(self.run.state);
            move_run(&mut self.out, from, RunTrigger::CompensationFailed)?;
            let row = self.rows[f];
            self.out.alert = Some(run_alert(self.run, AlertKind::RunError, name, row, reason));
            return Ok(self.out);
        }
        if let Some(p) = (0..n).find(|&i| self.wf.steps[i].kind == StepKind::Pivot) {
            // A pivot in flight may be passing the point of no return: nothing is dropped or
            // undone under it; the unwinding waits for it to settle.
            if matches!(self.states[p], StepState::Running | StepState::Waiting) {
                return Ok(self.out);
            }
            // A cancel that met the pivot came too late: once the pivot took effect the saga
            // can only go forward. (An operator's `compensate` is a decision to undo what can
            // be undone past the pivot; a cancel is not.)
            let cancelled = self
                .run
                .error
                .as_deref()
                .is_some_and(super::operator::is_cancelled);
            let undoing = self.states.iter().any(|s| {
                matches!(
                    s,
                    StepState::CompensationReady | StepState::Compensating | StepState::Compensated
                )
            });
            // Once undoing has begun the saga cannot go forward either: a pivot that took or
            // may have taken effect by then (a claim that met the cancel's unwinding, then an
            // attempt interrupted) stops the run for an operator, whatever else is undone.
            let completed = self.states[p] == StepState::Completed;
            if cancelled && (completed || self.rows[p].maybe_applied) {
                let name = self.wf.steps[p].name.clone();
                if completed && !undoing {
                    return self.cancel_too_late(&name);
                }
                let reason = if completed {
                    format!(
                        "the run was cancelled and pivot `{name}` completed while the steps \
                         before it were being undone; compensate to undo what can be, or \
                         finish the saga by hand"
                    )
                } else {
                    format!(
                        "the run was cancelled while pivot `{name}` ran, and the pivot may \
                         have taken effect (an attempt's outcome is unknown); retry it to \
                         learn the outcome (same idempotency key) or compensate"
                    )
                };
                let from = self.out.run_state.unwrap_or(self.run.state);
                move_run(&mut self.out, from, RunTrigger::PivotMaybeApplied)?;
                let row = self.rows[p];
                self.out.alert = Some(run_alert(self.run, AlertKind::RunError, &name, row, reason));
                return Ok(self.out);
            }
        }
        let undone: Vec<usize> = (0..n).filter(|i| !self.kept.contains(i)).collect();
        for i in undone {
            let never_acted = match self.states[i] {
                StepState::NotStarted => true,
                StepState::Ready | StepState::Waiting => !self.needs_undo(i),
                _ => false,
            };
            if never_acted {
                self.set(i, Trigger::Dropped);
            }
        }
        let busy = |s: StepState| {
            matches!(
                s,
                StepState::Running | StepState::CompensationReady | StepState::Compensating
            )
        };
        let eligible: Vec<usize> = (0..n)
            .filter(|&i| self.needs_undo(i))
            .filter(|&i| {
                self.wf.steps[i]
                    .dependents
                    .iter()
                    .all(|&d| !busy(self.states[d]) && !self.needs_undo(d))
            })
            .collect();
        for i in eligible {
            self.set(i, Trigger::CompensationDue);
        }
        let pending = (0..n).any(|i| busy(self.states[i]) || self.needs_undo(i));
        if !pending && !self.kept.is_empty() {
            return self.rolled_back();
        }
        if !pending {
            let from = self.out.run_state.unwrap_or(self.run.state);
            move_run(&mut self.out, from, RunTrigger::NothingLeftToUndo)?;
        }
        Ok(self.out)
    }

    /// A rollback undid everything after its step: those steps start afresh under new
    /// idempotency keys (queued at once when all they depend on is kept), the rollback's
    /// envelope gives way to the error the run held before, and the run goes forward again.
    /// Each step is written from its stored state, replacing what this evaluation planned
    /// for it (a drop): a step queued but never called is queued afresh, or waits again for
    /// what it depends on.
    fn rolled_back(mut self) -> Result<PlanWrite> {
        let n = self.rows.len();
        let mut writes = Vec::new();
        for i in (0..n).filter(|i| !self.kept.contains(i)) {
            let due = self.wf.steps[i].deps.iter().all(|d| self.kept.contains(d));
            let on = if due {
                Trigger::RolledBackDue
            } else {
                Trigger::RolledBack
            };
            if let Some(w) = step_write(self.rows[i], on) {
                writes.push(w);
            }
        }
        self.out
            .steps
            .retain(|w| !writes.iter().any(|r| r.id == w.id));
        self.out.steps.extend(writes);
        let from = self.out.run_state.unwrap_or(self.run.state);
        move_run(&mut self.out, from, RunTrigger::RolledBack)?;
        let cause = self
            .run
            .error
            .as_deref()
            .and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok())
            .and_then(|e| e.get("details")?.get("cause").cloned());
        match cause {
            Some(c) => self.out.run_error = Some(c.to_string()),
            None => self.out.clear_error = true,
        }
        let to = self
            .run
            .error
            .as_deref()
            .and_then(super::operator::rollback_target)
            .unwrap_or_default();
        // The new keys, kept in the history: a finished run's step rows are gone, and a
        // restart of it must reuse each step under the key its effect was applied with.
        let keys: serde_json::Map<String, serde_json::Value> = self
            .out
            .steps
            .iter()
            .filter_map(|w| Some((w.name.clone(), w.key.clone()?.into())))
            .collect();
        self.out.detail = Some(
            serde_json::json!({
                "reason": format!("rolled back to `{to}`: going forward again from there"),
                ROLLED_BACK_KEYS: keys,
            })
            .to_string(),
        );
        Ok(self.out)
    }
}

fn run_alert(run: &RunRow, kind: AlertKind, step: &str, row: &StepRow, reason: String) -> NewAlert {
    let last_error = row.error.as_deref().unwrap_or("no error recorded");
    NewAlert {
        run_id: Some(run.id),
        step: Some(step.to_owned()),
        kind,
        reason: format!("{reason}; last error: {last_error}"),
        attempts: row.phase_attempts(),
        actions: listed(&OPERATOR_ACTIONS),
        open_key: Some(format!("run_error:{}", run.id)),
    }
}
