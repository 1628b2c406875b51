//! The preview of an undo: what a `cancel` or a `compensate` of a run would do, worked out
//! by the functions that carry it out ([`super::operator::cancel`],
//! [`super::operator::compensate`], then the evaluator's [`super::plan`] again and again) on
//! a copy of the run's rows, each write applied to the copy as the store would apply it,
//! every compensation taken to succeed. Nothing here decides on its own: a preview and the
//! undo it shows cannot part ways unless the run changes in between.

use super::{Maybe, PlanWrite, StepWrite, Trigger, step_rule};
use crate::definition::{StepKind, Workflow};
use crate::model::{KeptStep, Undo, UndoOutcome, UndoPreview, UndoStep};
use crate::rows::{RunRow, StepRow};
use crate::{Result, RunState, StepState};

/// What `undo` of `run` (with its step rows `steps`, as read) would do.
///
/// # Errors
/// [`crate::Error::ActionNotAllowed`] when the action would be refused (a finished run),
/// [`crate::Error::CorruptRow`] for step rows the definition does not know.
pub fn preview_undo(
    wf: &Workflow,
    run: &RunRow,
    steps: &[StepRow],
    undo: Undo,
) -> Result<UndoPreview> {
    let action = match undo {
        Undo::Cancel => super::operator::cancel(run, steps, None)?,
        Undo::Compensate => super::operator::compensate(run, steps)?,
    };
    let mut sim = Sim {
        run: run.clone(),
        rows: steps.to_vec(),
        skipped: Vec::new(),
        reason: None,
    };
    sim.apply(&action);
    let in_flight = sim.settle_attempts(wf, undo);
    let mut groups: Vec<Vec<UndoStep>> = Vec::new();
    // The action itself queues the compensations that had failed (of a run in `error`):
    // they run first, before the evaluator plans the rest.
    let retried = queued(&action);
    if !retried.is_empty() {
        groups.push(retried.iter().map(|n| undo_step(wf, steps, n)).collect());
        for name in &retried {
            sim.compensate(name);
        }
    }
    // Each round moves at least one step or the run, or ends the loop; a step moves a
    // bounded number of times on the way to its undo.
    for _ in 0..=4 * steps.len() + 4 {
        let plan = super::plan(wf, &sim.run, &sim.rows)?;
        let due = queued(&plan);
        let moved = !plan.steps.is_empty() || plan.run_state.is_some();
        sim.apply(&plan);
        if !due.is_empty() {
            groups.push(due.iter().map(|n| undo_step(wf, steps, n)).collect());
            for name in &due {
                sim.compensate(name);
            }
        }
        if !moved || sim.run.state.is_final() || sim.run.state == RunState::Error {
            break;
        }
    }
    let (outcome, reason) = match sim.run.state {
        RunState::Compensated => (UndoOutcome::Compensated, None),
        RunState::Error => (UndoOutcome::StopsInError, sim.reason.take()),
        RunState::Running | RunState::Completed => (UndoOutcome::GoesForward, sim.reason.take()),
        _ => (UndoOutcome::Waits, Some(sim.waiting_for(wf))),
    };
    let undone: Vec<&str> = groups.iter().flatten().map(|s| s.step.as_str()).collect();
    let kept = steps
        .iter()
        .filter(|r| !undone.contains(&r.name.as_str()))
        .map(|r| KeptStep {
            step: r.name.clone(),
            state: r.state,
            reason: sim.kept_reason(wf, r),
        })
        .collect();
    Ok(UndoPreview {
        run_id: run.id,
        undo,
        run_state: run.state,
        input: serde_json::from_str(&run.input).unwrap_or_else(|_| run.input.as_str().into()),
        outcome,
        reason,
        groups,
        kept,
        in_flight,
    })
}

/// The steps whose compensation `plan` queues.
fn queued(plan: &PlanWrite) -> Vec<String> {
    plan.steps
        .iter()
        .filter(|w| w.to == StepState::CompensationReady)
        .map(|w| w.name.clone())
        .collect()
}

/// The compensation of step `name`, as the plan shows it.
fn undo_step(wf: &Workflow, steps: &[StepRow], name: &str) -> UndoStep {
    let row = steps.iter().find(|r| r.name == name);
    let def = wf.position(name).map(|i| &wf.steps[i]);
    UndoStep {
        step: name.to_owned(),
        state: row.map_or(StepState::NotStarted, |r| r.state),
        maybe_applied: row.is_some_and(|r| r.maybe_applied || is_forward_in_flight(r.state)),
        output: row
            .and_then(|r| r.output.as_deref())
            .map(|o| serde_json::from_str(o).unwrap_or_else(|_| o.into())),
        resource: def.and_then(|d| d.resource.as_deref()).map(str::to_owned),
    }
}

fn is_forward_in_flight(state: StepState) -> bool {
    matches!(state, StepState::Running)
}

/// The run's rows as the undo would leave them, step by step.
struct Sim {
    run: RunRow,
    rows: Vec<StepRow>,
    /// Steps the plan dropped, with the state they were dropped from.
    skipped: Vec<(String, StepState)>,
    /// Why the run stopped or went forward, as the plan said it.
    reason: Option<String>,
}

