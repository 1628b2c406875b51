//! Building a workflow: steps with their bodies, dependencies, kinds and policies, checked
//! when built (a definition error names the offending step).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::priority::check_priority;
use super::step::FnAction;
use super::{
    BacklogAlert, DeadlinePolicy, InputCheck, KeyPolicy, OnFailure, RetryLane, RetryPolicy,
    StepAction, StepContext, StepDef, StepKind, StepSettings, Workflow, validate,
};
use crate::{Error, StepError};

struct Draft {
    name: String,
    kind: StepKind,
    after: Vec<String>,
    action: Arc<dyn StepAction>,
    compensation: Option<Arc<dyn StepAction>>,
    retry: Option<RetryPolicy>,
    deadline: Option<DeadlinePolicy>,
    resource: Option<Arc<str>>,
    wait: Option<crate::wait::StepWait>,
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
    input_schema: Option<Arc<serde_json::Value>>,
    key_policy: KeyPolicy,
    on_failure: OnFailure,
    notify_on_finish: bool,
    backlog_alert: Option<BacklogAlert>,
    flow_key: Option<String>,
    priority: i32,
    retry_lane: RetryLane,
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
    pub(super) fn new(name: String, version: i32) -> Self {
        Self {
            name,
            version,
            defaults: StepSettings::default(),
            drafts: Vec::new(),
            misuse: Vec::new(),
            input_check: None,
            input_schema: None,
            key_policy: KeyPolicy::default(),
            on_failure: OnFailure::default(),
            notify_on_finish: false,
            backlog_alert: None,
            flow_key: None,
            priority: 0,
            retry_lane: RetryLane::Same,
        }
    }

