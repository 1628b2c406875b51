//! Operator actions as transitions (SAS-7: "the operator can fix the cause and retry the step
//! by hand"): each checks its preconditions on the locked run and returns the writes.

use super::pause::{self, PausedRun};
use super::run::{move_run, step_write};
use super::run_rules::RunTrigger;
use super::step::Trigger;
use super::writes::{PlanWrite, StepWrite};
use crate::definition::{StepKind, Workflow};
use crate::rows::{RunRow, StepRow};
use crate::{Error, OperatorAction, Result, RunState, StepState};

pub(super) fn not_allowed(action: &'static str, run: &RunRow, reason: impl Into<String>) -> Error {
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

fn writes(steps: &[StepRow], on: Trigger, pick: impl Fn(&StepRow) -> bool) -> Vec<StepWrite> {
    steps
        .iter()
        .filter(|s| pick(s))
        .filter_map(|s| step_write(s, on))
        .collect()
}

fn action(
    run: &RunRow,
    on: RunTrigger,
    steps: Vec<StepWrite>,
    event: &'static str,
    detail: Option<String>,
) -> Result<PlanWrite> {
    let mut plan = PlanWrite {
        steps,
        resolve_alerts: true,
        audited: true,
        event,
        detail,
        ..PlanWrite::default()
    };
    move_run(&mut plan, run.state, on)?;
    Ok(plan)
}

fn require_error(action: &'static str, run: &RunRow) -> Result<()> {
    if run.state == RunState::Error {
        Ok(())
    } else {
        Err(not_allowed(
            action,
            run,
            format!("the run is {}, not error", run.state),
        ))
    }
}

/// Retries one failed step (or failed compensation) of a run in `Error`.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` and the step is `Failed` (in the
/// forward phase) or `CompensationFailed`.
pub fn retry(run: &RunRow, steps: &[StepRow], step: &str) -> Result<PlanWrite> {
    const ACTION: &str = "retry a step of";
    require_error(ACTION, run)?;
    let s = steps
        .iter()
        .find(|s| s.name == step)
        .ok_or_else(|| not_allowed(ACTION, run, format!("no step `{step}`")))?;
    let on = match s.state {
        StepState::Failed if was_compensating(steps) => {
            return Err(not_allowed(
                ACTION,
                run,
                format!(
                    "the run was compensating; step `{step}` can no longer run forward (retry the \
                     failed compensation or resume)"
                ),
            ));
        }
        StepState::Failed => RunTrigger::OperatorRetryForward,
        StepState::CompensationFailed => RunTrigger::OperatorRetryCompensation,
        other => {
            return Err(not_allowed(
                ACTION,
                run,
                format!("step `{step}` is {other}, not failed"),
            ));
        }
    };
    let w = writes(steps, Trigger::OperatorRetry, |x| x.id == s.id);
    let detail = serde_json::json!({ "step": step }).to_string();
    action(
        run,
        on,
        w,
        OperatorAction::Retry.history_event(),
        Some(detail),
    )
}

/// The parent of a completed child run compensates the step that started it: the child
/// unwinds, undoing its completed steps in reverse order (its steps were kept for this).
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is `Completed`.
pub fn parent_compensates(run: &RunRow, _steps: &[StepRow]) -> Result<PlanWrite> {
    if run.state != RunState::Completed {
        return Err(not_allowed(
            "compensate the child",
            run,
            format!("the run is {}, not completed", run.state),
        ));
    }
    let mut plan = action(
        run,
        RunTrigger::ParentCompensates,
        Vec::new(),
        "parent_compensates",
        None,
    )?;
    plan.resolve_alerts = false;
    Ok(plan)
}

/// Asks for the run to be compensated: a running run stops starting new steps and undoes
/// what completed; a run in `Error` retries its failed compensations.
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a finished run.
pub fn compensate(run: &RunRow, steps: &[StepRow]) -> Result<PlanWrite> {
    let mut plan = unwind(
        OperatorAction::Compensate,
        run,
        steps,
        RunTrigger::OperatorCompensate,
    )?;
    // A cancel stops at a pivot that took or may have taken effect; a `compensate` is the
    // operator's decision to undo past it. Without the cancel's envelope the unwinding that
    // follows takes it as that decision (the history keeps both actions).
    // Nor does it stop at the step a rollback goes back to: it undoes everything.
    if run
        .error
        .as_deref()
        .is_some_and(|e| is_cancelled(e) || rollback_target(e).is_some())
    {
        plan.clear_error = true;
    }
    Ok(plan)
}

/// The writes of an operator's `compensate` or `cancel`: the run unwinds, and its failed
/// compensations are due again.
fn unwind(
    act: OperatorAction,
    run: &RunRow,
    steps: &[StepRow],
    on: RunTrigger,
) -> Result<PlanWrite> {
    if run.state.is_final() {
        return Err(not_allowed(
            act.as_str(),
            run,
            format!("the run is already {}", run.state),
        ));
    }
    let mut w = writes(steps, Trigger::OperatorRetry, |s| {
        s.state == StepState::CompensationFailed
    });
    let paused = PausedRun::of(run, steps);
    if paused.is_some() {
        // Parked compensations are due again; parked forward steps are dropped by the
        // evaluation that follows.
        w.extend(
            pause::unpark(steps)
                .into_iter()
                .filter(|s| s.from == StepState::CompensationReady),
        );
    }
    let mut plan = action(run, on, w, act.history_event(), None)?;
    if let Some(p) = paused {
        p.restore(&mut plan);
    }
    Ok(plan)
}

/// Cancels a run that is not finished: like [`compensate`], and the run's error envelope
/// says it was cancelled (code [`CANCELLED`]), with the failure it held before, if any, as
/// `details.cause`. The envelope is what the unwinding reads to stop at a pivot that took or
/// may have taken effect, and what other instances look for to stop the run's attempts in
/// flight (the scheduler's part); a run in `Error` whose pivot may have acted is not undone
/// past it by a cancel.
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a finished run.
pub fn cancel(run: &RunRow, steps: &[StepRow], reason: Option<&str>) -> Result<PlanWrite> {
    let mut plan = unwind(
        OperatorAction::Cancel,
        run,
        steps,
        RunTrigger::OperatorCancel,
    )?;
    // The error the run holds once the plan is written.
    let held = match plan.run_error.take() {
        Some(e) => Some(e),
        None if plan.clear_error => None,
        None => run.error.clone(),
    };
    if held.as_deref().is_some_and(is_cancelled) {
        // Cancelled before: the first cancel's envelope stays.
        plan.run_error = held;
        return Ok(plan);
    }
    plan.clear_error = false;
    let message = match reason {
        Some(r) => format!("cancelled by an operator: {r}"),
        None => "cancelled by an operator".to_owned(),
    };
    plan.run_error = Some(cancelled_envelope(&message, held.as_deref()));
    Ok(plan)
}

/// The error envelope of a cancelled run; `cause` is the error it held before (JSON, or
/// kept as text when it is not).
fn cancelled_envelope(message: &str, cause: Option<&str>) -> String {
    let mut e = serde_json::json!({ "code": CANCELLED, "message": message, "retryable": false });
    if let Some(c) = cause {
        let c = serde_json::from_str(c).unwrap_or_else(|_| serde_json::Value::from(c));
        e["details"] = serde_json::json!({ "cause": c });
    }
    e.to_string()
}

/// The error code of a cancelled run (in the run's error envelope).
pub const CANCELLED: &str = "cancelled";

/// Whether a run's error envelope says an operator cancelled it: its `code` is
/// [`CANCELLED`], read as JSON (whatever the order of its keys), never matched as text.
pub fn is_cancelled(error: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Code<'a> {
        #[serde(borrow)]
        code: Option<std::borrow::Cow<'a, str>>,
    }
    serde_json::from_str::<Code<'_>>(error).is_ok_and(|e| e.code.as_deref() == Some(CANCELLED))
}

