//! [`Happened`]: what a committed unit of work did, as facts. [`super::StoreTx::commit`]
//! returns it; the use case that committed hands it to `crate::metrics::record`. The store
//! records facts only: which label an attempt's outcome gets, or how long a run took, is the
//! metrics layer's to say.

use std::time::Duration;

use uuid::Uuid;

use super::{EvalApplied, StepFinish};
use crate::RunState;
use crate::transition::Trigger;

/// What one unit of work did, returned by its commit. A unit of work that rolled back
/// returns none, so nothing it did is counted.
#[derive(Debug, Default)]
#[must_use = "hand it to `metrics::record`, or what the unit of work did is not counted"]
pub struct Happened {
    pub(crate) attempts: Vec<AttemptEnded>,
    pub(crate) runs: Vec<RunMoved>,
}

/// A written end of a step attempt.
#[derive(Debug)]
pub(crate) struct AttemptEnded {
    /// `name@version` of the step's workflow.
    pub(crate) workflow_key: String,
    pub(crate) step: String,
    /// What ended the attempt.
    pub(crate) on: Trigger,
    /// The attempt failed and its remote did not act.
    pub(crate) not_applied: bool,
    /// How long the attempt ran, when an agent answered for it.
    pub(crate) elapsed: Option<Duration>,
}

/// A run moved into a final state, or into `Error`.
#[derive(Debug)]
pub(crate) enum RunMoved {
    /// It finished in `state`; `cancelled` when an operator cancelled it. `created_at` is
    /// when it was created (database clock, milliseconds).
    Finished {
        workflow: String,
        state: RunState,
        cancelled: bool,
        created_at: i64,
    },
    /// It entered `Error`.
    Errored { workflow: String },
}

impl Happened {
    /// Records a written attempt end.
    pub(crate) fn attempt(&mut self, finish: &StepFinish) {
        self.attempts.push(AttemptEnded {
            workflow_key: finish.workflow_key.clone(),
            step: finish.name.clone(),
            on: finish.change.on,
            not_applied: finish.error.as_ref().is_some_and(|e| !e.may_have_applied()),
            elapsed: finish.elapsed,
        });
    }

    /// Records a run set aside in `Error` (it was in `phase`).
    pub fn set_aside(&mut self, workflow: &str, phase: RunState) {
        if phase != RunState::Error {
            self.runs.push(RunMoved::Errored {
                workflow: workflow.to_owned(),
            });
        }
    }

    /// Records the runs that applied plans moved into a final state or into `Error`;
    /// `cancelled` names the runs whose plans leave a `cancelled` error envelope.
    pub fn runs_moved(&mut self, applied: &[EvalApplied], cancelled: &[Uuid]) {
        for a in applied.iter().filter(|a| a.state != a.before.state) {
            let workflow = a.before.workflow.clone();
            if a.state.is_final() {
                self.runs.push(RunMoved::Finished {
                    workflow,
                    state: a.state,
                    cancelled: cancelled.contains(&a.before.id),
                    created_at: a.before.created_at,
                });
            } else if a.state == RunState::Error {
                self.runs.push(RunMoved::Errored { workflow });
            }
        }
    }
}
