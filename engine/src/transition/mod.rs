//! The one place that decides how a step or a run moves from one state to the next.
//!
//! Everything here is pure: (current state, event) → new state + effects, read from two
//! tables, [`STEP_RULES`] and [`RUN_RULES`]. The scheduler (claims, attempt results, the
//! evaluator), the supervisor (deadlines, dead instances), the engine's start and shutdown
//! (interruptions) and the operator actions all ask this module what to write, and the store
//! persists exactly that through a [`StoreTx`](crate::store::StoreTx); the store decides
//! nothing. `docs/state-machines.md` shows the same tables, rendered by [`step_table`] and
//! [`run_table`], and a test fails when the two disagree.
//!
//! Step events are classified against the step's counters first ([`on_failure`],
//! [`on_deferral`], [`on_timeout`], [`on_interruption`]): a failed attempt is
//! `failed_will_retry` below the failure threshold and `failed_for_good` at it, a deferral is
//! `deferred` within the deferral cap and a failure past it, an interruption is
//! `interrupted_too_often` past the interruption cap. Then [`decide`] applies the table's effects to the counters.

use crate::StepError;
use crate::rows::ExpiredStep;

mod doc;
pub mod migrate;
pub mod operator;
pub mod pause;
mod preview;
pub mod restart;
mod run;
mod run_rules;
mod step;
mod step_rules;
pub mod writes;

#[cfg(test)]
mod rescue_tests;
#[cfg(test)]
mod tests;

pub use doc::{run_table, step_table};
pub use preview::preview_undo;
pub use run::{ROLLED_BACK_KEYS, plan};
pub use run_rules::{
    OPERATOR_ACTIONS, PAUSED_ACTIONS, RUN_RULES, RunRule, RunTrigger, run_rule, set_aside_rule,
};
pub use step::{
    Counters, Due, Effects, Maybe, STEP_RULES, StepChange, StepRule, Trigger, decide, on_deferral,
    on_failure, on_interruption, on_timeout, step_rule,
};
pub use writes::{
    DeadlineGuard, MigrationWrite, NewAlert, NewRun, NewStep, Park, PlanWrite, RunStart,
    StepFinish, StepInsert, StepUpdate, StepWrite, WaitWrite,
};

/// The decided end of a running step found by a rescue: an interruption when its owner
/// instance is dead, frozen or stopped (not a failure; the deadline is not stretched), a
/// timeout otherwise.
pub fn rescue(step: &ExpiredStep) -> StepFinish {
    let c = step.counters;
    let (on, guard, error) = if step.owner_dead {
        (
            on_interruption(&c),
            DeadlineGuard::Any,
            StepError::interrupted(&step.locked_by, "its heartbeat stopped"),
        )
    } else {
        (
            on_timeout(&c),
            DeadlineGuard::Expired,
            StepError::timeout(c.deadline_ms),
        )
    };
    let change =
        decide(step.state, on, &c, true, 0).unwrap_or_else(|| StepChange::none(step.state, on, &c));
    // The counters after the change travel with the envelope into the history.
    let error = error.with_details(serde_json::json!({
        "failure_count": change.failure_count,
        "max_failures": c.max_failures,
        "interruptions": change.interruptions,
        "max_interruptions": c.max_interruptions,
        "deadline_ms": change.deadline_ms,
    }));
    StepFinish {
        id: step.id,
        run_id: step.run_id,
        workflow_key: step.workflow_key.clone(),
        name: step.name.clone(),
        attempt: step.attempt,
        owner: step.locked_by.clone(),
        change,
        output: None,
        error: Some(error),
        guard,
        elapsed: None,
        wait: WaitWrite::Keep,
    }
}