/// The longest an operator's `extend` moves a deadline at once.
pub const EXTEND_MAX: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Gives the run's attempts in flight (forward steps and compensations) `by` more time: their
/// stored deadlines move later, so the supervisor does not time them out; the instances
/// running them move their local deadlines too.
///
/// # Errors
/// [`Error::ActionNotAllowed`] when `by` is zero or over [`EXTEND_MAX`], or no attempt of
/// the run is in flight.
pub fn extend(run: &RunRow, steps: &[StepRow], by: std::time::Duration) -> Result<PlanWrite> {
    const ACTION: &str = "extend the deadlines of";
    if by.is_zero() || by > EXTEND_MAX {
        return Err(not_allowed(
            ACTION,
            run,
            format!(
                "an extension is 1 ms to {} hours",
                EXTEND_MAX.as_secs() / 3600
            ),
        ));
    }
    let in_flight: Vec<&StepRow> = steps.iter().filter(|s| s.state.is_in_flight()).collect();
    if in_flight.is_empty() {
        return Err(not_allowed(
            ACTION,
            run,
            format!("no attempt of the run is in flight (it is {})", run.state),
        ));
    }
    let extend_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    let names: Vec<&str> = in_flight.iter().map(|s| s.name.as_str()).collect();
    Ok(PlanWrite {
        extend: in_flight.iter().map(|s| (s.id, s.attempt)).collect(),
        extend_ms,
        audited: true,
        event: OperatorAction::Extend.history_event(),
        detail: Some(serde_json::json!({ "steps": names, "by_ms": extend_ms }).to_string()),
        ..PlanWrite::default()
    })
}