    /// Declares the input type: submissions whose input does not deserialise into `T` are
    /// rejected with [`Error::InvalidInput`], and `T`'s JSON Schema (derive
    /// `schemars::JsonSchema`) is published with the workflow's description
    /// ([`Workflow::describe`]), for consoles and HTTP clients to validate inputs with.
    pub fn input<T: DeserializeOwned + schemars::JsonSchema + 'static>(mut self) -> Self {
        self.input_check = Some(Arc::new(|v: &serde_json::Value| {
            T::deserialize(v).map(|_| ()).map_err(|e| e.to_string())
        }));
        self.input_schema = Some(Arc::new(schemars::schema_for!(T).to_value()));
        self
    }

    /// How long a run's business key stays taken (default: [`KeyPolicy::WhileRetained`]).
    pub fn business_keys(mut self, policy: KeyPolicy) -> Self {
        self.key_policy = policy;
        self
    }

    /// What a run does when a step fails for good before the point of no return (default:
    /// [`OnFailure::Compensate`]; [`OnFailure::Pause`] parks it for an operator instead).
    pub fn on_failure(mut self, policy: OnFailure) -> Self {
        self.on_failure = policy;
        self
    }

    /// Notifies every run's finish (`completed`, `compensated`, `cancelled`) through the
    /// outbox: a `run_finished` notice delivered at least once to the engine's sinks (a
    /// webhook, a channel). A start can ask for it, or not, whatever this default
    /// (`StartOptions::notify`).
    pub fn notify_on_finish(mut self, on: bool) -> Self {
        self.notify_on_finish = on;
        self
    }

    /// Raises a `backlog_growing` alert while the workflow's queue is past `alert`'s
    /// thresholds (checked by the supervisor leader).
    pub fn backlog_alert(mut self, alert: BacklogAlert) -> Self {
        self.backlog_alert = Some(alert);
        self
    }

    /// The claim priority of runs started without one (`StartOptions::priority` overrides
    /// it per run): [`PRIORITY_MIN`](super::PRIORITY_MIN) to
    /// [`PRIORITY_MAX`](super::PRIORITY_MAX), 0 by default. Among due steps, those of higher
    /// priority are claimed first. Checked by [`build`](Self::build).
    ///
    /// # Examples
    ///
    /// ```
    /// use sagaflow_engine::definition::RetryLane;
    /// use sagaflow_engine::{StepContext, StepError, Workflow};
    ///
    /// let refund = Workflow::builder("refund", 1)
    ///     .priority(10)
    ///     .retries(RetryLane::Ahead)
    ///     .step("pay_back", |_ctx: StepContext| async { Ok::<_, StepError>(()) })
    ///     .build()
    ///     .expect("valid");
    /// assert_eq!((refund.priority(), refund.retry_lane()), (10, RetryLane::Ahead));
    /// ```
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Where retried attempts queue relative to new work of the same priority (default:
    /// [`RetryLane::Same`]): [`RetryLane::Ahead`] finishes begun runs first,
    /// [`RetryLane::Behind`] lets new work pass a failing step.
    pub fn retries(mut self, lane: RetryLane) -> Self {
        self.retry_lane = lane;
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
            resource: None,
            wait: None,
        });
        self
    }

    /// Adds a timer step: once due, it waits `delay` on the database clock, parked in the
    /// database (no task is held, a restart loses nothing), then completes with
    /// `{"fired": true}`. Exactly one attempt completes it, on whichever instance claims it
    /// after the supervisor leader's timer pass found it due.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use sagaflow_engine::{StepContext, StepError, Workflow};
    /// let wf = Workflow::builder("order", 1)
    ///     .step("reserve", |_: StepContext| async { Ok::<_, StepError>(()) })
    ///     .timer("hold", Duration::from_secs(30 * 60))
    ///     .after(["reserve"])
    ///     .build();
    /// assert!(wf.is_ok());
    /// ```
    pub fn timer(self, name: impl Into<String>, delay: Duration) -> Self {
        self.builtin(
            name,
            crate::wait::TimerAction(delay),
            crate::wait::StepWait::Timer(delay),
        )
    }

    /// Adds a step that waits for the named event sent to its run (by run id or business
    /// key: `Engine::send_event`, the REST API, the CLI) and completes with its payload. An
    /// event sent before the step waits is kept and consumed when it does. When the event's
    /// timeout passes first, the step takes its [`OnTimeout`](crate::wait::OnTimeout) path.
    pub fn wait_for_event(self, name: impl Into<String>, wait: crate::wait::EventWait) -> Self {
        self.builtin(
            name,
            crate::wait::EventAction(wait.clone()),
            crate::wait::StepWait::Event(wait),
        )
    }

    /// Adds a step that starts a run of `workflow` (a child run) with the input `input`
    /// computes from the step's context, waits for it, and completes with the child's output
    /// (its steps' outputs by name). A child that ends compensated fails the step, and the
    /// parent unwinds. Compensating the parent compensates a completed child; cancelling the
    /// parent cancels its children. The child's business key is `<parent run>:<step>`, so the
    /// child is started once however often the step runs.
    pub fn child<F>(self, name: impl Into<String>, workflow: impl Into<String>, input: F) -> Self
    where
        F: Fn(&StepContext) -> Result<serde_json::Value, StepError> + Send + Sync + 'static,
    {
        let workflow = workflow.into();
        let mut b = self.builtin(
            name,
            crate::wait::ChildAction {
                workflow: workflow.clone(),
                input: Arc::new(input),
            },
            crate::wait::StepWait::Child { workflow },
        );
        if let Some(d) = b.drafts.last_mut() {
            d.compensation = Some(Arc::new(crate::wait::ChildCompensation));
        }
        b
    }

    fn builtin(
        mut self,
        name: impl Into<String>,
        action: impl StepAction,
        wait: crate::wait::StepWait,
    ) -> Self {
        self = self.step_with(name, action);
        if let Some(d) = self.drafts.last_mut() {
            d.wait = Some(wait);
        }
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

    /// Declares the remote resource the last step calls: by name (`"payments-api"`), or by
    /// the client that calls it (`&payments`, an `HttpAgent`). Its attempts obey the
    /// resource's limits (concurrency across every instance and per key, rate, time windows,
    /// batches, circuit breaker), declared with `EngineBuilder::with_resource` and
    /// changeable at run time. A step waiting for a limit spends no attempt and burns no
    /// deadline.
    pub fn resource(mut self, name: impl crate::resource::ResourceName) -> Self {
        let name: String = name.resource_name();
        if let Some(d) = self.last("resource") {
            d.resource = Some(Arc::from(name));
        }
        self
    }

    /// Where a run's flow key is read from its input: a JSON Pointer (`/customer_id`). Steps
    /// with a resource whose limits set a per-key concurrency share it fairly between keys,
    /// so one tenant's burst cannot starve the others. A string is taken as it is, a number
    /// or boolean as its JSON text; a missing value or another type gives no key.
    /// `StartOptions::flow_key` overrides it per run.
    pub fn flow_key(mut self, pointer: impl Into<String>) -> Self {
        let pointer = pointer.into();
        if !pointer.starts_with('/') {
            self.misuse.push(format!(
                "flow_key `{pointer}` is not a JSON Pointer: it starts with `/`, as in `/customer_id`"
            ));
        }
        self.flow_key = Some(pointer);
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
    /// step, a compensatable step after a pivot or retriable step, more than one pivot, a
    /// bad policy, or a default priority out of range.
    pub fn build(self) -> Result<Workflow, Error> {
        let invalid = |reason: String| Error::InvalidDefinition {
            workflow: self.name.clone(),
            reason,
        };
        if let Some(m) = self.misuse.first() {
            return Err(invalid(m.clone()));
        }
        check_priority(self.priority)
            .map_err(|why| invalid(format!("the default priority is invalid: {why}")))?;
        let mut index = HashMap::new();
        for (i, d) in self.drafts.iter().enumerate() {
            validate::check_name(&d.name).map_err(&invalid)?;
            if let Some(r) = &d.resource {
                validate::check_resource(&d.name, r).map_err(&invalid)?;
            }
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
            if matches!(d.wait, Some(crate::wait::StepWait::Child { .. })) {
                // Its compensation looks at the child until it is undone, however long.
                settings.retry.max_deferrals = u32::MAX;
            }
            steps.push(StepDef {
                name: d.name.clone(),
                kind: d.kind,
                deps,
                dependents: Vec::new(),
                action: d.action.clone(),
                compensation: d.compensation.clone(),
                settings,
                resource: d.resource.clone(),
                wait: d.wait.clone(),
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
            input_schema: self.input_schema,
            key_policy: self.key_policy,
            on_failure: self.on_failure,
            notify_on_finish: self.notify_on_finish,
            flow_key: self.flow_key,
            backlog_alert: self.backlog_alert,
            priority: self.priority,
            retry_lane: self.retry_lane,
            without_code: false,
        })
    }
}
