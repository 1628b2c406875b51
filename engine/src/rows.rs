//! The rows of runs and steps as the engine's units of work read them: nouns, with no I/O.
//! The store decodes them (`store/rows.rs`, with typed errors: a corrupt row is an error, not
//! a panic); the transitions decide on them; nothing here knows SQL.

use uuid::Uuid;

use crate::state::{Counters, phase_attempts};
use crate::{Error, RunState, StepState};

/// Longest offending value quoted in a damage report.
const QUOTE_MAX: usize = 80;

/// A stored value quoted in an error or alert: truncated, so a huge or hostile value cannot
/// flood logs.
pub fn quote(value: &str) -> String {
    match value.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("`{}…` ({} bytes)", &value[..cut], value.len()),
        None => format!("`{value}`"),
    }
}

/// A row of a run that cannot be decoded: the run is set aside for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The run the row belongs to.
    pub run_id: Uuid,
    /// Table.
    pub table: &'static str,
    /// The row's id.
    pub row: String,
    /// What is wrong: the column and its offending value (truncated).
    pub reason: String,
}

impl Damage {
    /// The damage of `run_id` reported by a decoding error.
    pub fn of(run_id: Uuid, e: Error) -> Self {
        match e {
            Error::CorruptRow { table, id, reason } => Self {
                run_id,
                table,
                row: id,
                reason,
            },
            other => Self {
                run_id,
                table: "sagaflow_steps",
                row: String::new(),
                reason: other.to_string(),
            },
        }
    }

    /// As an error (for callers that cannot act on a damaged run).
    pub fn to_error(&self) -> Error {
        Error::corrupt(self.table, &self.row, &self.reason)
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} row {}: {}", self.table, self.row, self.reason)
    }
}

/// One run.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// Run id.
    pub id: Uuid,
    /// Workflow name.
    pub workflow: String,
    /// Pinned workflow version.
    pub version: i32,
    /// Business key, if any.
    pub business_key: Option<String>,
    /// State.
    pub state: RunState,
    /// Input JSON.
    pub input: String,
    /// Output JSON (object of step outputs) once completed.
    pub output: Option<String>,
    /// Error envelope JSON of the failure that stopped the run.
    pub error: Option<String>,
    /// Created (DB clock, epoch ms).
    pub created_at: i64,
    /// Last changed.
    pub updated_at: i64,
    /// Finished.
    pub finished_at: Option<i64>,
    /// Attempts of its steps that ended without success.
    pub failed_attempts: i32,
    /// Whether its finish is notified through the outbox.
    pub notify: bool,
    /// The W3C `traceparent` of the run's trace (`None` for a run stored before the engine
    /// kept trace contexts).
    pub trace_parent: Option<String>,
    /// The W3C `tracestate` kept with it.
    pub trace_state: Option<String>,
    /// For a child run, the row id of its parent's step that started it.
    pub parent_step: Option<i64>,
}

/// A run as shown to applications: its row, and how it was queued. The engine's own units of
/// work read [`RunRow`] alone; they never need the queueing columns.
#[derive(Debug, Clone)]
pub struct RunView {
    /// The run.
    pub run: RunRow,
    /// Its claim priority.
    pub priority: i32,
    /// The start it was scheduled for (DB clock, epoch ms), when it was started later.
    pub start_at: Option<i64>,
    /// The run it was restarted from, for a run an operator restarted from a step.
    pub restarted_from: Option<Uuid>,
    /// The run it was restarted as, once an operator restarted it from a step.
    pub restarted_as: Option<Uuid>,
}