/// Resumes a run in `Error` or `Paused` where it stopped: retries every failed step of the
/// phase it was in (forward steps, or compensations); a paused run's parked steps are due
/// again.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` or `Paused`.
pub fn resume(run: &RunRow, steps: &[StepRow]) -> Result<PlanWrite> {
    if let Some(paused) = PausedRun::of(run, steps) {
        return pause::resume(run, steps, &paused);
    }
    if run.state != RunState::Error {
        return Err(not_allowed(
            "resume",
            run,
            format!("the run is {}, not error or paused", run.state),
        ));
    }
    let (from, on) = if was_compensating(steps) {
        (
            StepState::CompensationFailed,
            RunTrigger::OperatorRetryCompensation,
        )
    } else {
        (StepState::Failed, RunTrigger::OperatorRetryForward)
    };
    let w = writes(steps, Trigger::OperatorRetry, |s| s.state == from);
    action(run, on, w, OperatorAction::Resume.history_event(), None)
}

/// Records that an operator undid a step's effect by hand (e.g. refunded outside the system)
/// after its compensation failed; the run goes on compensating the rest.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` and the step is
/// `CompensationFailed`.
pub fn mark_compensated(run: &RunRow, steps: &[StepRow], step: &str) -> Result<PlanWrite> {
    const ACTION: &str = "mark a step compensated in";
    require_error(ACTION, run)?;
    let w = writes(steps, Trigger::OperatorMarkCompensated, |s| {
        s.name == step && s.state == StepState::CompensationFailed
    });
    if w.is_empty() {
        return Err(not_allowed(
            ACTION,
            run,
            format!("step `{step}` has no failed compensation"),
        ));
    }
    let detail = serde_json::json!({ "step": step }).to_string();
    action(
        run,
        RunTrigger::OperatorRetryCompensation,
        w,
        OperatorAction::MarkCompensated.history_event(),
        Some(detail),
    )
}

