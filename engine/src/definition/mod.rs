//! Workflow definitions: named step graphs with optional compensations (SAS-1).
//!
//! A [`Workflow`] is built once at start-up with [`Workflow::builder`]; `build()` checks the
//! graph and names the offending step in its error. A run is pinned to the `(name, version)`
//! that started it.

mod policy;
mod registry;
mod step;
mod validate;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use policy::millis;
pub use policy::{
    DEADLINE_CAP_DEFAULT, DEADLINE_DEFAULT, DeadlinePolicy, INITIAL_BACKOFF_DEFAULT,
    MAX_BACKOFF_DEFAULT, MAX_FAILURES_DEFAULT, MAX_INTERRUPTIONS_DEFAULT, RetryPolicy,
    StepSettings,
};
pub use registry::Registry;
pub use step::{StepAction, StepContext};

use crate::{Error, StepError};
use step::FnAction;

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
    pub(crate) key_policy: KeyPolicy,
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
        WorkflowBuilder {
            name: name.into(),
            version,
            defaults: StepSettings::default(),
            drafts: Vec::new(),
            misuse: Vec::new(),
            input_check: None,
            key_policy: KeyPolicy::default(),
        }
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

    /// Checks that `input` deserialises into the declared input type.
    ///
    /// # Errors
    /// [`Error::InvalidInput`].
    pub fn check_input(&self, input: &serde_json::Value) -> Result<(), Error> {
        match &self.input_check {
            Some(check) => check(input).map_err(|reason| Error::InvalidInput {
                workflow: self.name.clone(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// `name@version`.
pub fn workflow_key(name: &str, version: i32) -> String {
    format!("{name}@{version}")
}

struct Draft {
    name: String,
    kind: StepKind,
    after: Vec<String>,
    action: Arc<dyn StepAction>,
    compensation: Option<Arc<dyn StepAction>>,
    retry: Option<RetryPolicy>,
    deadline: Option<DeadlinePolicy>,
}

/// Builds a [`Workflow`]. Step-level methods (`after`, `compensate`, `pivot`, …) apply to the
/// step added last.
#[must_use]
pub struct WorkflowBuilder {
    name: String,
    version: i32,
    defaults: StepSettings,
    drafts: Vec<Draft>,
    misuse: Vec<String>,
    input_check: Option<InputCheck>,
    key_policy: KeyPolicy,
}

impl fmt::Debug for WorkflowBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowBuilder")
            .field("name", &self.name)
            .field("version", &self.version)
            .finish()
    }
}

impl WorkflowBuilder {
    /// Declares the input type: submissions whose input does not deserialise into `T` are
    /// rejected with [`Error::InvalidInput`].
    pub fn input<T: DeserializeOwned + 'static>(mut self) -> Self {
        self.input_check = Some(Arc::new(|v: &serde_json::Value| {
            T::deserialize(v).map(|_| ()).map_err(|e| e.to_string())
        }));
        self
    }

    /// How long a run's business key stays taken (default: [`KeyPolicy::WhileRetained`]).
    pub fn business_keys(mut self, policy: KeyPolicy) -> Self {
        self.key_policy = policy;
        self
    }

    /// Workflow-wide default retry policy.
    pub fn default_retry(mut self, retry: RetryPolicy) -> Self {
        self.defaults.retry = retry;
        self
    }

    /// Workflow-wide default deadline policy.
    pub fn default_deadline(mut self, deadline: DeadlinePolicy) -> Self {
        self.defaults.deadline = deadline;
        self
    }

    /// Adds a step whose body is an async closure.
    pub fn step<F, Fut, O>(self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, StepError>> + Send + 'static,
        O: Serialize + Send + 'static,
    {
        self.step_with(name, FnAction(f))
    }

    /// Adds a step whose body receives shared state (its clients, say) with the context: `state`
    /// is cloned for each attempt, so the body needs no clone of its own.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use sagaflow_engine::{StepContext, StepError, Workflow};
    /// struct Inventory;
    /// impl Inventory {
    ///     async fn reserve(&self, _key: &str) -> Result<String, StepError> { Ok("r-1".into()) }
    ///     async fn release(&self, _key: &str) -> Result<(), StepError> { Ok(()) }
    /// }
    /// let inventory = Arc::new(Inventory);
    /// let wf = Workflow::builder("order", 1)
    ///     .step_using("reserve", inventory.clone(), |inv, ctx| async move {
    ///         inv.reserve(ctx.idempotency_key()).await
    ///     })
    ///     .compensate_using(inventory, |inv, ctx| async move {
    ///         inv.release(ctx.idempotency_key()).await
    ///     })
    ///     .build();
    /// assert!(wf.is_ok());
    /// ```
    pub fn step_using<S, F, Fut, O>(self, name: impl Into<String>, state: S, f: F) -> Self
    where
        S: Clone + Send + Sync + 'static,
        F: Fn(S, StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, StepError>> + Send + 'static,
        O: Serialize + Send + 'static,
    {
        self.step(name, move |ctx| f(state.clone(), ctx))
    }

    /// Adds a step whose body is a [`StepAction`] (e.g. an agent adapter).
    pub fn step_with(mut self, name: impl Into<String>, action: impl StepAction) -> Self {
        self.drafts.push(Draft {
            name: name.into(),
            kind: StepKind::Compensatable,
            after: Vec::new(),
            action: Arc::new(action),
            compensation: None,
            retry: None,
            deadline: None,
        });
        self
    }

    fn last(&mut self, what: &str) -> Option<&mut Draft> {
        if self.drafts.is_empty() {
            self.misuse
                .push(format!("`{what}` called before any step was added"));
        }
        self.drafts.last_mut()
    }

    /// The last step runs after these steps and receives their outputs.
    pub fn after<I, S>(mut self, deps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Some(d) = self.last("after") {
            d.after.extend(deps.into_iter().map(Into::into));
        }
        self
    }

    /// Gives the last step a compensation (async closure).
    pub fn compensate<F, Fut, O>(self, f: F) -> Self
    where
        F: Fn(StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, StepError>> + Send + 'static,
        O: Serialize + Send + 'static,
    {
        self.compensate_with(FnAction(f))
    }

    /// Gives the last step a compensation that receives shared state with the context (see
    /// [`WorkflowBuilder::step_using`]).
    pub fn compensate_using<S, F, Fut, O>(self, state: S, f: F) -> Self
    where
        S: Clone + Send + Sync + 'static,
        F: Fn(S, StepContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, StepError>> + Send + 'static,
        O: Serialize + Send + 'static,
    {
        self.compensate(move |ctx| f(state.clone(), ctx))
    }

    /// Gives the last step a compensation ([`StepAction`]).
    pub fn compensate_with(mut self, action: impl StepAction) -> Self {
        if let Some(d) = self.last("compensate") {
            if d.compensation.is_some() {
                let msg = format!("step `{}` has two compensations", d.name);
                self.misuse.push(msg);
            } else {
                d.compensation = Some(Arc::new(action));
            }
        }
        self
    }

    /// Marks the last step as the pivot: the point of no return.
    pub fn pivot(mut self) -> Self {
        if let Some(d) = self.last("pivot") {
            d.kind = StepKind::Pivot;
        }
        self
    }

    /// Marks the last step as retriable: retried until it succeeds, never compensated. Its
    /// retry policy defaults to unlimited failures.
    pub fn retriable(mut self) -> Self {
        if let Some(d) = self.last("retriable") {
            d.kind = StepKind::Retriable;
        }
        self
    }

    /// Overrides the retry policy of the last step.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        if let Some(d) = self.last("retry") {
            d.retry = Some(retry);
        }
        self
    }

    /// Overrides the first deadline of the last step (the cap stays the workflow default,
    /// raised to this deadline if lower).
    pub fn deadline(mut self, initial: Duration) -> Self {
        let cap = self.defaults.deadline.cap;
        if let Some(d) = self.last("deadline") {
            d.deadline = Some(DeadlinePolicy::new(initial, cap.max(initial)));
        }
        self
    }

    /// Overrides the whole deadline policy of the last step.
    pub fn deadline_policy(mut self, policy: DeadlinePolicy) -> Self {
        if let Some(d) = self.last("deadline_policy") {
            d.deadline = Some(policy);
        }
        self
    }

    /// Validates the graph.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] naming the offending step: an empty graph, a duplicate or
    /// malformed name, an unknown dependency, a cycle, a compensation on a pivot or retriable
    /// step, a compensatable step after a pivot or retriable step, more than one pivot, or a
    /// bad policy.
    pub fn build(self) -> Result<Workflow, Error> {
        let invalid = |reason: String| Error::InvalidDefinition {
            workflow: self.name.clone(),
            reason,
        };
        if let Some(m) = self.misuse.first() {
            return Err(invalid(m.clone()));
        }
        let mut index = HashMap::new();
        for (i, d) in self.drafts.iter().enumerate() {
            validate::check_name(&d.name).map_err(&invalid)?;
            if index.insert(d.name.clone(), i).is_some() {
                return Err(invalid(format!("duplicate step name `{}`", d.name)));
            }
        }
        let mut steps = Vec::with_capacity(self.drafts.len());
        for d in &self.drafts {
            let mut deps = Vec::new();
            for dep in &d.after {
                let &j = index.get(dep).ok_or_else(|| {
                    invalid(format!("step `{}` depends on unknown step `{dep}`", d.name))
                })?;
                if !deps.contains(&j) {
                    deps.push(j);
                }
            }
            let mut settings = self.defaults;
            if d.kind == StepKind::Retriable {
                settings.retry = settings.retry.with_unlimited_failures();
            }
            if let Some(r) = d.retry {
                settings.retry = r;
            }
            if let Some(dl) = d.deadline {
                settings.deadline = dl;
            }
            steps.push(StepDef {
                name: d.name.clone(),
                kind: d.kind,
                deps,
                dependents: Vec::new(),
                action: d.action.clone(),
                compensation: d.compensation.clone(),
                settings,
            });
        }
        for i in 0..steps.len() {
            for k in 0..steps[i].deps.len() {
                let j = steps[i].deps[k];
                steps[j].dependents.push(i);
            }
        }
        validate::check_graph(&steps).map_err(&invalid)?;
        Ok(Workflow {
            name: self.name,
            version: self.version,
            steps,
            index,
            input_check: self.input_check,
            key_policy: self.key_policy,
        })
    }
}
