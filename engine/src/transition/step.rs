//! The step table: (state, trigger) → state + effects.

use crate::StepState;
use crate::StepState::{
    Compensated, Compensating, CompensationFailed, CompensationReady, Completed, Failed,
    NotStarted, Ready, Running, Skipped,
};

/// What happened to a step, classified against its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Trigger {
    /// A scheduler claimed the step (one atomic statement).
    Claimed,
    /// The attempt answered `Ok` before its deadline.
    Succeeded,
    /// The attempt failed, is retryable, and the failure count stays under the threshold.
    FailedWillRetry,
    /// The attempt failed terminally, or its failure reached the threshold.
    FailedForGood,
    /// The deadline passed while the owner lived; the failure count stays under the threshold.
    TimedOut,
    /// The deadline passed and the failure reached the threshold.
    TimedOutForGood,
    /// The attempt was lost with its engine instance (crash, freeze, shutdown); under the cap.
    Interrupted,
    /// The attempt was lost with its engine instance once more than the cap allows.
    InterruptedTooOften,
    /// Every dependency completed (evaluator).
    DependenciesMet,
    /// The run unwinds; the step never acted, so it is dropped (evaluator).
    Dropped,
    /// The run unwinds and the step's effect happened or may have happened: undo it
    /// (evaluator, once every dependent is settled).
    CompensationDue,
    /// An operator retries the step or its compensation.
    OperatorRetry,
    /// An operator undid the effect by hand.
    OperatorMarkCompensated,
    /// The data the attempt needed could not be decoded (a damaged row, or stored JSON that
    /// no longer matches the workflow's types): nothing was called, the attempt is given
    /// back without counting, and the step stays parked (not due) while its run is set aside.
    SetAside,
    /// An operator released a set-aside run: its parked steps are due again.
    OperatorRelease,
}

impl Trigger {
    /// Every trigger.
    pub const ALL: [Trigger; 15] = [
        Self::Claimed,
        Self::Succeeded,
        Self::FailedWillRetry,
        Self::FailedForGood,
        Self::TimedOut,
        Self::TimedOutForGood,
        Self::Interrupted,
        Self::InterruptedTooOften,
        Self::DependenciesMet,
        Self::Dropped,
        Self::CompensationDue,
        Self::OperatorRetry,
        Self::OperatorMarkCompensated,
        Self::SetAside,
        Self::OperatorRelease,
    ];

    /// The name used in history and docs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Succeeded => "succeeded",
            Self::FailedWillRetry => "failed_will_retry",
            Self::FailedForGood => "failed_for_good",
            Self::TimedOut => "timed_out",
            Self::TimedOutForGood => "timed_out_for_good",
            Self::Interrupted => "interrupted",
            Self::InterruptedTooOften => "interrupted_too_often",
            Self::DependenciesMet => "dependencies_met",
            Self::Dropped => "dropped",
            Self::CompensationDue => "compensation_due",
            Self::OperatorRetry => "operator_retry",
            Self::OperatorMarkCompensated => "operator_mark_compensated",
            Self::SetAside => "set_aside",
            Self::OperatorRelease => "operator_release",
        }
    }
}

/// When the step is due after the transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At once (`available_at = now`).
    Now,
    /// After the retry policy's backoff for this failure.
    AfterBackoff,
    /// Not queued (`available_at = NULL`).
    Never,
}

/// Whether the transition marks the step *maybe applied* (sticky; forward steps only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Maybe {
    /// Leaves the flag alone.
    Keep,
    /// Sets it when the failed attempt's outcome is unknown.
    IfUnknown,
    /// Sets it: a timed-out or interrupted forward attempt may have acted.
    Set,
}

/// What a transition does besides changing the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    /// `failure_count + 1` (counts toward the failure threshold).
    pub count_failure: bool,
    /// `interruptions + 1` (counts toward the interruption cap, never the threshold).
    pub count_interruption: bool,
    /// Doubles the deadline, up to its cap (an attempt ran out of time).
    pub extend_deadline: bool,
    /// Entering a phase afresh: `failure_count = 0`, deadline back to its first length.
    pub reset: bool,
    /// The *maybe applied* flag.
    pub maybe: Maybe,
    /// When it is due next.
    pub due: Due,
    /// Stores the attempt's output.
    pub store_output: bool,
}