/// Releases a run set aside for a damaged row, once the operator repaired the row: the run
/// goes back to the phase it was in (forward or compensating) and its parked steps are due
/// again. The run is evaluated afresh; a row still damaged sets it aside again.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` because of a damaged row.
pub fn release(run: &RunRow, steps: &[StepRow]) -> Result<PlanWrite> {
    const ACTION: &str = "release";
    require_error(ACTION, run)?;
    let aside: Option<serde_json::Value> = run
        .error
        .as_deref()
        .and_then(|e| serde_json::from_str(e).ok());
    let aside = aside.filter(|e| e["code"] == CORRUPT_ROW).ok_or_else(|| {
        not_allowed(
            ACTION,
            run,
            "the run was not set aside for a damaged row (use resume or retry)",
        )
    })?;
    let compensating = match aside["phase"].as_str() {
        Some("compensating") => true,
        Some("pending" | "running") => false,
        _ => was_compensating(steps),
    };
    let on = if compensating {
        RunTrigger::OperatorRetryCompensation
    } else {
        RunTrigger::OperatorRetryForward
    };
    // Parked steps: queued but never due (the attempt that met the damage gave them back).
    let w = writes(steps, Trigger::OperatorRelease, |s| {
        s.available_at.is_none()
    });
    action(run, on, w, OperatorAction::Release.history_event(), None)
}

/// The error code of a run set aside for a damaged row (in the run's error envelope).
pub const CORRUPT_ROW: &str = "corrupt_row";

/// The history event of an operator's corrected input.
pub const REPLACE_INPUT: &str = "operator_replace_input";

/// The action's name in refusals of [`replace_input`].
pub const REPLACE_INPUT_ACTION: &str = "replace the input of";

/// Replaces the input of a run parked for an operator (`Paused`, or `Error`, set aside or
/// not) and resumes it as [`resume`] or [`release`] would: the failed steps of the phase it
/// stopped in are retried, its parked steps are due again. The history event keeps the old
/// input and the new one (`old` and `new`, stored text; text that is not JSON is kept as a
/// string). Writing the new input is the caller's part, in the same unit of work.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is `Paused` or in `Error`.
pub fn replace_input(run: &RunRow, steps: &[StepRow], new: &str) -> Result<PlanWrite> {
    const ACTION: &str = REPLACE_INPUT_ACTION;
    let mut plan = match run.state {
        RunState::Paused => resume(run, steps)?,
        RunState::Error if is_set_aside(run) => release(run, steps)?,
        RunState::Error => resume(run, steps)?,
        other => {
            return Err(not_allowed(
                ACTION,
                run,
                format!("the run is {other}; only a paused run or one in error takes a new input"),
            ));
        }
    };
    let json = |text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
    };
    plan.event = REPLACE_INPUT;
    plan.audited = true;
    plan.detail =
        Some(serde_json::json!({ "old": json(&run.input), "new": json(new) }).to_string());
    Ok(plan)
}

/// Whether `run` was set aside for a damaged row (its error code is [`CORRUPT_ROW`]).
fn is_set_aside(run: &RunRow) -> bool {
    run.error
        .as_deref()
        .and_then(|e| serde_json::from_str::<serde_json::Value>(e).ok())
        .is_some_and(|e| e["code"] == CORRUPT_ROW)
}

/// The error code of a run rolling back to a step (in the run's error envelope, with the
/// step as `details.to`): what the unwinding reads to undo only what came after that step,
/// then go forward again.
pub const ROLLBACK: &str = "rollback";

/// The step a run rolls back to, when its error envelope says it does: code [`ROLLBACK`] and
/// `details.to`, read as JSON.
pub fn rollback_target(error: &str) -> Option<String> {
    let e: serde_json::Value = serde_json::from_str(error).ok()?;
    if e.get("code")?.as_str()? != ROLLBACK {
        return None;
    }
    e.get("details")?.get("to")?.as_str().map(str::to_owned)
}

/// The steps a rollback to step `at` keeps: `at` and every step it depends on.
pub(crate) fn kept(wf: &Workflow, at: usize) -> std::collections::BTreeSet<usize> {
    let mut kept = super::restart::ancestors(wf, at);
    kept.insert(at);
    kept
}

