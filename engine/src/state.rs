//! The state machines of a step and of a run.
//!
//! Each variant's documentation names the component that moves a row *out* of it. The full
//! graph with every edge is drawn in `docs/state-machines.md`.

/// Persisted state of one step of a run (SAS-1).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum StepState {
    /// Waiting for its dependencies. Moved to `Ready` by the scheduler's evaluator when every
    /// dependency completed, or to `Skipped` when the run compensates.
    NotStarted,
    /// Queued, due at `available_at`. Moved to `Running` by a scheduler's claim, or to
    /// `Skipped` by the evaluator when the run compensates.
    Ready,
    /// Claimed by a scheduler (`locked_by`) and handed to an agent; must finish before
    /// `complete_by`. Moved by the fenced completion write (to `Completed`, `Ready` for a
    /// retry, or `Failed`) or by the supervisor when the deadline passed (to `Ready` with an
    /// extended deadline, or `Failed` at the failure threshold).
    Running,
    /// Finished successfully; its output is stored. Moved to `CompensationReady` by the
    /// evaluator when the run compensates and the step has a compensation.
    Completed,
    /// Failed terminally or past its failure threshold. Moved back to `Ready` only by an
    /// operator retry; moved to `CompensationReady` by the evaluator when the failure left the
    /// remote effect possibly applied (a timeout, or an output too large to store) and the step
    /// has a compensation.
    Failed,
    /// Its compensation is queued. Moved to `Compensating` by a scheduler's claim.
    CompensationReady,
    /// Its compensation is running under a deadline. Moved like `Running`, to
    /// `Compensated`, `CompensationReady` or `CompensationFailed`.
    Compensating,
    /// Its compensation finished (or an operator undid the effect by hand). Final.
    Compensated,
    /// Its compensation failed terminally or exhausted its retries; the run is in `Error`.
    /// Moved by an operator: back to `CompensationReady` (retry, resume) or to `Compensated`
    /// (undone by hand).
    CompensationFailed,
    /// Never ran because the run compensated first. Final.
    Skipped,
    /// Parked until something outside the engine happens: a timer's time, a named event, a
    /// callback, the end of a child run (the step's `wait` says which), or at the latest its
    /// timeout (`available_at`). No task is held in memory. Moved to `Ready` when what it
    /// waits for arrives (the event's sender, the callback, the child's last evaluation) or
    /// its time comes (the supervisor leader's timer pass); the resumed attempt then
    /// completes or fails it. Moved to `Skipped` or `CompensationReady` by the evaluator when
    /// the run compensates.
    Waiting,
}

impl StepState {
    /// Every state, for exhaustive tests and documentation.
    pub const ALL: [StepState; 11] = [
        Self::NotStarted,
        Self::Ready,
        Self::Running,
        Self::Completed,
        Self::Failed,
        Self::CompensationReady,
        Self::Compensating,
        Self::Compensated,
        Self::CompensationFailed,
        Self::Skipped,
        Self::Waiting,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether an agent is (or may be) working on the step.
    pub const fn is_in_flight(self) -> bool {
        matches!(self, Self::Running | Self::Compensating)
    }

    /// Whether the step belongs to the compensation phase.
    pub const fn is_compensation(self) -> bool {
        matches!(
            self,
            Self::CompensationReady
                | Self::Compensating
                | Self::Compensated
                | Self::CompensationFailed
        )
    }
}

/// Persisted state of a run (SAS-7 `ProcessState`, extended for sagas).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RunState {
    /// Accepted: stored with its root steps already queued. Moved by its first evaluation,
    /// normally when its first step result is written: to `Running` (or straight to
    /// `Completed`, `Compensating`, `Compensated` or `Error`), or by an operator `compensate`.
    Pending,
    /// Steps are executing. Moved by the evaluator to `Completed`, `Compensating`, `Compensated` (nothing to undo) or `Error`.
    Running,
    /// Completed steps are being undone in reverse dependency order. Moved by the evaluator
    /// to `Compensated`, or `Error` when a compensation exhausts its retries.
    Compensating,
    /// Every step completed. Final.
    Completed,
    /// Every completed step was compensated. Final.
    Compensated,
    /// Needs an operator: an alert was raised. Moved by operator actions (retry a step,
    /// compensate, resume).
    Error,
    /// Claims no new steps: paused by an operator, or parked by its workflow's
    /// [`OnFailure::Pause`](crate::definition::OnFailure::Pause) policy where it would have
    /// started compensating (an alert says so). Attempts already in flight finish and are
    /// recorded; steps due meanwhile wait. Moved by an operator: resume (back to the phase it
    /// was in, retrying that phase's failed steps), compensate or cancel.
    Paused,
}

impl RunState {
    /// Every state.
    pub const ALL: [RunState; 7] = [
        Self::Pending,
        Self::Running,
        Self::Compensating,
        Self::Completed,
        Self::Compensated,
        Self::Error,
        Self::Paused,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether the run will not move again without an operator.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Compensated | Self::Error | Self::Paused
        )
    }

    /// Whether the run is finished for good (an `Error` run can still be retried).
    pub const fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Compensated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_stored_spelling() {
        for s in StepState::ALL {
            assert_eq!(s.as_str().parse::<StepState>().ok(), Some(s));
        }
        for s in RunState::ALL {
            assert_eq!(s.as_str().parse::<RunState>().ok(), Some(s));
        }
        // The spellings are stored: renaming a variant must not change them.
        let stored: Vec<&str> = StepState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            stored,
            [
                "not_started",
                "ready",
                "running",
                "completed",
                "failed",
                "compensation_ready",
                "compensating",
                "compensated",
                "compensation_failed",
                "skipped",
                "waiting"
            ]
        );
        let stored: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            stored,
            [
                "pending",
                "running",
                "compensating",
                "completed",
                "compensated",
                "error",
                "paused"
            ]
        );
        assert!("bogus".parse::<StepState>().is_err());
        assert!("bogus".parse::<RunState>().is_err());
    }
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
    /// The attempt's number within its phase (`forward_attempts` of a running step,
    /// `compensation_attempts` of a compensating one), the attempt in flight included.
    pub phase_attempt: i32,
}

/// The attempt counter of the phase `state` belongs to.
pub(crate) const fn phase_attempts(state: StepState, forward: i32, compensation: i32) -> i32 {
    if state.is_compensation() {
        compensation
    } else {
        forward
    }
}
