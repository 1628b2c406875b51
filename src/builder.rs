//! Configuring and starting an engine.

use std::sync::Arc;
use std::time::Duration;

use sagaflow_engine::resource::Resource;
use sagaflow_engine::scheduler::SchedulerConfig;
use sagaflow_engine::store::{SqliteSync, StoreOptions, redact_url};
use sagaflow_engine::{
    Alert, Error, LogSink, NoticeSink, Registry, Result, Store, Workflow, WorkflowDescription,
};
use sagaflow_supervisor::{HEARTBEAT_INTERVAL_DEFAULT, SupervisorConfig};

use crate::engine::Engine;

/// Default largest serialized run input.
pub const MAX_INPUT_DEFAULT: usize = 256 * 1024;

/// Builds an [`Engine`]. Setters are `with_*`; [`EngineBuilder::start`] checks everything and
/// starts the background loops.
#[must_use]
pub struct EngineBuilder {
    url: Option<String>,
    store_options: StoreOptions,
    /// A read replica for display reads ([`EngineBuilder::with_read_replica`]).
    replica_url: Option<String>,
    registry: Registry,
    errors: Vec<Error>,
    sinks: Vec<Arc<dyn NoticeSink>>,
    resources: Vec<Resource>,
    schedules: Vec<sagaflow_engine::cron::Schedule>,
    pub(crate) scheduler: SchedulerConfig,
    pub(crate) supervisor: SupervisorConfig,
    run_supervisor: bool,
    workers: bool,
    published: bool,
    max_input_bytes: usize,
    heartbeat_every: Duration,
    pub(crate) admin: Option<(std::net::SocketAddr, crate::admin::AdminConfig)>,
    pub(crate) migrations: Vec<sagaflow_engine::migration::Migration>,
    pause_hook: Option<Arc<sagaflow_engine::interleave::PauseHook>>,
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("store_options", &self.store_options)
            .field("scheduler", &self.scheduler)
            .field("supervisor", &self.supervisor)
            .finish_non_exhaustive()
    }
}

impl Default for EngineBuilder {
    fn default() -> Self {
        let id = format!("{}-{}", hostname(), uuid::Uuid::now_v7().simple());
        Self {
            url: None,
            store_options: StoreOptions::default(),
            replica_url: None,
            registry: Registry::new(),
            errors: Vec::new(),
            sinks: vec![Arc::new(LogSink)],
            resources: Vec::new(),
            schedules: Vec::new(),
            scheduler: SchedulerConfig::new(id.clone()),
            supervisor: SupervisorConfig::new(id),
            run_supervisor: true,
            workers: true,
            published: false,
            max_input_bytes: MAX_INPUT_DEFAULT,
            heartbeat_every: HEARTBEAT_INTERVAL_DEFAULT,
            admin: None,
            migrations: Vec::new(),
            pause_hook: None,
        }
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("pid{}", std::process::id()))
}

impl EngineBuilder {
    /// The database: `sqlite://path/to/file.db?mode=rwc` or `postgres://user@host/db`.
    pub fn with_database_url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// PostgreSQL pool size.
    pub fn with_pool_size(mut self, n: u32) -> Self {
        self.store_options.pool_size = Some(n);
        self
    }

    /// How long to wait for the database: to establish a connection, and for a pooled one
    /// (defaults: 5 s each). An unreachable database fails [`EngineBuilder::start`] after
    /// `connect` with the driver's cause.
    pub fn with_connect_timeouts(mut self, connect: Duration, acquire: Duration) -> Self {
        self.store_options.connect_timeout = connect;
        self.store_options.acquire_timeout = acquire;
        self
    }

    /// When an SQLite commit is on disk: [`SqliteSync::Full`] (the default) or
    /// [`SqliteSync::Normal`], faster but able to lose the last commits to a power loss (see
    /// its documentation). No effect on PostgreSQL.
    pub fn with_sqlite_sync(mut self, sync: SqliteSync) -> Self {
        self.store_options.sqlite_sync = sync;
        self
    }

