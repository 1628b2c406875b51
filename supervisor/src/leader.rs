//! The leader loop (LE-1..3): election, renewal with the fenced term, stepping down when the
//! lease cannot be renewed in time or the sweep stalls, and starting the maintenance services
//! for the length of each term.

use std::sync::{Arc, Mutex, PoisonError};

use sagaflow_engine::store::{Election, LeaderFence, RescueCounts};
use sagaflow_engine::{Result, Signals, Store};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, millis, run_service};
use crate::services::schedules::{ScheduleStarter, StarterSlot};
use crate::services::{Rescue, maintenance_services};
use crate::stall::StallWatch;
use crate::stats::{Counters, SupervisorStats};

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermEnd {
    /// The instance shuts down.
    Shutdown,
    /// The lease was taken over, or could not be renewed (in time).
    LeaseLost,
    /// No sweep completed within the stall threshold: the leader gave the lease up (LE-3).
    Stalled,
}

/// A supervisor instance; at most one per lease name leads at a time.
#[derive(Debug)]
pub struct Supervisor {
    pub(crate) store: Store,
    pub(crate) signals: Arc<Signals>,
    pub(crate) config: SupervisorConfig,
    /// The current term, while this instance leads.
    term: Mutex<Option<Arc<LeaderContext>>>,
    /// The rescue service, also driven directly by [`Supervisor::sweep_once`].
    rescue: Arc<Rescue>,
    /// What the leader starts each term.
    services: Vec<Arc<dyn MaintenanceService>>,
    stats: Arc<Counters>,
    /// What builds the runs of recurring schedules, once the engine gives it.
    starter: StarterSlot,
}

impl Supervisor {
    /// A supervisor over `store`.
    ///
    /// # Errors
    /// [`Error::Config`](sagaflow_engine::Error::Config).
    pub fn new(store: Store, signals: Arc<Signals>, config: SupervisorConfig) -> Result<Self> {
        config.validate()?;
        let rescue = Arc::new(Rescue::default());
        let starter = StarterSlot::default();
        let services = maintenance_services(&config, rescue.clone(), &signals, &starter);
        Ok(Self {
            store,
            signals,
            config,
            term: Mutex::new(None),
            rescue,
            services,
            stats: Arc::default(),
            starter,
        })
    }

    /// Gives the schedules service what builds the runs of recurring schedules (the engine,
    /// once it exists); no schedule fires before. Only the first call counts.
    pub fn set_schedule_starter(&self, starter: Arc<dyn ScheduleStarter>) {
        let _ = self.starter.set(starter);
    }

    /// Spawns the election loop: try to lead; while leading, renew and run the maintenance
    /// services.
    pub fn spawn(self: Arc<Self>, tracker: &TaskTracker, cancel: CancellationToken) {
        tracker.spawn(async move { self.election_loop(cancel).await });
    }

    /// Like [`Supervisor::spawn`], for an instance that can crash on purpose (a test's
    /// [`CrashHook`](sagaflow_engine::crash::CrashHook)): when `killed` fires, the election
    /// loop is dropped where it stands, and a term in progress ends without releasing the
    /// lease, which is left to expire as a killed process leaves it. `cancel` should be a
    /// child of `killed`, so that the term's services stop with it.
    pub fn spawn_killable(
        self: Arc<Self>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
        killed: CancellationToken,
    ) {
        tracker.spawn(async move {
            tokio::select! {
                biased;
                () = killed.cancelled() => {}
                () = self.election_loop(cancel) => {}
            }
        });
    }

    /// The fence of the current term, if this instance leads.
    pub fn fence(&self) -> Option<LeaderFence> {
        self.term().map(|t| t.fence.clone())
    }

    /// Whether this instance currently leads.
    pub fn is_leader(&self) -> bool {
        self.term().is_some()
    }

    /// What this instance did so far.
    pub fn stats(&self) -> SupervisorStats {
        self.stats.snapshot()
    }

    /// Wakes the leader's sweeper now instead of at its next tick.
    pub fn request_sweep(&self) {
        self.rescue.request();
    }

    /// Runs one sweep now if this instance leads (`None` otherwise). Tests use it to drive
    /// time-dependent recovery without waiting for the sweep interval.
    ///
    /// # Errors
    /// [`Error::Db`](sagaflow_engine::Error::Db); [`Error::LeaseLost`](sagaflow_engine::Error::LeaseLost)
    /// when the term ended meanwhile.
    pub async fn sweep_once(&self) -> Result<Option<RescueCounts>> {
        match self.term() {
            Some(ctx) => self.rescue.sweep(&ctx).await.map(Some),
            None => Ok(None),
        }
    }

