//! What the engine shows an application: runs, steps, history events and alerts as typed
//! values — states as enums, payloads as `serde_json::Value`, times as UTC timestamps —
//! decoded from the store's rows at the edge, so no caller parses JSON strings or matches
//! event names.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::store::{RunRow, StepRow};
use crate::{Error, Result, RunState, StepState};

/// A point in time on the database's clock.
pub type Timestamp = DateTime<Utc>;

/// Epoch milliseconds (the stored form) as a timestamp. Out-of-range values (no clock ever
/// wrote one) saturate rather than fail a read.
pub(crate) fn timestamp(ms: i64) -> Timestamp {
    DateTime::from_timestamp_millis(ms).unwrap_or(if ms < 0 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

/// Parses a stored JSON column; a value that is not JSON is a damaged row.
fn json(table: &'static str, row: impl ToString, column: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        Error::corrupt(
            table,
            row.to_string(),
            format!("column `{column}` is not JSON: {e}"),
        )
    })
}

fn json_opt(
    table: &'static str,
    row: impl ToString,
    column: &str,
    text: Option<&str>,
) -> Result<Option<Value>> {
    text.map(|t| json(table, row, column, t)).transpose()
}

/// One run of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Run {
    /// Run id.
    pub id: Uuid,
    /// Workflow name.
    pub workflow: String,
    /// The workflow version the run is pinned to.
    pub version: i32,
    /// Business key, if the run was started with one.
    pub business_key: Option<String>,
    /// State.
    pub state: RunState,
    /// The input it was started with.
    pub input: Value,
    /// Once completed: an object with each step's output under the step's name.
    pub output: Option<Value>,
    /// The error envelope (`code`, `message`, …) of the failure that stopped or unwound it.
    pub error: Option<Value>,
    /// When it was accepted.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// When it finished (`Completed` or `Compensated`).
    pub finished_at: Option<Timestamp>,
}

impl RunRow {
    /// The run as applications see it.
    ///
    /// # Errors
    /// [`Error::CorruptRow`] when a JSON column does not hold JSON.
    pub fn into_run(self) -> Result<Run> {
        const T: &str = "sagaflow_runs";
        let r = self;
        Ok(Run {
            input: json(T, r.id, "input", &r.input)?,
            output: json_opt(T, r.id, "output", r.output.as_deref())?,
            error: json_opt(T, r.id, "error", r.error.as_deref())?,
            id: r.id,
            workflow: r.workflow,
            version: r.version,
            business_key: r.business_key,
            state: r.state,
            created_at: timestamp(r.created_at),
            updated_at: timestamp(r.updated_at),
            finished_at: r.finished_at.map(timestamp),
        })
    }
}

/// Attempts of one step, counted per phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
pub struct Attempts {
    /// Attempts of the forward step so far.
    pub forward: i32,
    /// Attempts of its compensation so far.
    pub compensation: i32,
    /// Failed attempts in the current phase.
    pub failures: i32,
    /// Failures the current phase tolerates before the step fails for good.
    pub max_failures: i32,
    /// Attempts lost with their engine instance in the current phase (never failures).
    pub interruptions: i32,
    /// Interruptions tolerated before the run stops with a `poison_step` alert.
    pub max_interruptions: i32,
}

/// One step of an unfinished run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Step {
    /// The run it belongs to.
    pub run_id: Uuid,
    /// Step name.
    pub name: String,
    /// State.
    pub state: StepState,
    /// Attempt counters.
    pub attempts: Attempts,
    /// Whether a forward attempt may have taken effect without the engine learning its
    /// result (it failed with an unknown outcome, timed out, or was interrupted). Sticky.
    pub maybe_applied: bool,
    /// The engine instance running it, while it runs.
    pub locked_by: Option<String>,
    /// The deadline of the attempt in flight (`CompleteBy`).
    pub complete_by: Option<Timestamp>,
    /// When it is due, while queued.
    pub available_at: Option<Timestamp>,
    /// The current length of an attempt's deadline.
    pub deadline: Duration,
    /// The idempotency key its forward attempts send.
    pub idempotency_key: String,
    /// Its output once completed.
    pub output: Option<Value>,
    /// The error envelope of its last failure.
    pub error: Option<Value>,
}

impl Step {
    /// The attempts of the phase the step is in: compensation attempts once the run undoes
    /// it, forward attempts before.
    pub fn phase_attempts(&self) -> i32 {
        if self.state.is_compensation() {
            self.attempts.compensation
        } else {
            self.attempts.forward
        }
    }
}