    /// Serves display reads from a PostgreSQL read replica (a streaming standby, or a load
    /// balancer in front of several): the console, the HTTP API's reads and event streams,
    /// [`Engine::follow`], and the listing and counting reads of Rust code
    /// ([`Engine::list_runs`], [`Engine::run_counts`], [`Engine::stats`] and the other
    /// overviews). These may lag the primary by [`Engine::replica_lag`]; the console shows by
    /// how much. Writes, the decisions they rest on, and the reads of one run by Rust code
    /// ([`Engine::run`], [`Engine::steps`], [`Engine::history`], [`Engine::wait`]) stay on
    /// the primary, so a run just started is always found there. `start` fails with
    /// [`Error::Config`] for an SQLite URL or a list of servers, and as a database start
    /// does when the replica cannot be reached or its schema is not this release's.
    pub fn with_read_replica(mut self, url: impl Into<String>) -> Self {
        self.replica_url = Some(url.into());
        self
    }

    /// All connection settings and PostgreSQL session limits at once (see [`StoreOptions`]).
    pub fn with_store_options(mut self, options: StoreOptions) -> Self {
        self.store_options = options;
        self
    }

    /// Moves the database clock this engine reads by the [`TestClock`]'s offset, so that a
    /// test can let hours pass at once: deadlines, backoff, scheduled starts, rate limits and
    /// time windows all see the moved time. For tests only; give every engine of the test
    /// the same clock.
    ///
    /// [`TestClock`]: crate::testing::TestClock
    #[cfg(feature = "testing")]
    pub fn with_test_clock(mut self, clock: crate::testing::TestClock) -> Self {
        self.store_options.test_clock = Some(clock);
        self
    }

    /// Whether [`EngineBuilder::start`] applies the schema migrations the database lacks
    /// (default: yes, under the engines' migration lock). Off, the start changes no schema:
    /// it fails with [`Error::SchemaOutOfDate`] unless the database's schema is exactly
    /// this release's. For tools that must not migrate, such as the `sagaflow` command's
    /// reads and actions. (Moving runs between workflow versions is another thing:
    /// [`EngineBuilder::with_migration`].)
    pub fn with_schema_migrations(mut self, on: bool) -> Self {
        self.store_options.migrate = on;
        self
    }

    /// The former name of [`EngineBuilder::with_schema_migrations`], one letter away from
    /// [`EngineBuilder::with_migration`], which moves runs between workflow versions.
    #[deprecated(since = "0.2.0", note = "renamed to `with_schema_migrations`")]
    pub fn with_migrations(self, on: bool) -> Self {
        self.with_schema_migrations(on)
    }

    /// Registers a workflow definition (several versions of one name may be registered).
    pub fn with_workflow(mut self, wf: Workflow) -> Self {
        if let Err(e) = self.registry.register(wf) {
            self.errors.push(e);
        }
        self
    }

    /// Registers a workflow given as the result of its builder, so a definition error surfaces
    /// from [`EngineBuilder::start`].
    pub fn with_workflow_result(mut self, wf: Result<Workflow>) -> Self {
        match wf {
            Ok(wf) => self.with_workflow(wf),
            Err(e) => {
                self.errors.push(e);
                self
            }
        }
    }

    /// Adds a sink the outbox delivers notices to (alerts, and the finishes of runs whose
    /// start asked for a notification): a [`crate::WebhookSink`], a
    /// [`crate::ChannelSink`], or an application's own [`NoticeSink`]. The supervisor leader
    /// delivers each notice to every sink at least once; its name must be unique among the
    /// engine's sinks and stay the same across restarts. The [`LogSink`] is present unless
    /// [`EngineBuilder::without_log_sink`] is called.
    pub fn with_notice_sink(mut self, sink: impl NoticeSink) -> Self {
        self.sinks.push(Arc::new(sink));
        self
    }

    /// The former name of [`EngineBuilder::with_notice_sink`]: a sink receives every notice,
    /// not only alerts.
    #[deprecated(since = "0.2.0", note = "renamed to `with_notice_sink`")]
    pub fn with_alert_sink(self, sink: impl NoticeSink) -> Self {
        self.with_notice_sink(sink)
    }

