//! A harness for testing one's own sagas: an engine on a fresh database with a test clock
//! already wired, time travel that the engine notices at once, crashes at named points of a
//! step, restarts on the same database, and assertions on runs and their history.
//!
//! ```no_run
//! use std::time::Duration;
//! use sagaflow::{HistoryKind, RunState, StepContext, StepError, Workflow};
//! use sagaflow::testing::CrashPoint;
//! use sagaflow_testkit::SagaTest;
//!
//! # async fn example() {
//! let order = Workflow::builder("order", 1)
//!     .step("charge", |_: StepContext| async { Ok::<_, StepError>("charged") })
//!     .build()
//!     .expect("valid");
//! let mut t = SagaTest::new([order]).sqlite().await;
//! t.crash_at("charge", CrashPoint::BeforeCall);
//! let id = t.start("order", &()).await;
//! t.restart().await; // waits for the crash, then a fresh engine on the same database
//! t.expect(id, RunState::Completed).await;
//! assert!(t.history_kinds(id).await.contains(&HistoryKind::Interrupted));
//! t.shutdown().await;
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use sagaflow::testing::{CrashHook, CrashPoint, TestClock};
use sagaflow::{
    Engine, EngineBuilder, HistoryEvent, HistoryKind, Run, RunState, StepState, Uuid, Workflow,
};

use sagaflow::testing::interleave::{Held, PauseHook, Point, Unit};

use crate::db::{TestDb, sqlite_db};
use crate::effects::{Effect, EffectLedger};
use crate::engine::{fast_builder_on, init_logging};
use crate::wait::{eventually_some, expect_state};

/// How long the harness waits for anything (a run to finish, a crash, a history entry).
pub const HARNESS_WAIT: Duration = Duration::from_secs(30);

/// The settings an engine of a [`SagaTest`] is built with, beyond the testkit's fast ones.
type Configure = Arc<dyn Fn(EngineBuilder) -> EngineBuilder + Send + Sync>;

/// What a [`SagaTest`] runs: the workflows under test and the engine's settings. Made by
/// [`SagaTest::new`]; [`SagaTestBuilder::on`] or [`SagaTestBuilder::sqlite`] start it.
#[must_use]
pub struct SagaTestBuilder {
    workflows: Vec<Workflow>,
    configure: Option<Configure>,
}

impl std::fmt::Debug for SagaTestBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaTestBuilder")
            .field("workflows", &self.workflows.len())
            .finish_non_exhaustive()
    }
}

impl SagaTestBuilder {
    /// More engine settings (resources, sinks, a retention…), applied to every engine the
    /// test starts, the restarted ones included.
    pub fn with(
        mut self,
        configure: impl Fn(EngineBuilder) -> EngineBuilder + Send + Sync + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self
    }

    /// Starts the engine on `db` (which must outlive the test).
    ///
    /// # Panics
    /// When the engine does not start.
    pub async fn on(self, db: &TestDb) -> SagaTest {
        self.start(db.backend, db.url.clone(), None).await
    }

    /// Starts the engine on a fresh SQLite file, removed with the harness.
    ///
    /// # Panics
    /// When the engine does not start.
    pub async fn sqlite(self) -> SagaTest {
        let db = sqlite_db();
        let (backend, url) = (db.backend, db.url.clone());
        self.start(backend, url, Some(db)).await
    }

    async fn start(self, backend: &'static str, url: String, own: Option<TestDb>) -> SagaTest {
        init_logging();
        let mut t = SagaTest {
            backend,
            url,
            _db: own,
            workflows: self.workflows,
            configure: self.configure,
            clock: TestClock::new(),
            instance: format!("saga-test-{}", Uuid::new_v4().simple()),
            hook: Arc::new(CrashHook::new()),
            pauses: Arc::new(PauseHook::new()),
            engine: None,
        };
        t.engine = Some(t.launch().await);
        t
    }
}

/// An engine under test, on its own database, with a [`TestClock`] (docs/testing.md,
/// "Testing your saga", shows a whole test).
///
/// Every engine of the test has the same instance id: [`SagaTest::restart`] is a process
/// restarted in place, which releases what its predecessor left in flight at once (as
/// interruptions). Intervals are short (polls every 50 ms, sweeps every 100 ms), and
/// [`SagaTest::advance`] wakes the engine, so that time travel is noticed within
/// milliseconds.
pub struct SagaTest {
    backend: &'static str,
    url: String,
    _db: Option<TestDb>,
    workflows: Vec<Workflow>,
    configure: Option<Configure>,
    clock: TestClock,
    instance: String,
    hook: Arc<CrashHook>,
    pauses: Arc<PauseHook>,
    engine: Option<Engine>,
}

