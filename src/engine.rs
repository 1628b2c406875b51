//! A running engine instance.

use std::sync::Arc;
use std::time::Duration;

use sagaflow_agents::AgentPool;
use sagaflow_engine::definition::millis;
use sagaflow_engine::hub::{AlertSink, Hub, RunEvent};
use sagaflow_engine::scheduler::{Scheduler, SchedulerConfig};
use sagaflow_engine::store::{EvalApplied, NewRun, NewStep, RunInsertOutcome};
use sagaflow_engine::{
    AlertRow, Error, HistoryRow, Registry, Result, RunRow, RunState, StepRow, Store, Workflow,
    operator,
};
use sagaflow_supervisor::{Supervisor, SupervisorConfig};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::builder::EngineBuilder;
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

/// Options of a run start.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Business key (e.g. the order id): while a run holds it, starting the workflow with the
    /// same key returns that run instead of creating another.
    pub business_key: Option<String>,
    /// What to do with a duplicate.
    pub on_duplicate: OnDuplicate,
}

impl StartOptions {
    /// Options with a business key and the default duplicate policy (return the existing
    /// run).
    pub fn keyed(key: impl Into<String>) -> Self {
        Self {
            business_key: Some(key.into()),
            on_duplicate: OnDuplicate::ReturnExisting,
        }
    }

    /// Sets the duplicate policy.
    #[must_use]
    pub fn on_duplicate(mut self, d: OnDuplicate) -> Self {
        self.on_duplicate = d;
        self
    }
}

/// The result of a start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The run's id.
    pub id: Uuid,
    /// Whether a new run was created (false: the run holding the business key was returned).
    pub created: bool,
    /// The run's state: `Pending` for a new run, the existing run's state otherwise.
    pub state: RunState,
}

/// The health of an engine instance (see [`Engine::health`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Health {
    /// Its loops run.
    Running,
    /// It was shut down.
    Stopped,
    /// It stopped on this fatal error and does no more work.
    Failed(Error),
}

/// How often an idle engine checks that its SQLite file is still the one it opened (a busy
/// one also checks before every claim).
const DATABASE_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Stops the engine when its database is lost: watches the SQLite file's identity and, on a
/// fatal error from any loop, cancels every loop, so nothing more is claimed or accepted.
async fn watch_database(store: Store, hub: Arc<Hub>, cancel: CancellationToken) {
    let check = async {
        if !store.has_file() {
            return std::future::pending().await;
        }
        loop {
            if let Err(e) = store.check_file() {
                hub.fail(e);
                return;
            }
            tokio::time::sleep(DATABASE_CHECK_EVERY).await;
        }
    };
    tokio::select! {
        () = check => {}
        _ = hub.fatal_error() => {}
        () = cancel.cancelled() => return,
    }
    cancel.cancel();
}

struct Inner {
    store: Store,
    registry: Arc<Registry>,
    hub: Arc<Hub>,
    scheduler: Arc<Scheduler>,
    supervisor: Option<Arc<Supervisor>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    max_input_bytes: usize,
    submit: mpsc::Sender<Submission>,
    /// This instance's registration (worker engines): its incarnation.
    incarnation: Option<String>,
    stopped: std::sync::atomic::AtomicBool,
}