impl StepRow {
    /// The step as applications see it.
    ///
    /// # Errors
    /// [`Error::CorruptRow`] when a JSON column does not hold JSON.
    pub fn into_step(self) -> Result<Step> {
        const T: &str = "sagaflow_steps";
        let r = self;
        Ok(Step {
            output: json_opt(T, r.id, "output", r.output.as_deref())?,
            error: json_opt(T, r.id, "error", r.error.as_deref())?,
            run_id: r.run_id,
            name: r.name,
            state: r.state,
            attempts: Attempts {
                forward: r.forward_attempts,
                compensation: r.compensation_attempts,
                failures: r.failure_count,
                max_failures: r.max_failures,
                interruptions: r.interruptions,
                max_interruptions: r.max_interruptions,
            },
            maybe_applied: r.maybe_applied,
            locked_by: r.locked_by,
            complete_by: r.complete_by.map(timestamp),
            available_at: r.available_at.map(timestamp),
            deadline: Duration::from_millis(u64::try_from(r.deadline_ms).unwrap_or(0)),
            idempotency_key: r.idempotency_key,
        })
    }
}

/// What a history event records.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, strum::EnumString, strum::AsRefStr, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HistoryKind {
    /// The run was accepted.
    Submitted,
    /// A run or step changed state as the saga advanced (evaluation, scheduling).
    State,
    /// An attempt succeeded.
    Completed,
    /// An attempt failed and the step is queued again.
    Retry,
    /// An attempt failed for good.
    Failed,
    /// An attempt ran past its deadline (the supervisor re-queued or failed the step).
    Timeout,
    /// An attempt was lost with its engine instance.
    Interrupted,
    /// A damaged row set the run aside for an operator.
    SetAside,
    /// An operator retried a step or its compensation.
    OperatorRetryStep,
    /// An operator asked for compensation.
    OperatorCompensate,
    /// An operator resumed a run in `Error`.
    OperatorResume,
    /// An operator marked a step compensated by hand.
    OperatorMarkCompensated,
    /// An operator released a set-aside run.
    OperatorRelease,
    /// An event this version does not know (written by a newer one).
    #[strum(default)]
    Other(String),
}

/// A state named in a history event: a run's or a step's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "of", content = "state", rename_all = "snake_case")]
pub enum EntityState {
    /// A run state.
    Run(RunState),
    /// A step state.
    Step(StepState),
}

impl EntityState {
    /// The state when it is a step's.
    pub fn step(self) -> Option<StepState> {
        match self {
            Self::Step(s) => Some(s),
            Self::Run(_) => None,
        }
    }

    /// The state when it is a run's.
    pub fn run(self) -> Option<RunState> {
        match self {
            Self::Run(s) => Some(s),
            Self::Step(_) => None,
        }
    }
}

impl std::fmt::Display for EntityState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Run(s) => s.fmt(f),
            Self::Step(s) => s.fmt(f),
        }
    }
}

/// One entry of a run's append-only history.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct HistoryEvent {
    /// Sequence number (increasing within a database).
    pub id: i64,
    /// The step concerned; `None` when the event is about the run.
    pub step: Option<String>,
    /// What happened.
    pub kind: HistoryKind,
    /// State before (a step's when `step` is set, the run's otherwise).
    pub from: Option<EntityState>,
    /// State after.
    pub to: Option<EntityState>,
    /// The fencing token of the attempt concerned.
    pub attempt: Option<i32>,
    /// Who: a scheduler's instance id, `supervisor:<holder>#<term>`, or `operator`.
    pub actor: String,
    /// Details: an error envelope, a note.
    pub detail: Option<Value>,
    /// When (database clock).
    pub at: Timestamp,
}

impl HistoryEvent {
    /// Whether this event moved `step` into `state`.
    pub fn step_entered(&self, step: &str, state: StepState) -> bool {
        self.step.as_deref() == Some(step) && self.to == Some(EntityState::Step(state))
    }

    /// Whether this event is `kind` on `step`.
    pub fn is(&self, kind: &HistoryKind, step: &str) -> bool {
        &self.kind == kind && self.step.as_deref() == Some(step)
    }
}

impl std::fmt::Display for HistoryEvent {
    /// One line: time, kind, subject, states, attempt, actor and detail.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.at.format("%H:%M:%S%.3f"), self.kind)?;
        if let Some(step) = &self.step {
            write!(f, " {step}")?;
        }
        match (self.from, self.to) {
            (Some(from), Some(to)) => write!(f, " {from} -> {to}")?,
            (None, Some(to)) => write!(f, " -> {to}")?,
            _ => {}
        }
        if let Some(a) = self.attempt {
            write!(f, " attempt {a}")?;
        }
        write!(f, " by {}", self.actor)?;
        if let Some(d) = &self.detail {
            write!(f, " {d}")?;
        }
        Ok(())
    }
}

/// The stored columns of one history row.
#[derive(Debug, Clone, sea_orm::FromQueryResult)]
pub(crate) struct HistoryColumns {
    pub(crate) id: i64,
    pub(crate) step: Option<String>,
    pub(crate) event: String,
    pub(crate) from_state: Option<String>,
    pub(crate) to_state: Option<String>,
    pub(crate) attempt: Option<i32>,
    pub(crate) actor: String,
    pub(crate) detail: Option<String>,
    pub(crate) at: i64,
}

impl TryFrom<HistoryColumns> for HistoryEvent {
    type Error = Error;

