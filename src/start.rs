//! Starting runs: options, the duplicate policy of business keys, validation of the input,
//! and the rows a new run is stored as (group-committed by the submitter, or written on the
//! caller's own transaction).

use std::sync::Arc;
use std::time::Duration;

use sagaflow_engine::definition::{check_priority, millis};
use sagaflow_engine::store::{NewRun, RunInsertOutcome, RunStart};
use sagaflow_engine::trace::TraceContext;
use sagaflow_engine::{Error, Result, RunState, StartOption, Timestamp, Workflow};
use sea_orm::ConnectionTrait;
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::engine::Engine;
use crate::submit::Submission;

/// What to do when a retained run already holds the business key (how long a run holds its
/// key is its workflow's [`KeyPolicy`](sagaflow_engine::KeyPolicy)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDuplicate {
    /// Return the existing run, its id and state ([`Started::created`] is `false`): starting
    /// twice is safe, which is what an order service re-submitting an order needs. The
    /// default.
    #[default]
    ReturnExisting,
    /// Fail with [`Error::DuplicateKey`].
    Reject,
}

pub use sagaflow_engine::{PRIORITY_MAX, PRIORITY_MIN};

/// The longest flow key a run may carry, in bytes.
const FLOW_KEY_MAX: usize = 200;

/// How far ahead a run may be scheduled: 366 days. A start further ahead is refused with
/// [`Error::InvalidStartOption`] (most likely a unit mistaken, seconds for milliseconds); work
/// planned further out belongs in the application's own calendar.
pub const START_AHEAD_MAX: Duration = Duration::from_secs(366 * 24 * 60 * 60);

/// When a run's first steps become due.
///
/// The database's clock decides when that is, as for every deadline of the engine: a delay
/// is added to the database's time when the run is inserted, and an instant is compared
/// with the database's time by the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartTime {
    /// At once. The default.
    #[default]
    Now,
    /// At this instant; at once if it has passed.
    At(Timestamp),
    /// This long after the run is stored.
    After(Duration),
}

/// Options of a run start.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Business key (e.g. the order id): while a run holds it, starting the workflow with the
    /// same key returns that run instead of creating another.
    pub business_key: Option<String>,
    /// What to do with a duplicate.
    pub on_duplicate: OnDuplicate,
    /// When the run's first steps become due: at once by default (the run is then stored
    /// `Running`). With a start time the run is `Pending` until its first step completes,
    /// and its steps count as `scheduled` in [`Engine::stats`] until they are due.
    pub start: StartTime,
    /// Claim priority, [`PRIORITY_MIN`] to [`PRIORITY_MAX`]; `None` takes the workflow's
    /// default ([`WorkflowBuilder::priority`](crate::WorkflowBuilder::priority), 0 unless
    /// set). Among due steps, those of runs of higher priority are claimed first, and steps
    /// of equal priority in the order they became due. Every step of the run has it,
    /// compensations included; a retried step is queued at it moved by the workflow's
    /// [`RetryLane`](crate::RetryLane), and a step that waits gains a level per aging period
    /// ([`EngineBuilder::with_priority_aging`](crate::EngineBuilder::with_priority_aging)).
    pub priority: Option<i32>,
    /// Whether the run's finish is notified through the outbox (a `run_finished` notice to
    /// the engine's sinks): `None` takes the workflow's default
    /// ([`WorkflowBuilder::notify_on_finish`](crate::WorkflowBuilder::notify_on_finish)).
    pub notify: Option<bool>,
    /// The W3C `traceparent` the run continues (`00-<trace id>-<parent id>-<flags>`): every
    /// attempt of its steps belongs to that trace. Without one the run gets a new trace of
    /// its own (with the `otel` feature: the caller's current OpenTelemetry span, if any).
    pub trace_parent: Option<String>,
    /// The W3C `tracestate` kept with [`trace_parent`](Self::trace_parent) and sent
    /// downstream with it.
    pub trace_state: Option<String>,
    /// The run's flow key (a tenant, a customer), which per-key limits of resources count
    /// by; `None` takes it from the input where the workflow says
    /// ([`WorkflowBuilder::flow_key`](crate::WorkflowBuilder::flow_key)). At most 200 bytes.
    pub flow_key: Option<String>,
    /// The version of the workflow to run: `None` (the default) runs the newest registered
    /// (or published) version. An older version still registered can be started, to test a
    /// migration or to finish a batch on the version it began with; a version this engine
    /// does not have is [`Error::WorkflowNotFound`] naming `workflow@version`.
    pub version: Option<i32>,
}

