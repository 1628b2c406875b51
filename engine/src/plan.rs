//! The planner: given a run and its steps, decide the next transitions.
//!
//! This is the only place that knows how a step graph advances and how a saga unwinds. It is
//! a pure function, called by the scheduler under the run's row lock (inline in every result
//! batch, see [`Store::step_finish_batch`](crate::store::Store::step_finish_batch), and by the
//! evaluation loop), so every decision is made on a consistent snapshot and written
//! atomically.
//!
//! Forward: a `NotStarted` step becomes `Ready` when all its dependencies are `Completed`;
//! the run completes when every step has.
//!
//! Failure: a `Failed` step makes the run compensate, unless the failure happened after the
//! pivot completed or in a retriable step: then nothing can be undone and the run goes to
//! `Error` with an alert.
//!
//! Compensation (reverse topological order): queued steps are skipped; a completed step with
//! a compensation becomes `CompensationReady` once every step that depends on it is settled
//! (never ran, failed, compensated, or has nothing to undo). A step that failed with an
//! *unknown outcome* (`maybe_applied`: one of its attempts timed out, so the remote side may
//! have applied the effect and the answer was lost) is compensated too; its compensation sees
//! no output and must find out (e.g. replay the forward call under
//! [`StepContext::forward_idempotency_key`](crate::StepContext::forward_idempotency_key)) or
//! fail, which puts the run in `Error` with an alert rather than leaving a silent
//! inconsistency. A *pivot* with an unknown outcome is not compensated at all: the run stops
//! in `Error` for an operator. Running steps are waited for:
//! when they complete they are compensated too. The run is `Compensated` when nothing is left
//! to undo, or `Error` when a compensation failed terminally or at its threshold.

use crate::definition::{StepKind, Workflow};
use crate::store::{NewAlert, PlanWrite, RunRow, StepRow, StepWrite};
use crate::{Error, Result, RunState, StepState};

/// Actions an operator can take on a run in `Error`, as listed in alerts.
pub const OPERATOR_ACTIONS: [&str; 4] = ["retry_step", "compensate", "resume", "mark_compensated"];

/// Decides the writes that advance `run`.
///
/// # Errors
/// [`Error::CorruptRow`] when the stored steps do not match the definition.
pub fn evaluate(wf: &Workflow, run: &RunRow, rows: &[StepRow]) -> Result<PlanWrite> {
    let mut plan = advance(wf, run, rows)?;
    if let Some(state) = plan.run_state {
        plan.release_key = wf.key_policy().releases_key(state);
    }
    Ok(plan)
}

fn advance(wf: &Workflow, run: &RunRow, rows: &[StepRow]) -> Result<PlanWrite> {
    let mut states: Vec<StepState> = vec![StepState::NotStarted; wf.steps.len()];
    let mut row_of: Vec<Option<&StepRow>> = vec![None; wf.steps.len()];
    for r in rows {
        let i = wf.position(&r.name).ok_or_else(|| {
            Error::corrupt(
                "sagaflow_steps",
                r.id,
                format!("step `{}` is not in workflow {}", r.name, wf.key()),
            )
        })?;
        states[i] = r.state;
        row_of[i] = Some(r);
    }
    if let Some(i) = row_of.iter().position(Option::is_none)
        && !run.state.is_final()
    {
        return Err(Error::corrupt(
            "sagaflow_runs",
            run.id,
            format!("step `{}` has no row", wf.steps[i].name),
        ));
    }
    let unknown: Vec<bool> = row_of
        .iter()
        .map(|r| r.is_some_and(|r| r.state == StepState::Failed && r.maybe_applied))
        .collect();
    let mut plan = PlanWrite::default();
    let mut set = |plan: &mut PlanWrite, states: &mut Vec<StepState>, i: usize, to: StepState| {
        if let Some(r) = row_of[i] {
            plan.steps.push(StepWrite {
                id: r.id,
                name: r.name.clone(),
                from: states[i],
                to,
            });
            states[i] = to;
        }
    };

    match run.state {
        RunState::Pending | RunState::Running => {
            if let Some(f) = (0..states.len()).find(|&i| states[i] == StepState::Failed) {
                let pivot_done = (0..states.len()).any(|i| {
                    wf.steps[i].kind == StepKind::Pivot && states[i] == StepState::Completed
                });
                let row = row_of[f];
                plan.run_error = row.and_then(|r| r.error.clone());
                if wf.steps[f].kind == StepKind::Pivot && unknown[f] {
                    // The point of no return may have been passed: compensating could undo a
                    // saga whose pivot took effect. Retrying with the same idempotency key
                    // tells which; an operator decides.
                    plan.run_state = Some(RunState::Error);
                    plan.alert = Some(run_alert(
                        run,
                        &wf.steps[f].name,
                        row,
                        format!(
                            "pivot `{}` may have taken effect (an attempt timed out); retry it to \
                             learn the outcome (same idempotency key) or compensate",
                            wf.steps[f].name
                        ),
                    ));
                    return Ok(plan);
                }
                if pivot_done || wf.steps[f].kind == StepKind::Retriable {
                    plan.run_state = Some(RunState::Error);
                    plan.alert = Some(run_alert(
                        run,
                        &wf.steps[f].name,
                        row,
                        if pivot_done {
                            format!(
                                "step `{}` failed after the point of no return; the saga cannot be compensated",
                                wf.steps[f].name
                            )
                        } else {
                            format!(
                                "retriable step `{}` failed; retriable steps are never compensated",
                                wf.steps[f].name
                            )
                        },
                    ));
                    return Ok(plan);
                }
                plan.run_state = Some(RunState::Compensating);
                compensate(wf, run, &row_of, &unknown, &mut states, &mut plan, &mut set);
                return Ok(plan);
            }
            for i in 0..states.len() {
                if states[i] == StepState::NotStarted
                    && wf.steps[i]
                        .deps
                        .iter()
                        .all(|&d| states[d] == StepState::Completed)
                {
                    set(&mut plan, &mut states, i, StepState::Ready);
                }
            }
            if states.iter().all(|&s| s == StepState::Completed) {
                let mut out = serde_json::Map::new();
                for (i, r) in row_of.iter().enumerate() {
                    let v = match r.and_then(|r| r.output.as_deref()) {
                        Some(o) => serde_json::from_str(o).map_err(|e| {
                            Error::corrupt("sagaflow_steps", wf.steps[i].name.clone(), e)
                        })?,
                        None => serde_json::Value::Null,
                    };
                    out.insert(wf.steps[i].name.clone(), v);
                }
                plan.run_state = Some(RunState::Completed);
                plan.run_output = Some(serde_json::Value::Object(out).to_string());
            } else if run.state == RunState::Pending {
                plan.run_state = Some(RunState::Running);
            }
        }
        RunState::Compensating => {
            compensate(wf, run, &row_of, &unknown, &mut states, &mut plan, &mut set)
        }
        RunState::Completed | RunState::Compensated | RunState::Error => {}
    }
    Ok(plan)
}

