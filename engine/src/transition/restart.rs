//! Restart from a step (an operator's): which steps of a stopped or finished run a new run
//! takes over as done, and when a restart is refused. Pure: the operator's unit of work
//! (`crate::operator::restart`) reads the source under its lock and writes what this decides.
//!
//! The new run reuses the steps the named step depends on, directly or not (its ancestors):
//! each is stored completed with the source's output and idempotency key, so that the new
//! run's compensation of it undoes the one effect the source applied, under the key the
//! remote service saw. Every other step runs again, under the new run's keys. What the
//! source still holds of those effects is the new run's from then on: the source is linked to
//! it and takes no operator action again.

use std::collections::BTreeSet;

use uuid::Uuid;

use crate::definition::Workflow;
use crate::rows::{RunRow, StepRow};
use crate::wait::StepWait;
use crate::{Error, Result, RunState, StepState};

/// The action's name in its refusals.
pub const RESTART: &str = "restart";

/// A step of the source that the new run takes over as completed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reused {
    /// Step name.
    pub name: String,
    /// Its output JSON in the source.
    pub output: Option<String>,
    /// The idempotency key its effect was applied under.
    pub idempotency_key: String,
}

/// The source run of a restart as its unit of work read it.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The run.
    pub run: &'a RunRow,
    /// The run it was already restarted as, if any.
    pub restarted_as: Option<Uuid>,
    /// Its step rows: those of a run in `error` (a finished run's left the table).
    pub steps: &'a [StepRow],
    /// For a finished run, the keys its steps were last given by a rollback (from its
    /// history, [`rekeyed`]); the others kept `<run>:<step>`.
    pub keys: &'a std::collections::HashMap<String, String>,
}

/// The idempotency keys a run's rollbacks gave its steps, the latest of each, from its
/// history (the detail of each `rolled_back` transition).
pub fn rekeyed(history: &[crate::HistoryEvent]) -> std::collections::HashMap<String, String> {
    let mut keys = std::collections::HashMap::new();
    for e in history {
        let Some(given) = e
            .detail
            .as_ref()
            .and_then(|d| d.get(super::ROLLED_BACK_KEYS))
            .and_then(|k| k.as_object())
        else {
            continue;
        };
        for (step, key) in given {
            if let Some(key) = key.as_str() {
                keys.insert(step.clone(), key.to_owned());
            }
        }
    }
    keys
}

fn refuse(run: &RunRow, reason: impl Into<String>) -> Error {
    Error::ActionNotAllowed {
        action: RESTART,
        run_id: run.id,
        reason: reason.into(),
    }
}

/// The steps a restart of `source` from step `from` of `wf` (the source's version) reuses,
/// in the workflow's order.
///
/// # Errors
/// [`Error::ActionNotAllowed`] naming the reason: the run is not in `error`, `compensated`
/// or `completed`; it is a child run (its parent restarts it); it was restarted already;
/// the workflow has no such step; a step it depends on is not completed in the source (an
/// undone or failed step has no effect to reuse; a compensated run kept no outputs), or
/// started a child run (which stays the source's). [`Error::CorruptRow`] when a completed
/// run's output is not an object of step outputs.
pub fn restart(wf: &Workflow, source: Source<'_>, from: &str) -> Result<Vec<Reused>> {
    let run = source.run;
    if !matches!(
        run.state,
        RunState::Error | RunState::Compensated | RunState::Completed
    ) {
        return Err(refuse(
            run,
            format!(
                "the run is {}: only a run in error, compensated or completed is restarted \
                 (cancel it, or wait for it to finish)",
                run.state
            ),
        ));
    }
    if run.parent_step.is_some() {
        return Err(refuse(
            run,
            "it is a child run: restart its parent run from the step that started it",
        ));
    }
    if let Some(newer) = source.restarted_as {
        return Err(refuse(
            run,
            format!("it was restarted already, as run {newer}: restart that run instead"),
        ));
    }
    let Some(at) = wf.position(from) else {
        return Err(refuse(
            run,
            format!("workflow {} has no step `{from}`", wf.key()),
        ));
    };
    let ancestors = ancestors(wf, at);
    let outputs = match run.state {
        RunState::Completed => Some(completed_outputs(run)?),
        _ => None,
    };
    let mut out = Vec::with_capacity(ancestors.len());
    for i in ancestors {
        let def = &wf.steps[i];
        let name = def.name.as_str();
        if matches!(def.wait, Some(StepWait::Child { .. })) {
            return Err(refuse(
                run,
                format!(
                    "step `{name}`, which `{from}` depends on, started a child run that stays \
                     linked to this run: restart from `{name}` or a step before it"
                ),
            ));
        }
        let reused = match (&outputs, run.state) {
            (Some(outputs), _) => Reused {
                name: name.to_owned(),
                output: outputs.get(name).map(ToString::to_string),
                // A completed run's step rows are gone; its keys are the ones it was given.
                idempotency_key: source
                    .keys
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| format!("{}:{name}", run.id)),
            },
            (None, RunState::Compensated) => {
                return Err(refuse(
                    run,
                    format!(
                        "a compensated run undid what it did and kept no step outputs, and \
                         `{from}` depends on `{name}`: restart it from a step with no \
                         dependencies"
                    ),
                ));
            }
            (None, _) => {
                let row = source.steps.iter().find(|s| s.name == name);
                match row {
                    Some(s) if s.state == StepState::Completed => Reused {
                        name: name.to_owned(),
                        output: s.output.clone(),
                        idempotency_key: s.idempotency_key.clone(),
                    },
                    other => {
                        let state = other.map_or("missing".to_owned(), |s| s.state.to_string());
                        return Err(refuse(
                            run,
                            format!(
                                "step `{name}`, which `{from}` depends on, is {state} in this \
                                 run, not completed: restart from `{name}` or a step before it"
                            ),
                        ));
                    }
                }
            }
        };
        out.push(reused);
    }
    Ok(out)
}

/// The steps step `at` depends on, directly or not, in the workflow's order.
pub(crate) fn ancestors(wf: &Workflow, at: usize) -> BTreeSet<usize> {
    let mut found = BTreeSet::new();
    let mut todo: Vec<usize> = wf.steps[at].deps.clone();
    while let Some(i) = todo.pop() {
        if found.insert(i) {
            todo.extend(&wf.steps[i].deps);
        }
    }
    found
}

/// A completed run's output: each step's output under its name.
fn completed_outputs(run: &RunRow) -> Result<serde_json::Map<String, serde_json::Value>> {
    let text = run.output.as_deref().unwrap_or("{}");
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(Error::corrupt(
            "sagaflow_runs",
            run.id,
            "the output of a completed run is not an object of step outputs",
        )),
    }
}