impl StartOptions {
    /// Options with a business key and the default duplicate policy (return the existing
    /// run).
    pub fn keyed(key: impl Into<String>) -> Self {
        Self {
            business_key: Some(key.into()),
            ..Self::default()
        }
    }

    /// Asks for a `run_finished` notice when the run finishes (`true`), or for none
    /// (`false`), whatever the workflow's default.
    #[must_use]
    pub fn notify(mut self, on: bool) -> Self {
        self.notify = Some(on);
        self
    }

    /// Sets the duplicate policy.
    #[must_use]
    pub fn on_duplicate(mut self, d: OnDuplicate) -> Self {
        self.on_duplicate = d;
        self
    }

    /// Starts the run at an instant rather than at once (at once if it has passed). At most
    /// [`START_AHEAD_MAX`] ahead, as the application's clock sees it when the run is started.
    ///
    /// # Examples
    ///
    /// ```
    /// use sagaflow::StartOptions;
    /// use sagaflow::Timestamp;
    ///
    /// let at: Timestamp = "2030-01-01T08:00:00Z".parse().expect("a time");
    /// let options = StartOptions::keyed("o-1").start_at(at);
    /// ```
    #[must_use]
    pub fn start_at(mut self, at: Timestamp) -> Self {
        self.start = StartTime::At(at);
        self
    }

    /// Starts the run this long after it is stored (by the database's clock), at most
    /// [`START_AHEAD_MAX`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sagaflow::StartOptions;
    ///
    /// let options = StartOptions::default().start_after(Duration::from_secs(3600));
    /// ```
    #[must_use]
    pub fn start_after(mut self, delay: Duration) -> Self {
        self.start = StartTime::After(delay);
        self
    }

    /// Sets the claim priority ([`PRIORITY_MIN`] to [`PRIORITY_MAX`]; higher is claimed
    /// first), whatever the workflow's default.
    ///
    /// # Examples
    ///
    /// ```
    /// use sagaflow::StartOptions;
    ///
    /// let urgent = StartOptions::keyed("o-1").priority(10);
    /// assert_eq!(urgent.priority, Some(10));
    /// ```
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Continues the trace of this W3C `traceparent` header value
    /// (`00-<32 hex>-<16 hex>-<2 hex>`); the run's attempts belong to it, and
    /// [`StepContext::trace_parent`](crate::StepContext::trace_parent) carries it downstream.
    /// Checked when the run is started.
    ///
    /// # Examples
    ///
    /// ```
    /// use sagaflow::StartOptions;
    ///
    /// let options = StartOptions::keyed("o-1")
    ///     .trace_parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    /// ```
    #[must_use]
    pub fn trace_parent(mut self, traceparent: impl Into<String>) -> Self {
        self.trace_parent = Some(traceparent.into());
        self
    }

    /// Runs this version of the workflow instead of the newest (see
    /// [`StartOptions::version`](Self#structfield.version)).
    #[must_use]
    pub fn version(mut self, version: i32) -> Self {
        self.version = Some(version);
        self
    }

    /// Sets the run's flow key (see [`StartOptions::flow_key`](Self::flow_key)).
    #[must_use]
    pub fn flow_key(mut self, key: impl Into<String>) -> Self {
        self.flow_key = Some(key.into());
        self
    }

    /// Keeps this W3C `tracestate` with the trace parent (ignored without one).
    #[must_use]
    pub fn trace_state(mut self, tracestate: impl Into<String>) -> Self {
        self.trace_state = Some(tracestate.into());
        self
    }

    /// The trace context given, checked; `None` when none was given.
    fn trace(&self) -> Result<Option<TraceContext>> {
        self.trace_parent
            .as_deref()
            .map(|tp| TraceContext::parse(tp, self.trace_state.as_deref()))
            .transpose()
    }