    fn try_from(c: HistoryColumns) -> Result<Self> {
        const T: &str = "sagaflow_history";
        let on_step = c.step.is_some();
        let state = |column: &str, v: Option<String>| -> Result<Option<EntityState>> {
            let Some(v) = v else { return Ok(None) };
            let parsed = if on_step {
                v.parse().ok().map(EntityState::Step)
            } else {
                v.parse().ok().map(EntityState::Run)
            };
            parsed.map(Some).ok_or_else(|| {
                Error::corrupt(
                    T,
                    c.id.to_string(),
                    format!("column `{column}` holds `{v}`, which is not a state"),
                )
            })
        };
        // Details are JSON envelopes; older rows may hold a plain note.
        let detail = c
            .detail
            .map(|d| serde_json::from_str(&d).unwrap_or(Value::String(d)));
        Ok(Self {
            from: state("from_state", c.from_state)?,
            to: state("to_state", c.to_state)?,
            id: c.id,
            step: c.step,
            kind: c
                .event
                .parse()
                .unwrap_or_else(|_| HistoryKind::Other(c.event.clone())),
            attempt: c.attempt,
            actor: c.actor,
            detail,
            at: timestamp(c.at),
        })
    }
}

/// What an alert is about.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, strum::EnumString, strum::AsRefStr, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AlertKind {
    /// A run stopped in `Error`: a compensation failed, a step failed after the pivot, a
    /// retriable step failed for good, or the pivot may have taken effect.
    RunError,
    /// A step was interrupted more often than its cap allows (it may crash its process).
    PoisonStep,
    /// Runs of a workflow version no engine instance registers are waiting.
    UnknownVersion,
    /// A row could not be decoded; its run is set aside until an operator repairs it.
    CorruptRow,
    /// No supervisor has completed a sweep for too long.
    SupervisorStalled,
    /// A kind this version does not know (raised by a newer one).
    #[strum(default)]
    Other(String),
}

/// An operator alert, stored before it is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Alert {
    /// Alert id.
    pub id: i64,
    /// The run concerned, if any.
    pub run_id: Option<Uuid>,
    /// The step concerned, if any.
    pub step: Option<String>,
    /// What it is about.
    pub kind: AlertKind,
    /// What happened, in words.
    pub reason: String,
    /// Attempts the step made in the phase that failed (forward or compensation); 0 when the
    /// alert names no step.
    pub attempts: i32,
    /// What the operator can do.
    pub actions: Vec<String>,
    /// When it was raised (database clock).
    pub created_at: Timestamp,
    /// When it was resolved.
    pub resolved_at: Option<Timestamp>,
}

/// How many retained runs are in each state (a monitoring snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunCounts(std::collections::BTreeMap<RunState, u64>);

impl RunCounts {
    /// Runs in `state`.
    pub fn get(&self, state: RunState) -> u64 {
        self.0.get(&state).copied().unwrap_or(0)
    }

    /// Every retained run.
    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The states with at least one run, with their counts.
    pub fn iter(&self) -> impl Iterator<Item = (RunState, u64)> + '_ {
        self.0.iter().map(|(s, n)| (*s, *n))
    }
}

impl FromIterator<(RunState, u64)> for RunCounts {
    fn from_iter<I: IntoIterator<Item = (RunState, u64)>>(iter: I) -> Self {
        let mut m = std::collections::BTreeMap::new();
        for (s, n) in iter {
            *m.entry(s).or_insert(0) += n;
        }
        Self(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_unknown_names_are_kept() {
        assert_eq!(
            "operator_retry_step".parse::<HistoryKind>().ok(),
            Some(HistoryKind::OperatorRetryStep)
        );
        assert_eq!(HistoryKind::SetAside.as_ref(), "set_aside");
        assert_eq!(
            "from_the_future".parse::<AlertKind>().ok(),
            Some(AlertKind::Other("from_the_future".into()))
        );
        assert_eq!(
            AlertKind::SupervisorStalled.to_string(),
            "supervisor_stalled"
        );
    }

    #[test]
    fn history_states_follow_the_subject() {
        let row = |step: Option<&str>, to: &str| HistoryColumns {
            id: 1,
            step: step.map(Into::into),
            event: "state".into(),
            from_state: None,
            to_state: Some(to.into()),
            attempt: None,
            actor: "a".into(),
            detail: Some("not json".into()),
            at: 0,
        };
        let e = HistoryEvent::try_from(row(Some("s"), "compensated")).expect("decodes");
        assert_eq!(e.to, Some(EntityState::Step(StepState::Compensated)));
        assert_eq!(e.detail, Some(Value::String("not json".into())));
        let e = HistoryEvent::try_from(row(None, "compensated")).expect("decodes");
        assert_eq!(e.to, Some(EntityState::Run(RunState::Compensated)));
        assert!(HistoryEvent::try_from(row(None, "not_started")).is_err());
    }

    #[test]
    fn timestamps_saturate() {
        assert_eq!(timestamp(i64::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(timestamp(0).timestamp_millis(), 0);
    }
}