/// A running sagaflow instance: scheduler, agents and (usually) a supervisor candidate over
/// one database. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("owner", &self.inner.scheduler.owner())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts configuring an engine.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        store: Store,
        heartbeat: Option<(String, Duration)>,
        registry: Arc<Registry>,
        sinks: Vec<Arc<dyn AlertSink>>,
        scheduler: SchedulerConfig,
        supervisor: Option<SupervisorConfig>,
        workers: bool,
        max_input_bytes: usize,
    ) -> Result<Self> {
        let hub = Arc::new(Hub::new(sinks));
        let tracker = TaskTracker::new();
        let cancel = CancellationToken::new();
        let in_flight = scheduler.max_in_flight;
        let scheduler = Arc::new(Scheduler::new(
            store.clone(),
            registry.clone(),
            hub.clone(),
            scheduler,
        )?);
        let supervisor = match supervisor {
            Some(c) => Some(Arc::new(Supervisor::new(store.clone(), hub.clone(), c)?)),
            None => None,
        };
        if workers {
            let (tx, rx) = mpsc::channel(in_flight.max(1));
            AgentPool::spawn(&tracker, cancel.clone(), rx);
            scheduler.clone().spawn(&tracker, cancel.clone(), tx);
            if let Some(s) = &supervisor {
                s.clone().spawn(&tracker, cancel.clone());
            }
        }
        if let Some((incarnation, every)) = &heartbeat {
            tracker.spawn(crate::instance::heartbeat(
                store.clone(),
                scheduler.owner().to_owned(),
                incarnation.clone(),
                *every,
                cancel.clone(),
            ));
        }
        let submit = crate::submit::spawn(store.clone(), hub.clone(), &tracker, cancel.clone());
        tracker.spawn(watch_database(store.clone(), hub.clone(), cancel.clone()));
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                registry,
                hub,
                scheduler,
                supervisor,
                tracker,
                cancel,
                max_input_bytes,
                submit,
                incarnation: heartbeat.map(|(i, _)| i),
                stopped: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Whether this instance is running, was shut down, or stopped on a fatal error.
    pub fn health(&self) -> Health {
        match self.inner.hub.fatal() {
            Some(e) => Health::Failed(e),
            None if self.inner.cancel.is_cancelled() => Health::Stopped,
            None => Health::Running,
        }
    }

    /// Waits until this instance stops on a fatal error (its database lost: an SQLite file
    /// deleted or replaced under it) and returns the error; waits forever while it is healthy.
    /// An embedding program selects on it beside its own work to exit, or alert, with the
    /// reason.
    pub async fn fatal_error(&self) -> Error {
        self.inner.hub.fatal_error().await
    }

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

    /// Starts a run with options (business key, duplicate policy). With a business key that
    /// a retained run holds, nothing is created and that run is returned (or, with
    /// [`OnDuplicate::Reject`], [`Error::DuplicateKey`]): intake is idempotent for as long
    /// as the workflow's key policy keeps the key taken.
    ///
    /// # Errors
    /// As [`Engine::start`], plus [`Error::DuplicateKey`] with [`OnDuplicate::Reject`].
    pub async fn start_with<I: Serialize>(
        &self,
        workflow: &str,
        input: &I,
        opts: StartOptions,
    ) -> Result<Started> {
        let run = self.prepare(workflow, input, opts.business_key.clone())?;
        let (reply, answer) = oneshot::channel();
        self.inner
            .submit
            .send(Submission { run, reply })
            .await
            .map_err(|_| Error::Shutdown)?;
        let outcome = answer.await.map_err(|_| Error::Shutdown)??;
        let started = resolve(outcome, opts, workflow)?;
        if started.created {
            self.inner.hub.publish(RunEvent {
                run_id: started.id,
                workflow: workflow.to_owned(),
                state: RunState::Pending,
            });
        }
        Ok(started)
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
        let run = self.prepare(workflow, input, opts.business_key.clone())?;
        let outcome = self.inner.store.run_insert(conn, &run).await?;
        resolve(outcome, opts, workflow)
    }

    /// Validates a submission and builds its rows.
    fn prepare<I: Serialize>(
        &self,
        workflow: &str,
        input: &I,
        business_key: Option<String>,
    ) -> Result<NewRun> {
        if let Some(fatal) = self.inner.hub.fatal() {
            return Err(fatal);
        }
        if self.inner.cancel.is_cancelled() {
            return Err(Error::Shutdown);
        }
        let wf = self.inner.registry.latest(workflow)?;
        let value = serde_json::to_value(input).map_err(|e| Error::InvalidInput {
            workflow: workflow.to_owned(),
            reason: e.to_string(),
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
        Ok(new_run(wf, json, business_key))
    }

    /// Wakes this instance's scheduler (after committing a transaction that started runs).
    pub fn wake(&self) {
        self.inner.hub.claim.notify_one();
        self.inner.hub.eval.notify_one();
    }

    /// A run by id.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run(&self, id: Uuid) -> Result<Option<RunRow>> {
        self.inner.store.run_get(id).await
    }

    /// The newest retained run of `workflow` started with `business_key`, active or
    /// finished (e.g. to answer "what happened to order o-1?").
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_by_key(&self, workflow: &str, business_key: &str) -> Result<Option<RunRow>> {
        self.inner.store.run_by_key(workflow, business_key).await
    }

    /// The steps of an unfinished run (finished runs keep their history; see
    /// [`Engine::history`]).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn steps(&self, id: Uuid) -> Result<Vec<StepRow>> {
        self.inner.store.run_steps(id).await
    }

    /// A run's history, oldest first.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn history(&self, id: Uuid) -> Result<Vec<HistoryRow>> {
        self.inner.store.run_history(id).await
    }

    /// Subscribes to status events of runs moved by this instance (SAS-8).
    pub fn subscribe(&self) -> broadcast::Receiver<RunEvent> {
        self.inner.hub.subscribe_events()
    }

    /// Subscribes to alerts raised by this instance.
    pub fn subscribe_alerts(&self) -> broadcast::Receiver<AlertRow> {
        self.inner.hub.subscribe_alerts()
    }

    /// Open alerts (from every instance sharing the database).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn open_alerts(&self) -> Result<Vec<AlertRow>> {
        self.inner.store.alert_list(None, true).await
    }

    /// Alerts of one run, open or resolved.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_alerts(&self, id: Uuid) -> Result<Vec<AlertRow>> {
        self.inner.store.alert_list(Some(id), false).await
    }

    /// Waits until the run is `Completed`, `Compensated` or `Error`, at most `timeout`.
    /// Works for runs moved by other instances too (it re-reads the run periodically).
    ///
    /// # Errors
    /// [`Error::WaitTimeout`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn wait(&self, id: Uuid, timeout: Duration) -> Result<RunRow> {
        let mut events = self.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let run = self.run(id).await?.ok_or(Error::RunNotFound(id))?;
            if run.state.is_terminal() {
                return Ok(run);
            }
            let tick = tokio::time::sleep(Duration::from_millis(200));
            tokio::select! {
                () = tick => {}
                e = events.recv() => if let Ok(e) = e && e.run_id != id { continue; },
                () = tokio::time::sleep_until(deadline) => return Err(Error::WaitTimeout(id)),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::WaitTimeout(id));
            }
        }
    }

    /// Operator actions.
    pub fn operator(&self) -> Operator<'_> {
        Operator { engine: self }
    }

    /// This instance's supervisor candidate, if enabled.
    pub fn supervisor(&self) -> Option<&Supervisor> {
        self.inner.supervisor.as_deref()
    }

    /// The store (for inspection and advanced use).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The database connection pool (to begin transactions for [`Engine::start_in`]).
    pub fn connection(&self) -> &DatabaseConnection {
        self.inner.store.connection()
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        self.inner.scheduler.owner()
    }

    /// Stops every background loop and waits for them. Attempts in flight are cancelled and
    /// report nothing; their steps are released at once as *interruptions* (queued again,
    /// not counted as failures, their deadline unchanged), and the instance is marked
    /// stopped. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        let Some(incarnation) = &self.inner.incarnation else {
            return;
        };
        if self
            .inner
            .stopped
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let store = &self.inner.store;
        let id = self.instance_id();
        match crate::instance::release_owned(store, id).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                instance = id,
                steps = n,
                "released in-flight steps at shutdown"
            ),
            Err(e) => tracing::warn!(
                instance = id,
                error = %e,
                "could not release in-flight steps at shutdown; the supervisor will once this \
                 instance's heartbeat is stale"
            ),
        }
        if let Err(e) = store.instance_stop(id, incarnation).await {
            tracing::debug!(error = %e, "could not mark the instance stopped");
        }
    }
}

