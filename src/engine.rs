//! A running engine instance: its loops, its health, reading runs and alerts, waiting, and
//! shutdown. Starting runs is in `start.rs`, operator actions in `operator.rs`.

use std::sync::Arc;
use std::time::Duration;

use sagaflow_agents::AgentPool;
use sagaflow_engine::scheduler::{Scheduler, SchedulerConfig};
use sagaflow_engine::signals::{NoticeSink, RunEvent, Signals};
use sagaflow_engine::{
    Alert, Backend, Error, HistoryEvent, Registry, Result, Run, RunCounts, Step, StepRow, Store,
    Undo, UndoPreview,
    store::{PublishedDefinition, RunView, Stats, WorkflowQueue},
};
use sagaflow_supervisor::{Supervisor, SupervisorConfig, SupervisorStats};
use sea_orm::DatabaseConnection;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::builder::EngineBuilder;
use crate::operator::Operator;
use crate::submit::Submission;
use sagaflow_engine::store::{RunPage, RunQuery};

/// A snapshot of an instance's supervisor candidate (see [`Engine::supervisor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SupervisorStatus {
    leader: bool,
    stats: SupervisorStats,
}

impl SupervisorStatus {
    /// Whether it held the leader lease when asked.
    pub fn is_leader(&self) -> bool {
        self.leader
    }

    /// What it has done so far.
    pub fn stats(&self) -> SupervisorStats {
        self.stats
    }
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
async fn watch_database(store: Store, signals: Arc<Signals>, cancel: CancellationToken) {
    let check = async {
        if !store.has_file() {
            return std::future::pending().await;
        }
        loop {
            if let Err(e) = store.check_file() {
                signals.fail(e);
                return;
            }
            tokio::time::sleep(DATABASE_CHECK_EVERY).await;
        }
    };
    tokio::select! {
        () = check => {}
        _ = signals.fatal_error() => {}
        () = cancel.cancelled() => return,
    }
    cancel.cancel();
}

pub(crate) struct Inner {
    pub(crate) store: Store,
    pub(crate) signals: Arc<Signals>,
    pub(crate) scheduler: Arc<Scheduler>,
    pub(crate) supervisor: Option<Arc<Supervisor>>,
    pub(crate) tracker: TaskTracker,
    pub(crate) cancel: CancellationToken,
    pub(crate) max_input_bytes: usize,
    /// Starts use the published definitions, not the registry
    /// ([`EngineBuilder::with_published_workflows`]).
    pub(crate) published: bool,
    pub(crate) submit: mpsc::Sender<Submission>,
    /// This instance's registration (worker engines): its incarnation.
    pub(crate) incarnation: Option<String>,
    pub(crate) stopped: std::sync::atomic::AtomicBool,
    /// Where the API served by [`EngineBuilder::with_admin`] listens.
    pub(crate) admin_addr: std::sync::OnceLock<std::net::SocketAddr>,
    /// The crash hook of a test ([`EngineBuilder::with_crash_hook`]).
    pub(crate) crash: Option<Arc<sagaflow_engine::crash::CrashHook>>,
    /// The migrations between versions ([`EngineBuilder::with_migration`]), set once started.
    pub(crate) migrations: std::sync::OnceLock<Vec<sagaflow_engine::migration::Migration>>,
    /// The resources this engine declared: those the steps of a workflow registered at run
    /// time may call.
    pub(crate) declared_resources: Vec<String>,
    /// Taken while the registry changes, so that changes apply one after the other.
    pub(crate) registration: tokio::sync::Mutex<()>,
    /// How long an instance may stay silent before it counts as dead.
    pub(crate) stale_after: Duration,
    /// The read replica display reads go to ([`EngineBuilder::with_read_replica`]).
    pub(crate) replica: std::sync::OnceLock<Store>,
}

/// A run with its steps, its history and its alerts, read as of one moment
/// ([`Engine::run_detail`]): what the console's run page and `GET /api/v1/runs/{id}` show.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunDetail {
    /// The run.
    pub run: Run,
    /// Its steps, in the order of the workflow's definition (none once it finished: a
    /// finished run's story is its history).
    pub steps: Vec<Step>,
    /// Its history, oldest first.
    pub history: Vec<HistoryEvent>,
    /// Its alerts, open and resolved, oldest first.
    pub alerts: Vec<Alert>,
}

