//! Workflow definitions: named step graphs with optional compensations (SAS-1).
//!
//! A [`Workflow`] is built once at start-up with [`Workflow::builder`]; `build()` checks the
//! graph and names the offending step in its error. A run is pinned to the `(name, version)`
//! that started it.

mod builder;
mod describe;
pub(crate) mod migration;
mod policy;
mod priority;
mod registry;
mod schema;
mod step;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

pub use builder::WorkflowBuilder;
pub use describe::{StepDescription, WorkflowDescription};
pub use policy::millis;
pub use policy::{
    DEADLINE_CAP_DEFAULT, DEADLINE_DEFAULT, DeadlinePolicy, INITIAL_BACKOFF_DEFAULT,
    MAX_BACKOFF_DEFAULT, MAX_DEFERRAL_DELAY_DEFAULT, MAX_DEFERRALS_DEFAULT, MAX_FAILURES_DEFAULT,
    MAX_INTERRUPTIONS_DEFAULT, RetryPolicy, StepSettings,
};
pub use priority::{PRIORITY_MAX, PRIORITY_MIN, RetryLane, check_priority};
pub use registry::Registry;
pub use schema::FieldError;
pub(crate) use step::{AttemptHook, StepServices};
pub use step::{PROGRESS_MAX_BYTES, PROGRESS_MIN_INTERVAL, StepAction, StepContext};

use crate::Error;

/// The saga role of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Can be undone; its compensation (if any) runs when a later step fails.
    Compensatable,
    /// The point of no return: once it completes, the saga only goes forward.
    Pivot,
    /// Follows the pivot: retried until it succeeds, never compensated.
    Retriable,
}

/// How long a run's business key stays taken: while it is taken, starting the workflow with
/// the same key returns the existing run instead of creating another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyPolicy {
    /// Taken while the run is active (not `Completed` or `Compensated`); a finished run's key
    /// may start a new run.
    WhileActive,
    /// Taken for as long as the run is retained, finished or not: a re-submitted order never
    /// runs twice. Purging the run frees the key. The default.
    #[default]
    WhileRetained,
    /// Taken while the run is active or `Completed`; a run that ended `Compensated` (its
    /// business failed and was undone) frees the key for a new attempt.
    AllowAfterFailure,
}

impl KeyPolicy {
    /// Whether a run that just reached the final state `state` frees its key.
    pub fn releases_key(self, state: crate::RunState) -> bool {
        use crate::RunState;
        match self {
            Self::WhileActive => state.is_final(),
            Self::WhileRetained => false,
            Self::AllowAfterFailure => state == RunState::Compensated,
        }
    }
}

/// What a run does when a step fails for good before the point of no return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Undo what was done, in reverse order (the saga's answer). The default.
    #[default]
    Compensate,
    /// Park the run in [`RunState::Paused`](crate::RunState::Paused) with a `run_paused`
    /// alert instead, so that an operator chooses: fix the cause and resume (the failed steps
    /// are retried), or compensate. For sagas whose compensation is costly or visible to
    /// customers (a refund, a cancelled shipment), where a failure is often fixable.
    Pause,
}

impl OnFailure {
    /// The published spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Compensate => "compensate",
            Self::Pause => "pause",
        }
    }
}

/// When a workflow's queue is a backlog worth an operator's attention: the supervisor
/// leader raises one `backlog_growing` alert for the workflow while its due steps number more
/// than `ready_over`, or the oldest of them has waited longer than `oldest_ready_over`, and
/// resolves it once neither holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BacklogAlert {
    /// Due (ready) steps of the workflow's runs above which the backlog is raised.
    pub ready_over: Option<u64>,
    /// Age of the oldest due step above which the backlog is raised.
    pub oldest_ready_over: Option<std::time::Duration>,
}

impl BacklogAlert {
    /// Alerts when more than `n` steps of the workflow are due.
    pub fn ready_over(n: u64) -> Self {
        Self {
            ready_over: Some(n),
            oldest_ready_over: None,
        }
    }

    /// Alerts when a due step of the workflow has waited longer than `age`.
    pub fn oldest_ready_over(age: std::time::Duration) -> Self {
        Self {
            ready_over: None,
            oldest_ready_over: Some(age),
        }
    }

