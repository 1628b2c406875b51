//! Leader election and the leader's duties.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sagaflow_engine::store::{LeaderFence, RescueCounts};
use sagaflow_engine::{Error, Hub, Result, Store, transition};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::SupervisorConfig;
use crate::stall::StallWatch;

/// How often the leader applies the retention policy.
const PURGE_EVERY: Duration = Duration::from_secs(60);

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

/// Counters of what this supervisor instance did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SupervisorStats {
    /// Expired steps re-queued with an extended deadline.
    pub requeued: u64,
    /// Steps of dead or stopped instances re-queued (interruptions).
    pub interrupted: u64,
    /// Expired steps failed at their threshold.
    pub failed: u64,
    /// Terms won.
    pub terms_won: u64,
    /// Sweeps run as leader.
    pub sweeps: u64,
    /// Terms given up because no sweep completed within the stall threshold (LE-3).
    pub stalls: u64,
}

/// A supervisor instance; at most one per lease name leads at a time.
#[derive(Debug)]
pub struct Supervisor {
    pub(crate) store: Store,
    pub(crate) hub: Arc<Hub>,
    pub(crate) config: SupervisorConfig,
    fence: Mutex<Option<LeaderFence>>,
    sweep_now: Notify,
    requeued: AtomicU64,
    interrupted: AtomicU64,
    failed: AtomicU64,
    terms_won: AtomicU64,
    sweeps: AtomicU64,
    stalls: AtomicU64,
    /// When this instance's sweep loop last made progress (a sweep returned or a rescue
    /// batch committed); the renewal loop reads it (LE-3).
    progress: Mutex<Instant>,
}

