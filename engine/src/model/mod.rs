//! What the engine shows an application: runs, steps, history events and alerts as typed
//! values — states as enums, payloads as `serde_json::Value`, times as UTC timestamps —
//! decoded from the store's rows at the edge, so no caller parses JSON strings or matches
//! event names.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::{Error, Result, RunState, StepState};

mod alert;
mod history;
mod notice;
mod undo;

pub use alert::{Alert, AlertKind, RESOLVED_BY_ENGINE};
pub(crate) use history::FoldedStates;
pub(crate) use history::HistoryColumns;
pub use history::{EntityState, HistoryEvent, HistoryKind};
pub use notice::{
    Delivery, DeliveryCounts, DeliveryState, Notice, NoticeBody, NoticeTopic, RunFinished,
};
pub use undo::{KeptStep, Undo, UndoOutcome, UndoPreview, UndoStep};

pub(crate) use crate::clock::Timestamp;

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
pub(crate) fn json(
    table: &'static str,
    row: impl ToString,
    column: &str,
    text: &str,
) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| {
        Error::corrupt(
            table,
            row.to_string(),
            format!("column `{column}` is not JSON: {e}"),
        )
    })
}

pub(crate) fn json_opt(
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub created_at: Timestamp,
    /// When it last changed.
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub updated_at: Timestamp,
    /// When it finished (`Completed` or `Compensated`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub finished_at: Option<Timestamp>,
    /// Attempts of its steps (forward and compensation) that ended without success:
    /// failures, timeouts and interruptions.
    pub failed_attempts: i64,
    /// Its claim priority: among due steps, those of runs of higher priority are claimed
    /// first (0 unless the start said otherwise).
    pub priority: i32,
    /// The start it was scheduled for, when it was started later (`StartOptions::start_at`,
    /// `StartOptions::start_after`); `None` for a run started at once. Its first steps were
    /// not claimed before then.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub start_at: Option<Timestamp>,
    /// The run it was restarted from, for a run an operator restarted from a step of
    /// another (`Operator::restart_from`): it reused that run's outputs of the steps before.
    pub restarted_from: Option<Uuid>,
    /// The run it was restarted as, once an operator restarted it from a step: that run now
    /// owns the effects it reused, and operator actions on this one are refused.
    pub restarted_as: Option<Uuid>,
}

/// Attempts of one step, counted per phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub complete_by: Option<Timestamp>,
    /// When it is due, while queued.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub available_at: Option<Timestamp>,
    /// The current length of an attempt's deadline.
    #[cfg_attr(feature = "openapi", schema(value_type = DurationSchema))]
    pub deadline: Duration,
    /// The idempotency key its forward attempts send.
    pub idempotency_key: String,
    /// Its output once completed.
    pub output: Option<Value>,
    /// The error envelope of its last failure.
    pub error: Option<Value>,
    /// The latest progress its attempt in flight reported (`StepContext::progress`): best
    /// effort, the last value written, kept once the step settles.
    pub progress: Option<Value>,
}

impl Step {
    /// The attempts of the phase the step is in: compensation attempts once the run undoes
    /// it, forward attempts before.
    pub fn phase_attempts(&self) -> i32 {
        crate::state::phase_attempts(
            self.state,
            self.attempts.forward,
            self.attempts.compensation,
        )
    }
}

/// A length of time as serde writes a [`Duration`]: whole seconds and the nanoseconds
/// beyond them.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(as = Duration)]
#[allow(dead_code)] // a schema, never built
struct DurationSchema {
    /// Whole seconds.
    secs: u64,
    /// Nanoseconds beyond them.
    nanos: u32,
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
    fn timestamps_saturate() {
        assert_eq!(timestamp(i64::MAX), DateTime::<Utc>::MAX_UTC);
        assert_eq!(timestamp(0).timestamp_millis(), 0);
    }
}
