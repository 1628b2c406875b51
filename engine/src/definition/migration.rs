//! Migrations as definitions: how runs of a workflow move from one registered version to
//! another (a [`Migration`] with its optional mapping closure), the run a mapping rewrites
//! ([`MigratingRun`]), and the plan and report the use case answers with. Nouns: the use
//! case that reads, decides (through the transitions) and writes is the engine's
//! `migration` module.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::{Registry, Workflow};
use crate::{Error, Result, RunState, StepState};

/// Why a mapping closure refuses a run: the run stays on its version, and the plan shows
/// the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MigrationRefusal(String);

impl MigrationRefusal {
    /// A refusal, in words for the operator.
    pub fn new(reason: impl Into<String>) -> Self {
        Self(reason.into())
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

/// A mapping closure: rewrites a [`MigratingRun`], or refuses it.
pub type MapFn =
    dyn Fn(&mut MigratingRun) -> std::result::Result<(), MigrationRefusal> + Send + Sync;

/// How runs of workflow `name` move from version `from` to version `to`.
#[derive(Clone)]
pub struct Migration {
    name: String,
    from: i32,
    to: i32,
    map: Option<Arc<MapFn>>,
    automatic: bool,
}

impl fmt::Debug for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Migration")
            .field("name", &self.name)
            .field("from", &self.from)
            .field("to", &self.to)
            .field("mapped", &self.map.is_some())
            .field("automatic", &self.automatic)
            .finish()
    }
}

impl Migration {
    /// The migration of workflow `name` from version `from` to version `to`, with the
    /// default mapping by step name.
    pub fn new(name: impl Into<String>, from: i32, to: i32) -> Self {
        Self {
            name: name.into(),
            from,
            to,
            map: None,
            automatic: false,
        }
    }

    /// Applies the migration without an operator: the supervisor leader's engine migrates
    /// the unfinished runs of the old version at every timer pass (recorded as done by
    /// `engine:<instance>`), each as an operator's `migrate` would; a run that cannot be
    /// migrated yet (an attempt in flight) is tried again at the next pass, one the mapping
    /// refuses stays on its version. Off by default: an operator applies a migration after
    /// reading its dry run.
    #[must_use]
    pub fn automatic(mut self) -> Self {
        self.automatic = true;
        self
    }

    /// Whether engines apply it without an operator ([`Migration::automatic`]).
    pub fn is_automatic(&self) -> bool {
        self.automatic
    }

    /// Adds a mapping closure, called for each run after the default mapping: it may rewrite
    /// the input, set a step's state and output, rename a step's output, or account for a
    /// step the new version dropped; returning a [`MigrationRefusal`] leaves the run as it
    /// is.
    #[must_use]
    pub fn map<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut MigratingRun) -> std::result::Result<(), MigrationRefusal>
            + Send
            + Sync
            + 'static,
    {
        self.map = Some(Arc::new(f));
        self
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version runs leave.
    pub fn from(&self) -> i32 {
        self.from
    }

    /// The version runs move to.
    pub fn to(&self) -> i32 {
        self.to
    }

    /// Its mapping closure, if it has one.
    pub(crate) fn mapping(&self) -> Option<&MapFn> {
        self.map.as_deref()
    }

    /// Checks that both versions are registered and differ.
    ///
    /// # Errors
    /// [`Error::Config`] naming the problem.
    pub fn check(&self, registry: &Registry) -> Result<()> {
        let label = format!(
            "migration of `{}` from {} to {}",
            self.name, self.from, self.to
        );
        if self.from == self.to {
            return Err(Error::Config(format!(
                "{label}: the two versions are the same"
            )));
        }
        for v in [self.from, self.to] {
            if registry.get(&self.name, v).is_none() {
                return Err(Error::Config(format!(
                    "{label}: version {v} of `{}` is not registered (register both versions)",
                    self.name
                )));
            }
        }
        Ok(())
    }
}

/// A run being migrated, as the mapping closure sees it: its input and each step's state
/// and output, by name (the steps of the old version, and the steps new in the new version
/// as `not_started`).
#[derive(Debug, Clone, PartialEq)]
pub struct MigratingRun {
    pub(crate) id: Uuid,
    pub(crate) state: RunState,
    pub(crate) input: Value,
    pub(crate) steps: BTreeMap<String, MigratingStep>,
}

/// One step of a [`MigratingRun`].
#[derive(Debug, Clone, PartialEq)]
pub struct MigratingStep {
    pub(crate) state: StepState,
    pub(crate) output: Option<Value>,
    /// Its row, when the run has one (a step of the old version).
    pub(crate) row: Option<i64>,
}

impl MigratingStep {
    /// Its state.
    pub fn state(&self) -> StepState {
        self.state
    }

    /// Its output, once completed.
    pub fn output(&self) -> Option<&Value> {
        self.output.as_ref()
    }

    /// Whether the step is new in the version the run moves to.
    pub fn is_new(&self) -> bool {
        self.row.is_none()
    }
}

