//! The scheduler (SAS-1, SAS-5): claims due steps in batches, hands them to agents, writes
//! their results through fenced batch writes, and advances runs through the transition module.
//!
//! Four loops per engine instance, all on one `TaskTracker` and watching one
//! `CancellationToken`:
//! - **claim**: takes up to `claim_batch` due steps in one statement while in-flight slots are
//!   free, loads their inputs in two queries, and sends a [`Dispatch`] per step to the agents;
//! - **complete** (`completion_writers` of them): drain agent responses, decide complete /
//!   retry with backoff / fail, and write each batch in one transaction;
//! - **evaluate**: takes runs marked dirty (by the supervisor, operators, stale guards) and
//!   applies the planner's decisions under their row locks; raises alerts and publishes status
//!   events. Runs touched by a result batch are evaluated inline, in the batch's transaction;
//! - **listen** (PostgreSQL): wakes the other loops on `NOTIFY sagaflow_ready` from any
//!   process.
//!
//! Restart recovery (SAS-5) needs no special path: queued steps are simply claimed again,
//! dirty runs evaluated again, and steps left `Running` by a dead process expire and are
//! re-queued by the supervisor.

mod catalog;
mod claim;
mod complete;
mod evaluate;
mod inflight;
mod listen;
mod services;

pub use catalog::Catalog;
pub use complete::{FinishOutcome, finish_batch};
pub use evaluate::plan_and_apply;
pub use inflight::CANCEL_POLL;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::definition::Registry;
use crate::protocol::{AgentResponse, Dispatch};
use crate::signals::Signals;
use crate::store::Store;
use crate::{Error, Result};

/// Default maximum of steps in flight per engine instance.
pub const MAX_IN_FLIGHT_DEFAULT: usize = 256;
/// Default number of steps claimed per statement.
pub const CLAIM_BATCH_DEFAULT: u32 = 64;
/// Default pause after a poll that found nothing (a local submission wakes the loop at once).
pub const EMPTY_POLL_PAUSE_DEFAULT: Duration = Duration::from_millis(500);
/// Default pause after a database error.
pub const ERROR_PAUSE_DEFAULT: Duration = Duration::from_secs(2);
/// Default pause after a successful claim (AT-6: leaves room for intake).
pub const SUCCESS_PAUSE_DEFAULT: Duration = Duration::ZERO;
/// Default maximum of results written per transaction.
pub const COMPLETE_BATCH_DEFAULT: usize = 128;
pub use crate::store::{COMPLETION_WRITERS_RANGE, completion_writers_default};

/// Default largest serialized step output.
pub const MAX_PAYLOAD_DEFAULT: usize = 256 * 1024;

/// Scheduler settings (AT-6: concurrency and pauses are configuration).
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// This instance's id, written to `LockedBy`.
    pub owner: String,
    /// Steps in flight at most.
    pub max_in_flight: usize,
    /// Steps per claim statement.
    pub claim_batch: u32,
    /// Pause after an empty poll.
    pub empty_poll_pause: Duration,
    /// Pause after an error.
    pub error_pause: Duration,
    /// Pause after a successful claim.
    pub success_pause: Duration,
    /// Results per write transaction.
    pub complete_batch: usize,
    /// Result batches written concurrently, each in its own transaction on its own
    /// connection. Batches lock their runs in id order, so concurrent writers cannot
    /// deadlock on runs; on SQLite they take turns at the single connection.
    pub completion_writers: usize,
    /// Largest step output, serialized.
    pub max_payload_bytes: usize,
    /// Test hook (see [`Freeze`]). Never set outside tests.
    #[doc(hidden)]
    pub freeze_in_transaction: Option<std::sync::Arc<Freeze>>,
    /// Test hook (see [`crate::crash::CrashHook`]). Never set outside tests.
    #[doc(hidden)]
    pub crash: Option<std::sync::Arc<crate::crash::CrashHook>>,
}

/// Test hook: the first completion batch that reaches the middle of its transaction (its
/// runs locked, its results written, nothing committed) stops there for good and notifies
/// `reached`, and the instance claims nothing more: a process frozen at the worst moment.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct Freeze {
    /// Notified when the freeze happens.
    pub reached: tokio::sync::Notify,
    frozen: std::sync::atomic::AtomicBool,
}

impl Freeze {
    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) async fn freeze(&self) {
        self.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
        self.reached.notify_one();
        std::future::pending::<()>().await;
    }
}