    /// Alerts on either condition.
    #[must_use]
    pub fn and_oldest_ready_over(mut self, age: std::time::Duration) -> Self {
        self.oldest_ready_over = Some(age);
        self
    }

    /// Whether `ready` due steps, the oldest due for `oldest`, are past a threshold; and
    /// which, in words.
    pub fn exceeded(&self, ready: u64, oldest: Option<std::time::Duration>) -> Option<String> {
        if let Some(n) = self.ready_over.filter(|&n| ready > n) {
            return Some(format!(
                "{ready} steps are due, more than the threshold of {n}"
            ));
        }
        match (self.oldest_ready_over, oldest) {
            (Some(limit), Some(age)) if age > limit => Some(format!(
                "the oldest due step has waited {:.1} s, longer than the threshold of {:.1} s",
                age.as_secs_f64(),
                limit.as_secs_f64()
            )),
            _ => None,
        }
    }
}

type InputCheck = Arc<dyn Fn(&serde_json::Value) -> Result<(), String> + Send + Sync>;

/// One step of a built workflow.
#[derive(Clone)]
pub struct StepDef {
    pub(crate) name: String,
    pub(crate) kind: StepKind,
    pub(crate) deps: Vec<usize>,
    pub(crate) dependents: Vec<usize>,
    pub(crate) action: Arc<dyn StepAction>,
    pub(crate) compensation: Option<Arc<dyn StepAction>>,
    pub(crate) settings: StepSettings,
    pub(crate) resource: Option<Arc<str>>,
    /// What the step waits for, when it is one of the engine's waiting steps.
    pub(crate) wait: Option<crate::wait::StepWait>,
}

impl fmt::Debug for StepDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepDef")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("deps", &self.deps)
            .field("compensated", &self.compensation.is_some())
            .field("settings", &self.settings)
            .finish()
    }
}

impl StepDef {
    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The saga role.
    pub fn kind(&self) -> StepKind {
        self.kind
    }
    /// Whether the step depends on no other step (it is queued when the run starts).
    pub fn is_root(&self) -> bool {
        self.deps.is_empty()
    }
    /// The remote resource it calls, whose limits its attempts obey.
    pub fn resource(&self) -> Option<&str> {
        self.resource.as_deref()
    }
    /// What the step waits for, when it is a timer, an event wait or a child step.
    pub fn wait(&self) -> Option<&crate::wait::StepWait> {
        self.wait.as_ref()
    }
    /// Whether the step has a compensation.
    pub fn has_compensation(&self) -> bool {
        self.compensation.is_some()
    }
    /// Its effective settings.
    pub fn settings(&self) -> &StepSettings {
        &self.settings
    }
    /// The action of the forward step.
    pub fn action(&self) -> &Arc<dyn StepAction> {
        &self.action
    }
    /// The compensation action.
    pub fn compensation(&self) -> Option<&Arc<dyn StepAction>> {
        self.compensation.as_ref()
    }
}

/// A validated workflow definition.
#[derive(Clone)]
pub struct Workflow {
    pub(crate) name: String,
    pub(crate) version: i32,
    pub(crate) steps: Vec<StepDef>,
    pub(crate) index: HashMap<String, usize>,
    pub(crate) input_check: Option<InputCheck>,
    pub(crate) input_schema: Option<Arc<serde_json::Value>>,
    pub(crate) key_policy: KeyPolicy,
    pub(crate) on_failure: OnFailure,
    pub(crate) notify_on_finish: bool,
    pub(crate) backlog_alert: Option<BacklogAlert>,
    pub(crate) flow_key: Option<String>,
    pub(crate) priority: i32,
    pub(crate) retry_lane: RetryLane,
    /// Rebuilt from a published description: its steps have no code (see
    /// [`Workflow::from_description`]).
    pub(crate) without_code: bool,
}

