//! A run's history as applications read it: what happened (`HistoryKind`), to which state
//! of a run or a step (`EntityState`), by whom and when, decoded from the stored columns.

use serde::Serialize;
use serde_json::Value;

use super::{Timestamp, timestamp};
use crate::{Error, Result, RunState, StepState};

/// What a history event records.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, Serialize, strum::EnumString, strum::AsRefStr, strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// The remote asked to be called again later and applied nothing: the step is queued
    /// again after the delay, no failure counted (the detail's `retry_after_ms`).
    Deferred,
    /// An attempt ran past its deadline (the supervisor re-queued or failed the step).
    Timeout,
    /// An attempt was lost with its engine instance.
    Interrupted,
    /// A damaged row set the run aside for an operator.
    SetAside,
    /// An operator retried a step or its compensation (`operator_retry_step` before 0.2).
    #[strum(to_string = "operator_retry", serialize = "operator_retry_step")]
    OperatorRetry,
    /// An operator asked for compensation.
    OperatorCompensate,
    /// An operator cancelled the run.
    OperatorCancel,
    /// An operator extended the deadlines of the run's attempts in flight.
    OperatorExtend,
    /// An operator paused the run.
    OperatorPause,
    /// An operator resumed a run in `Error` or `Paused`.
    OperatorResume,
    /// An operator marked a step compensated by hand.
    OperatorMarkCompensated,
    /// An operator released a set-aside run.
    OperatorRelease,
    /// An attempt parked its step: it waits for a timer, an event, a callback or a child run
    /// (the detail says which and for how long).
    Parked,
    /// A waiting step was woken: what it waited for arrived, or its time came.
    Woken,
    /// An event (or a callback) was sent to the run; the detail says whether a waiting step
    /// took it or it was kept.
    EventReceived,
    /// The run was started as a child of a step of another run (the detail names both).
    ChildStarted,
    /// The parent of this completed child run compensates it.
    ParentCompensates,
    /// An operator replaced the run's input (the detail keeps the old one and the new one)
    /// and resumed it.
    OperatorReplaceInput,
    /// The run moved to another version of its workflow (the detail has `from`, `to` and the
    /// steps that changed).
    Migrated,
    /// An event this version does not know (written by a newer one).
    #[strum(default)]
    Other(String),
}

/// A state named in a history event: a run's or a step's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "of", content = "state", rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub at: Timestamp,
}

impl HistoryEvent {
    /// Whether this event moved `step` into `state`.
    pub fn step_entered(&self, step: &str, state: StepState) -> bool {
        self.step.as_deref() == Some(step) && self.to == Some(EntityState::Step(state))
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
#[derive(Debug, Clone)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_unknown_names_are_kept() {
        assert_eq!(
            "operator_retry".parse::<HistoryKind>().ok(),
            Some(HistoryKind::OperatorRetry)
        );
        // The name an older release stored.
        assert_eq!(
            "operator_retry_step".parse::<HistoryKind>().ok(),
            Some(HistoryKind::OperatorRetry)
        );
        assert_eq!(HistoryKind::OperatorRetry.as_ref(), "operator_retry");
        assert_eq!(
            serde_json::to_value(HistoryKind::OperatorRetry).ok(),
            Some(Value::from("operator_retry"))
        );
        assert_eq!(HistoryKind::SetAside.as_ref(), "set_aside");
        assert_eq!(
            "from_the_future".parse::<HistoryKind>().ok(),
            Some(HistoryKind::Other("from_the_future".into()))
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
}