    /// The start as the store takes it with the priority given (if any), or the option
    /// that is out of range.
    fn checked(&self) -> Result<(RunStart, Option<i32>)> {
        let invalid =
            |option: StartOption, reason: String| Error::InvalidStartOption { option, reason };
        if let Some(p) = self.priority {
            check_priority(p).map_err(|why| invalid(StartOption::Priority, why))?;
        }
        let ahead_max = || {
            format!(
                "more than {} days ahead",
                START_AHEAD_MAX.as_secs() / 86_400
            )
        };
        let start = match self.start {
            StartTime::Now => RunStart::Now,
            StartTime::After(delay) if delay > START_AHEAD_MAX => {
                return Err(invalid(StartOption::StartAfter, ahead_max()));
            }
            StartTime::After(delay) => RunStart::After(millis(delay)),
            // The one use of the application's clock: a bound to refuse nonsense, a year out.
            // When the run is due is the database's to say.
            StartTime::At(at) if at.timestamp_millis() > app_now_ms() + millis(START_AHEAD_MAX) => {
                return Err(invalid(StartOption::StartAt, ahead_max()));
            }
            StartTime::At(at) => RunStart::At(at.timestamp_millis()),
        };
        Ok((start, self.priority))
    }
}

/// The application's clock, in epoch milliseconds.
fn app_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, millis)
}

/// The result of a start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The run's id.
    pub id: Uuid,
    /// Whether a new run was created (false: the run holding the business key was returned).
    pub created: bool,
    /// The run's state: for a new run, `Running` (`Pending` when it was given a start
    /// time); the existing run's state otherwise.
    pub state: RunState,
}

impl Engine {
    /// Starts a run of the newest version of `workflow`.
    ///
    /// # Errors
    /// [`Error::WorkflowNotFound`], [`Error::InvalidInput`], [`Error::PayloadTooLarge`],
    /// [`Error::Shutdown`], [`Error::Db`].
    pub async fn start<I: Serialize>(&self, workflow: &str, input: &I) -> Result<Uuid> {
        self.start_with(workflow, input, StartOptions::default())
            .await
            .map(|s| s.id)
    }

    /// Starts a run with options (business key, duplicate policy, start time, priority). With
    /// a start time, the run is stored `Pending` and its first steps wait until then.
    /// With a business key that
    /// a retained run holds, nothing is created and that run is returned (or, with
    /// [`OnDuplicate::Reject`], [`Error::DuplicateKey`]): intake is idempotent for as long
    /// as the workflow's key policy keeps the key taken.
    ///
    /// # Errors
    /// As [`Engine::start`], plus [`Error::DuplicateKey`] with [`OnDuplicate::Reject`], and
    /// [`Error::InvalidStartOption`] for a start more than [`START_AHEAD_MAX`] ahead, a
    /// priority outside [`PRIORITY_MIN`]..=[`PRIORITY_MAX`], or a malformed
    /// [`trace_parent`](StartOptions::trace_parent) or
    /// [`trace_state`](StartOptions::trace_state).
    pub async fn start_with<I: Serialize>(
        &self,
        workflow: &str,
        input: &I,
        opts: StartOptions,
    ) -> Result<Started> {
        let run = self.prepare(workflow, input, &opts).await?;
        let initial = run.initial_state();
        let (reply, answer) = oneshot::channel();
        self.inner
            .submit
            .send(Submission { run, reply })
            .await
            .map_err(|_| Error::Shutdown)?;
        let outcome = answer.await.map_err(|_| Error::Shutdown)??;
        // The submitter published the first event of a new run as it committed.
        resolve(outcome, opts, workflow, initial)
    }

    /// Starts a run on the caller's connection or transaction: the run and its steps commit
    /// or roll back with the caller's own writes (e.g. the order row, SAS-7). Call
    /// [`Engine::wake`] after committing for the quickest pickup (otherwise the next poll
    /// finds it).
    ///
    /// # Errors
    /// As [`Engine::start_with`].
    pub async fn start_in<C, I>(
        &self,
        conn: &C,
        workflow: &str,
        input: &I,
        opts: StartOptions,
    ) -> Result<Started>
    where
        C: ConnectionTrait,
        I: Serialize,
    {
        let run = self.prepare(workflow, input, &opts).await?;
        let outcome = self.inner.store.run_insert(conn, &run).await?;
        if matches!(outcome, RunInsertOutcome::Inserted(_)) {
            // Counted when written: the caller's transaction commits it (or rolls it back)
            // out of the engine's sight.
            sagaflow_engine::metrics::run_started(&run.workflow);
        }
        resolve(outcome, opts, workflow, run.initial_state())
    }

