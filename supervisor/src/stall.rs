//! Watching the supervisor itself (LE-3): the leader records each completed sweep on the
//! lease row, and followers raise one `supervisor_stalled` alert when no leader has swept for
//! too long, resolved when sweeps resume.
//!
//! This is not a maintenance service: the alert is raised by the instances that do *not*
//! hold the lease (a stalled leader cannot report itself), so the election loop runs the
//! check between its attempts. The leader's own half, stepping down when no sweep makes
//! progress, is part of the renewal in [`crate::leader`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use sagaflow_engine::AlertKind;
use sagaflow_engine::store::{LeaderProgress, NewAlert};
use tokio::time::Instant;

use crate::leader::Supervisor;
use crate::service::{LeaderContext, millis};

/// The resolution recorded when sweeps resume.
const SWEEPS_RESUMED: &str = "supervisor sweeps are completing again";

impl Supervisor {
    /// A follower's check on the leader (LE-3): raises a `supervisor_stalled` alert when no
    /// leader has completed a sweep for [`SupervisorConfig::stall_alert_after`], and resolves
    /// it once sweeps are recorded again.
    ///
    /// [`SupervisorConfig::stall_alert_after`]: crate::SupervisorConfig::stall_alert_after
    pub(crate) async fn watch_leader(&self, watch: &mut StallWatch) {
        let progress = match self.store.leader_progress(&self.config.lease_name).await {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the leader's progress");
                return;
            }
        };
        let limit = self.config.stall_alert_after();
        let key = stalled_key(&self.config.lease_name);
        if progress.since_sweep_ms > millis(limit) {
            // One insert per alert threshold at most; the open key makes it one alert in all.
            if watch.raised_at.is_some_and(|t| t.elapsed() < limit) {
                return;
            }
            watch.raised_at = Some(Instant::now());
            let alert = stalled_alert(&self.config.lease_name, &progress, limit, key);
            match self.store.alert_insert(&alert).await {
                Ok(Some(row)) => self.signals.alert(&row),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, reason = %alert.reason, "could not store an alert");
                }
            }
        } else if watch.raised_at.is_some() {
            let lease = &self.config.lease_name;
            let resolved = self
                .store
                .alert_resolve_stall(&key, lease, millis(limit), SWEEPS_RESUMED)
                .await;
            match resolved {
                Ok(resolved) => {
                    watch.raised_at = None;
                    if resolved {
                        tracing::info!(
                            lease = %self.config.lease_name,
                            "supervisor sweeps resumed; resolved the supervisor_stalled alert"
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "could not resolve the stall alert"),
            }
        }
    }
}

impl LeaderContext {
    /// Records the completed sweep in the lease row, for followers to see (LE-3). The first
    /// record of a term also resolves an open `supervisor_stalled` alert: sweeps resumed.
    pub(crate) async fn record_sweep(&self) {
        match self.store.leader_record_sweep(&self.fence).await {
            Ok(true) if !self.sweep_recorded.swap(true, Ordering::Relaxed) => {
                let limit = millis(self.config.stall_alert_after());
                let resolved = self
                    .store
                    .alert_resolve_stall(
                        &stalled_key(&self.fence.name),
                        &self.fence.name,
                        limit,
                        SWEEPS_RESUMED,
                    )
                    .await;
                match resolved {
                    Ok(true) => tracing::info!(
                        term = self.fence.term,
                        "supervisor sweeps resumed; resolved the supervisor_stalled alert"
                    ),
                    Ok(false) => {}
                    Err(e) => tracing::debug!(error = %e, "could not resolve the stall alert"),
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not record the completed sweep"),
        }
    }
}

/// What a follower remembers of the stall alert.
#[derive(Debug, Default)]
pub(crate) struct StallWatch {
    /// When this instance last tried to raise the alert; `None` while sweeps are healthy.
    raised_at: Option<Instant>,
}

/// The open key of the stall alert of lease `lease`: one such alert at a time.
fn stalled_key(lease: &str) -> String {
    format!("{}:{lease}", AlertKind::SupervisorStalled)
}

fn stalled_alert(
    lease: &str,
    progress: &LeaderProgress,
    limit: Duration,
    open_key: String,
) -> NewAlert {
    let holder = match &progress.holder {
        Some(h) => format!("held by `{h}` (term {})", progress.term),
        None => format!("free (last term {})", progress.term),
    };
    NewAlert {
        run_id: None,
        step: None,
        kind: AlertKind::SupervisorStalled,
        reason: format!(
            "no supervisor sweep has completed for {} ms (threshold {} ms); lease `{lease}` is \
             {holder}. Expired steps and the work of dead instances are not being rescued",
            progress.since_sweep_ms,
            millis(limit)
        ),
        attempts: 0,
        actions: vec![
            "check the leader instance's logs for 'stepping down' warnings and the database for \
             blocked or long-running supervisor queries (locks, a wedged connection)"
                .into(),
            "restart the instance that holds the lease if it does not step down".into(),
            "the alert resolves itself when sweeps complete again; resolve_alert otherwise".into(),
        ],
        open_key: Some(open_key),
    }
}
