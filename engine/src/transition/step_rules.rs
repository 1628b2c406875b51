//! The step table: every (state, trigger) → state + effects that sagaflow makes, as data.
//! `docs/state-machines.md` shows it rendered from this code.

use super::step::{Due, Effects, Maybe, StepRule, Trigger};
use crate::StepState;
use crate::StepState::{
    Compensated, Compensating, CompensationFailed, CompensationReady, Completed, Failed,
    NotStarted, Ready, Running, Skipped, Waiting,
};

const NONE: Effects = Effects {
    count_failure: false,
    count_interruption: false,
    extend_deadline: false,
    reset: false,
    maybe: Maybe::Keep,
    due: Due::Never,
    store_output: false,
    rekey: false,
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
/// A deferral: queued again after the delay the remote asked for, nothing counted, nothing
/// marked (only a request that applied nothing is deferred).
const DEFER: Effects = Effects {
    due: Due::AfterAskedDelay,
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
/// A wait: parked until its timeout at the latest, nothing counted; a step that handed a
/// callback token out may have acted.
const PARK: Effects = Effects {
    maybe: Maybe::IfUnknown,
    due: Due::AfterAskedDelay,
    ..NONE
};
const DONE: Effects = Effects {
    store_output: true,
    ..NONE
};
/// A rollback: afresh, under a new idempotency key, not queued (a dependency is still to run).
const AFRESH: Effects = Effects {
    reset: true,
    rekey: true,
    ..NONE
};
/// A rollback: afresh, under a new idempotency key, and queued (its dependencies are kept).
const AFRESH_QUEUED: Effects = Effects {
    reset: true,
    rekey: true,
    due: Due::Now,
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
    rule(Ready, Trigger::Paused, Ready, "evaluator, operator", NONE),
    rule(Running, Trigger::Succeeded, Completed, "completion", DONE),
    rule(
        Running,
        Trigger::FailedWillRetry,
        Ready,
        "completion",
        RETRY,
    ),
    rule(Running, Trigger::FailedForGood, Failed, "completion", FAIL),
    rule(Running, Trigger::Deferred, Ready, "completion", DEFER),
    rule(Running, Trigger::SetAside, Ready, "completion", NONE),
    rule(Running, Trigger::Parked, Waiting, "completion", PARK),
    rule(
        Waiting,
        Trigger::Woken,
        Ready,
        "event, callback, child run, timer pass",
        RELEASE,
    ),
    rule(Waiting, Trigger::Dropped, Skipped, "evaluator", NONE),
    rule(
        Waiting,
        Trigger::CompensationDue,
        CompensationReady,
        "evaluator",
        QUEUE,
    ),
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
        CompensationReady,
        Trigger::Paused,
        CompensationReady,
        "evaluator, operator",
        comp(NONE),
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
        Trigger::Deferred,
        CompensationReady,
        "completion",
        comp(DEFER),
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
    // A rollback to an earlier step: what ran after it starts afresh once the unwinding
    // has undone what it did.
    rule(
        Compensated,
        Trigger::RolledBack,
        NotStarted,
        "evaluator",
        AFRESH,
    ),
    rule(
        Skipped,
        Trigger::RolledBack,
        NotStarted,
        "evaluator",
        AFRESH,
    ),
    rule(Failed, Trigger::RolledBack, NotStarted, "evaluator", AFRESH),
    rule(Ready, Trigger::RolledBack, NotStarted, "evaluator", AFRESH),
    rule(
        Completed,
        Trigger::RolledBack,
        NotStarted,
        "evaluator",
        AFRESH,
    ),
    rule(
        Compensated,
        Trigger::RolledBackDue,
        Ready,
        "evaluator",
        AFRESH_QUEUED,
    ),
    rule(
        Skipped,
        Trigger::RolledBackDue,
        Ready,
        "evaluator",
        AFRESH_QUEUED,
    ),
    rule(
        Failed,
        Trigger::RolledBackDue,
        Ready,
        "evaluator",
        AFRESH_QUEUED,
    ),
    rule(
        Completed,
        Trigger::RolledBackDue,
        Ready,
        "evaluator",
        AFRESH_QUEUED,
    ),
    rule(
        NotStarted,
        Trigger::RolledBackDue,
        Ready,
        "evaluator",
        AFRESH_QUEUED,
    ),
    rule(
        Ready,
        Trigger::RolledBackDue,
        Ready,
        "evaluator",
        AFRESH_QUEUED,
    ),
];