const NONE: Effects = Effects {
    count_failure: false,
    count_interruption: false,
    extend_deadline: false,
    reset: false,
    maybe: Maybe::Keep,
    due: Due::Never,
    store_output: false,
};
const QUEUE: Effects = Effects {
    reset: true,
    due: Due::Now,
    ..NONE
};
const RETRY: Effects = Effects {
    count_failure: true,
    maybe: Maybe::IfUnknown,
    due: Due::AfterBackoff,
    ..NONE
};
const FAIL: Effects = Effects {
    count_failure: true,
    maybe: Maybe::IfUnknown,
    ..NONE
};
const TIMEOUT: Effects = Effects {
    count_failure: true,
    extend_deadline: true,
    maybe: Maybe::Set,
    due: Due::Now,
    ..NONE
};
const TIMEOUT_FAIL: Effects = Effects {
    count_failure: true,
    maybe: Maybe::Set,
    ..NONE
};
const INTERRUPT: Effects = Effects {
    count_interruption: true,
    maybe: Maybe::Set,
    due: Due::Now,
    ..NONE
};
const INTERRUPT_FAIL: Effects = Effects {
    count_interruption: true,
    maybe: Maybe::Set,
    ..NONE
};
const CLAIM: Effects = NONE;
/// Due again, counters untouched.
const RELEASE: Effects = Effects {
    due: Due::Now,
    ..NONE
};
const DONE: Effects = Effects {
    store_output: true,
    ..NONE
};

/// Compensation phase: the same edges, but a compensation never marks the forward step.
const fn comp(e: Effects) -> Effects {
    Effects {
        maybe: Maybe::Keep,
        store_output: false,
        ..e
    }
}

/// One row of the step table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRule {
    /// State before.
    pub from: StepState,
    /// What happened.
    pub on: Trigger,
    /// State after.
    pub to: StepState,
    /// Who applies it.
    pub by: &'static str,
    /// What else changes.
    pub effects: Effects,
}

const fn rule(
    from: StepState,
    on: Trigger,
    to: StepState,
    by: &'static str,
    effects: Effects,
) -> StepRule {
    StepRule {
        from,
        on,
        to,
        by,
        effects,
    }
}

/// Every step transition sagaflow makes. A (state, trigger) pair that is not listed is
/// refused: the caller's write does not happen.
pub const STEP_RULES: &[StepRule] = &[
    rule(
        NotStarted,
        Trigger::DependenciesMet,
        Ready,
        "evaluator",
        QUEUE,
    ),
    rule(NotStarted, Trigger::Dropped, Skipped, "evaluator", NONE),
    rule(Ready, Trigger::Claimed, Running, "claim", CLAIM),
    rule(Ready, Trigger::Dropped, Skipped, "evaluator", NONE),
    rule(
        Ready,
        Trigger::CompensationDue,
        CompensationReady,
        "evaluator",
        QUEUE,
    ),
    rule(Ready, Trigger::OperatorRelease, Ready, "operator", RELEASE),
    rule(Running, Trigger::Succeeded, Completed, "completion", DONE),
    rule(
        Running,
        Trigger::FailedWillRetry,
        Ready,
        "completion",
        RETRY,
    ),
    rule(Running, Trigger::FailedForGood, Failed, "completion", FAIL),
    rule(Running, Trigger::SetAside, Ready, "completion", NONE),
    rule(Running, Trigger::TimedOut, Ready, "supervisor", TIMEOUT),
    rule(
        Running,
        Trigger::TimedOutForGood,
        Failed,
        "supervisor",
        TIMEOUT_FAIL,
    ),
    rule(
        Running,
        Trigger::Interrupted,
        Ready,
        "supervisor, restart, shutdown",
        INTERRUPT,
    ),
    rule(
        Running,
        Trigger::InterruptedTooOften,
        Failed,
        "supervisor, restart, shutdown",
        INTERRUPT_FAIL,
    ),
    rule(
        Completed,
        Trigger::CompensationDue,
        CompensationReady,
        "evaluator",
        QUEUE,
    ),
    rule(
        Failed,
        Trigger::CompensationDue,
        CompensationReady,
        "evaluator",
        QUEUE,
    ),
    rule(Failed, Trigger::OperatorRetry, Ready, "operator", QUEUE),
    rule(
        CompensationReady,
        Trigger::Claimed,
        Compensating,
        "claim",
        CLAIM,
    ),
    rule(
        CompensationReady,
        Trigger::OperatorRelease,
        CompensationReady,
        "operator",
        RELEASE,
    ),
    rule(
        Compensating,
        Trigger::SetAside,
        CompensationReady,
        "completion",
        comp(NONE),
    ),
    rule(
        Compensating,
        Trigger::Succeeded,
        Compensated,
        "completion",
        comp(DONE),
    ),
    rule(
        Compensating,
        Trigger::FailedWillRetry,
        CompensationReady,
        "completion",
        comp(RETRY),
    ),
    rule(
        Compensating,
        Trigger::FailedForGood,
        CompensationFailed,
        "completion",
        comp(FAIL),
    ),
    rule(
        Compensating,
        Trigger::TimedOut,
        CompensationReady,
        "supervisor",
        comp(TIMEOUT),
    ),
    rule(
        Compensating,
        Trigger::TimedOutForGood,
        CompensationFailed,
        "supervisor",
        comp(TIMEOUT_FAIL),
    ),
    rule(
        Compensating,
        Trigger::Interrupted,
        CompensationReady,
        "supervisor, restart, shutdown",
        comp(INTERRUPT),
    ),
    rule(
        Compensating,
        Trigger::InterruptedTooOften,
        CompensationFailed,
        "supervisor, restart, shutdown",
        comp(INTERRUPT_FAIL),
    ),
    rule(
        CompensationFailed,
        Trigger::OperatorRetry,
        CompensationReady,
        "operator",
        QUEUE,
    ),
    rule(
        CompensationFailed,
        Trigger::OperatorMarkCompensated,
        Compensated,
        "operator",
        NONE,
    ),
];

