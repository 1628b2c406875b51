//! Operator actions on a run (SAS-7: "the operator can fix the cause and retry the step by
//! hand"). Each is applied under the run's row lock, recorded in the history, resolves the
//! run's open alerts, and marks the run for evaluation.

use uuid::Uuid;

use crate::store::{EvalApplied, PlanWrite, RunRow, StepRow, StepWrite, Store};
use crate::{Error, Result, RunState, StepState};

fn not_allowed(action: &'static str, run: &RunRow, reason: impl Into<String>) -> Error {
    Error::ActionNotAllowed {
        action,
        run_id: run.id,
        reason: reason.into(),
    }
}

fn was_compensating(steps: &[StepRow]) -> bool {
    steps
        .iter()
        .any(|s| s.state.is_compensation() || s.state == StepState::Skipped)
}

/// Retries one failed step (or failed compensation) of a run in `Error`.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` and the step is `Failed` or
/// `CompensationFailed`; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn retry_step(store: &Store, run_id: Uuid, step: &str) -> Result<EvalApplied> {
    store
        .run_operate(run_id, |run, steps| {
            if run.state != RunState::Error {
                return Err(not_allowed(
                    "retry a step of",
                    run,
                    format!("the run is {}, not error", run.state),
                ));
            }
            let s = steps
                .iter()
                .find(|s| s.name == step)
                .ok_or_else(|| not_allowed("retry a step of", run, format!("no step `{step}`")))?;
            let (to, run_state) = match s.state {
                StepState::Failed if was_compensating(steps) => {
                    return Err(not_allowed(
                        "retry a step of",
                        run,
                        format!("the run was compensating; step `{step}` can no longer run forward (retry the failed compensation or resume)"),
                    ));
                }
                StepState::Failed => (StepState::Ready, RunState::Running),
                StepState::CompensationFailed => {
                    (StepState::CompensationReady, RunState::Compensating)
                }
                other => {
                    return Err(not_allowed(
                        "retry a step of",
                        run,
                        format!("step `{step}` is {other}, not failed"),
                    ));
                }
            };
            Ok(PlanWrite {
                steps: vec![StepWrite {
                    id: s.id,
                    name: s.name.clone(),
                    from: s.state,
                    to,
                }],
                run_state: Some(run_state),
                resolve_alerts: true,
                event: "operator_retry_step",
                detail: Some(format!("{{\"step\":\"{step}\"}}")),
                ..PlanWrite::default()
            })
        })
        .await
}

/// Asks for the run to be compensated: a running run stops starting new steps and undoes
/// what completed; a run in `Error` retries its failed compensations.
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a finished run; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn compensate(store: &Store, run_id: Uuid) -> Result<EvalApplied> {
    store
        .run_operate(run_id, |run, steps| {
            if run.state.is_final() {
                return Err(not_allowed(
                    "compensate",
                    run,
                    format!("the run is already {}", run.state),
                ));
            }
            let writes = steps
                .iter()
                .filter(|s| s.state == StepState::CompensationFailed)
                .map(|s| StepWrite {
                    id: s.id,
                    name: s.name.clone(),
                    from: s.state,
                    to: StepState::CompensationReady,
                })
                .collect();
            Ok(PlanWrite {
                steps: writes,
                run_state: Some(RunState::Compensating),
                resolve_alerts: true,
                event: "operator_compensate",
                ..PlanWrite::default()
            })
        })
        .await
}

/// Resumes a run in `Error` where it stopped: retries every failed step of the phase it was
/// in (forward steps, or compensations).
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error`; [`Error::RunNotFound`];
/// [`Error::Db`].
pub async fn resume(store: &Store, run_id: Uuid) -> Result<EvalApplied> {
    store
        .run_operate(run_id, |run, steps| {
            if run.state != RunState::Error {
                return Err(not_allowed(
                    "resume",
                    run,
                    format!("the run is {}, not error", run.state),
                ));
            }
            let compensating = was_compensating(steps);
            let (from, to, run_state) = if compensating {
                (
                    StepState::CompensationFailed,
                    StepState::CompensationReady,
                    RunState::Compensating,
                )
            } else {
                (StepState::Failed, StepState::Ready, RunState::Running)
            };
            let writes = steps
                .iter()
                .filter(|s| s.state == from)
                .map(|s| StepWrite {
                    id: s.id,
                    name: s.name.clone(),
                    from,
                    to,
                })
                .collect();
            Ok(PlanWrite {
                steps: writes,
                run_state: Some(run_state),
                resolve_alerts: true,
                event: "operator_resume",
                ..PlanWrite::default()
            })
        })
        .await
}

/// Records that an operator undid a step's effect by hand (e.g. refunded outside the system)
/// after its compensation failed: `CompensationFailed → Compensated`, and the run resumes
/// compensating the rest.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` and the step is
/// `CompensationFailed`; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn mark_compensated(store: &Store, run_id: Uuid, step: &str) -> Result<EvalApplied> {
    store
        .run_operate(run_id, |run, steps| {
            if run.state != RunState::Error {
                return Err(not_allowed(
                    "mark a step compensated in",
                    run,
                    format!("the run is {}, not error", run.state),
                ));
            }
            let s = steps
                .iter()
                .find(|s| s.name == step && s.state == StepState::CompensationFailed)
                .ok_or_else(|| {
                    not_allowed(
                        "mark a step compensated in",
                        run,
                        format!("step `{step}` has no failed compensation"),
                    )
                })?;
            Ok(PlanWrite {
                steps: vec![StepWrite {
                    id: s.id,
                    name: s.name.clone(),
                    from: s.state,
                    to: StepState::Compensated,
                }],
                run_state: Some(RunState::Compensating),
                resolve_alerts: true,
                event: "operator_mark_compensated",
                detail: Some(format!("{{\"step\":\"{step}\"}}")),
                ..PlanWrite::default()
            })
        })
        .await
}
