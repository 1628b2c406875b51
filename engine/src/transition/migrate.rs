//! Migrating a run to another version of its workflow, decided: which states, outputs and
//! input the run has under the new version, or why it is refused. Pure, like the rest of the
//! transition module; [`crate::migration`] reads the run under its lock and the store writes
//! what is decided here.
//!
//! A run migrates only at rest: none of its attempts in flight (a `running` or
//! `compensating` step) and not finished. Its run state does not change; the evaluation the
//! migration asks for moves it on (queueing the new steps whose dependencies completed).

use std::collections::BTreeMap;

use serde_json::Value;

use super::writes::{MigrationWrite, NewStep, StepInsert, StepUpdate};
use crate::definition::migration::{
    MigratingRun, MigratingStep, MigrationRefusal, StepMigration, Versions,
};
use crate::rows::{RunRow, StepRow};
use crate::{RunState, StepState, workflow_key};

/// What migrating a run decides: the run as it will be, and what changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The run under the new version.
    pub target: MigratingRun,
    /// Each step, before and after, in the new version's order, then the dropped steps.
    pub changes: Vec<StepMigration>,
    /// Whether the input changes.
    pub input_changed: bool,
}

fn refuse(reason: impl Into<String>) -> MigrationRefusal {
    MigrationRefusal::new(reason)
}

/// Stored JSON text as a value, or why it is not JSON.
fn json(what: &str, text: &str) -> Result<Value, MigrationRefusal> {
    serde_json::from_str(text).map_err(|e| refuse(format!("{what} is not JSON ({e})")))
}

/// Whether a step in `state` went forward (it needs its dependencies completed).
fn went_forward(state: StepState) -> bool {
    !matches!(state, StepState::NotStarted | StepState::Skipped) && !state.is_compensation()
}

/// Decides how `run` (with its step rows) becomes a run of the new version: the default
/// mapping by step name, then the migration's closure, then the checks.
///
/// # Errors
/// A [`MigrationRefusal`] saying why the run stays: it is finished, an attempt is in flight,
/// the closure refused it, a step the new version dropped was not accounted for, a step
/// went forward without its new dependencies, or the input does not fit the new version.
pub fn decide(
    v: Versions<'_>,
    run: &RunRow,
    steps: &[StepRow],
) -> Result<Decided, MigrationRefusal> {
    let to = v.migration.to();
    if run.state.is_final() {
        return Err(refuse(format!(
            "the run is {}: nothing to migrate",
            run.state
        )));
    }
    if let Some(s) = steps.iter().find(|s| s.state.is_in_flight()) {
        return Err(refuse(format!(
            "step `{}` has an attempt in flight ({}); try again when it settles",
            s.name, s.state
        )));
    }
    let input = json("the run's input", &run.input)?;
    let mut before: BTreeMap<&str, (StepState, Option<Value>)> = BTreeMap::new();
    let mut target = MigratingRun {
        id: run.id,
        state: run.state,
        input: input.clone(),
        steps: BTreeMap::new(),
    };
    for s in steps {
        let output = match &s.output {
            Some(o) => Some(json(&format!("the output of step `{}`", s.name), o)?),
            None => None,
        };
        before.insert(&s.name, (s.state, output.clone()));
        target.steps.insert(
            s.name.clone(),
            MigratingStep {
                state: s.state,
                output,
                row: Some(s.id),
            },
        );
    }
    let fresh = || MigratingStep {
        state: StepState::NotStarted,
        output: None,
        row: None,
    };
    for st in v.new.steps() {
        target
            .steps
            .entry(st.name().to_owned())
            .or_insert_with(fresh);
    }
    if let Some(map) = v.migration.mapping() {
        map(&mut target)?;
    }
    for (name, s) in &target.steps {
        if v.new.step(name).is_none()
            && !matches!(s.state, StepState::NotStarted | StepState::Skipped)
        {
            return Err(refuse(format!(
                "step `{name}` is {}, and version {to} has no such step: the mapping must account for it",
                s.state
            )));
        }
    }
    target.steps.retain(|name, _| v.new.step(name).is_some());
    // `skipped` means "dropped while the run unwinds". A run going forward completes only
    // when every step completed, and its resume would read a skipped step as a sign that it
    // was unwinding: a forward run with a skipped step could never end.
    let unwinding = run.state == RunState::Compensating
        || steps
            .iter()
            .any(|s| s.state.is_compensation() || s.state == StepState::Skipped);
    if !unwinding
        && let Some((name, _)) = target
            .steps
            .iter()
            .find(|(_, s)| s.state == StepState::Skipped)
    {
        return Err(refuse(format!(
            "step `{name}` is skipped, but the run is going forward and completes only when \
             every step completed: map it to completed (with its output) or not_started"
        )));
    }
    for st in v.new.steps() {
        target
            .steps
            .entry(st.name().to_owned())
            .or_insert_with(fresh);
    }
    for (i, st) in v.new.steps().iter().enumerate() {
        let state = target.steps[st.name()].state;
        if !went_forward(state) {
            continue;
        }
        for dep in v.new.deps_of(i) {
            let dep_state = target.steps[dep].state;
            if dep_state != StepState::Completed {
                return Err(refuse(format!(
                    "step `{}` is {state}, but its dependency `{dep}` in version {to} is {dep_state}",
                    st.name()
                )));
            }
        }
    }
    v.new
        .check_input(&target.input)
        .map_err(|e| refuse(format!("the input does not fit version {to}: {e}")))?;

    let mut changes: Vec<StepMigration> = v
        .new
        .steps()
        .iter()
        .map(|st| {
            let after = &target.steps[st.name()];
            let was = before.get(st.name());
            StepMigration {
                step: st.name().to_owned(),
                before: was.map(|b| b.0),
                after: Some(after.state),
                output_changed: was.map_or(after.output.is_some(), |b| b.1 != after.output),
            }
        })
        .collect();
    changes.extend(
        before
            .iter()
            .filter(|(name, _)| v.new.step(name).is_none())
            .map(|(name, b)| StepMigration {
                step: (*name).to_owned(),
                before: Some(b.0),
                after: None,
                output_changed: b.1.is_some(),
            }),
    );
    Ok(Decided {
        input_changed: target.input != input,
        target,
        changes,
    })
}

