//! The checks of a run's state: no step in flight once it finished (invariant 2), every step
//! that may have acted compensated in a compensated run (invariant 3), and an unfinished run
//! that something will move (invariant 5). Pure code.

use sagaflow_engine::transition::pause::PAUSED;

use super::read::StepRec;
use super::report::{HistoryLine, Invariant};
use super::rules::Found;
use crate::{RunState, StepError, StepState};

/// Invariants 2, 3 and 5; a run state that is not one is a path violation.
pub(super) fn check(f: &mut Found<'_, '_>) {
    let d = f.d;
    match d.run.state.parse::<RunState>() {
        Ok(state) if state.is_final() => {
            in_flight_after_finish(f, state);
            if state == RunState::Compensated {
                uncompensated(f);
            }
        }
        Ok(state) => stuck(f, state),
        Err(_) => {
            let msg = format!("the run's row holds `{}`, not a run state", d.run.state);
            f.push(Invariant::Path, None, msg, &last_lines(d.lines, None, 2));
        }
    }
}

/// The last `n` lines of the run (of `step` only, with one).
fn last_lines<'l>(lines: &'l [HistoryLine], step: Option<&str>, n: usize) -> Vec<&'l HistoryLine> {
    let mine: Vec<&HistoryLine> = lines
        .iter()
        .filter(|l| step.is_none() || l.step.as_deref() == step)
        .collect();
    mine[mine.len().saturating_sub(n)..].to_vec()
}

fn step_state(s: &StepRec) -> Option<StepState> {
    s.state.parse().ok()
}

/// Invariant 2: a finished run has no step in flight.
fn in_flight_after_finish(f: &mut Found<'_, '_>, state: RunState) {
    let d = f.d;
    let last_run_line = d.lines.iter().rev().find(|l| l.step.is_none());
    for s in d.steps {
        if !step_state(s).is_some_and(StepState::is_in_flight) {
            continue;
        }
        let mut lines: Vec<&HistoryLine> = last_run_line.into_iter().collect();
        lines.extend(last_lines(d.lines, Some(&s.name), 2));
        lines.sort_by_key(|l| l.id);
        let msg = format!(
            "the run is {state}, but the step is {} (attempt {})",
            s.state, s.attempt
        );
        f.push(Invariant::InFlightAfterFinish, Some(&s.name), msg, &lines);
    }
}

/// The line that shows a forward attempt of the step may have acted without completing, if
/// any: a timeout or an interruption, or a failure whose outcome is not `not_applied`.
fn maybe_applied(l: &HistoryLine) -> bool {
    if l.from.as_deref() != Some(StepState::Running.as_str()) {
        return false;
    }
    match l.event.as_str() {
        "timeout" | "interrupted" => true,
        // Only a stored envelope that decodes counts: a line that cannot say stays silent.
        "retry" | "failed" => l
            .detail
            .clone()
            .and_then(|d| serde_json::from_value::<StepError>(d).ok())
            .is_some_and(|e| e.may_have_applied()),
        _ => false,
    }
}

/// Invariant 3: in a compensated run, each compensatable step with a compensation (as its
/// published definition says) that may have acted went to `compensated`, and the pivot did
/// not act (its effect cannot be undone) unless an operator chose to compensate past it.
fn uncompensated(f: &mut Found<'_, '_>) {
    let d = f.d;
    // Without the published definition it cannot be told which steps have a compensation.
    let Some(def) = d.definition else { return };
    let completed = StepState::Completed.as_str();
    let compensated = StepState::Compensated.as_str();
    let operator_chose = d
        .lines
        .iter()
        .any(|l| l.step.is_none() && l.event == "operator_compensate");
    for sd in def
        .steps
        .iter()
        .filter(|s| s.kind == crate::StepKind::Pivot.as_str())
    {
        let acted = d.lines.iter().find(|l| {
            l.step.as_deref() == Some(sd.name.as_str())
                && (l.to.as_deref() == Some(completed) || maybe_applied(l))
        });
        if let Some(evidence) = acted
            && !operator_chose
        {
            let msg = format!(
                "the run is compensated, but its pivot acted (line #{}): its effect stands, and \
                 no operator chose to compensate past it",
                evidence.id
            );
            f.push(Invariant::Uncompensated, Some(&sd.name), msg, &[evidence]);
        }
    }
    for sd in &def.steps {
        if sd.kind != crate::StepKind::Compensatable.as_str() || !sd.compensates {
            continue;
        }
        let mine: Vec<&HistoryLine> = d
            .lines
            .iter()
            .filter(|l| l.step.as_deref() == Some(sd.name.as_str()))
            .collect();
        let acted = mine
            .iter()
            .find(|l| l.to.as_deref() == Some(completed) || maybe_applied(l));
        let Some(evidence) = acted else { continue };
        if mine.iter().any(|l| l.to.as_deref() == Some(compensated)) {
            continue;
        }
        let how = if evidence.to.as_deref() == Some(completed) {
            "completed"
        } else {
            "may have acted"
        };
        let msg = format!(
            "the run is compensated, but the step {how} (line #{}) and its history has no \
             line into compensated",
            evidence.id
        );
        let mut lines = vec![*evidence];
        if let Some(last) = mine.last()
            && last.id != evidence.id
        {
            lines.push(last);
        }
        f.push(Invariant::Uncompensated, Some(&sd.name), msg, &lines);
    }
}

/// Whether a paused run's error envelope says it was paused (an operator's pause raises no
/// alert; the envelope states why).
fn pause_envelope(error: Option<&str>) -> bool {
    error
        .and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .is_some_and(|e| e["code"] == PAUSED)
}

/// Invariant 5: an unfinished run is due, in flight, waiting, scheduled, marked for
/// evaluation, or held for an operator with an open alert.
fn stuck(f: &mut Found<'_, '_>, state: RunState) {
    let d = f.d;
    let run = d.run;
    let moving = run.dirty
        || d.steps.iter().any(|s| match step_state(s) {
            Some(StepState::Ready | StepState::CompensationReady) => s.available_at.is_some(),
            Some(StepState::Running | StepState::Compensating) => true,
            Some(StepState::Waiting) => s.wait.is_some(),
            _ => false,
        })
        || (state == RunState::Pending && run.start_at.is_some())
        || (matches!(state, RunState::Error | RunState::Paused) && d.open_alerts > 0)
        || (state == RunState::Paused && pause_envelope(run.error.as_deref()));
    if moving {
        return;
    }
    let steps: Vec<String> = d
        .steps
        .iter()
        .map(|s| {
            let parked = matches!(
                step_state(s),
                Some(StepState::Ready | StepState::CompensationReady)
            ) && s.available_at.is_none();
            let no_wait = step_state(s) == Some(StepState::Waiting) && s.wait.is_none();
            let note = if parked {
                " (not due)"
            } else if no_wait {
                " (no wait stored)"
            } else {
                ""
            };
            format!("{} {}{note}", s.name, s.state)
        })
        .collect();
    let held = if matches!(state, RunState::Error | RunState::Paused) {
        ", and no open alert"
    } else {
        ""
    };
    let child = if run.parent_step.is_some() {
        " (a child run)"
    } else {
        ""
    };
    let msg = format!(
        "the run{child} is {state} and nothing will move it: not marked for evaluation, no \
         step due, in flight or waiting{held}; steps: {}",
        if steps.is_empty() {
            "none".to_owned()
        } else {
            steps.join(", ")
        }
    );
    f.push(Invariant::Stuck, None, msg, &last_lines(d.lines, None, 3));
}