    /// Validates a submission and builds its rows.
    pub(crate) async fn prepare<I: Serialize>(
        &self,
        workflow: &str,
        input: &I,
        opts: &StartOptions,
    ) -> Result<NewRun> {
        let (start, priority) = opts.checked()?;
        let trace = opts.trace()?.unwrap_or_else(caller_trace);
        if let Some(fatal) = self.inner.signals.fatal() {
            return Err(fatal);
        }
        if self.inner.cancel.is_cancelled() {
            return Err(Error::Shutdown);
        }
        let published;
        let registry;
        let wf = if self.inner.published {
            published = self.published_workflow(workflow, opts.version).await?;
            &published
        } else {
            registry = self.inner.scheduler.registry();
            match opts.version {
                None => registry.latest(workflow)?,
                Some(v) => registry
                    .get_registered(workflow, v)
                    .ok_or_else(|| Error::WorkflowNotFound(format!("{workflow}@{v}")))?,
            }
        };
        let value = serde_json::to_value(input).map_err(|e| Error::InvalidInput {
            workflow: workflow.to_owned(),
            reason: e.to_string(),
            field: None,
        })?;
        wf.check_input(&value)?;
        let json = value.to_string();
        if json.len() > self.inner.max_input_bytes {
            return Err(Error::PayloadTooLarge {
                what: format!("input of workflow `{workflow}`"),
                size: json.len(),
                limit: self.inner.max_input_bytes,
            });
        }
        let flow_key = opts.flow_key.clone().or_else(|| wf.flow_key_of(&value));
        if flow_key.as_ref().is_some_and(|k| k.len() > FLOW_KEY_MAX) {
            return Err(Error::InvalidInput {
                workflow: workflow.to_owned(),
                reason: format!("the flow key is longer than {FLOW_KEY_MAX} bytes"),
                field: None,
            });
        }
        let mut run = NewRun::for_workflow(
            wf,
            json,
            opts.business_key.clone(),
            start,
            priority.unwrap_or(wf.priority()),
            opts.notify.unwrap_or(wf.notify_on_finish()),
            trace,
        );
        run.flow_key = flow_key;
        Ok(run)
    }

    /// The published `version` of `workflow` (the newest for `None`), rebuilt from its
    /// description (an engine of published workflows,
    /// [`EngineBuilder::with_published_workflows`]).
    ///
    /// [`EngineBuilder::with_published_workflows`]: crate::EngineBuilder::with_published_workflows
    async fn published_workflow(
        &self,
        workflow: &str,
        version: Option<i32>,
    ) -> Result<Arc<Workflow>> {
        let store = &self.inner.store;
        let newest = match version {
            None => store.definition_latest(workflow).await?,
            Some(v) => store.definition_get(workflow, v).await?,
        }
        .ok_or_else(|| match version {
            None => Error::WorkflowNotFound(workflow.to_owned()),
            Some(v) => Error::WorkflowNotFound(format!("{workflow}@{v}")),
        })?;
        let description = newest
            .description
            .map_err(|reason| Error::InvalidDefinition {
                workflow: workflow.to_owned(),
                reason: format!(
                    "its published description (version {}) does not decode: {reason}",
                    newest.version
                ),
            })?;
        Workflow::from_description(&description).map(Arc::new)
    }

    /// Wakes this instance's scheduler (after committing a transaction that started runs).
    pub fn wake(&self) {
        self.inner.signals.wake_claimer();
        self.inner.signals.wake_evaluator();
    }
}

/// Applies the duplicate policy to an insert outcome.
/// `initial` is the state a new run was stored in.
fn resolve(
    outcome: RunInsertOutcome,
    opts: StartOptions,
    workflow: &str,
    initial: RunState,
) -> Result<Started> {
    match outcome {
        RunInsertOutcome::Inserted(id) => Ok(Started {
            id,
            created: true,
            state: initial,
        }),
        RunInsertOutcome::Duplicate { existing, state } => match opts.on_duplicate {
            OnDuplicate::ReturnExisting => Ok(Started {
                id: existing,
                created: false,
                state,
            }),
            OnDuplicate::Reject => Err(Error::DuplicateKey {
                workflow: workflow.to_owned(),
                key: opts.business_key.unwrap_or_default(),
                existing,
                state,
            }),
        },
    }
}

/// The trace of a run started without a trace context: the caller's current OpenTelemetry
/// span when there is one (feature `otel`), a new trace otherwise.
pub(crate) fn caller_trace() -> TraceContext {
    #[cfg(feature = "otel")]
    if let Some(current) = sagaflow_engine::trace::otel::current() {
        return current;
    }
    TraceContext::generate()
}
