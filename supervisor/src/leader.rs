//! Leader election and the leader's duties.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sagaflow_engine::store::{LeaderFence, RescueCounts};
use sagaflow_engine::{Error, Hub, Result, Store};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::SupervisorConfig;
use crate::sweep::decide;

/// How often the leader applies the retention policy.
const PURGE_EVERY: Duration = Duration::from_secs(60);

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
}

/// A supervisor instance; at most one per lease name leads at a time.
#[derive(Debug)]
pub struct Supervisor {
    store: Store,
    hub: Arc<Hub>,
    config: SupervisorConfig,
    fence: Mutex<Option<LeaderFence>>,
    sweep_now: Notify,
    requeued: AtomicU64,
    interrupted: AtomicU64,
    failed: AtomicU64,
    terms_won: AtomicU64,
    sweeps: AtomicU64,
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
        loop {
            if cancel.is_cancelled() {
                return;
            }
            match self
                .store
                .leader_try_elect_with(
                    &self.config.lease_name,
                    &self.config.holder,
                    self.config.lease_ttl,
                    Some(self.config.instance_stale_after),
                )
                .await
            {
                Ok(Some(fence)) => {
                    failures = 0;
                    self.lead(fence, &cancel).await;
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
            // Followers look as often as the leader sweeps: a dead leader's lease is taken
            // as soon as its heartbeat goes stale, not when the lease runs out.
            let every = self.config.renew_interval.min(self.config.sweep_interval);
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = cancel.cancelled() => return,
            }
        }
    }

    async fn lead(&self, fence: LeaderFence, cancel: &CancellationToken) {
        tracing::info!(holder = %fence.holder, term = fence.term, "became supervisor leader");
        *self.fence.lock().unwrap_or_else(PoisonError::into_inner) = Some(fence.clone());
        self.terms_won.fetch_add(1, Ordering::Relaxed);
        let work = cancel.child_token();
        let renew = async {
            // A renewal must land before the lease could expire; one that takes longer counts
            // as failed (a hung database or a frozen process must not keep a zombie leader).
            let budget = self
                .config
                .lease_ttl
                .saturating_sub(self.config.renew_interval);
            loop {
                tokio::select! {
                    () = tokio::time::sleep(self.config.renew_interval) => {}
                    () = work.cancelled() => break,
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
        };
        tokio::join!(renew, self.sweep_loop(&fence, &work));
        *self.fence.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if cancel.is_cancelled() {
            // LE-2: a leader that ends releases the lease so another takes over at once.
            if let Err(e) = self.store.leader_release(&fence).await {
                tracing::debug!(error = %e, "could not release the leader lease; it will expire");
            }
        }
    }

    async fn sweep_loop(&self, fence: &LeaderFence, work: &CancellationToken) {
        let mut last_purge: Option<tokio::time::Instant> = None;
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

    async fn sweep(&self, fence: &LeaderFence) -> Result<RescueCounts> {
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
            let rescues: Vec<_> = expired.iter().map(decide).collect();
            let c = self.store.step_rescue(Some(fence), &rescues).await?;
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