/// Rolls a run back to step `to`: the steps after it (every step but `to` and those it
/// depends on) that did or may have done something are compensated in reverse order, the
/// others dropped; once nothing is left to undo, the evaluator starts them afresh under new
/// idempotency keys and the run goes forward again from `to` ([`RunTrigger::RolledBack`]).
/// The run's error envelope says so (code [`ROLLBACK`], `details.to`, the error it held
/// before as `details.cause`) until then.
///
/// # Errors
/// [`Error::ActionNotAllowed`] naming the reason when it cannot be done safely: the run is
/// not running or in error (or is undoing already); the workflow has no step `to`, or `to`
/// is not completed; a step is in flight or waiting; a pivot completed or may have acted
/// (past the point of no return, nothing before it is undone); a step to undo is retriable
/// (never compensated); nothing after `to` has started.
pub fn rollback(
    wf: &Workflow,
    run: &RunRow,
    steps: &[StepRow],
    to: &str,
    reason: Option<&str>,
) -> Result<PlanWrite> {
    let act = OperatorAction::Rollback.as_str();
    let refuse = |why: String| not_allowed(act, run, why);
    if !matches!(run.state, RunState::Running | RunState::Error) {
        return Err(refuse(format!(
            "the run is {}: only a running run or one in error rolls back",
            run.state
        )));
    }
    if was_compensating(steps) {
        return Err(refuse(
            "the run is undoing what it did: let it finish, or compensate it".into(),
        ));
    }
    let Some(at) = wf.position(to) else {
        return Err(refuse(format!("workflow {} has no step `{to}`", wf.key())));
    };
    let row = |name: &str| steps.iter().find(|s| s.name == name);
    match row(to) {
        Some(s) if s.state == StepState::Completed => {}
        other => {
            let state = other.map_or("missing".to_owned(), |s| s.state.to_string());
            return Err(refuse(format!(
                "step `{to}` is {state}, not completed: roll back to a completed step"
            )));
        }
    }
    if let Some(s) = steps
        .iter()
        .find(|s| s.state.is_in_flight() || s.state == StepState::Waiting)
    {
        return Err(refuse(format!(
            "step `{}` is {}: wait for it to settle, or cancel the run",
            s.name, s.state
        )));
    }
    for def in &wf.steps {
        let Some(s) = row(&def.name) else { continue };
        let acted = s.state == StepState::Completed || s.maybe_applied;
        if def.kind == StepKind::Pivot && acted {
            return Err(refuse(format!(
                "pivot `{}` {}: the run is past its point of no return",
                def.name,
                if s.state == StepState::Completed {
                    "completed"
                } else {
                    "may have taken effect"
                }
            )));
        }
    }
    let keep = kept(wf, at);
    let mut started = false;
    for (i, def) in wf.steps.iter().enumerate() {
        let Some(s) = row(&def.name) else { continue };
        if keep.contains(&i) || s.state == StepState::NotStarted {
            continue;
        }
        started = true;
        let acted = s.state == StepState::Completed || s.maybe_applied;
        if acted && def.kind == StepKind::Retriable {
            return Err(refuse(format!(
                "step `{}` is retriable and {}: it is never compensated",
                def.name,
                if s.state == StepState::Completed {
                    "completed"
                } else {
                    "may have acted"
                }
            )));
        }
    }
    if !started {
        return Err(refuse(format!(
            "no step after `{to}` has started: there is nothing to roll back"
        )));
    }
    let mut plan = action(
        run,
        RunTrigger::OperatorRollback,
        Vec::new(),
        act_event(),
        None,
    )?;
    let message = match reason {
        Some(r) => format!("rolling back to `{to}` by an operator: {r}"),
        None => format!("rolling back to `{to}` by an operator"),
    };
    let mut e = serde_json::json!({
        "code": ROLLBACK,
        "message": message,
        "retryable": false,
        "details": { "to": to },
    });
    if let Some(c) = run.error.as_deref() {
        let c = serde_json::from_str(c).unwrap_or_else(|_| serde_json::Value::from(c));
        e["details"]["cause"] = c;
    }
    plan.run_error = Some(e.to_string());
    plan.detail = Some(serde_json::json!({ "step": to }).to_string());
    Ok(plan)
}

fn act_event() -> &'static str {
    OperatorAction::Rollback.history_event()
}