impl SchedulerConfig {
    /// Defaults with the given owner id.
    pub fn new(owner: impl Into<String>) -> Self {
        Self {
            owner: owner.into(),
            max_in_flight: MAX_IN_FLIGHT_DEFAULT,
            claim_batch: CLAIM_BATCH_DEFAULT,
            empty_poll_pause: EMPTY_POLL_PAUSE_DEFAULT,
            error_pause: ERROR_PAUSE_DEFAULT,
            success_pause: SUCCESS_PAUSE_DEFAULT,
            complete_batch: COMPLETE_BATCH_DEFAULT,
            completion_writers: completion_writers_default(),
            max_payload_bytes: MAX_PAYLOAD_DEFAULT,
            freeze_in_transaction: None,
            crash: None,
        }
    }

    /// Checks cross-field rules.
    ///
    /// # Errors
    /// [`Error::Config`].
    pub fn validate(&self) -> Result<()> {
        if self.owner.is_empty() {
            return Err(Error::Config("scheduler owner id must not be empty".into()));
        }
        if self.max_in_flight == 0
            || self.claim_batch == 0
            || self.complete_batch == 0
            || self.completion_writers == 0
        {
            return Err(Error::Config(
                "max_in_flight, claim_batch, complete_batch and completion_writers must be at least 1"
                    .into(),
            ));
        }
        if self.empty_poll_pause.is_zero() {
            return Err(Error::Config(
                "empty_poll_pause must be positive (it bounds polling)".into(),
            ));
        }
        Ok(())
    }
}

/// One scheduler instance.
#[derive(Debug)]
pub struct Scheduler {
    store: Store,
    /// What attempts are given beyond their inputs (callback tokens, child undo).
    services: Arc<services::Services>,
    /// The registry and its claim filter, swapped when definitions are (un)registered.
    catalog: catalog::Current,
    signals: Arc<Signals>,
    config: SchedulerConfig,
    slots: Arc<Semaphore>,
    in_flight: inflight::InFlight,
    /// Set while this instance's liveness is in doubt (its heartbeat is late): it claims
    /// nothing and has stopped its attempts (see [`Scheduler::fence`]).
    fenced: std::sync::atomic::AtomicBool,
}

impl Scheduler {
    /// Whether the leased step calls a resource (its attempt counts against its limits).
    fn holds_resource(&self, lease: &crate::protocol::StepLease) -> bool {
        let catalog = self.catalog();
        !catalog.resources.is_empty()
            && catalog
                .registry
                .by_key(&lease.workflow_key)
                .and_then(|w| w.step(&lease.step))
                .is_some_and(|d| d.resource().is_some())
    }