fn needs_compensation(wf: &Workflow, states: &[StepState], unknown: &[bool], i: usize) -> bool {
    (states[i] == StepState::Completed || (states[i] == StepState::Failed && unknown[i]))
        && wf.steps[i].kind == StepKind::Compensatable
        && wf.steps[i].compensation.is_some()
}

fn compensate<F>(
    wf: &Workflow,
    run: &RunRow,
    row_of: &[Option<&StepRow>],
    unknown: &[bool],
    states: &mut Vec<StepState>,
    plan: &mut PlanWrite,
    set: &mut F,
) where
    F: FnMut(&mut PlanWrite, &mut Vec<StepState>, usize, StepState),
{
    if let Some(f) = (0..states.len()).find(|&i| states[i] == StepState::CompensationFailed) {
        plan.run_state = Some(RunState::Error);
        plan.alert = Some(run_alert(
            run,
            &wf.steps[f].name,
            row_of[f],
            format!(
                "the compensation of step `{}` failed (terminally or at its threshold)",
                wf.steps[f].name
            ),
        ));
        return;
    }
    for i in 0..states.len() {
        if matches!(states[i], StepState::NotStarted | StepState::Ready) {
            set(plan, states, i, StepState::Skipped);
        }
    }
    let settled = |states: &[StepState], d: usize| {
        !matches!(
            states[d],
            StepState::Running | StepState::CompensationReady | StepState::Compensating
        ) && !needs_compensation(wf, states, unknown, d)
    };
    let eligible: Vec<usize> = (0..states.len())
        .filter(|&i| needs_compensation(wf, states, unknown, i))
        .filter(|&i| wf.steps[i].dependents.iter().all(|&d| settled(states, d)))
        .collect();
    for i in eligible {
        set(plan, states, i, StepState::CompensationReady);
    }
    let busy = states.iter().enumerate().any(|(i, &s)| {
        matches!(
            s,
            StepState::Running | StepState::CompensationReady | StepState::Compensating
        ) || needs_compensation(wf, states, unknown, i)
    });
    if !busy {
        plan.run_state = Some(RunState::Compensated);
    }
}

fn run_alert(run: &RunRow, step: &str, row: Option<&StepRow>, reason: String) -> NewAlert {
    let last_error = row
        .and_then(|r| r.error.as_deref())
        .unwrap_or("no error recorded");
    NewAlert {
        run_id: Some(run.id),
        step: Some(step.to_owned()),
        kind: "run_error".into(),
        reason: format!("{reason}; last error: {last_error}"),
        attempts: row.map_or(0, |r| r.attempt),
        actions: OPERATOR_ACTIONS.iter().map(|a| (*a).to_owned()).collect(),
        open_key: Some(format!("run_error:{}", run.id)),
    }
}

#[cfg(test)]
mod tests;
