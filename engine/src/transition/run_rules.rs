//! The run table: what can happen to a run ([`RunTrigger`]), the rules that move it
//! ([`RUN_RULES`]), and the look-ups the evaluator and the operator actions go through.

use crate::OperatorAction;
use crate::RunState;
use crate::RunState::{
    Compensated, Compensating, Completed, Error as RunError, Paused, Pending, Running,
};

/// Actions an operator can take on a run in `Error`, as listed in alerts.
pub const OPERATOR_ACTIONS: [OperatorAction; 4] = [
    OperatorAction::Retry,
    OperatorAction::Compensate,
    OperatorAction::Resume,
    OperatorAction::MarkCompensated,
];

/// Actions an operator can take on a run parked in `Paused`, as listed in alerts.
pub const PAUSED_ACTIONS: [OperatorAction; 3] = [
    OperatorAction::Resume,
    OperatorAction::Compensate,
    OperatorAction::Cancel,
];

/// The actions an alert lists: their names.
pub(super) fn listed(actions: &[OperatorAction]) -> Vec<String> {
    actions.iter().map(|a| a.as_str().to_owned()).collect()
}

/// What happened to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunTrigger {
    /// Its first evaluation found work going on.
    Progressed,
    /// Every step completed.
    AllCompleted,
    /// A step failed before the pivot completed: undo what was done.
    StepFailed,
    /// A step failed before the pivot completed, and the workflow parks such runs for an
    /// operator instead of compensating them.
    StepFailedPaused,
    /// Nothing (more) needs undoing.
    NothingLeftToUndo,
    /// A step failed after the pivot completed: nothing can be undone.
    FailedAfterPivot,
    /// A retriable step failed for good (retriable steps are never compensated).
    RetriableFailed,
    /// The pivot failed with an unknown outcome: it may have taken effect.
    PivotMaybeApplied,
    /// A step was interrupted more often than its cap allows.
    PoisonStep,
    /// A compensation failed for good.
    CompensationFailed,
    /// An operator paused the run: it claims no new steps until resumed.
    OperatorPause,
    /// An operator retried a failed forward step, or resumed the forward phase (of a run in
    /// `Error` or `Paused`).
    OperatorRetryForward,
    /// An operator retried a failed compensation, resumed the compensation phase (of a run in
    /// `Error` or `Paused`), or marked a step compensated by hand.
    OperatorRetryCompensation,
    /// An operator asked for compensation.
    OperatorCompensate,
    /// An operator cancelled the run: its forward attempts in flight are stopped and what
    /// completed is compensated.
    OperatorCancel,
    /// A row of the run could not be decoded: the run is set aside for an operator, never
    /// compensated as if its business had failed.
    DamagedRow,
    /// A step waiting for an event timed out, and its wait says an operator decides
    /// ([`OnTimeout::Fail`](crate::wait::OnTimeout::Fail)).
    WaitTimedOut,
    /// The parent of a completed child run compensates the step that started it: the child
    /// undoes what it did.
    ParentCompensates,
    /// The run was cancelled, and its pivot completed before anything was undone: the
    /// cancel came after the point of no return, and the run goes forward again.
    CancelTooLate,
    /// An operator rolls the run back to a step: the steps after it are undone.
    OperatorRollback,
    /// A rollback undid what came after its step: the run goes forward again from there.
    RolledBack,
}

impl RunTrigger {
    /// The name used in docs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Progressed => "progressed",
            Self::AllCompleted => "all_completed",
            Self::StepFailed => "step_failed",
            Self::StepFailedPaused => "step_failed_paused",
            Self::NothingLeftToUndo => "nothing_left_to_undo",
            Self::FailedAfterPivot => "failed_after_pivot",
            Self::RetriableFailed => "retriable_failed",
            Self::PivotMaybeApplied => "pivot_maybe_applied",
            Self::PoisonStep => "poison_step",
            Self::CompensationFailed => "compensation_failed",
            Self::OperatorPause => "operator_pause",
            Self::OperatorRetryForward => "operator_retry_forward",
            Self::OperatorRetryCompensation => "operator_retry_compensation",
            Self::OperatorCompensate => "operator_compensate",
            Self::OperatorCancel => "operator_cancel",
            Self::DamagedRow => "damaged_row",
            Self::WaitTimedOut => "wait_timed_out",
            Self::ParentCompensates => "parent_compensates",
            Self::CancelTooLate => "cancel_too_late",
            Self::OperatorRollback => "operator_rollback",
            Self::RolledBack => "rolled_back",
        }
    }
}