    /// Declares a remote resource and the limits its steps' attempts obey
    /// ([`WorkflowBuilder::resource`](crate::WorkflowBuilder::resource)): concurrency across
    /// every instance and per flow key, rate, time windows, batches, a circuit breaker. The
    /// limits are written to the database at start as the resource's defaults; an operator's
    /// override, set at run time, wins over them until cleared. Every resource a registered
    /// step names must be declared. An [`HttpAgent`](crate::http::HttpAgent) declares the
    /// resource it calls: `.with_resource(&payments)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use sagaflow::{Engine, Resource};
    ///
    /// let builder = Engine::builder()
    ///     .with_resource(Resource::new("payments-api").max_in_flight(8).rate(20, Duration::from_secs(1)));
    /// ```
    pub fn with_resource(mut self, resource: impl Into<Resource>) -> Self {
        let resource: Resource = resource.into();
        if let Err(e) = resource.check() {
            self.errors.push(e);
        } else if self.resources.iter().any(|r| r.name() == resource.name()) {
            self.errors.push(Error::Config(format!(
                "resource `{}` is declared twice",
                resource.name()
            )));
        } else {
            self.resources.push(resource);
        }
        self
    }

    /// Leaves the [`LogSink`] out (notices are then only delivered to the sinks added).
    pub fn without_log_sink(mut self) -> Self {
        self.sinks.retain(|s| s.name() != LogSink.name());
        self
    }

    /// How often the supervisor leader delivers pending notices when nothing wakes it
    /// sooner (default 1 s; a notice stored by the leader's own instance wakes it at once).
    pub fn with_delivery_interval(mut self, d: Duration) -> Self {
        self.supervisor.delivery_interval = d;
        self
    }

    /// How often the supervisor leader's timer pass wakes parked steps whose time came
    /// (default 1 s): timers fire, and waits for events, callbacks and children time out, at
    /// most this late.
    pub fn with_timer_interval(mut self, d: Duration) -> Self {
        self.supervisor.timer_interval = d;
        self
    }

    /// How often the supervisor leader reads the workflows' queues (default 10 s): it sets
    /// the metrics' queue gauges and checks the workflows' backlog alerts.
    pub fn with_backlog_interval(mut self, d: Duration) -> Self {
        self.supervisor.backlog_interval = d;
        self
    }

    /// This instance's id (written to `LockedBy` and the leader lease).
    pub fn with_instance_id(mut self, id: impl Into<String>) -> Self {
        let id = id.into();
        self.scheduler.owner.clone_from(&id);
        self.supervisor.holder = id;
        self
    }

