//! The rescue service (SAS-4, SAS-6): owns steps still `Running`/`Compensating` past their
//! `CompleteBy` (a hung agent, SAS-3) or held by an instance whose heartbeat went stale.
//!
//! Each pass pages through them in batches, lets [`transition::rescue`] decide (re-queue with
//! a longer deadline, fail at the threshold, or re-queue an interruption), writes each batch
//! in one statement fenced by the term, wakes the scheduler when anything moved, and records
//! the completed sweep on the lease row for the stall watch (LE-3).

use sagaflow_engine::rescue::rescue_steps;
use sagaflow_engine::store::RescueCounts;
use sagaflow_engine::{Error, Result, transition};
use tokio::sync::Notify;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport, millis};
use crate::stats::Counters;

/// Re-queues or fails expired and orphaned steps.
#[derive(Debug, Default)]
pub(crate) struct Rescue {
    /// Starts the next sweep before the sweep interval is up.
    sweep_now: Notify,
}

impl Rescue {
    /// Asks for a sweep now instead of at the next tick.
    pub(crate) fn request(&self) {
        self.sweep_now.notify_one();
    }

    /// One sweep: every rescuable step, batch by batch, until a batch comes back short or
    /// changes nothing.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::LeaseLost`] when the term ended meanwhile.
    pub(crate) async fn sweep(&self, ctx: &LeaderContext) -> Result<RescueCounts> {
        if let Some(gate) = &ctx.config.sweep_gate {
            gate.pass().await;
        }
        Counters::add(&ctx.stats.sweeps, 1);
        let stale_ms = millis(ctx.config.instance_stale_after);
        let batch = ctx.config.sweep_batch;
        let mut total = RescueCounts::default();
        loop {
            let expired = ctx.store.step_list_rescuable(stale_ms, batch).await?;
            if expired.is_empty() {
                break;
            }
            let full = expired.len() >= batch as usize;
            let rescues: Vec<_> = expired.iter().map(transition::rescue).collect();
            let c = rescue_steps(&ctx.store, Some(&ctx.fence), &rescues).await?;
            // A committed batch is progress: a long sweep through a backlog is not a stall.
            ctx.mark_progress();
            total.requeued += c.requeued;
            total.interrupted += c.interrupted;
            total.failed += c.failed;
            total.skipped += c.skipped;
            if !full || c.requeued + c.failed + c.interrupted == 0 {
                break;
            }
        }
        if total.requeued + total.failed + total.interrupted > 0 {
            Counters::add(&ctx.stats.requeued, total.requeued);
            Counters::add(&ctx.stats.interrupted, total.interrupted);
            Counters::add(&ctx.stats.failed, total.failed);
            ctx.signals.wake_claimer();
            ctx.signals.wake_evaluator();
        }
        Ok(total)
    }
}

#[async_trait::async_trait]
impl MaintenanceService for Rescue {
    fn name(&self) -> &'static str {
        "rescue"
    }

    fn interval(&self, config: &SupervisorConfig) -> std::time::Duration {
        config.sweep_interval
    }

    fn wake(&self) -> Option<&Notify> {
        Some(&self.sweep_now)
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let swept = match self.sweep(ctx).await {
            Err(e @ Error::LeaseLost { .. }) => return Err(e),
            other => other,
        };
        // Only a sweep that did its work is progress. One that fails every time (a database
        // that refuses it) is a stall: the lease lapses to another instance, and followers
        // raise `supervisor_stalled` when none can sweep.
        let c = swept?;
        ctx.mark_progress();
        ctx.record_sweep().await;
        Ok(ServiceReport::default()
            .with("requeued", c.requeued)
            .with("interrupted", c.interrupted)
            .with("failed", c.failed))
    }
}