/// One row of the run table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRule {
    /// States it applies in.
    pub from: &'static [RunState],
    /// What happened.
    pub on: RunTrigger,
    /// State after.
    pub to: RunState,
    /// The alert raised with it, if any.
    pub alert: Option<&'static str>,
}

const ACTIVE: &[RunState] = &[Pending, Running];
/// Every state a run can be in before it finishes.
const UNFINISHED: &[RunState] = &[Pending, Running, Compensating, RunError, Paused];
/// The states an operator resumes a run from.
const HALTED: &[RunState] = &[RunError, Paused];

const fn rule(
    from: &'static [RunState],
    on: RunTrigger,
    to: RunState,
    alert: Option<&'static str>,
) -> RunRule {
    RunRule {
        from,
        on,
        to,
        alert,
    }
}

/// Every run transition sagaflow makes.
pub const RUN_RULES: &[RunRule] = &[
    rule(&[Pending], RunTrigger::Progressed, Running, None),
    // From `compensating` only through `cancel_too_late` in the same evaluation.
    rule(
        &[Pending, Running, Compensating],
        RunTrigger::AllCompleted,
        Completed,
        None,
    ),
    rule(ACTIVE, RunTrigger::StepFailed, Compensating, None),
    rule(
        ACTIVE,
        RunTrigger::StepFailedPaused,
        Paused,
        Some("run_paused"),
    ),
    rule(
        &[Pending, Running, Compensating],
        RunTrigger::NothingLeftToUndo,
        Compensated,
        None,
    ),
    rule(
        ACTIVE,
        RunTrigger::FailedAfterPivot,
        RunError,
        Some("run_error"),
    ),
    rule(
        ACTIVE,
        RunTrigger::RetriableFailed,
        RunError,
        Some("run_error"),
    ),
    rule(
        &[Pending, Running, Compensating],
        RunTrigger::PivotMaybeApplied,
        RunError,
        Some("run_error"),
    ),
    rule(
        &[Pending, Running, Compensating],
        RunTrigger::PoisonStep,
        RunError,
        Some("poison_step"),
    ),
    rule(
        &[Compensating],
        RunTrigger::CompensationFailed,
        RunError,
        Some("run_error"),
    ),
    rule(
        UNFINISHED,
        RunTrigger::DamagedRow,
        RunError,
        Some("corrupt_row"),
    ),
    rule(
        &[Pending, Running, Compensating],
        RunTrigger::OperatorPause,
        Paused,
        None,
    ),
    rule(HALTED, RunTrigger::OperatorRetryForward, Running, None),
    rule(
        HALTED,
        RunTrigger::OperatorRetryCompensation,
        Compensating,
        None,
    ),
    rule(
        UNFINISHED,
        RunTrigger::OperatorCompensate,
        Compensating,
        None,
    ),
    rule(UNFINISHED, RunTrigger::OperatorCancel, Compensating, None),
    rule(
        ACTIVE,
        RunTrigger::WaitTimedOut,
        RunError,
        Some("run_error"),
    ),
    rule(
        &[Completed],
        RunTrigger::ParentCompensates,
        Compensating,
        None,
    ),
    rule(&[Compensating], RunTrigger::CancelTooLate, Running, None),
    rule(
        &[Running, RunError],
        RunTrigger::OperatorRollback,
        Compensating,
        None,
    ),
    rule(&[Compensating], RunTrigger::RolledBack, Running, None),
];

/// The rule for a run in `from` on `on`, if the table has one.
pub fn run_rule(from: RunState, on: RunTrigger) -> Option<&'static RunRule> {
    RUN_RULES
        .iter()
        .find(|r| r.on == on && r.from.contains(&from))
}

/// Where a run with a damaged row goes, and the alert kind it raises: the run table's
/// [`RunTrigger::DamagedRow`] rule. (A run whose own state cannot be decoded goes there
/// too.)
pub fn set_aside_rule() -> &'static RunRule {
    RUN_RULES
        .iter()
        .find(|r| r.on == RunTrigger::DamagedRow)
        .unwrap_or(&RUN_RULES[0])
}
