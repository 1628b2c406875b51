//! Pausing a run, and what a paused run remembers.
//!
//! A run is paused by an operator ([`pause`]) or parked by its workflow's
//! [`OnFailure::Pause`](crate::definition::OnFailure::Pause) policy where it would have
//! started compensating. Either way its queued steps are parked (not due) and steps that
//! become due while it is paused are parked by the evaluator, so no new attempt starts;
//! attempts in flight finish and are recorded.
//!
//! The run's error envelope says it is paused and keeps what resuming needs: the phase it
//! was in (forward or compensating) and the error it held before (the failure that parked
//! it, or the one that diverted it into compensation), which resuming, compensating or
//! cancelling puts back.

use serde_json::{Value, json};

use super::operator::not_allowed;
use super::run::{move_run, step_write};
use super::run_rules::RunTrigger;
use super::step::Trigger;
use super::writes::{PlanWrite, StepWrite};
use crate::rows::{RunRow, StepRow};
use crate::{OperatorAction, Result, RunState, StepState};

/// The error code of a paused run (in the run's error envelope).
pub const PAUSED: &str = "paused";

/// What a paused run's error envelope keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PausedRun {
    /// It was compensating when it was paused.
    pub(crate) compensating: bool,
    /// The error envelope it held before, as stored text.
    pub(crate) cause: Option<String>,
}

impl PausedRun {
    /// What `run`'s envelope keeps, if the run is paused. When the envelope does not say
    /// (written by hand, or damaged), the phase is read from the steps (any in a
    /// compensation state or skipped: compensating) and there was no earlier error.
    pub(crate) fn of(run: &RunRow, steps: &[StepRow]) -> Option<Self> {
        if run.state != RunState::Paused {
            return None;
        }
        let envelope: Option<Value> = run
            .error
            .as_deref()
            .and_then(|e| serde_json::from_str(e).ok());
        let details = envelope.as_ref().map(|e| &e["details"]);
        let compensating = match details.and_then(|d| d["phase"].as_str()) {
            Some("compensating") => true,
            Some(_) => false,
            None => steps
                .iter()
                .any(|s| s.state.is_compensation() || s.state == StepState::Skipped),
        };
        let cause = details
            .map(|d| &d["cause"])
            .filter(|c| !c.is_null())
            .map(|c| match c {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        Some(Self {
            compensating,
            cause,
        })
    }

    /// Puts the earlier error back on the run (or clears the envelope when there was none).
    pub(crate) fn restore(&self, plan: &mut PlanWrite) {
        match &self.cause {
            Some(c) => plan.run_error = Some(c.clone()),
            None => plan.clear_error = true,
        }
    }
}

/// The error envelope of a paused run: `message` for people, the phase and the earlier
/// error (`cause`, stored text) for resuming.
pub(crate) fn envelope(message: &str, compensating: bool, cause: Option<&str>) -> String {
    let cause = cause.map(|c| serde_json::from_str::<Value>(c).unwrap_or_else(|_| c.into()));
    json!({
        "code": PAUSED,
        "message": message,
        "retryable": false,
        "details": {
            "phase": if compensating { "compensating" } else { "running" },
            "cause": cause,
        },
    })
    .to_string()
}

/// Parks the queued steps that are due: they stay queued, and wait for the run to resume.
pub(crate) fn park<'a>(steps: impl IntoIterator<Item = &'a StepRow>) -> Vec<StepWrite> {
    queued(steps, true, Trigger::Paused)
}

/// Makes the parked steps due again.
pub(crate) fn unpark(steps: &[StepRow]) -> Vec<StepWrite> {
    queued(steps, false, Trigger::OperatorRelease)
}

/// The writes of `on` for the queued steps that are due (`due`) or parked (not `due`).
fn queued<'a>(
    steps: impl IntoIterator<Item = &'a StepRow>,
    due: bool,
    on: Trigger,
) -> Vec<StepWrite> {
    steps
        .into_iter()
        .filter(|s| matches!(s.state, StepState::Ready | StepState::CompensationReady))
        .filter(|s| s.available_at.is_some() == due)
        .filter_map(|s| step_write(s, on))
        .collect()
}

/// Pauses a run that is pending, running or compensating: no new step is claimed until an
/// operator resumes it; attempts in flight finish.
///
/// # Errors
/// [`crate::Error::ActionNotAllowed`] for a run in any other state.
pub fn pause(run: &RunRow, steps: &[StepRow], reason: Option<&str>) -> Result<PlanWrite> {
    const ACTION: &str = "pause";
    let compensating = match run.state {
        RunState::Pending | RunState::Running => false,
        RunState::Compensating => true,
        other => {
            let why = match other {
                RunState::Paused => "the run is already paused".to_owned(),
                RunState::Error => {
                    "the run is in error: it claims no steps until an operator acts".to_owned()
                }
                _ => format!("the run is already {other}"),
            };
            return Err(not_allowed(ACTION, run, why));
        }
    };
    let message = match reason {
        Some(r) => format!("paused by an operator: {r}"),
        None => "paused by an operator".to_owned(),
    };
    let mut plan = PlanWrite {
        steps: park(steps),
        resolve_alerts: true,
        audited: true,
        event: OperatorAction::Pause.history_event(),
        run_error: Some(envelope(&message, compensating, run.error.as_deref())),
        ..PlanWrite::default()
    };
    move_run(&mut plan, run.state, RunTrigger::OperatorPause)?;
    Ok(plan)
}

/// Resumes a paused run in the phase it was paused in: its parked steps are due again, the
/// failed steps of that phase are retried (the failure that parked it, or any that ended
/// while it was paused), and its earlier error is put back.
pub(crate) fn resume(run: &RunRow, steps: &[StepRow], paused: &PausedRun) -> Result<PlanWrite> {
    let (failed, on) = if paused.compensating {
        (
            StepState::CompensationFailed,
            RunTrigger::OperatorRetryCompensation,
        )
    } else {
        (StepState::Failed, RunTrigger::OperatorRetryForward)
    };
    let mut writes = unpark(steps);
    writes.extend(
        steps
            .iter()
            .filter(|s| s.state == failed)
            .filter_map(|s| step_write(s, Trigger::OperatorRetry)),
    );
    let mut plan = PlanWrite {
        steps: writes,
        resolve_alerts: true,
        audited: true,
        event: OperatorAction::Resume.history_event(),
        ..PlanWrite::default()
    };
    paused.restore(&mut plan);
    move_run(&mut plan, run.state, on)?;
    Ok(plan)
}
