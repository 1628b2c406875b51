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
    /// An operator rolled the run back to a step (the detail has the step as `step`): the
    /// steps after it are undone, then run again.
    OperatorRollback,
    /// An operator restarted a new run from a step of this one (the detail has the new run
    /// as `as` and the step as `step`); the new run owns the effects it reused.
    OperatorRestart,
    /// The run was restarted from a step of another (the detail has that run as `from`, the
    /// step as `step`, and the steps it took over as completed as `reused`).
    RestartedFrom,
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
    /// The stored row's sequence number (increasing within a database). The state changes
    /// one unit of work decided together with an event are stored in that event's row and
    /// share its id; a run's history is in id order.
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
    /// The state changes folded into this row ([`FoldedStates`]), as stored.
    pub(crate) then_states: Option<String>,
}

/// The state changes a history row carries after its own event (the column `then_states`):
/// changes decided in the same unit of work, by the same actor, that have no attempt and no
/// detail of their own, such as the successors a completion made ready and the run's move to
/// `running` or `completed`. Each is a `[step, from, to]` triple, `step` being `None` for the
/// run; stored as that JSON array. Reading the row gives each back as a `state` event of its
/// own, after the row's event, at its time and with its id, so a saga writes one history row
/// per attempt instead of one per transition and its history reads the same.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub(crate) struct FoldedStates(pub(crate) Vec<(Option<String>, Option<String>, Option<String>)>);

impl FoldedStates {
    /// Reads the column.
    ///
    /// # Errors
    /// When the text is not such an array.
    pub(crate) fn parse(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }

    /// The column's text; `None` when there is nothing folded.
    pub(crate) fn to_column(&self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        // A vector of strings and nulls always serializes.
        serde_json::to_string(self).ok()
    }
}

impl HistoryColumns {
    /// The events the row holds: its own, then each state change folded into it.
    ///
    /// # Errors
    /// [`Error::CorruptRow`] when a state or the folded column does not decode.
    pub(crate) fn into_events(mut self) -> Result<Vec<HistoryEvent>> {
        let Some(text) = self.then_states.take() else {
            return Ok(vec![self.try_into()?]);
        };
        let folded = FoldedStates::parse(&text).map_err(|e| {
            Error::corrupt(
                "sagaflow_history",
                self.id.to_string(),
                format!("column `then_states` does not decode: {e}"),
            )
        })?;
        let mut out = Vec::with_capacity(1 + folded.0.len());
        for (step, from_state, to_state) in folded.0 {
            let next = Self {
                id: self.id,
                step,
                event: HistoryKind::State.as_ref().to_owned(),
                from_state,
                to_state,
                attempt: None,
                actor: self.actor.clone(),
                detail: None,
                at: self.at,
                then_states: None,
            };
            out.push(next.try_into()?);
        }
        out.insert(0, self.try_into()?);
        Ok(out)
    }
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
            then_states: None,
        };
        let e = HistoryEvent::try_from(row(Some("s"), "compensated")).expect("decodes");
        assert_eq!(e.to, Some(EntityState::Step(StepState::Compensated)));
        assert_eq!(e.detail, Some(Value::String("not json".into())));
        let e = HistoryEvent::try_from(row(None, "compensated")).expect("decodes");
        assert_eq!(e.to, Some(EntityState::Run(RunState::Compensated)));
        assert!(HistoryEvent::try_from(row(None, "not_started")).is_err());
    }

    #[test]
    fn a_row_gives_back_the_state_changes_folded_into_it_in_order() {
        let folded = FoldedStates(vec![
            (
                Some("charge".into()),
                Some("not_started".into()),
                Some("ready".into()),
            ),
            (None, Some("pending".into()), Some("running".into())),
        ]);
        let text = folded.to_column().expect("something folded");
        assert_eq!(
            text,
            r#"[["charge","not_started","ready"],[null,"pending","running"]]"#
        );
        let row = HistoryColumns {
            id: 7,
            step: Some("reserve".into()),
            event: "completed".into(),
            from_state: Some("running".into()),
            to_state: Some("completed".into()),
            attempt: Some(1),
            actor: "i1".into(),
            detail: None,
            at: 5,
            then_states: Some(text),
        };
        let events = row.into_events().expect("decodes");
        let seen: Vec<_> = events
            .iter()
            .map(|e| {
                (
                    e.id,
                    e.kind.clone(),
                    e.step.as_deref(),
                    e.to,
                    e.attempt,
                    e.actor.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    7,
                    HistoryKind::Completed,
                    Some("reserve"),
                    Some(EntityState::Step(StepState::Completed)),
                    Some(1),
                    "i1"
                ),
                (
                    7,
                    HistoryKind::State,
                    Some("charge"),
                    Some(EntityState::Step(StepState::Ready)),
                    None,
                    "i1"
                ),
                (
                    7,
                    HistoryKind::State,
                    None,
                    Some(EntityState::Run(RunState::Running)),
                    None,
                    "i1"
                ),
            ]
        );
        assert!(events.iter().all(|e| e.at == events[0].at));
        assert_eq!(FoldedStates::default().to_column(), None);
        let mut bad = row_with_folded("[1]");
        assert!(
            bad.clone().into_events().is_err(),
            "a column that does not decode is damage"
        );
        bad.then_states = Some(r#"[[null,"pending","not_a_state"]]"#.into());
        assert!(
            bad.into_events().is_err(),
            "so is a folded state that is no state"
        );
    }

    fn row_with_folded(text: &str) -> HistoryColumns {
        HistoryColumns {
            id: 1,
            step: None,
            event: "submitted".into(),
            from_state: None,
            to_state: Some("pending".into()),
            attempt: None,
            actor: "api".into(),
            detail: None,
            at: 0,
            then_states: Some(text.into()),
        }
    }
}