/// One step of an unfinished run.
#[derive(Debug, Clone)]
pub struct StepRow {
    /// Row id.
    pub id: i64,
    /// Run id.
    pub run_id: Uuid,
    /// Step name.
    pub name: String,
    /// State.
    pub state: StepState,
    /// Owner while running (`LockedBy`).
    pub locked_by: Option<String>,
    /// Deadline while running (`CompleteBy`, epoch ms).
    pub complete_by: Option<i64>,
    /// Due time while queued.
    pub available_at: Option<i64>,
    /// Claims so far, forward and compensation together: with `locked_by`, the fencing token
    /// of the attempt in flight. Only grows; not an attempt number to show (see
    /// [`StepRow::phase_attempts`]).
    pub attempt: i32,
    /// Forward attempts so far (claims of the step while `ready`).
    pub forward_attempts: i32,
    /// Compensation attempts so far (claims while `compensation_ready`).
    pub compensation_attempts: i32,
    /// Failed attempts in the current phase (`FailureCount`).
    pub failure_count: i32,
    /// Failure threshold.
    pub max_failures: i32,
    /// Attempts lost with their engine instance (crash, freeze, shutdown) in this phase;
    /// never counted as failures.
    pub interruptions: i32,
    /// Interruption cap: one more stops the run with a `poison_step` alert.
    pub max_interruptions: i32,
    /// Whether a forward attempt may have taken effect without the engine learning its
    /// result (an attempt failed with an unknown outcome, timed out, or was interrupted).
    /// Sticky.
    pub maybe_applied: bool,
    /// Current deadline length in ms.
    pub deadline_ms: i64,
    /// Idempotency key of the forward step.
    pub idempotency_key: String,
    /// Output JSON once completed.
    pub output: Option<String>,
    /// Last error envelope JSON.
    pub error: Option<String>,
    /// The latest progress its attempt in flight reported (JSON), if any.
    pub progress: Option<String>,
}

impl StepRow {
    /// The attempts of the phase the step is in: its compensation attempts once the run undoes
    /// it (`compensation_ready`, `compensating`, `compensated`, `compensation_failed`), its
    /// forward attempts before.
    pub fn phase_attempts(&self) -> i32 {
        phase_attempts(
            self.state,
            self.forward_attempts,
            self.compensation_attempts,
        )
    }
}

/// A step just claimed: the lease that fences every later write of this attempt.
#[derive(Debug, Clone)]
pub struct ClaimedStep {
    /// Row id.
    pub id: i64,
    /// Run id.
    pub run_id: Uuid,
    /// `name@version` of the workflow.
    pub workflow_key: String,
    /// Step name.
    pub name: String,
    /// `Running` or `Compensating`.
    pub state: StepState,
    /// The fencing token of this attempt: the step's claims so far, of both phases.
    pub attempt: i32,
    /// Forward attempts so far, this one included when `Running`.
    pub forward_attempts: i32,
    /// Compensation attempts so far, this one included when `Compensating`.
    pub compensation_attempts: i32,
    /// Failures, interruptions and deadline so far, with their limits.
    pub counters: Counters,
    /// Deadline (epoch ms, DB clock).
    pub complete_by: i64,
    /// The DB clock when claimed: `complete_by - db_now` is the time the agent has.
    pub db_now: i64,
    /// When the step fell due (epoch ms, DB clock), if the claim read it.
    pub due_at: Option<i64>,
    /// Idempotency key of the forward step.
    pub idempotency_key: String,
    /// The step's output (for a compensation).
    pub output: Option<String>,
    /// The step's stored wait, when it resumes after one.
    pub wait: Option<String>,
}

impl ClaimedStep {
    /// This attempt's 1-based number within its phase: the forward attempts of a `Running`
    /// step, the compensation attempts of a `Compensating` one.
    pub fn phase_attempt(&self) -> i32 {
        phase_attempts(
            self.state,
            self.forward_attempts,
            self.compensation_attempts,
        )
    }
}

/// A running step to rescue: its deadline passed (SAS-3: a crashed and a hung agent look
/// the same), or its owner instance stopped heartbeating (then it is an interruption).
#[derive(Debug, Clone)]
pub struct ExpiredStep {
    /// Row id.
    pub id: i64,
    /// Run id.
    pub run_id: Uuid,
    /// `name@version` of the workflow.
    pub workflow_key: String,
    /// Step name.
    pub name: String,
    /// `Running` or `Compensating`.
    pub state: StepState,
    /// The fencing token of the attempt in flight.
    pub attempt: i32,
    /// Its owner (`LockedBy`).
    pub locked_by: String,
    /// Failures, interruptions and deadline so far, with their limits.
    pub counters: Counters,
    /// Whether the owner instance is dead, frozen or stopped (its heartbeat is stale).
    pub owner_dead: bool,
}