impl std::fmt::Debug for SagaTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaTest")
            .field("backend", &self.backend)
            .field("instance", &self.instance)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl SagaTest {
    /// A test of `workflows`; start it with [`SagaTestBuilder::on`] (a database of
    /// [`crate::backends`]) or [`SagaTestBuilder::sqlite`].
    // `SagaTest::new(workflows).on(&db)` reads as the test it starts; the builder between
    // carries the engine's settings.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(workflows: impl IntoIterator<Item = Workflow>) -> SagaTestBuilder {
        SagaTestBuilder {
            workflows: workflows.into_iter().collect(),
            configure: None,
        }
    }

    async fn launch(&self) -> Engine {
        let mut b = fast_builder_on(&self.url)
            .with_instance_id(self.instance.clone())
            .with_test_clock(self.clock.clone())
            .with_crash_hook(self.hook.clone())
            .with_pause_hook(self.pauses.clone());
        for wf in &self.workflows {
            b = b.with_workflow(wf.clone());
        }
        if let Some(configure) = &self.configure {
            b = configure(b);
        }
        b.start()
            .await
            .unwrap_or_else(|e| panic!("[{}] engine start: {e}", self.backend))
    }

    /// The engine running now (a new one after each [`SagaTest::restart`]).
    ///
    /// # Panics
    /// Never: a harness always has an engine.
    pub fn engine(&self) -> &Engine {
        self.engine
            .as_ref()
            .expect("the harness always has an engine")
    }

    /// The test clock every engine of the test reads.
    pub fn clock(&self) -> &TestClock {
        &self.clock
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Lets `by` pass at once: deadlines, backoff, scheduled starts, windows and retention
    /// see the moved time, and the engine is woken to look now (a due step is claimed and a
    /// passed deadline swept within milliseconds). Instances' heartbeats and the leader's
    /// lease run on the wall clock: nothing is judged dead by the jump.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.engine().wake_up();
    }

    /// Makes the engine crash, once, at `point` of the next attempt of the step named
    /// `step`: it stops dead there, writing nothing more and releasing nothing, as a killed
    /// process would. [`SagaTest::restart`] then starts a fresh engine on the same database.
    pub fn crash_at(&self, step: &str, point: CrashPoint) {
        self.hook.arm(step, point);
    }

    /// Like [`SagaTest::crash_at`], at `point` of the next *compensation* attempt of `step`
    /// (its forward attempts pass).
    pub fn crash_in_compensation_at(&self, step: &str, point: CrashPoint) {
        self.hook.arm_compensation(step, point);
    }

    /// Holds the engine's next unit of work `unit` (an operator's action, an evaluation, a
    /// completion batch…) at `point`, inside its transaction and with its locks, until the
    /// returned [`Held`] is released or dropped: the test acts meanwhile (lets a step's
    /// attempt go on, sends an event), then lets the unit finish, and checks what the two
    /// left. Armed once; it holds the first unit that reaches the point, also of an engine
    /// started by [`SagaTest::restart`].
    pub fn hold(&self, unit: Unit, point: Point) -> Held {
        self.pauses.hold(unit, point)
    }

    /// Holds the answer of the next forward attempt of `step` when it reaches the engine:
    /// the step's action returned (its effect happened) and nothing of its result is written;
    /// the step stays `running` until the returned [`Held`] is released or dropped. The test
    /// acts meanwhile (an operator cancels, an event arrives), knowing the attempt is in
    /// flight, however fast the step is.
    pub fn hold_answer(&self, step: &str) -> Held {
        self.pauses.hold_answer(step)
    }

    /// Whether the engine crashed at the point armed by [`SagaTest::crash_at`].
    pub fn has_crashed(&self) -> bool {
        self.engine().has_crashed()
    }

    /// Waits until the engine crashed at the point armed by [`SagaTest::crash_at`].
    ///
    /// # Panics
    /// When it does not within [`HARNESS_WAIT`].
    pub async fn crashed(&self) {
        let armed = self.hook.armed();
        if tokio::time::timeout(HARNESS_WAIT, self.hook.crashed())
            .await
            .is_err()
        {
            panic!(
                "[{}] the engine did not crash within {HARNESS_WAIT:?} (armed at {armed:?})",
                self.backend
            );
        }
    }

    /// Waits, without a bound, until the engine crashed at the armed point.
    pub(crate) async fn crashed_quietly(&self) {
        self.hook.crashed().await;
    }

    /// Starts a fresh engine on the same database, with the same clock and instance id, as
    /// a process restarted in place: it releases what its predecessor left in flight as
    /// interruptions, and runs it again. If a crash is armed, waits for it first; an engine
    /// that did not crash is shut down gracefully.
    ///
    /// # Panics
    /// When an armed crash does not happen in time, or the new engine does not start.
    pub async fn restart(&mut self) {
        if self.hook.armed().is_some() {
            self.crashed().await;
        }
        if let Some(old) = self.engine.take() {
            // After a crash this only waits for the stopped loops: a dead instance releases
            // nothing.
            old.shutdown().await;
        }
        self.hook = Arc::new(CrashHook::new());
        self.engine = Some(self.launch().await);
    }

    /// Starts a run of `workflow` with `input`.
    ///
    /// # Panics
    /// When the start is refused.
    pub async fn start<I: serde::Serialize>(&self, workflow: &str, input: &I) -> Uuid {
        self.engine()
            .start(workflow, input)
            .await
            .unwrap_or_else(|e| panic!("[{}] start of `{workflow}`: {e}", self.backend))
    }

    /// Waits until the run is finished (`Completed`, `Compensated` or `Error`) and returns
    /// it.
    ///
    /// # Panics
    /// When it does not finish within [`HARNESS_WAIT`].
    pub async fn finish(&self, id: Uuid) -> Run {
        self.engine()
            .wait(id, HARNESS_WAIT)
            .await
            .unwrap_or_else(|e| panic!("[{}] waiting for run {id}: {e}", self.backend))
    }

    /// Waits until the run is finished and asserts it ended in `state`.
    ///
    /// # Panics
    /// On a timeout or another state (with the run's history).
    pub async fn expect(&self, id: Uuid, state: RunState) -> Run {
        expect_state(self.engine(), id, state, self.backend).await
    }

    /// The run's history, oldest first.
    ///
    /// # Panics
    /// When it cannot be read.
    pub async fn history(&self, id: Uuid) -> Vec<HistoryEvent> {
        self.engine()
            .history(id)
            .await
            .unwrap_or_else(|e| panic!("[{}] history of run {id}: {e}", self.backend))
    }

    /// What happened to the run, in order (`Submitted`, `State`, `Completed`, `Timeout`,
    /// `Interrupted`…).
    ///
    /// # Panics
    /// When the history cannot be read.
    pub async fn history_kinds(&self, id: Uuid) -> Vec<HistoryKind> {
        self.history(id).await.into_iter().map(|e| e.kind).collect()
    }

    /// Waits until the run's history holds an event of `kind` and returns the first.
    ///
    /// # Panics
    /// When none comes within [`HARNESS_WAIT`].
    pub async fn wait_history(&self, id: Uuid, kind: HistoryKind) -> HistoryEvent {
        let what = format!(
            "[{}] a `{kind}` event in the history of run {id}",
            self.backend
        );
        eventually_some(HARNESS_WAIT, &what, || {
            let kind = kind.clone();
            async move {
                let history = self.engine().history(id).await.ok()?;
                history.into_iter().find(|e| e.kind == kind)
            }
        })
        .await
    }

    /// Waits until the step `step` of the run is in `state` (an attempt in flight:
    /// [`StepState::Running`]).
    ///
    /// # Panics
    /// When it is not within [`HARNESS_WAIT`].
    pub async fn wait_step(&self, id: Uuid, step: &str, state: StepState) {
        let what = format!("[{}] step `{step}` of run {id} {state}", self.backend);
        eventually_some(HARNESS_WAIT, &what, || async move {
            let steps = self.engine().steps(id).await.ok()?;
            steps
                .iter()
                .any(|s| s.name == step && s.state == state)
                .then_some(())
        })
        .await;
    }

    /// Shuts the engine down (gracefully, unless it crashed).
    pub async fn shutdown(self) {
        if let Some(engine) = &self.engine {
            engine.shutdown().await;
        }
    }
}

/// Asserts that the remote applied `operation` exactly once (one effect, whatever the
/// number of calls: repeats with the same idempotency key replay it) and returns that
/// effect.
///
/// # Panics
/// When it applied the operation zero or several times.
pub fn applied_once(ledger: &EffectLedger, operation: &str) -> Effect {
    let effects = ledger.effects_of(operation);
    match <[Effect; 1]>::try_from(effects) {
        Ok([effect]) => effect,
        Err(effects) => panic!(
            "`{operation}` applied {} times, expected exactly once: {effects:?}",
            effects.len()
        ),
    }
}
