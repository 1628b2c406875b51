//! A step's vocabulary and decisions: triggers, effects, counters, and `decide`, which
//! applies a rule of the step table (`step_rules.rs`) to a claimed step's counters.

pub use super::step_rules::STEP_RULES;
use crate::StepState;

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
    /// The remote asked to be called again later and applied nothing
    /// ([`StepError::try_again_after`](crate::StepError::try_again_after)), and the attempt's
    /// number within its phase is within the deferral cap: queued again after the asked
    /// delay, no failure counted.
    Deferred,
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
    /// An operator released a set-aside run or resumed a paused one: its parked steps are
    /// due again.
    OperatorRelease,
    /// The run is paused: a queued step is parked (not due) until an operator resumes it.
    Paused,
    /// The attempt asked to wait (a timer, an event, a callback, a child run): the step is
    /// parked in `Waiting` until what it waits for arrives or its timeout passes; nothing is
    /// counted. A step that handed a callback token out may have acted.
    Parked,
    /// What a waiting step waited for arrived, or its time came: it is due again, and its
    /// next attempt reads what woke it.
    Woken,
    /// The run rolled back to an earlier step and goes forward again: a step after it (undone,
    /// dropped, failed, or done with nothing to undo) starts afresh under a new idempotency
    /// key (evaluator).
    RolledBack,
    /// As [`RolledBack`](Self::RolledBack), for a step whose dependencies are all kept: it is
    /// queued at once.
    RolledBackDue,
}

impl Trigger {
    /// Every trigger.
    pub const ALL: [Trigger; 21] = [
        Self::Claimed,
        Self::Succeeded,
        Self::FailedWillRetry,
        Self::FailedForGood,
        Self::Deferred,
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
        Self::Paused,
        Self::Parked,
        Self::Woken,
        Self::RolledBack,
        Self::RolledBackDue,
    ];

    /// The name used in history and docs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Claimed => "claimed",
            Self::Succeeded => "succeeded",
            Self::FailedWillRetry => "failed_will_retry",
            Self::FailedForGood => "failed_for_good",
            Self::Deferred => "deferred",
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
            Self::RolledBack => "rolled_back",
            Self::RolledBackDue => "rolled_back_due",
            Self::Paused => "paused",
            Self::Parked => "parked",
            Self::Woken => "woken",
        }
    }

    /// Whether the trigger ends an attempt that did not succeed: a failure, a timeout or an
    /// interruption (a deferral is none of these). Each such end adds one to the run's
    /// failed-attempt count, which operators sort runs by.
    pub const fn ends_attempt_unsuccessfully(self) -> bool {
        matches!(
            self,
            Self::FailedWillRetry
                | Self::FailedForGood
                | Self::TimedOut
                | Self::TimedOutForGood
                | Self::Interrupted
                | Self::InterruptedTooOften
        )
    }
}

/// When the step is due after the transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At once (`available_at = now`).
    Now,
    /// After the retry policy's backoff for this failure.
    AfterBackoff,
    /// After the delay the remote asked for (a deferral), capped by the retry policy, or
    /// after a wait's timeout.
    AfterAskedDelay,
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
    /// Starts afresh: a new idempotency key (its effect was undone or never happened, so a
    /// new call must not be answered with the old one's result), output, error and the
    /// *maybe applied* flag cleared.
    pub rekey: bool,
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

/// The rule for `from` on `on`, if the table has one.
pub fn step_rule(from: StepState, on: Trigger) -> Option<&'static StepRule> {
    STEP_RULES.iter().find(|r| r.from == from && r.on == on)
}

pub use crate::state::Counters;

/// A failed attempt: retry or fail for good.
pub fn on_failure(retryable: bool, c: &Counters) -> Trigger {
    if retryable && c.failure_count.saturating_add(1) < c.max_failures {
        Trigger::FailedWillRetry
    } else {
        Trigger::FailedForGood
    }
}

/// An attempt whose remote asked to be called again later, having applied nothing: a
/// deferral while the attempt's number within its phase is at most `max_deferrals`, an
/// ordinary retryable failure ([`on_failure`]) past it, so a remote that always answers
/// "later" cannot hold a run forever.
pub fn on_deferral(c: &Counters, max_deferrals: u32) -> Trigger {
    if i64::from(c.phase_attempt) <= i64::from(max_deferrals) {
        Trigger::Deferred
    } else {
        on_failure(true, c)
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
/// whether a failed attempt may have acted; `delay_ms` is the retry policy's backoff for
/// this failure, or the (capped) delay a deferral asked for.
///
/// Returns `None` when the table has no such edge.
pub fn decide(
    from: StepState,
    on: Trigger,
    c: &Counters,
    outcome_unknown: bool,
    delay_ms: i64,
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
            Due::AfterBackoff | Due::AfterAskedDelay => Some(delay_ms.max(0)),
            Due::Never => None,
        },
        store_output: e.store_output,
    })
}