/// A running sagaflow instance: scheduler, agents and (usually) a supervisor candidate over
/// one database. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
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
        heartbeat: Option<crate::instance::Heartbeat>,
        registry: Arc<Registry>,
        sinks: Vec<Arc<dyn NoticeSink>>,
        scheduler: SchedulerConfig,
        supervisor: Option<SupervisorConfig>,
        workers: bool,
        published: bool,
        max_input_bytes: usize,
        declared_resources: Vec<String>,
        stale_after: Duration,
    ) -> Result<Self> {
        let signals = Arc::new(Signals::new(sinks));
        let tracker = TaskTracker::new();
        // An instance that can crash on purpose (a test hook) stops every loop at the crash.
        let crash = scheduler.crash.clone();
        let cancel = crash
            .as_ref()
            .map_or_else(CancellationToken::new, |c| c.token().child_token());
        let in_flight = scheduler.max_in_flight;
        let scheduler = Arc::new(Scheduler::new(
            store.clone(),
            registry.clone(),
            signals.clone(),
            scheduler,
        )?);
        let supervisor = match supervisor {
            Some(c) => Some(Arc::new(Supervisor::new(
                store.clone(),
                signals.clone(),
                c,
            )?)),
            None => None,
        };
        if workers {
            let (tx, rx) = mpsc::channel(in_flight.max(1));
            AgentPool::spawn(&tracker, cancel.clone(), rx);
            scheduler.clone().spawn(&tracker, cancel.clone(), tx);
            match (&supervisor, &crash) {
                (Some(s), None) => s.clone().spawn(&tracker, cancel.clone()),
                (Some(s), Some(c)) => s
                    .clone()
                    .spawn_killable(&tracker, cancel.clone(), c.token()),
                (None, _) => {}
            }
        }
        if let Some(beat) = &heartbeat {
            tracker.spawn(crate::instance::heartbeat(
                store.clone(),
                scheduler.clone(),
                beat.clone(),
                cancel.clone(),
            ));
        }
        let submit = crate::submit::spawn(store.clone(), signals.clone(), &tracker, cancel.clone());
        tracker.spawn(watch_database(
            store.clone(),
            signals.clone(),
            cancel.clone(),
        ));
        let engine = Self {
            inner: Arc::new(Inner {
                store,
                signals,
                scheduler,
                supervisor,
                tracker,
                cancel,
                max_input_bytes,
                published,
                submit,
                incarnation: heartbeat.map(|h| h.incarnation),
                stopped: std::sync::atomic::AtomicBool::new(false),
                admin_addr: std::sync::OnceLock::new(),
                crash,
                migrations: std::sync::OnceLock::new(),
                declared_resources,
                registration: tokio::sync::Mutex::new(()),
                stale_after,
                replica: std::sync::OnceLock::new(),
            }),
        };
        if let Some(s) = &engine.inner.supervisor {
            s.set_schedule_starter(crate::schedule::starter(&engine));
        }
        Ok(engine)
    }

    /// The overview figures of a console: the queue (due, scheduled, running steps), the
    /// age of the oldest due step, the unfinished runs per workflow and state, and the runs
    /// finished in the last 1, 5 and 15 minutes; each read through an index.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn stats(&self) -> Result<Stats> {
        self.reads().stats().await
    }

    /// The remote resources declared by the fleet's engines: their limits (the code's
    /// defaults and an operator's override), and how many attempts are in flight and how
    /// many due steps wait, by name.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn resources(&self) -> Result<Vec<crate::ResourceView>> {
        self.reads().resource_list().await
    }

    /// The queue per workflow: for each workflow with steps due, scheduled or in flight (all
    /// its versions together), the figures of [`Engine::stats`]'s queue: steps due now,
    /// queued for later and running, and how long its oldest due step has waited. One
    /// statement over the steps of unfinished runs, by workflow name.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn queue_by_workflow(&self) -> Result<Vec<WorkflowQueue>> {
        self.reads().queue_by_workflow().await
    }

    /// Reads the queue per workflow from the database and sets the metrics' queue gauges
    /// (see [`crate::metrics`]).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn refresh_queue_gauges(&self) -> Result<()> {
        sagaflow_engine::metrics::refresh_queue_gauges(&self.inner.store).await
    }

    /// One page of runs, filtered by workflow, state, business key and creation time,
    /// newest first or most failed attempts first, from an opaque cursor (the previous page's
    /// [`RunPage::next`]). Every page is one indexed range read, however far it is.
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine) -> sagaflow::Result<()> {
    /// use sagaflow::{RunOrder, RunQuery, RunState};
    /// let mut query = RunQuery::new().state(RunState::Error).order(RunOrder::Attempts);
    /// loop {
    ///     let page = engine.list_runs(&query).await?;
    ///     for run in &page.runs {
    ///         println!("{} {} failed attempts", run.id, run.failed_attempts);
    ///     }
    ///     match page.next {
    ///         Some(next) => query = query.after(next),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidQuery`] for a cursor the list did not give out; [`Error::Db`].
    pub async fn list_runs(&self, query: &RunQuery) -> Result<RunPage> {
        self.reads().run_list(query).await
    }

    /// Hands an alert raised outside the engine's loops to its sinks and subscribers.
    pub(crate) fn deliver_alert(&self, alert: &Alert) {
        self.inner.signals.alert(alert);
    }

    /// The workflow definitions published to the database by every engine that used it
    /// (name, version, step graph, policies, input schema), by name and version: what a
    /// console draws and an HTTP client validates inputs with, without this application's
    /// code. A stored description this release cannot read comes back as its decoding error.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn definitions(&self) -> Result<Vec<PublishedDefinition>> {
        self.reads().definition_list().await
    }

    /// Whether this instance is running, was shut down, or stopped on a fatal error.
    pub fn health(&self) -> Health {
        match self.inner.signals.fatal() {
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
        self.inner.signals.fatal_error().await
    }

    /// A run by id.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run(&self, id: Uuid) -> Result<Option<Run>> {
        self.inner
            .store
            .run_view(id)
            .await?
            .map(RunView::into_run)
            .transpose()
    }

    /// The newest retained run of `workflow` started with `business_key`, active or
    /// finished (e.g. to answer "what happened to order o-1?").
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_by_key(&self, workflow: &str, business_key: &str) -> Result<Option<Run>> {
        let row = self.inner.store.run_by_key(workflow, business_key).await?;
        row.map(RunView::into_run).transpose()
    }

    /// The steps of an unfinished run (finished runs keep their history; see
    /// [`Engine::history`]).
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn steps(&self, id: Uuid) -> Result<Vec<Step>> {
        let rows = self.inner.store.run_steps(id).await?;
        rows.into_iter().map(StepRow::into_step).collect()
    }

    /// What a `cancel` or a `compensate` of the run would do, before an operator asks for
    /// it: the compensations in order (a group's steps run side by side), which steps may
    /// have taken effect, the output each compensation reads and the resource it uses, what
    /// is left as it is and why, and how the run ends. It is worked out by the transition
    /// rules that carry the action out, on the run as it is now, each compensation taken to
    /// succeed; attempts in flight are ended as the action would end them, and
    /// [`UndoPreview::in_flight`] says so. Nothing is written.
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::ActionNotAllowed`] when the action would be refused
    /// (a finished run); [`Error::VersionNotFound`] when neither this engine nor the
    /// database's published definitions have the run's workflow version (an engine without
    /// the workflow's code, such as the command-line tool, plans over the published graph);
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn preview_undo(&self, id: Uuid, undo: Undo) -> Result<UndoPreview> {
        let mut previews = self.preview_undos(id, &[undo]).await?;
        previews.pop().ok_or(Error::RunNotFound(id))?
    }

    /// [`Engine::preview_undo`] of each of `undos`, over one read of the run, its steps and
    /// its definition (the console shows a cancel's and a compensate's side by side). The
    /// outer error is the read's; each preview may be refused on its own.
    pub(crate) async fn preview_undos(
        &self,
        id: Uuid,
        undos: &[Undo],
    ) -> Result<Vec<Result<UndoPreview>>> {
        let store = &self.inner.store;
        let run = store.run_get(id).await?.ok_or(Error::RunNotFound(id))?;
        let steps = store.run_steps(id).await?;
        let registry = self.inner.scheduler.registry();
        let rebuilt;
        let wf = match registry.get(&run.workflow, run.version) {
            Some(wf) => wf.as_ref(),
            None => {
                // An engine without the run's code (the command-line tool, a client-only
                // engine) plans over the graph its engines published: the preview needs the
                // steps, their roles, dependencies and compensations, never their code.
                let published = store
                    .definition_get(&run.workflow, run.version)
                    .await?
                    .and_then(|d| d.description.ok())
                    .ok_or_else(|| Error::VersionNotFound {
                        name: run.workflow.clone(),
                        version: run.version,
                        run_id: id,
                    })?;
                rebuilt = sagaflow_engine::Workflow::from_description(&published)?;
                &rebuilt
            }
        };
        Ok(undos
            .iter()
            .map(|&u| sagaflow_engine::transition::preview_undo(wf, &run, &steps, u))
            .collect())
    }

    /// A run's history, oldest first.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn history(&self, id: Uuid) -> Result<Vec<HistoryEvent>> {
        self.inner.store.run_history(id).await
    }

    /// Subscribes to status events of runs moved by this instance (SAS-8).
    pub fn subscribe(&self) -> broadcast::Receiver<RunEvent> {
        self.inner.signals.subscribe_events()
    }

    /// Subscribes to alerts raised by this instance.
    pub fn subscribe_alerts(&self) -> broadcast::Receiver<Alert> {
        self.inner.signals.subscribe_alerts()
    }

    /// Open alerts (from every instance sharing the database).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn open_alerts(&self) -> Result<Vec<Alert>> {
        self.reads().alert_list(None, true).await
    }

    /// Deliveries of the outbox's notices to the sinks, most recently changed first: all of
    /// them, or those in `state` (`DeliveryState::Dead`: the dead letters an operator may
    /// send again with [`Operator::redeliver`](crate::Operator::redeliver)). At most `limit`.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn deliveries(
        &self,
        state: Option<sagaflow_engine::DeliveryState>,
        limit: u32,
    ) -> Result<Vec<sagaflow_engine::Delivery>> {
        self.reads().delivery_list(state, limit).await
    }

    /// How the outbox's notices stand with the sink named `sink`: how many it delivered,
    /// has still to deliver, and gave up on. For a sink of this engine only the topics it
    /// takes are counted as pending. Zero pending means every notice stored so far reached
    /// it or was dead-lettered; an application about to stop can wait for that to hand its
    /// last alerts over (the next engine to lead on the database delivers what is left).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine) -> sagaflow::Result<()> {
    /// let hook = engine.delivery_counts("ops-webhook").await?;
    /// println!("{} delivered, {} pending, {} dead", hook.delivered, hook.pending, hook.dead);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn delivery_counts(&self, sink: &str) -> Result<sagaflow_engine::DeliveryCounts> {
        let own = self
            .inner
            .signals
            .sinks()
            .iter()
            .find(|s| s.name() == sink)
            .cloned();
        self.inner
            .store
            .delivery_counts(sink, |topic| own.as_ref().is_none_or(|s| s.accepts(topic)))
            .await
    }

    /// Every alert, open or resolved, oldest first (from every instance sharing the
    /// database; alerts of purged runs are gone with them).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn all_alerts(&self) -> Result<Vec<Alert>> {
        self.inner.store.alert_list(None, false).await
    }

    /// How many finished runs (`Completed` or `Compensated`) finished more than
    /// `older_than` ago (database clock): what [`Engine::purge_finished`] deletes, now or, on
    /// PostgreSQL, for a finished run in a day's partition, when the last run of its day
    /// is due too (at most a day later).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn finished_count(&self, older_than: Duration) -> Result<u64> {
        self.inner
            .store
            .run_count_finished(millis(older_than))
            .await
    }

    /// Deletes the runs that finished more than `older_than` ago (database clock), with
    /// their history and alerts, as the supervisor's retention sweep does (see
    /// [`EngineBuilder::with_retention`](crate::EngineBuilder::with_retention)), in bounded
    /// batches until none is left. On PostgreSQL their history goes with the partition of
    /// the day they started, dropped here once no kept run of that day needs it (a purged
    /// run's history is unreadable from the moment its run is deleted), and so do the
    /// finished runs that are not child runs: those of a day some run of which is still
    /// within `older_than` wait for it, at most a day (with `older_than` under a day they
    /// are deleted one by one instead). Returns how many runs were deleted or dropped.
    ///
    /// # Errors
    /// [`Error::Db`] (the batches deleted before it stay deleted).
    pub async fn purge_finished(&self, older_than: Duration) -> Result<u64> {
        /// Runs deleted per statement, as the retention sweep does.
        const BATCH: u32 = 1000;
        let age = millis(older_than);
        let total = self.inner.store.run_purge_due(age, BATCH).await?;
        let days = self.inner.store.history_partitions_maintain(age).await?;
        Ok(total + days.runs_dropped)
    }

    /// Alerts of one run, open or resolved.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_alerts(&self, id: Uuid) -> Result<Vec<Alert>> {
        self.inner.store.alert_list(Some(id), false).await
    }

    /// Waits until the run is `Completed`, `Compensated` or `Error`, at most `timeout`.
    /// Works for runs moved by other instances too (it re-reads the run periodically).
    ///
    /// # Errors
    /// [`Error::WaitTimeout`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn wait(&self, id: Uuid, timeout: Duration) -> Result<Run> {
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
        Operator {
            engine: self,
            audit: sagaflow_engine::operator::Audit::default(),
        }
    }

    /// What this instance's supervisor candidate reports, if it takes part in elections.
    pub fn supervisor(&self) -> Option<SupervisorStatus> {
        self.inner.supervisor.as_deref().map(|s| SupervisorStatus {
            leader: s.is_leader(),
            stats: s.stats(),
        })
    }

    /// The supervisor itself, for this project's own tests (the `internals` feature).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn supervisor_internals(&self) -> Option<&Supervisor> {
        self.inner.supervisor.as_deref()
    }

    /// How many retained runs are in each state (from every instance sharing the database).
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_counts(&self) -> Result<RunCounts> {
        self.reads().run_count_by_state().await
    }

    /// Steps waiting to run (`ready` and `compensation_ready`), across every instance: the
    /// backlog.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn queue_depth(&self) -> Result<u64> {
        let n = self.inner.store.step_queue_depth().await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Whether this instance crashed on purpose (its test's crash hook fired): its loops
    /// stopped dead, and shutting it down releases nothing.
    #[doc(hidden)]
    pub fn has_crashed(&self) -> bool {
        self.inner
            .crash
            .as_deref()
            .is_some_and(sagaflow_engine::crash::CrashHook::has_crashed)
    }

    /// Wakes this instance's scheduler and supervisor at once, as after a test moved its
    /// `TestClock`: steps that became due are claimed, and deadlines that
    /// passed are swept, without waiting for the next poll or sweep.
    #[doc(hidden)]
    pub fn wake_up(&self) {
        self.inner.signals.wake_claimer();
        self.inner.signals.wake_evaluator();
        if let Some(s) = &self.inner.supervisor {
            s.request_sweep();
        }
    }

    /// The store display reads go to: the read replica when one is configured
    /// ([`EngineBuilder::with_read_replica`]), else the primary.
    pub(crate) fn reads(&self) -> &Store {
        self.inner.replica.get().unwrap_or(&self.inner.store)
    }

    /// How far the read replica is behind the primary: zero once it has replayed all the
    /// primary had written when asked, else the time since the last transaction it replayed
    /// committed (by the two servers' clocks; an upper bound, since the primary may have been
    /// idle meanwhile); `None` without a replica.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn replica_lag(&self) -> Result<Option<Duration>> {
        match self.inner.replica.get() {
            Some(r) => {
                let lsn = self.inner.store.wal_position().await?;
                r.replica_lag(&lsn).await
            }
            None => Ok(None),
        }
    }

    /// Run `id` with its steps, its history and its alerts, read in one snapshot (a
    /// `REPEATABLE READ, READ ONLY` transaction on PostgreSQL, a read transaction on SQLite),
    /// so that they agree: [`Engine::run`], [`Engine::steps`] and [`Engine::history`] called
    /// one after another can each see a different moment (a run read `running`, then its
    /// history saying it completed). Read where display reads go (a replica may lag), or from
    /// the primary while the replica has not yet received the run. `None` when there is no
    /// such run (or retention purged it).
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`].
    pub async fn run_detail(&self, id: Uuid) -> Result<Option<RunDetail>> {
        let reads = self.reads();
        let detail = match reads.run_page(id).await? {
            Some(d) => d,
            None if reads.is_replica() => match self.inner.store.run_page(id).await? {
                Some(d) => d,
                None => return Ok(None),
            },
            None => return Ok(None),
        };
        Ok(Some(RunDetail {
            run: detail.run.into_run()?,
            steps: detail
                .steps
                .into_iter()
                .map(StepRow::into_step)
                .collect::<Result<Vec<_>>>()?,
            history: detail.history,
            alerts: detail.alerts,
        }))
    }

    /// A run read where display reads go, or from the primary while the replica has not yet
    /// received it.
    pub(crate) async fn run_shown(&self, id: Uuid) -> Result<Option<Run>> {
        let reads = self.reads();
        match reads.run_view(id).await? {
            Some(run) => run.into_run().map(Some),
            None if reads.is_replica() => self.run(id).await,
            None => Ok(None),
        }
    }

    /// Which database this engine runs on.
    pub fn backend(&self) -> Backend {
        self.inner.store.backend()
    }

    /// The store, for this project's own tests and tools (the `internals` feature).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
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
        if self.has_crashed() {
            // A crashed instance is dead: it releases nothing and is not marked stopped.
            return;
        }
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

/// A duration in whole milliseconds, saturating.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