/// The rule for `from` on `on`, if the table has one.
pub fn step_rule(from: StepState, on: Trigger) -> Option<&'static StepRule> {
    STEP_RULES.iter().find(|r| r.from == from && r.on == on)
}

/// A step's counters and limits, as the decisions need them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Failed attempts in this phase.
    pub failure_count: i32,
    /// Failure threshold (`i32::MAX`: none).
    pub max_failures: i32,
    /// Attempts lost with their engine instance.
    pub interruptions: i32,
    /// Interruption cap.
    pub max_interruptions: i32,
    /// Current deadline length.
    pub deadline_ms: i64,
    /// Deadline cap.
    pub deadline_cap_ms: i64,
}

/// A failed attempt: retry or fail for good.
pub fn on_failure(retryable: bool, c: &Counters) -> Trigger {
    if retryable && c.failure_count.saturating_add(1) < c.max_failures {
        Trigger::FailedWillRetry
    } else {
        Trigger::FailedForGood
    }
}

/// A deadline that passed while the owner lived.
pub fn on_timeout(c: &Counters) -> Trigger {
    if c.failure_count.saturating_add(1) < c.max_failures {
        Trigger::TimedOut
    } else {
        Trigger::TimedOutForGood
    }
}

/// An attempt lost with its engine instance.
pub fn on_interruption(c: &Counters) -> Trigger {
    if c.interruptions.saturating_add(1) > c.max_interruptions {
        Trigger::InterruptedTooOften
    } else {
        Trigger::Interrupted
    }
}

/// A decided change of one claimed step, with the counters it leaves behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepChange {
    /// State before (the fence).
    pub from: StepState,
    /// What happened.
    pub on: Trigger,
    /// State after.
    pub to: StepState,
    /// New failure count.
    pub failure_count: i32,
    /// New interruption count.
    pub interruptions: i32,
    /// New deadline length.
    pub deadline_ms: i64,
    /// Whether to set *maybe applied*.
    pub maybe_applied: bool,
    /// Delay before the step is due again; `None` when it is not queued.
    pub due_in_ms: Option<i64>,
    /// Whether the attempt's output is stored.
    pub store_output: bool,
}

impl StepChange {
    /// A change that changes nothing: written for a pair the table does not have, it matches
    /// no row (its `to` is its `from`, and nothing is queued).
    pub fn none(from: StepState, on: Trigger, c: &Counters) -> Self {
        Self {
            from,
            on,
            to: from,
            failure_count: c.failure_count,
            interruptions: c.interruptions,
            deadline_ms: c.deadline_ms,
            maybe_applied: false,
            due_in_ms: None,
            store_output: false,
        }
    }
}

/// Applies the rule for (`from`, `on`) to a claimed step's counters. `outcome_unknown` says
/// whether a failed attempt may have acted; `backoff_ms` is the retry policy's delay for
/// this failure.
///
/// Returns `None` when the table has no such edge.
pub fn decide(
    from: StepState,
    on: Trigger,
    c: &Counters,
    outcome_unknown: bool,
    backoff_ms: i64,
) -> Option<StepChange> {
    let r = step_rule(from, on)?;
    let e = r.effects;
    let deadline_ms = if e.extend_deadline {
        c.deadline_ms
            .saturating_mul(2)
            .min(c.deadline_cap_ms)
            .max(c.deadline_ms.min(c.deadline_cap_ms))
    } else {
        c.deadline_ms
    };
    Some(StepChange {
        from,
        on,
        to: r.to,
        failure_count: c.failure_count + i32::from(e.count_failure),
        interruptions: c.interruptions + i32::from(e.count_interruption),
        deadline_ms,
        maybe_applied: match e.maybe {
            Maybe::Keep => false,
            Maybe::IfUnknown => outcome_unknown,
            Maybe::Set => true,
        },
        due_in_ms: match e.due {
            Due::Now => Some(0),
            Due::AfterBackoff => Some(backoff_ms.max(0)),
            Due::Never => None,
        },
        store_output: e.store_output,
    })
}