/// The rows a decided migration writes: the run re-pinned, its kept steps rewritten, its
/// dropped steps deleted, its new steps inserted with the new version's settings.
pub fn step_rows(v: Versions<'_>, run: &RunRow, steps: &[StepRow], d: &Decided) -> MigrationWrite {
    let key = workflow_key(v.migration.name(), v.migration.to());
    let text = |o: &Option<Value>| o.as_ref().map(Value::to_string);
    let mut update = Vec::new();
    let mut insert = Vec::new();
    for st in v.new.steps() {
        let s = &d.target.steps[st.name()];
        match s.row.and_then(|id| steps.iter().find(|r| r.id == id)) {
            Some(row) => update.push(StepUpdate {
                id: row.id,
                from: row.state,
                attempt: row.attempt,
                state: s.state,
                output: text(&s.output),
            }),
            None => {
                let ms = |t: std::time::Duration| i64::try_from(t.as_millis()).unwrap_or(i64::MAX);
                let settings = st.settings();
                insert.push(StepInsert {
                    state: s.state,
                    output: text(&s.output),
                    step: NewStep {
                        name: st.name().to_owned(),
                        max_failures: settings.retry.max_failures_stored(),
                        max_interruptions: settings.retry.max_interruptions_stored(),
                        deadline_ms: ms(settings.deadline.initial),
                        deadline_cap_ms: ms(settings.deadline.cap),
                        idempotency_key: format!("{}:{}", run.id, st.name()),
                        ready: false,
                        resource: st.resource().map(str::to_owned),
                    },
                });
            }
        }
    }
    let kept: Vec<i64> = update.iter().map(|u| u.id).collect();
    MigrationWrite {
        run_id: run.id,
        version: v.migration.to(),
        workflow_key: key,
        input: d.input_changed.then(|| d.target.input.to_string()),
        update,
        delete: steps
            .iter()
            .filter(|s| !kept.contains(&s.id))
            .map(|s| (s.id, s.state, s.attempt))
            .collect(),
        insert,
    }
}