impl fmt::Debug for Workflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Workflow {
    /// Starts a definition.
    ///
    /// # Examples
    /// ```
    /// use sagaflow_engine::{StepContext, StepError, Workflow};
    ///
    /// let wf = Workflow::builder("order", 1)
    ///     .step("reserve", |_ctx: StepContext| async { Ok::<_, StepError>("r-1") })
    ///     .compensate(|_ctx: StepContext| async { Ok::<_, StepError>(()) })
    ///     .step("charge", |_ctx: StepContext| async { Ok::<_, StepError>(42) })
    ///     .after(["reserve"])
    ///     .build()
    ///     .expect("valid");
    /// assert_eq!(wf.steps().len(), 2);
    /// ```
    pub fn builder(name: impl Into<String>, version: i32) -> WorkflowBuilder {
        WorkflowBuilder::new(name.into(), version)
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its version.
    pub fn version(&self) -> i32 {
        self.version
    }
    /// `name@version`, the key runs and steps are stored under.
    pub fn key(&self) -> String {
        workflow_key(&self.name, self.version)
    }
    /// How long a run's business key stays taken.
    pub fn key_policy(&self) -> KeyPolicy {
        self.key_policy
    }
    /// What a run does when a step fails for good before the point of no return.
    pub fn on_failure(&self) -> OnFailure {
        self.on_failure
    }
    /// Whether its runs' finishes are notified through the outbox by default.
    pub fn notify_on_finish(&self) -> bool {
        self.notify_on_finish
    }
    /// The claim priority of runs started without one.
    pub fn priority(&self) -> i32 {
        self.priority
    }
    /// Where its retried attempts queue relative to new work of the same priority.
    pub fn retry_lane(&self) -> RetryLane {
        self.retry_lane
    }

    /// The flow key of a run of this workflow with `input`: the value at the workflow's
    /// [`flow_key`](WorkflowBuilder::flow_key) pointer, when it is a string, a number or a
    /// boolean.
    pub fn flow_key_of(&self, input: &serde_json::Value) -> Option<String> {
        match input.pointer(self.flow_key.as_deref()?)? {
            serde_json::Value::String(s) => Some(s.clone()),
            v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => Some(v.to_string()),
            _ => None,
        }
    }

    /// The resources its steps call, each once, in step order.
    pub fn resources(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::HashSet::new();
        self.steps
            .iter()
            .filter_map(StepDef::resource)
            .filter(move |r| seen.insert(*r))
    }
    /// Its backlog thresholds, if it has any.
    pub fn backlog_alert(&self) -> Option<BacklogAlert> {
        self.backlog_alert
    }
    /// Its steps, in declaration order.
    pub fn steps(&self) -> &[StepDef] {
        &self.steps
    }
    /// A step by name.
    pub fn step(&self, name: &str) -> Option<&StepDef> {
        self.index.get(name).map(|&i| &self.steps[i])
    }
    /// Index of a step by name.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
    /// Names of a step's dependencies.
    pub fn deps_of(&self, step: usize) -> impl Iterator<Item = &str> {
        self.steps[step]
            .deps
            .iter()
            .map(|&d| self.steps[d].name.as_str())
    }

    /// Checks `input` against the input's JSON Schema, which says where it is wrong (a JSON
    /// Pointer), then that it deserialises into the declared input type.
    ///
    /// # Errors
    /// [`Error::InvalidInput`], with the [`FieldError`] when the schema found it.
    pub fn check_input(&self, input: &serde_json::Value) -> Result<(), Error> {
        if let Some(schema) = &self.input_schema {
            schema::check(schema, input).map_err(|f| Error::InvalidInput {
                workflow: self.name.clone(),
                reason: f.to_string(),
                field: Some(f),
            })?;
        }
        self.check_input_type(input)
    }

    /// Checks only that `input` deserialises into the declared input type: what a claim
    /// checks of a stored input (accepted by [`Workflow::check_input`] once), without walking
    /// the schema again on the hot path.
    ///
    /// # Errors
    /// [`Error::InvalidInput`].
    pub fn check_input_type(&self, input: &serde_json::Value) -> Result<(), Error> {
        match &self.input_check {
            Some(check) => check(input).map_err(|reason| Error::InvalidInput {
                workflow: self.name.clone(),
                reason,
                field: None,
            }),
            None => Ok(()),
        }
    }
}

/// `name@version`.
pub fn workflow_key(name: &str, version: i32) -> String {
    format!("{name}@{version}")
}