    fn term(&self) -> Option<Arc<LeaderContext>> {
        self.term
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_term(&self, term: Option<Arc<LeaderContext>>) {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = term;
    }

    async fn election_loop(&self, cancel: CancellationToken) {
        let mut failures = 0u64;
        let mut watch = StallWatch::default();
        // Followers look as often as the leader sweeps: a dead leader's lease is taken
        // as soon as its heartbeat goes stale, not when the lease runs out.
        let every = self.config.renew_interval.min(self.config.sweep_interval);
        // After giving up a stalled term, this instance sits out a few elections so that
        // another one takes the lease (with the same id it could win it straight back).
        let mut sit_out_until: Option<Instant> = None;
        loop {
            if cancel.is_cancelled() {
                return;
            }
            if sit_out_until.is_none_or(|t| Instant::now() >= t) {
                sit_out_until = None;
                match self
                    .store
                    .leader_try_elect_with(&Election {
                        name: &self.config.lease_name,
                        holder: &self.config.holder,
                        ttl: self.config.lease_ttl,
                        stale_after: Some(self.config.instance_stale_after),
                        vacant_after: Some(self.config.stall_alert_after()),
                    })
                    .await
                {
                    Ok(Some(fence)) => {
                        failures = 0;
                        if self.lead(fence, &cancel).await == TermEnd::Stalled {
                            sit_out_until = Some(Instant::now() + every.saturating_mul(2));
                        }
                        continue;
                    }
                    Ok(None) => failures = 0,
                    Err(e) => {
                        failures += 1;
                        if failures == 1 {
                            tracing::warn!(error = %e, "leader election failed; will retry");
                        }
                    }
                }
            }
            self.watch_leader(&mut watch).await;
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = cancel.cancelled() => return,
            }
        }
    }

    /// One term: starts every maintenance service, renews until renewal fails or the sweep
    /// stalls, then stops the services and (unless the lease was lost) releases the lease.
    async fn lead(&self, fence: LeaderFence, cancel: &CancellationToken) -> TermEnd {
        tracing::info!(holder = %fence.holder, term = fence.term, "became supervisor leader");
        let ctx = Arc::new(LeaderContext::new(
            fence.clone(),
            self.store.clone(),
            self.signals.clone(),
            self.config.clone(),
            self.stats.clone(),
        ));
        self.set_term(Some(ctx.clone()));
        let gauge = sagaflow_engine::metrics::LeaderGauge::raise();
        Counters::add(&self.stats.terms_won, 1);
        let work = cancel.child_token();
        // Each service is dropped as soon as the work is cancelled, even in the middle of a
        // pass blocked on an await, so that the term really ends.
        let services = TaskTracker::new();
        for service in &self.services {
            let (service, ctx, work) = (service.clone(), ctx.clone(), work.clone());
            services.spawn(async move {
                tokio::select! {
                    () = run_service(service, ctx, work.clone()) => {}
                    () = work.cancelled() => {}
                }
            });
        }
        services.close();
        let stalled = self.renew(&ctx, &work).await;
        // LE-2: the leader's work stops the moment renewal fails.
        work.cancel();
        services.wait().await;
        self.set_term(None);
        drop(gauge);
        let end = if cancel.is_cancelled() {
            TermEnd::Shutdown
        } else if stalled {
            Counters::add(&self.stats.stalls, 1);
            TermEnd::Stalled
        } else {
            TermEnd::LeaseLost
        };
        if end != TermEnd::LeaseLost {
            // LE-2: a leader that ends releases the lease so another takes over at once.
            if let Err(e) = self.store.leader_release(&fence).await {
                tracing::debug!(error = %e, "could not release the leader lease; it will expire");
            }
        }
        end
    }

    /// Renews the lease every renew interval until the work is cancelled, a renewal fails or
    /// does not land in time, or the sweep stalls; returns whether it stalled (LE-3).
    async fn renew(&self, ctx: &LeaderContext, work: &CancellationToken) -> bool {
        let fence = &ctx.fence;
        let stall_after = self.config.stall_after();
        // A renewal must land before the lease could expire; one that takes longer counts
        // as failed (a hung database or a frozen process must not keep a zombie leader).
        let budget = self
            .config
            .lease_ttl
            .saturating_sub(self.config.renew_interval);
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.renew_interval) => {}
                () = work.cancelled() => return false,
            }
            // LE-3: the lease is renewed only while the sweep makes progress. A leader whose
            // sweep hangs (a query stuck on a lock, a wedged connection) would otherwise hold
            // the lease forever while nobody rescues anything.
            let idle = ctx.since_progress();
            if idle >= stall_after {
                tracing::warn!(
                    term = fence.term,
                    idle_ms = millis(idle),
                    stall_after_ms = millis(stall_after),
                    "no supervisor sweep completed within the stall threshold; stepping down"
                );
                return true;
            }
            match tokio::time::timeout(
                budget,
                self.store.leader_renew(fence, self.config.lease_ttl),
            )
            .await
            {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    tracing::warn!(
                        term = fence.term,
                        "leader lease was taken over; stepping down"
                    );
                    return false;
                }
                Ok(Err(e)) => {
                    tracing::warn!(term = fence.term, error = %e, "leader lease renewal failed; stepping down");
                    return false;
                }
                Err(_) => {
                    tracing::warn!(
                        term = fence.term,
                        "leader lease renewal timed out; stepping down"
                    );
                    return false;
                }
            }
        }
    }
}
