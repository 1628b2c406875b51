//! What a maintenance service is and how the leader runs one: the [`MaintenanceService`]
//! trait, the [`LeaderContext`] of the term a service works in, the [`ServiceReport`] it
//! returns, and the loop that ticks one service until the term ends.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sagaflow_engine::scheduler::ErrorStreak;
use sagaflow_engine::store::{LeaderFence, NewAlert};
use sagaflow_engine::{Alert, Error, Result, Signals, Store};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::SupervisorConfig;
use crate::stats::Counters;

/// One duty of the leader, run only while this instance holds the lease.
///
/// A service ticks: each [`run_once`](MaintenanceService::run_once) pages through what it
/// owns, decides, writes in bulk fenced by the term, and returns counts. The leader runs
/// every service in its own task, again after [`interval`](MaintenanceService::interval) or
/// when [`wake`](MaintenanceService::wake) fires, and drops it the moment the term ends.
/// Services are listed in [`crate::services::maintenance_services`].
#[async_trait::async_trait]
pub(crate) trait MaintenanceService: fmt::Debug + Send + Sync + 'static {
    /// Short name, for logs.
    fn name(&self) -> &'static str;

    /// The pause between two passes.
    fn interval(&self, config: &SupervisorConfig) -> Duration;

    /// A signal that starts the next pass before the interval is up (`None`: timer only).
    fn wake(&self) -> Option<&Notify> {
        None
    }

    /// One pass over what the service owns.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] ends the term; any other error is logged and retried at the next
    /// tick.
    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport>;
}

/// What one pass of a service changed, as named counts; logged only when one is non-zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceReport {
    counts: Vec<(&'static str, u64)>,
}

impl ServiceReport {
    /// Adds the count `n` named `what`.
    pub(crate) fn with(mut self, what: &'static str, n: u64) -> Self {
        self.counts.push((what, n));
        self
    }

    /// Whether the pass changed anything.
    pub(crate) fn changed(&self) -> bool {
        self.counts.iter().any(|&(_, n)| n > 0)
    }
}

impl fmt::Display for ServiceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (what, n)) in self.counts.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{what}={n}")?;
        }
        Ok(())
    }
}

/// Everything a service needs during one term: the fence its writes quote, the store, the
/// signals to wake the scheduler, the settings, the instance's counters, and the progress clock
/// the renewal loop reads (LE-3).
#[derive(Debug)]
pub(crate) struct LeaderContext {
    pub(crate) fence: LeaderFence,
    pub(crate) store: Store,
    pub(crate) signals: Arc<Signals>,
    pub(crate) config: SupervisorConfig,
    pub(crate) stats: Arc<Counters>,
    /// When the rescue service last made progress (a sweep returned or a batch committed).
    progress: Mutex<Instant>,
    /// Whether a completed sweep was recorded on the lease row during this term.
    pub(crate) sweep_recorded: AtomicBool,
}

impl LeaderContext {
    /// The context of a term that starts now.
    pub(crate) fn new(
        fence: LeaderFence,
        store: Store,
        signals: Arc<Signals>,
        config: SupervisorConfig,
        stats: Arc<Counters>,
    ) -> Self {
        Self {
            fence,
            store,
            signals,
            config,
            stats,
            progress: Mutex::new(Instant::now()),
            sweep_recorded: AtomicBool::new(false),
        }
    }

    /// Notes that the sweep is not hung (LE-3).
    pub(crate) fn mark_progress(&self) {
        *self.progress.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// How long ago the sweep last made progress.
    pub(crate) fn since_progress(&self) -> Duration {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    /// Stores `alert` unless one is open under its key, and delivers it if stored: 1 when
    /// raised, 0 when it was already open. Fenced by this term: a leader that lost its lease
    /// raises nothing (`LeaseLost`).
    pub(crate) async fn alert_raise(&self, alert: &NewAlert) -> Result<u64> {
        let stored = self.store.alert_insert_fenced(alert, &self.fence).await?;
        Ok(self.delivered(stored))
    }

    /// Stores `alert` unless one is open under its key, and delivers it if stored, whether or
    /// not this term still leads: for an alert that reports what the pass has written
    /// already (a notice dead-lettered), which no later leader would raise again.
    pub(crate) async fn alert_report(&self, alert: &NewAlert) -> Result<u64> {
        let stored = self.store.alert_insert(alert).await?;
        Ok(self.delivered(stored))
    }

    /// Hands a stored alert to the sinks: 1 when one was stored, else 0.
    fn delivered(&self, stored: Option<Alert>) -> u64 {
        stored.map_or(0, |a| {
            self.signals.alert(&a);
            1
        })
    }

    /// Resolves the open alert under `key`, saying why: 1 when one was open, else 0. Fenced
    /// by this term: a leader that lost its lease resolves nothing.
    pub(crate) async fn alert_resolve(&self, key: &str, why: &str) -> Result<u64> {
        Ok(u64::from(
            self.store
                .alert_resolve_key_fenced(key, why, &self.fence)
                .await?,
        ))
    }
}

/// Runs `service` pass after pass until `work` is cancelled; a lost lease cancels `work`.
pub(crate) async fn run_service(
    service: Arc<dyn MaintenanceService>,
    ctx: Arc<LeaderContext>,
    work: CancellationToken,
) {
    let span = tracing::info_span!(
        "maintenance",
        service = service.name(),
        term = ctx.fence.term
    );
    async move {
        // A pass failing on every tick (the database is away) logs once per incident.
        let mut streak = ErrorStreak::default();
        loop {
            match service.run_once(&ctx).await {
                Ok(report) => {
                    streak.succeeded(service.name());
                    if report.changed() {
                        tracing::info!(counts = %report, "maintenance pass changed state");
                    }
                }
                Err(Error::LeaseLost { .. }) => {
                    tracing::warn!("lease lost during a maintenance pass; stepping down");
                    work.cancel();
                    return;
                }
                Err(e) => streak.failed(service.name(), &e),
            }
            let woken = async {
                match service.wake() {
                    Some(signal) => signal.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep(service.interval(&ctx.config)) => {}
                () = woken => {}
                () = work.cancelled() => return,
            }
        }
    }
    .instrument(span)
    .await;
}

/// Milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_its_counts_and_says_whether_anything_changed() {
        let quiet = ServiceReport::default()
            .with("requeued", 0)
            .with("failed", 0);
        assert!(!quiet.changed());
        let busy = quiet.with("interrupted", 2);
        assert!(busy.changed());
        assert_eq!(busy.to_string(), "requeued=0 failed=0 interrupted=2");
    }
}