impl Supervisor {
    /// A supervisor over `store`.
    ///
    /// # Errors
    /// [`Error::Config`].
    pub fn new(store: Store, hub: Arc<Hub>, config: SupervisorConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            store,
            hub,
            config,
            fence: Mutex::new(None),
            sweep_now: Notify::new(),
            requeued: AtomicU64::new(0),
            interrupted: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            terms_won: AtomicU64::new(0),
            sweeps: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            progress: Mutex::new(Instant::now()),
        })
    }

    /// Spawns the election loop: try to lead; while leading, renew and sweep.
    pub fn spawn(self: Arc<Self>, tracker: &TaskTracker, cancel: CancellationToken) {
        tracker.spawn(async move { self.election_loop(cancel).await });
    }

    /// The fence of the current term, if this instance leads.
    pub fn fence(&self) -> Option<LeaderFence> {
        self.fence
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether this instance currently leads.
    pub fn is_leader(&self) -> bool {
        self.fence().is_some()
    }

    /// What this instance did so far.
    pub fn stats(&self) -> SupervisorStats {
        SupervisorStats {
            requeued: self.requeued.load(Ordering::Relaxed),
            interrupted: self.interrupted.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            terms_won: self.terms_won.load(Ordering::Relaxed),
            sweeps: self.sweeps.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
        }
    }

    /// Wakes the leader's sweeper now instead of at its next tick.
    pub fn request_sweep(&self) {
        self.sweep_now.notify_one();
    }

    /// Runs one sweep now if this instance leads (`None` otherwise). Tests use it to drive
    /// time-dependent recovery without waiting for the sweep interval.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::LeaseLost`] when the term ended meanwhile.
    pub async fn sweep_once(&self) -> Result<Option<RescueCounts>> {
        match self.fence() {
            Some(f) => self.sweep(&f).await.map(Some),
            None => Ok(None),
        }
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
                    .leader_try_elect_with(
                        &self.config.lease_name,
                        &self.config.holder,
                        self.config.lease_ttl,
                        Some(self.config.instance_stale_after),
                        Some(self.config.stall_alert_after()),
                    )
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

    async fn lead(&self, fence: LeaderFence, cancel: &CancellationToken) -> TermEnd {
        tracing::info!(holder = %fence.holder, term = fence.term, "became supervisor leader");
        *self.fence.lock().unwrap_or_else(PoisonError::into_inner) = Some(fence.clone());
        self.terms_won.fetch_add(1, Ordering::Relaxed);
        self.mark_progress();
        let work = cancel.child_token();
        let stall_after = self.config.stall_after();
        let renew = async {
            // A renewal must land before the lease could expire; one that takes longer counts
            // as failed (a hung database or a frozen process must not keep a zombie leader).
            let budget = self
                .config
                .lease_ttl
                .saturating_sub(self.config.renew_interval);
            let mut stalled = false;
            loop {
                tokio::select! {
                    () = tokio::time::sleep(self.config.renew_interval) => {}
                    () = work.cancelled() => break,
                }
                // LE-3: the lease is renewed only while the sweep loop makes progress. A
                // leader whose sweep hangs (a query stuck on a lock, a wedged connection)
                // would otherwise hold the lease forever while nobody rescues anything.
                let idle = self.since_progress();
                if idle >= stall_after {
                    tracing::warn!(
                        term = fence.term,
                        idle_ms = millis(idle),
                        stall_after_ms = millis(stall_after),
                        "no supervisor sweep completed within the stall threshold; stepping down"
                    );
                    stalled = true;
                    break;
                }
                match tokio::time::timeout(
                    budget,
                    self.store.leader_renew(&fence, self.config.lease_ttl),
                )
                .await
                {
                    Ok(Ok(true)) => {}
                    Ok(Ok(false)) => {
                        tracing::warn!(
                            term = fence.term,
                            "leader lease was taken over; stepping down"
                        );
                        break;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(term = fence.term, error = %e, "leader lease renewal failed; stepping down");
                        break;
                    }
                    Err(_) => {
                        tracing::warn!(
                            term = fence.term,
                            "leader lease renewal timed out; stepping down"
                        );
                        break;
                    }
                }
            }
            // LE-2: the leader's work stops the moment renewal fails.
            work.cancel();
            stalled
        };
        // The sweep loop is dropped as soon as the work is cancelled, even in the middle of a
        // sweep blocked on an await, so that the term really ends.
        let sweeping = async {
            tokio::select! {
                () = self.sweep_loop(&fence, &work) => {}
                () = work.cancelled() => {}
            }
        };
        let (stalled, ()) = tokio::join!(renew, sweeping);
        *self.fence.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let end = if cancel.is_cancelled() {
            TermEnd::Shutdown
        } else if stalled {
            self.stalls.fetch_add(1, Ordering::Relaxed);
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

    async fn sweep_loop(&self, fence: &LeaderFence, work: &CancellationToken) {
        let mut last_purge: Option<tokio::time::Instant> = None;
        let mut recorded = false;
        loop {
            match self.sweep(fence).await {
                Ok(_) => {}
                Err(Error::LeaseLost { .. }) => {
                    tracing::warn!(
                        term = fence.term,
                        "lease lost during a sweep; stepping down"
                    );
                    work.cancel();
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "sweep failed; will retry"),
            }
            // A sweep that returned, even with an error, is progress: the loop is not hung.
            self.mark_progress();
            self.record_sweep(fence, &mut recorded).await;
            if let Some(retention) = self.config.retention
                && last_purge.is_none_or(|t| t.elapsed() >= PURGE_EVERY)
            {
                last_purge = Some(tokio::time::Instant::now());
                let ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
                if let Err(e) = self.store.instance_purge(ms).await {
                    tracing::warn!(error = %e, "purging silent instances failed");
                }
                match self.store.run_purge_finished(ms, 1000).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(runs = n, "purged finished runs past retention"),
                    Err(e) => tracing::warn!(error = %e, "retention purge failed"),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.config.sweep_interval) => {}
                () = self.sweep_now.notified() => {}
                () = work.cancelled() => return,
            }
        }
    }

    fn mark_progress(&self) {
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn since_progress(&self) -> Duration {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    async fn sweep(&self, fence: &LeaderFence) -> Result<RescueCounts> {
        if let Some(gate) = &self.config.sweep_gate {
            gate.pass().await;
        }
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        let mut total = RescueCounts::default();
        loop {
            let stale_ms =
                i64::try_from(self.config.instance_stale_after.as_millis()).unwrap_or(i64::MAX);
            let expired = self
                .store
                .step_list_rescuable(stale_ms, self.config.sweep_batch)
                .await?;
            if expired.is_empty() {
                break;
            }
            let full = expired.len() >= self.config.sweep_batch as usize;
            let rescues: Vec<_> = expired.iter().map(transition::rescue).collect();
            let c = self.store.step_rescue(Some(fence), &rescues).await?;
            // A committed batch is progress: a long sweep through a backlog is not a stall.
            self.mark_progress();
            total.requeued += c.requeued;
            total.interrupted += c.interrupted;
            total.failed += c.failed;
            total.skipped += c.skipped;
            if !full || c.requeued + c.failed + c.interrupted == 0 {
                break;
            }
        }
        if total.requeued + total.failed + total.interrupted > 0 {
            tracing::info!(
                requeued = total.requeued,
                interrupted = total.interrupted,
                failed = total.failed,
                term = fence.term,
                "supervisor rescued steps"
            );
            self.requeued.fetch_add(total.requeued, Ordering::Relaxed);
            self.interrupted
                .fetch_add(total.interrupted, Ordering::Relaxed);
            self.failed.fetch_add(total.failed, Ordering::Relaxed);
            self.hub.claim.notify_one();
            self.hub.eval.notify_one();
        }
        Ok(total)
    }
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