    /// A scheduler over `store` running the workflows of `registry`.
    ///
    /// # Errors
    /// [`Error::Config`].
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        signals: Arc<Signals>,
        config: SchedulerConfig,
    ) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            slots: Arc::new(Semaphore::new(config.max_in_flight)),
            services: Arc::new(services::Services(store.clone())),
            store,
            catalog: catalog::Current::new(registry),
            signals,
            config,
            in_flight: inflight::InFlight::default(),
            fenced: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Spawns the claim, complete and evaluate loops on `tracker`; they stop when `cancel`
    /// fires. Dispatches go to `agents`.
    pub fn spawn(
        self: Arc<Self>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
        agents: mpsc::Sender<Dispatch>,
    ) {
        let (reply_tx, reply_rx) =
            mpsc::channel::<AgentResponse>(self.config.max_in_flight.max(16));
        tracker.spawn(claim::run(self.clone(), cancel.clone(), agents, reply_tx));
        let reply_rx = Arc::new(tokio::sync::Mutex::new(reply_rx));
        for _ in 0..self.config.completion_writers {
            tracker.spawn(complete::run(
                self.clone(),
                cancel.clone(),
                reply_rx.clone(),
            ));
        }
        tracker.spawn(evaluate::run(self.clone(), cancel.clone()));
        tracker.spawn(inflight::watch(self.clone(), cancel.clone()));
        tracker.spawn(listen::run(self, cancel));
    }

    /// Stops this instance's forward attempts of a run (an operator cancelled it): their
    /// cancellation tokens fire and their agents answer `cancelled` at once. Returns how many
    /// attempts were stopped. Other instances notice within [`CANCEL_POLL`].
    pub fn cancel_attempts(&self, run_id: uuid::Uuid) -> usize {
        self.in_flight.cancel_forward(run_id)
    }

    /// Stops every attempt in flight on this instance, of both phases, and claims nothing
    /// until [`Scheduler::unfence`]: called when the instance's heartbeat is late, before
    /// any other instance may count it dead and take its steps over. A compensation must
    /// never start while a forward attempt of its step may still act, and two attempts of a
    /// step must not overlap: an instance that cannot prove it is alive stops acting first.
    /// Returns how many attempts were stopped; their results are written as any stopped
    /// attempt's are (fenced: a step taken over meanwhile keeps what its new owner wrote).
    pub fn fence(&self) -> usize {
        self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
        self.in_flight.cancel_all()
    }

    /// Claims again after a [`Scheduler::fence`] (the heartbeat landed).
    pub fn unfence(&self) {
        if self.fenced.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.in_flight.clear_fenced();
            self.signals.wake_claimer();
        }
    }

    /// Whether the instance is fenced (see [`Scheduler::fence`]).
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Moves the local deadlines of this instance's attempts of a run later by `by` (an
    /// operator extended their stored deadlines). Returns how many. Other instances follow
    /// the stored deadlines within [`CANCEL_POLL`].
    pub fn extend_attempts(&self, run_id: uuid::Uuid, by: std::time::Duration) -> usize {
        self.in_flight.extend_run(run_id, by)
    }

    /// Spawns only the PostgreSQL wake-up listener (none on SQLite), which wakes through this
    /// scheduler's [`Signals`]. Test hook: [`Scheduler::spawn`] runs it with the other loops.
    #[doc(hidden)]
    pub fn spawn_listener(self: Arc<Self>, tracker: &TaskTracker, cancel: CancellationToken) {
        tracker.spawn(listen::run(self, cancel));
    }

    /// What this scheduler runs now: the registry and the claim filter derived from it.
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load()
    }

    /// The workflow definitions this scheduler runs now.
    pub fn registry(&self) -> Arc<Registry> {
        self.catalog.load().registry.clone()
    }

    /// Runs the definitions of `registry` from now on: the next claim and evaluation passes
    /// use its keys and resources (both loops are woken), while attempts in flight finish
    /// with the definitions they started with. A definition taken out stays known to
    /// `registry` by its key (see [`Registry::unregister`]), so that their results are
    /// written and their runs evaluated as usual.
    pub fn set_registry(&self, registry: Arc<Registry>) {
        self.catalog.store(registry);
        self.signals.wake_claimer();
        self.signals.wake_evaluator();
    }

    /// The scheduler's owner id.
    pub fn owner(&self) -> &str {
        &self.config.owner
    }

    /// Whether this instance crashes (test hook) at `point` of an attempt of `step`, or
    /// crashed before: the caller then stops without writing anything.
    fn crashes(&self, point: crate::crash::CrashPoint, lease: &crate::protocol::StepLease) -> bool {
        self.config.crash.as_deref().is_some_and(|c| {
            c.hit(
                point,
                &lease.step,
                lease.state == crate::StepState::Compensating,
            )
        })
    }
}

/// Sleeps for `d` or until cancelled; returns `false` when cancelled.
pub(crate) async fn pause(cancel: &CancellationToken, d: Duration) -> bool {
    if d.is_zero() {
        return !cancel.is_cancelled();
    }
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = cancel.cancelled() => false,
    }
}

/// Logs a database error once per incident, not once per poll (AT-8).
#[derive(Debug, Default)]
pub struct ErrorStreak {
    failures: u64,
}

impl ErrorStreak {
    /// Records a failure of `what`; logs the first of a streak and then at powers of two.
    pub fn failed(&mut self, what: &str, e: &Error) {
        self.failures += 1;
        if self.failures == 1 {
            tracing::warn!(error = %e, task = what, "failed; retrying with backoff");
        } else if self.failures.is_power_of_two() {
            tracing::warn!(error = %e, task = what, failures = self.failures, "still failing");
        }
    }

    /// Records a success; logs the end of a streak once.
    pub fn succeeded(&mut self, what: &str) {
        if self.failures > 0 {
            tracing::info!(task = what, failures = self.failures, "recovered");
            self.failures = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{COMPLETION_WRITERS_RANGE, completion_writers_default};
    use crate::store::{PG_POOL_BESIDE_WRITERS, pg_pool_default};

    #[test]
    fn writers_follow_the_cores_within_their_range_and_the_pool_makes_room_for_them() {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let (min, max) = COMPLETION_WRITERS_RANGE;
        let writers = completion_writers_default();
        assert_eq!(writers, cores.clamp(min, max));
        assert_eq!(
            pg_pool_default(),
            PG_POOL_BESIDE_WRITERS + u32::try_from(writers).expect("small")
        );
    }
}
