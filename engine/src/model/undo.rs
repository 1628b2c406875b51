//! What an undo would do, shown before an operator asks for it: the compensations a
//! `cancel` or a `compensate` would run, in order, and what it would leave alone.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::{RunState, StepState};

/// The two actions that undo a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::Display)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum Undo {
    /// `cancel`: stops the run's attempts in flight, and undoes what completed up to a pivot
    /// that took or may have taken effect.
    Cancel,
    /// `compensate`: undoes what completed, past a pivot too (the operator's decision).
    Compensate,
}

/// How the run ends if every compensation of the plan succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, strum::Display)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum UndoOutcome {
    /// Everything to undo is undone: the run ends `compensated`.
    Compensated,
    /// The run stops in `error` for an operator (a pivot that took or may have taken effect
    /// under a cancel, or a compensation that already failed for good); see the reason.
    StopsInError,
    /// The cancel comes too late: the pivot completed, so the run goes forward and completes.
    GoesForward,
    /// The undo waits for something the preview cannot decide (see the reason).
    Waits,
}

/// One compensation of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct UndoStep {
    /// The step whose effect is undone.
    pub step: String,
    /// Its state now.
    pub state: StepState,
    /// Whether the effect may have been applied without the engine learning it (an attempt
    /// failed with an unknown outcome, timed out, was interrupted, or is stopped by the
    /// cancel): the compensation runs although the step did not complete.
    pub maybe_applied: bool,
    /// The step's output, which the compensation reads (`StepContext::output`) beside the
    /// run's input; `None` when it did not complete.
    pub output: Option<Value>,
    /// The remote resource the compensation's attempts count against, if any.
    pub resource: Option<String>,
}

/// A step the undo leaves as it is, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct KeptStep {
    /// The step.
    pub step: String,
    /// Its state now.
    pub state: StepState,
    /// Why nothing is undone for it.
    pub reason: String,
}

/// What a `cancel` or `compensate` of a run would do (`Engine::preview_undo`), computed by the
/// same transition rules that carry it out, on the run as it is now, assuming that every
/// compensation succeeds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct UndoPreview {
    /// The run.
    pub run_id: Uuid,
    /// The action previewed.
    pub undo: Undo,
    /// The run's state now.
    pub run_state: RunState,
    /// The run's input, which every compensation reads (`StepContext::input`) beside its
    /// step's output.
    pub input: Value,
    /// How the run ends.
    pub outcome: UndoOutcome,
    /// Why it ends that way, when it does not end `compensated`.
    pub reason: Option<String>,
    /// The compensations in the order they run: the steps of one group run side by side, a
    /// group starts when the one before it has finished.
    pub groups: Vec<Vec<UndoStep>>,
    /// The steps left as they are, with why.
    pub kept: Vec<KeptStep>,
    /// Attempts in flight now, and what the preview assumed of their end: a cancel stops
    /// them (their outcome unknown); under a compensate they run on and are taken to
    /// complete.
    pub in_flight: Vec<String>,
}