impl MigratingRun {
    /// The run's id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The run's state (it does not change).
    pub fn state(&self) -> RunState {
        self.state
    }

    /// The run's input.
    pub fn input(&self) -> &Value {
        &self.input
    }

    /// The run's input, to rewrite.
    pub fn input_mut(&mut self) -> &mut Value {
        &mut self.input
    }

    /// A step by name.
    pub fn step(&self, name: &str) -> Option<&MigratingStep> {
        self.steps.get(name)
    }

    /// The names of its steps.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.steps.keys().map(String::as_str)
    }

    fn step_mut(
        &mut self,
        name: &str,
    ) -> std::result::Result<&mut MigratingStep, MigrationRefusal> {
        self.steps
            .get_mut(name)
            .ok_or_else(|| MigrationRefusal::new(format!("the run has no step `{name}`")))
    }

    /// Sets a step's state: `not_started` (it runs when its dependencies completed),
    /// `completed` (give it an output with [`set_output`](Self::set_output)) or `skipped`
    /// (only in a run that is unwinding: a run going forward with a skipped step is refused).
    ///
    /// # Errors
    /// A [`MigrationRefusal`] for another state or an unknown step.
    pub fn set_state(
        &mut self,
        name: &str,
        state: StepState,
    ) -> std::result::Result<(), MigrationRefusal> {
        if !matches!(
            state,
            StepState::NotStarted | StepState::Completed | StepState::Skipped
        ) {
            return Err(MigrationRefusal::new(format!(
                "a mapping sets a step not_started, completed or skipped, not {state}"
            )));
        }
        let step = self.step_mut(name)?;
        step.state = state;
        if state != StepState::Completed {
            step.output = None;
        }
        Ok(())
    }

    /// Sets a step's output.
    ///
    /// # Errors
    /// A [`MigrationRefusal`] for an unknown step.
    pub fn set_output(
        &mut self,
        name: &str,
        output: Option<Value>,
    ) -> std::result::Result<(), MigrationRefusal> {
        self.step_mut(name)?.output = output;
        Ok(())
    }

    /// Moves the state and output of step `from` (of the old version) to step `to` (of the
    /// new version), and accounts for `from`: a renamed step.
    ///
    /// # Errors
    /// A [`MigrationRefusal`] when either step is unknown.
    pub fn rename(&mut self, from: &str, to: &str) -> std::result::Result<(), MigrationRefusal> {
        let old = self
            .steps
            .remove(from)
            .ok_or_else(|| MigrationRefusal::new(format!("the run has no step `{from}`")))?;
        let new = self.step_mut(to)?;
        new.state = old.state;
        new.output = old.output;
        Ok(())
    }

    /// Accounts for a step the new version no longer has, whatever its state: it is
    /// removed from the run.
    pub fn remove(&mut self, name: &str) -> Option<MigratingStep> {
        self.steps.remove(name)
    }
}

/// What migrating a run does, or did, to one of its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepMigration {
    /// The step.
    pub step: String,
    /// Its state before (`None`: new in the version the run moves to).
    pub before: Option<StepState>,
    /// Its state after (`None`: dropped).
    pub after: Option<StepState>,
    /// Whether its output changes.
    pub output_changed: bool,
}

/// What migrating one run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MigrationOutcome {
    /// The dry run: the run would migrate.
    Migrates,
    /// Applied: the run migrated.
    Migrated,
    /// The run stays on its version (the reason says why).
    Refused,
}

/// One run in a migration plan or report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunMigration {
    /// The run.
    pub run_id: Uuid,
    /// Its state.
    pub state: RunState,
    /// What happens to it.
    pub outcome: MigrationOutcome,
    /// Why it is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Each step, before and after (for a run that migrates).
    pub steps: Vec<StepMigration>,
    /// Whether its input changes.
    pub input_changed: bool,
}

/// The dry run or the report of a migration: every unfinished run of the old version.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MigrationPlan {
    /// The workflow.
    pub workflow: String,
    /// The version runs leave.
    pub from: i32,
    /// The version runs move to.
    pub to: i32,
    /// The runs, oldest first.
    pub runs: Vec<RunMigration>,
    /// Where the next page of a paged dry run starts (pass it as `after`); `None` on the
    /// last page, and in a report of an applied migration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Uuid>,
}

impl MigrationPlan {
    /// How many runs migrate (or would).
    pub fn migrating(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.outcome != MigrationOutcome::Refused)
            .count()
    }

    /// How many runs are refused.
    pub fn refused(&self) -> usize {
        self.runs.len() - self.migrating()
    }
}

/// The two versions a migration moves between, with the migration.
#[derive(Debug, Clone, Copy)]
pub struct Versions<'a> {
    /// The migration.
    pub migration: &'a Migration,
    /// The version runs leave.
    pub old: &'a Workflow,
    /// The version runs move to.
    pub new: &'a Workflow,
}