impl Sim {
    /// Applies a plan's writes to the copy: step states and the *maybe applied* flag, the
    /// run's state and error.
    fn apply(&mut self, plan: &PlanWrite) {
        for w in &plan.steps {
            self.apply_step(w);
        }
        if let Some(state) = plan.run_state {
            self.run.state = state;
        }
        if plan.clear_error {
            self.run.error = None;
        }
        if let Some(e) = &plan.run_error {
            self.run.error = Some(e.clone());
        }
        if let Some(alert) = &plan.alert {
            self.reason = Some(alert.reason.clone());
        } else if let Some(detail) = &plan.detail
            && let Ok(d) = serde_json::from_str::<serde_json::Value>(detail)
            && let Some(r) = d["reason"].as_str()
        {
            self.reason = Some(r.to_owned());
        }
    }

    fn apply_step(&mut self, w: &StepWrite) {
        if let Some(r) = self.rows.iter_mut().find(|r| r.name == w.name) {
            if w.to == StepState::Skipped {
                self.skipped.push((w.name.clone(), r.state));
            }
            r.state = w.to;
            if w.effects.maybe == Maybe::Set {
                r.maybe_applied = true;
            }
        }
    }

    /// Moves step `name` through its compensation as the rules do when it succeeds.
    fn compensate(&mut self, name: &str) {
        for on in [Trigger::Claimed, Trigger::Succeeded] {
            let Some(r) = self.rows.iter_mut().find(|r| r.name == name) else {
                return;
            };
            if let Some(rule) = step_rule(r.state, on) {
                r.state = rule.to;
            }
        }
    }

    /// Ends the attempts in flight as the preview assumes, and says so: a cancel stops the
    /// forward attempts (their outcome unknown) but a pivot's, whose end decides where the
    /// run goes; under a compensate they run on and complete; compensations in flight
    /// succeed.
    fn settle_attempts(&mut self, wf: &Workflow, undo: Undo) -> Vec<String> {
        let mut said = Vec::new();
        for r in &mut self.rows {
            let pivot = wf
                .position(&r.name)
                .is_some_and(|i| wf.steps[i].kind == StepKind::Pivot);
            match r.state {
                StepState::Running if pivot => said.push(format!(
                    "pivot `{}` is running: the undo waits for it to end",
                    r.name
                )),
                StepState::Running if undo == Undo::Cancel => {
                    said.push(format!(
                        "`{}` is running: the cancel stops it, its outcome unknown",
                        r.name
                    ));
                    r.state = StepState::Failed;
                    r.maybe_applied = true;
                }
                StepState::Running => {
                    said.push(format!(
                        "`{}` is running: taken to complete before it is undone",
                        r.name
                    ));
                    r.state = StepState::Completed;
                }
                StepState::Compensating => {
                    said.push(format!(
                        "the compensation of `{}` is running: taken to succeed",
                        r.name
                    ));
                    r.state = StepState::Compensated;
                }
                _ => {}
            }
        }
        said
    }

    /// What an undo that did not end waits for.
    fn waiting_for(&self, wf: &Workflow) -> String {
        let busy: Vec<String> = self
            .rows
            .iter()
            .filter(|r| matches!(r.state, StepState::Running | StepState::Waiting))
            .map(|r| format!("`{}`", r.name))
            .collect();
        if let Some(p) = self.rows.iter().find(|r| {
            r.state == StepState::Running
                && wf
                    .position(&r.name)
                    .is_some_and(|i| wf.steps[i].kind == StepKind::Pivot)
        }) {
            return format!(
                "pivot `{}` is in flight: if it completes, a cancel comes too late and the run \
                 goes forward; if it fails with an unknown outcome, a cancel stops the run in \
                 error for an operator; a compensate undoes what can be undone once it ends",
                p.name
            );
        }
        if self.run.state == RunState::Paused {
            return "the run is paused".to_owned();
        }
        format!("the undo waits for {}", busy.join(", "))
    }

    /// Why the undo leaves step `r` (as read) as it is.
    fn kept_reason(&self, wf: &Workflow, r: &StepRow) -> String {
        if let Some((_, from)) = self.skipped.iter().find(|(n, _)| *n == r.name) {
            return match from {
                StepState::NotStarted => "never started: dropped".to_owned(),
                StepState::Waiting => "parked, never acted: dropped".to_owned(),
                _ => "queued, never acted: dropped".to_owned(),
            };
        }
        let def = wf.position(&r.name).map(|i| &wf.steps[i]);
        let now = self
            .rows
            .iter()
            .find(|x| x.name == r.name)
            .map_or(r.state, |x| x.state);
        match (r.state, def) {
            (StepState::Compensated, _) => "already undone".to_owned(),
            (StepState::Skipped, _) => "dropped before".to_owned(),
            (StepState::NotStarted | StepState::Ready | StepState::Waiting, _)
                if now == r.state =>
            {
                "never acted".to_owned()
            }
            (_, Some(d)) if d.kind == StepKind::Pivot => {
                "a pivot: the point of no return is not undone".to_owned()
            }
            (_, Some(d)) if d.kind == StepKind::Retriable => {
                "after the pivot: a retriable step is not undone".to_owned()
            }
            (StepState::Failed, _) if !r.maybe_applied => {
                "failed without effect: nothing to undo".to_owned()
            }
            (_, Some(d)) if d.compensation.is_none() => {
                "has no compensation: its effect stays".to_owned()
            }
            (state, _) => format!("{state}: not undone by this action"),
        }
    }
}
