//! Rows read from the store, decoded with typed errors (a corrupt row is an error, not a
//! panic). The row types are nouns of the bottom layer (`crate::rows`); their decoding, the
//! column lists and the errors that name a corrupt column live here.

use sea_orm::DbErr;

use super::row::{FromRow, Row, from_row};
use uuid::Uuid;

use crate::model::HistoryColumns;
pub use crate::rows::{ClaimedStep, Damage, ExpiredStep, RunRow, RunView, StepRow, quote};
use crate::state::{Counters, phase_attempts};
use crate::{Error, Result, StepState};

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

/// The states a run ends in for good ([`crate::RunState::is_final`]), as an SQL list.
pub(super) const FINAL_RUN_STATES: &str = "('completed', 'compensated')";

/// The columns a [`RunView`] reads beside [`RUN_COLS`].
pub(super) const RUN_VIEW_COLS: &str = "priority, start_at, restarted_from, restarted_as";

/// The queueing columns of a run.
struct Queueing {
    priority: i32,
    start_at: Option<i64>,
    restarted_from: Option<Uuid>,
    restarted_as: Option<Uuid>,
}

from_row!(Queueing {
    priority,
    start_at,
    restarted_from,
    restarted_as,
});

impl RunView {
    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: Uuid = r.try_get("", "id")?;
        let run = decode_row("sagaflow_runs", id, r)?;
        let q: Queueing = decode_row("sagaflow_runs", id, r)?;
        Ok(Self {
            run,
            priority: q.priority,
            start_at: q.start_at,
            restarted_from: q.restarted_from,
            restarted_as: q.restarted_as,
        })
    }
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
    progress,
});

pub(super) const STEP_COLS: &str = "id, run_id, name, state, locked_by, complete_by, available_at, attempt, \
     forward_attempts, compensation_attempts, failure_count, max_failures, interruptions, max_interruptions, maybe_applied, deadline_ms, \
     idempotency_key, output, error, progress";

impl StepRow {
    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: i64 = r.try_get("", "id")?;
        decode_row("sagaflow_steps", id, r)
    }
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
    pub(super) fn decode(r: &Row) -> Result<Self> {
        let id: i64 = r.try_get("", "id")?;
        decode_row("sagaflow_steps", id, r)
    }
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
    then_states,
});

#[cfg(test)]
mod tests {
    use super::FINAL_RUN_STATES;
    use crate::RunState;

    #[test]
    fn the_sql_list_of_final_run_states_is_the_enums() {
        let finals: Vec<String> = RunState::ALL
            .iter()
            .filter(|s| s.is_final())
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        assert_eq!(FINAL_RUN_STATES, format!("({})", finals.join(", ")));
    }
}