/// Applies the duplicate policy to an insert outcome.
fn resolve(outcome: RunInsertOutcome, opts: StartOptions, workflow: &str) -> Result<Started> {
    match outcome {
        RunInsertOutcome::Inserted(id) => Ok(Started {
            id,
            created: true,
            state: RunState::Pending,
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

fn new_run(wf: &Workflow, input: String, business_key: Option<String>) -> NewRun {
    let id = Uuid::now_v7();
    let steps = wf
        .steps()
        .iter()
        .map(|s| NewStep {
            name: s.name().to_owned(),
            max_failures: s.settings().retry.max_failures_stored(),
            max_interruptions: s.settings().retry.max_interruptions_stored(),
            deadline_ms: millis(s.settings().deadline.initial),
            deadline_cap_ms: millis(s.settings().deadline.cap),
            // SAS-2: stable across every retry of this step in this run.
            idempotency_key: format!("{id}:{}", s.name()),
            ready: s.is_root(),
        })
        .collect();
    NewRun {
        id,
        workflow: wf.name().to_owned(),
        version: wf.version(),
        business_key,
        input,
        steps,
    }
}

/// Operator actions on runs (each recorded in the run's history; each resolves the run's open
/// alerts).
#[derive(Debug, Clone, Copy)]
pub struct Operator<'a> {
    engine: &'a Engine,
}

impl Operator<'_> {
    /// Retries a failed step (or failed compensation) of a run in `Error`.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn retry_step(&self, run_id: Uuid, step: &str) -> Result<RunState> {
        let a = operator::retry_step(&self.engine.inner.store, run_id, step).await?;
        Ok(self.after(a))
    }

    /// Requests compensation of a run that is not finished.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn compensate(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::compensate(&self.engine.inner.store, run_id).await?;
        Ok(self.after(a))
    }

    /// Resumes a run in `Error`, retrying the failed steps of the phase it stopped in.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn resume(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::resume(&self.engine.inner.store, run_id).await?;
        Ok(self.after(a))
    }

    /// Releases a run set aside for a damaged row (its error code is `corrupt_row`, and a
    /// `corrupt_row` alert names the table, row, column and value) once the row is repaired:
    /// the run goes back to the phase it was in, its parked steps are due again, and it is
    /// evaluated afresh (a row still damaged sets it aside again).
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] unless the run was set aside; [`Error::CorruptRow`] while a
    /// step row is still damaged; [`Error::RunNotFound`], [`Error::Db`].
    pub async fn release(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::release(&self.engine.inner.store, run_id).await?;
        Ok(self.after(a))
    }

    /// Records that the effect of `step` was undone by hand after its compensation failed;
    /// the run goes on compensating the remaining steps.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn mark_compensated(&self, run_id: Uuid, step: &str) -> Result<RunState> {
        let a = operator::mark_compensated(&self.engine.inner.store, run_id, step).await?;
        Ok(self.after(a))
    }

    /// Marks an alert resolved (e.g. an `unknown_version` alert once the version is deployed).
    /// Returns whether an open alert was resolved.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn resolve_alert(&self, alert_id: i64) -> Result<bool> {
        self.engine.inner.store.alert_resolve(alert_id).await
    }

    fn after(&self, a: EvalApplied) -> RunState {
        let hub = &self.engine.inner.hub;
        hub.publish(RunEvent {
            run_id: a.before.id,
            workflow: a.before.workflow.clone(),
            state: a.state,
        });
        hub.eval.notify_one();
        hub.claim.notify_one();
        a.state
    }
}
