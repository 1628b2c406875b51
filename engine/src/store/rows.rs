//! Rows read from the store, decoded with typed errors (a corrupt row is an error, not a panic).

use sea_orm::DbErr;

use super::row::{FromRow, Row, from_row};
use uuid::Uuid;

use crate::model::HistoryColumns;
use crate::state::Counters;
use crate::{Error, Result, RunState, StepState};

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

/// Decodes a state column, naming the column and quoting the value when it is not a state.
pub(super) fn state_of<T: std::str::FromStr>(
    table: &'static str,
    id: impl ToString,
    value: &str,
) -> Result<T> {
    value.parse().map_err(|_| {
        Error::corrupt(
            table,
            id.to_string(),
            format!(
                "column `state` holds {}, which is not a state",
                quote(value)
            ),
        )
    })
}

/// A state column through its stored spelling; a value that is not a state is a type error
/// naming the column and quoting the value.
pub(super) fn state_cell<T: std::str::FromStr>(
    r: &Row,
    col: &str,
) -> std::result::Result<T, DbErr> {
    let value: String = r.try_get("", col)?;
    value.parse().map_err(|_| {
        DbErr::Type(format!(
            "column `{col}` holds {}, which is not a state",
            quote(&value)
        ))
    })
}

/// Decodes a row of `table` whose id is already known, reporting any column that does not
/// decode as damage of that row.
fn decode_row<T: FromRow>(table: &'static str, id: impl ToString, r: &Row) -> Result<T> {
    T::from_row(r).map_err(|e| {
        let reason = match e {
            DbErr::Type(reason) => reason,
            other => other.to_string(),
        };
        Error::corrupt(table, id.to_string(), reason)
    })
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

from_row!(RunRow {
    id,
    workflow,
    version,
    business_key,
    state: state_cell,
    input,
    output,
    error,
    created_at,
    updated_at,
    finished_at,
    failed_attempts,
    notify,
    trace_parent,
    trace_state,
    parent_step,
});

pub(super) const RUN_COLS: &str = "id, workflow, version, business_key, state, input, output, error, created_at, updated_at, finished_at, failed_attempts, notify, trace_parent, trace_state, parent_step";

impl RunRow {
    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: Uuid = r.try_get("", "id")?;
        decode_row("sagaflow_runs", id, r)
    }
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
}

/// The columns a [`RunView`] reads beside [`RUN_COLS`].
pub(super) const RUN_VIEW_COLS: &str = "priority, start_at";

/// The queueing columns of a run.
struct Queueing {
    priority: i32,
    start_at: Option<i64>,
}

from_row!(Queueing { priority, start_at });

impl RunView {
    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: Uuid = r.try_get("", "id")?;
        let run = decode_row("sagaflow_runs", id, r)?;
        let q: Queueing = decode_row("sagaflow_runs", id, r)?;
        Ok(Self {
            run,
            priority: q.priority,
            start_at: q.start_at,
        })
    }
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
}

from_row!(StepRow {
    id,
    run_id,
    name,
    state: state_cell,
    locked_by,
    complete_by,
    available_at,
    attempt,
    forward_attempts,
    compensation_attempts,
    failure_count,
    max_failures,
    interruptions,
    max_interruptions,
    maybe_applied,
    deadline_ms,
    idempotency_key,
    output,
    error,
});

pub(super) const STEP_COLS: &str = "id, run_id, name, state, locked_by, complete_by, available_at, attempt, \
     forward_attempts, compensation_attempts, failure_count, max_failures, interruptions, max_interruptions, maybe_applied, deadline_ms, \
     idempotency_key, output, error";

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

    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: i64 = r.try_get("", "id")?;
        decode_row("sagaflow_steps", id, r)
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

impl FromRow for ClaimedStep {
    fn from_row(r: &Row) -> std::result::Result<Self, DbErr> {
        Ok(Self {
            id: r.try_get("", "id")?,
            run_id: r.try_get("", "run_id")?,
            workflow_key: r.try_get("", "workflow_key")?,
            name: r.try_get("", "name")?,
            state: state_cell(r, "state")?,
            attempt: r.try_get("", "attempt")?,
            forward_attempts: r.try_get("", "forward_attempts")?,
            compensation_attempts: r.try_get("", "compensation_attempts")?,
            counters: Counters::from_row(r)?,
            complete_by: r.try_get("", "complete_by")?,
            db_now: r.try_get("", "db_now")?,
            due_at: r.try_get::<Option<i64>>("", "due_at").ok().flatten(),
            idempotency_key: r.try_get("", "idempotency_key")?,
            output: r.try_get("", "output")?,
            wait: r.try_get::<Option<String>>("", "wait").ok().flatten(),
        })
    }
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

    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: i64 = r.try_get("", "id")?;
        decode_row("sagaflow_steps", id, r)
    }
}

use crate::state::phase_attempts;

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

impl ExpiredStep {
    pub(super) const COLS: &str = "id, run_id, workflow_key, name, state, attempt, locked_by, failure_count, \
        max_failures, interruptions, max_interruptions, deadline_ms, deadline_cap_ms, \
        forward_attempts, compensation_attempts";

    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: i64 = r.try_get("", "id")?;
        let state = decode_row("sagaflow_steps", id, r).map(|StateOnly { state }| state)?;
        Ok(Self {
            id,
            run_id: r.try_get("", "run_id")?,
            workflow_key: r.try_get("", "workflow_key")?,
            name: r.try_get("", "name")?,
            state,
            attempt: r.try_get("", "attempt")?,
            locked_by: r
                .try_get::<Option<String>>("", "locked_by")?
                .unwrap_or_default(),
            counters: Counters::from_row(r)?,
            owner_dead: r
                .try_get::<Option<bool>>("", "owner_dead")?
                .unwrap_or(false),
        })
    }
}

/// The state column alone (of a row decoded field by field).
struct StateOnly {
    state: StepState,
}
from_row!(StateOnly { state: state_cell });

// The counters of a claimed or running step, as the transition table decides on them (the
// type lives with the decisions, which know nothing of rows). The row's `state`,
// `forward_attempts` and `compensation_attempts` give the attempt's number within its phase.
impl FromRow for Counters {
    fn from_row(r: &Row) -> std::result::Result<Self, DbErr> {
        let state: StepState = state_cell(r, "state")?;
        Ok(Self {
            failure_count: r.try_get("", "failure_count")?,
            max_failures: r.try_get("", "max_failures")?,
            interruptions: r.try_get("", "interruptions")?,
            max_interruptions: r.try_get("", "max_interruptions")?,
            deadline_ms: r.try_get("", "deadline_ms")?,
            deadline_cap_ms: r.try_get("", "deadline_cap_ms")?,
            phase_attempt: phase_attempts(
                state,
                r.try_get("", "forward_attempts")?,
                r.try_get("", "compensation_attempts")?,
            ),
        })
    }
}

/// Decodes one history row into its stored columns (typed in [`crate::model`]).
pub(super) fn history_columns(r: &Row) -> Result<HistoryColumns> {
    Ok(HistoryColumns::from_row(r)?)
}

// The columns of one history entry, read by name.
from_row!(HistoryColumns {
    id,
    step,
    event,
    from_state,
    to_state,
    attempt,
    actor,
    detail,
    at,
});