    /// Steps in flight at most in this instance.
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        self.scheduler.max_in_flight = n;
        self
    }

    /// Steps claimed per statement.
    pub fn with_claim_batch(mut self, n: u32) -> Self {
        self.scheduler.claim_batch = n;
        self
    }

    /// Result batches written concurrently (each in its own transaction).
    pub fn with_completion_writers(mut self, n: usize) -> Self {
        self.scheduler.completion_writers = n;
        self
    }

    /// Pause after an empty poll (local submissions wake the scheduler at once).
    pub fn with_poll_interval(mut self, d: Duration) -> Self {
        self.scheduler.empty_poll_pause = d;
        self
    }

    /// Pause after a database error.
    pub fn with_error_pause(mut self, d: Duration) -> Self {
        self.scheduler.error_pause = d;
        self
    }

    /// Pause after each successful claim (AT-6).
    pub fn with_success_pause(mut self, d: Duration) -> Self {
        self.scheduler.success_pause = d;
        self
    }

    /// Largest serialized run input.
    pub fn with_max_input_bytes(mut self, n: usize) -> Self {
        self.max_input_bytes = n;
        self
    }

    /// Largest serialized step output.
    pub fn with_max_output_bytes(mut self, n: usize) -> Self {
        self.scheduler.max_payload_bytes = n;
        self
    }

    /// Leader lease lifetime and renewal period.
    pub fn with_lease(mut self, ttl: Duration, renew_every: Duration) -> Self {
        self.supervisor.lease_ttl = ttl;
        self.supervisor.renew_interval = renew_every;
        self
    }

    /// How often this instance heartbeats, and how long an instance may stay silent before
    /// the supervisor treats it as dead and releases its in-flight steps (as interruptions,
    /// not failures). Defaults: every 500 ms, dead after 2 s.
    pub fn with_heartbeat(mut self, every: Duration, stale_after: Duration) -> Self {
        self.heartbeat_every = every;
        self.supervisor.instance_stale_after = stale_after;
        self
    }

    /// Supervisor sweep period.
    pub fn with_sweep_interval(mut self, d: Duration) -> Self {
        self.supervisor.sweep_interval = d;
        self
    }

    /// How long the supervisor leader may go without completing a sweep before it gives up
    /// its lease so that another instance leads (LE-3). Default:
    /// [`SWEEP_STALL_SWEEPS_DEFAULT`](sagaflow_supervisor::SWEEP_STALL_SWEEPS_DEFAULT) sweep
    /// intervals, at least 5 s (5 s with the default sweep interval). Followers raise a `supervisor_stalled` alert when no leader has
    /// swept for twice as long. Must be at least two sweep intervals, otherwise
    /// [`EngineBuilder::start`] fails with [`Error::Config`].
    pub fn with_sweep_stall_after(mut self, d: Duration) -> Self {
        self.supervisor.sweep_stall_after = Some(d);
        self
    }

    /// Test hook: every supervisor sweep of this instance waits while `gate` is closed, as a
    /// sweep blocked on a stuck query would. Not part of the supported API.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn with_sweep_gate(mut self, gate: sagaflow_supervisor::SweepGate) -> Self {
        self.supervisor.sweep_gate = Some(gate);
        self
    }

    /// Retention of finished runs (`None`: keep forever).
    pub fn with_retention(mut self, d: Option<Duration>) -> Self {
        self.supervisor.retention = d;
        self
    }

    /// How often the supervisor leader applies the retention (default
    /// [`RETENTION_INTERVAL_DEFAULT`](crate::RETENTION_INTERVAL_DEFAULT), a
    /// minute): each pass deletes finished runs past the retention, in bounded statements.
    /// Zero is refused by [`EngineBuilder::start`].
    pub fn with_retention_interval(mut self, d: Duration) -> Self {
        self.supervisor.retention_interval = d;
        self
    }

    /// The priority aging period (default: `Some(`[`PRIORITY_AGING_DEFAULT`]`)`, a minute):
    /// a queued step gains one priority level per period it waits, up to
    /// [`PRIORITY_MAX`](crate::PRIORITY_MAX), so that low-priority work still progresses
    /// while higher priorities keep arriving. The supervisor leader raises them, on the
    /// database's clock. `None` turns aging off: a step then waits for as long as steps of
    /// higher priority are due. A period under 1 ms is refused by [`EngineBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sagaflow::Engine;
    ///
    /// // A step of priority 0 passes fresh work of priority 10 after ten minutes of waiting.
    /// let builder = Engine::builder().with_priority_aging(Some(Duration::from_secs(60)));
    /// ```
    ///
    /// [`PRIORITY_AGING_DEFAULT`]: crate::PRIORITY_AGING_DEFAULT
    pub fn with_priority_aging(mut self, period: Option<Duration>) -> Self {
        self.supervisor.priority_aging = period;
        self
    }

    /// Starts a workflow on the ticks of a recurring schedule (see [`crate::Schedule`]): the
    /// supervisor leader fires each tick once across the fleet, missed ticks as the
    /// schedule's policy says. The schedule is written to the database when the engine
    /// starts (the code is the truth: its next tick is kept while its expression and zone
    /// stay the same). [`EngineBuilder::start`] fails with [`Error::InvalidSchedule`] for a
    /// workflow this engine does not know, an input its schema refuses, or a name used twice.
    pub fn with_schedule(mut self, schedule: sagaflow_engine::cron::Schedule) -> Self {
        self.schedules.push(schedule);
        self
    }

    /// Whether this instance takes part in supervisor leader election (default: yes).
    pub fn with_supervisor(mut self, on: bool) -> Self {
        self.run_supervisor = on;
        self
    }

    /// Whether this instance runs steps (default: yes). A client-only instance (`false`)
    /// submits runs, waits for them and acts as operator, while worker instances elsewhere
    /// run the steps (on PostgreSQL they are woken by LISTEN/NOTIFY). It runs no scheduler,
    /// agents or supervisor.
    pub fn with_workers(mut self, on: bool) -> Self {
        self.workers = on;
        self
    }

    /// Makes a client-only engine for the workflows other engines published to the database
    /// (see [`Engine::definitions`]), with no code of its own: it starts runs of them, reads
    /// runs and acts as operator, and executes nothing (it implies `with_workers(false)`);
    /// the engines that have a workflow's code run its steps. A start uses the newest
    /// published version of the workflow, read at each start (a version published later is
    /// used without a restart), checks the input against its published JSON Schema and the
    /// input limit, applies the business key as any start does, and writes the same run and
    /// step rows as an engine with the code would. Such an engine registers no workflow
    /// ([`EngineBuilder::start`] fails with [`Error::Config`] if one was) and publishes none.
    /// This is what the `sagaflow serve` command runs.
    pub fn with_published_workflows(mut self) -> Self {
        self.published = true;
        self.workers = false;
        self
    }

    /// Test hook (see `sagaflow_engine::scheduler::Freeze`): the first completion batch
    /// freezes in the middle of its transaction, and the instance claims nothing more.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn with_freeze_in_transaction(
        mut self,
        freeze: Arc<sagaflow_engine::scheduler::Freeze>,
    ) -> Self {
        self.scheduler.freeze_in_transaction = Some(freeze);
        self
    }

    /// Test hook (see [`interleave`](crate::testing::interleave)): this instance's units of work stop
    /// at the pause points the hook holds. Not part of the supported API; tests use
    /// `sagaflow_testkit::SagaTest::hold`.
    #[doc(hidden)]
    #[cfg(feature = "testing")]
    pub fn with_pause_hook(mut self, hook: Arc<sagaflow_engine::interleave::PauseHook>) -> Self {
        self.pause_hook = Some(hook);
        self
    }

    /// Test hook (see `CrashHook`): this instance crashes, once, at the
    /// point the hook is armed at. Not part of the supported API; tests use
    /// `sagaflow_testkit::SagaTest::crash_at`.
    #[doc(hidden)]
    #[cfg(feature = "testing")]
    pub fn with_crash_hook(mut self, hook: Arc<sagaflow_engine::crash::CrashHook>) -> Self {
        self.scheduler.crash = Some(hook);
        self
    }

    /// Connects, migrates, and starts the scheduler, agents and (unless disabled) the
    /// supervisor.
    ///
    /// # Errors
    /// The first definition error; [`Error::Config`] for missing or inconsistent settings;
    /// [`Error::Db`] when the database cannot be reached or migrated.
    pub async fn start(mut self) -> Result<Engine> {
        if let Some(e) = self.errors.drain(..).next() {
            return Err(e);
        }
        // Whichever recorder the process installed learns what the metrics mean.
        sagaflow_engine::metrics::describe();
        if self.published {
            if !self.registry.is_empty() {
                return Err(Error::Config(
                    "an engine of published workflows registers no workflow of its own: drop \
                     with_workflow, or with_published_workflows"
                        .into(),
                ));
            }
            // It executes nothing, whatever `with_workers` said after.
            self.workers = false;
        } else if self.registry.is_empty() {
            return Err(Error::Config("no workflow registered".into()));
        }
        let mut names = std::collections::HashSet::new();
        for sink in &self.sinks {
            if sink.name().is_empty() || !names.insert(sink.name().to_owned()) {
                return Err(Error::Config(format!(
                    "alert sinks need distinct, non-empty names: `{}` is empty or taken",
                    sink.name()
                )));
            }
        }
        let mut backlog: std::collections::BTreeMap<String, _> = Default::default();
        for wf in self.registry.workflows() {
            if let Some(b) = wf.backlog_alert() {
                backlog.insert(wf.name().to_owned(), b);
            }
        }
        self.supervisor.backlog_alerts = backlog.into_iter().collect();
        for wf in self.registry.workflows() {
            for step in wf.steps() {
                if let Some(r) = step.resource()
                    && !self.resources.iter().any(|d| d.name() == r)
                {
                    return Err(Error::Config(format!(
                        "step `{}` of workflow `{}` calls resource `{r}`, which is not declared: \
                         add with_resource(Resource::new(\"{r}\")) with its limits",
                        step.name(),
                        wf.name()
                    )));
                }
            }
        }
        crate::schedule::check(&self.schedules, &self.registry, self.published)?;
        crate::migrate::check(&self.migrations, &self.registry)?;
        self.scheduler.validate()?;
        self.supervisor.validate()?;
        if self.max_input_bytes == 0 {
            return Err(Error::Config("max_input_bytes must be positive".into()));
        }
        if self.heartbeat_every.is_zero()
            || self.heartbeat_every >= self.supervisor.instance_stale_after
        {
            return Err(Error::Config(format!(
                "the heartbeat interval ({:?}) must be positive and shorter than the time after \
                 which an instance counts as dead ({:?})",
                self.heartbeat_every, self.supervisor.instance_stale_after
            )));
        }
        // The API's address first: a refused or taken address fails the start before
        // anything is written.
        let admin = match self.admin.take() {
            Some((addr, config)) => Some((crate::admin::serve::bind(addr, &config).await?, config)),
            None => None,
        };
        let store = match self.url.take() {
            Some(url) => {
                let store = Store::open(&url, &self.store_options).await?;
                match self.pause_hook.take() {
                    Some(hook) => store.with_pause_hook(hook),
                    None => store,
                }
            }
            None => {
                return Err(Error::Config("no database: call with_database_url".into()));
            }
        };
        let replica = match self.replica_url.take() {
            Some(url) => Some(Store::open_replica(&url, &self.store_options).await?),
            None => None,
        };
        // What this engine runs, published for consoles and HTTP clients; alerts about a
        // changed graph under an unchanged version are delivered once the engine is up.
        let descriptions: Vec<_> = self.registry.workflows().map(|w| w.describe()).collect();
        let (changed, heartbeat) = match self.register(&store, &descriptions).await {
            Ok(registered) => registered,
            Err(e) => return Err(store.lost_or(e)),
        };
        let declared = self.resources.iter().map(|r| r.name().to_owned()).collect();
        let stale_after = self.supervisor.instance_stale_after;
        let (supervisor, timer_interval) = {
            let t = self.supervisor.timer_interval;
            (self.supervisor, t)
        };
        let engine = Engine::launch(
            store,
            heartbeat,
            Arc::new(self.registry),
            self.sinks,
            self.scheduler,
            (self.run_supervisor && self.workers).then_some(supervisor),
            self.workers,
            self.published,
            self.max_input_bytes,
            declared,
            stale_after,
        )?;
        let _ = engine.inner.migrations.set(self.migrations);
        if let Some(replica) = replica {
            let _ = engine.inner.replica.set(replica);
        }
        if self.run_supervisor && self.workers {
            engine.spawn_automatic_migrations(timer_interval);
        }
        for a in &changed {
            engine.deliver_alert(a);
        }
        if let Some((listener, config)) = admin {
            engine.serve_admin(listener, config);
        }
        Ok(engine)
    }

    /// Publishes the definitions and, for an engine with workers, registers the instance;
    /// returns the alerts about changed definitions and the heartbeat to keep.
    async fn register(
        &self,
        store: &Store,
        descriptions: &[WorkflowDescription],
    ) -> Result<(Vec<Alert>, Option<crate::instance::Heartbeat>)> {
        let changed = store
            .definitions_publish(descriptions, &self.scheduler.owner)
            .await?;
        store.resources_publish(&self.resources).await?;
        store.schedules_publish(&self.schedules).await?;
        let heartbeat = if self.workers {
            let incarnation = uuid::Uuid::new_v4().simple().to_string();
            crate::instance::register(
                store,
                &self.scheduler.owner,
                &incarnation,
                &self.registry.keys(),
                self.supervisor.instance_stale_after,
            )
            .await?;
            Some(crate::instance::Heartbeat {
                incarnation,
                every: self.heartbeat_every,
                stale_after: self.supervisor.instance_stale_after,
            })
        } else {
            None
        };
        Ok((changed, heartbeat))
    }
}
