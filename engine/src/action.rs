//! The actions an operator takes on a run: one type, one spelling, shared by the Rust API,
//! the HTTP API, the console, the command line, alerts and the run's history.

/// An action an operator takes on a run (SAS-7), each audited with its actor and reason.
///
/// Written in `snake_case` everywhere (`retry`, `mark_compensated`): in the HTTP API's
/// paths and answers, in the console's forms, in the actions an alert lists and, after
/// `operator_`, as the kind of the history event that records it. `retry_step`, the name
/// `retry` had before, still reads as [`Retry`](Self::Retry): the alerts an older release
/// stored list it.
///
/// ```
/// use sagaflow_engine::OperatorAction;
///
/// let action: OperatorAction = "mark_compensated".parse().expect("an action's name");
/// assert_eq!(action, OperatorAction::MarkCompensated);
/// assert!(action.needs_step());
/// assert_eq!("retry_step".parse::<OperatorAction>().ok(), Some(OperatorAction::Retry));
/// assert_eq!(OperatorAction::Retry.to_string(), "retry");
/// ```
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OperatorAction {
    /// Retries a failed step, or its failed compensation, of a run in `Error`. Names the
    /// step.
    #[strum(to_string = "retry", serialize = "retry_step")]
    #[serde(alias = "retry_step")]
    Retry,
    /// Resumes a run in `Error` or `Paused`, retrying the failed steps of its phase.
    Resume,
    /// Compensates a run that is not finished.
    Compensate,
    /// Cancels a run that is not finished: stops its attempts and compensates it.
    Cancel,
    /// Pauses a pending, running or compensating run.
    Pause,
    /// Gives the run's attempts in flight more time. Says by how much.
    Extend,
    /// Releases a run set aside for a damaged row, once the row is repaired.
    Release,
    /// Records that a step's effect was undone by hand after its compensation failed. Names
    /// the step.
    MarkCompensated,
    /// Rolls a run that has not passed its pivot back to a step: the steps after it are
    /// compensated in reverse order, then run again from there. Names the step.
    Rollback,
}

impl OperatorAction {
    /// Every action, in the order they are listed.
    pub const ALL: [OperatorAction; 9] = [
        Self::Retry,
        Self::Resume,
        Self::Compensate,
        Self::Cancel,
        Self::Pause,
        Self::Extend,
        Self::Release,
        Self::MarkCompensated,
        Self::Rollback,
    ];

    /// Its name: `retry`, `resume`, …, `mark_compensated`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether it acts on one step of the run, which the operator names with it.
    pub const fn needs_step(self) -> bool {
        matches!(self, Self::Retry | Self::MarkCompensated | Self::Rollback)
    }

    /// The kind of the history event that records it: `operator_` and its name.
    pub(crate) const fn history_event(self) -> &'static str {
        match self {
            Self::Retry => "operator_retry",
            Self::Resume => "operator_resume",
            Self::Compensate => "operator_compensate",
            Self::Cancel => "operator_cancel",
            Self::Pause => "operator_pause",
            Self::Extend => "operator_extend",
            Self::Release => "operator_release",
            Self::MarkCompensated => "operator_mark_compensated",
            Self::Rollback => "operator_rollback",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OperatorAction;

    #[test]
    fn names_are_stored_and_read_back() {
        let names: Vec<&str> = OperatorAction::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            names,
            [
                "retry",
                "resume",
                "compensate",
                "cancel",
                "pause",
                "extend",
                "release",
                "mark_compensated",
                "rollback"
            ]
        );
        for a in OperatorAction::ALL {
            assert_eq!(a.as_str().parse::<OperatorAction>().ok(), Some(a));
            assert_eq!(a.to_string(), a.as_str());
            let json = serde_json::to_value(a).expect("serializes");
            assert_eq!(json, serde_json::Value::from(a.as_str()));
            assert_eq!(serde_json::from_value::<OperatorAction>(json).ok(), Some(a));
            assert_eq!(a.history_event(), format!("operator_{a}"));
        }
        assert!("explode".parse::<OperatorAction>().is_err());
    }

    #[test]
    fn the_old_name_of_retry_still_reads() {
        assert_eq!(
            "retry_step".parse::<OperatorAction>().ok(),
            Some(OperatorAction::Retry)
        );
        assert_eq!(
            serde_json::from_str::<OperatorAction>(r#""retry_step""#).ok(),
            Some(OperatorAction::Retry)
        );
    }
}
