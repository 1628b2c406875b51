//! The timer pass: wakes parked steps whose time came — timers that fire, waits for events,
//! callbacks or children that time out — in bounded, index-driven statements
//! (`deliver::wake_due_steps`). Waking makes a step due; whichever instance claims it first
//! runs its next attempt, fenced like any other, so a timer fires once however many
//! instances run and whichever leader woke it. A parked step costs nothing between passes:
//! no task, no timer in memory, no row read until it is due.

use std::time::Duration;

use sagaflow_engine::Result;
use sagaflow_engine::deliver::wake_due_steps;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// Steps woken per statement; a pass repeats while statements come back full.
pub(crate) const TIMER_BATCH: u32 = 500;

/// Statements per pass at most, so that a burst of due timers does not starve the leader's
/// other services: the next pass takes the rest.
const TIMER_ROUNDS: u32 = 20;

/// Wakes due parked steps.
#[derive(Debug, Default)]
pub(crate) struct Timers;

#[async_trait::async_trait]
impl MaintenanceService for Timers {
    fn name(&self) -> &'static str {
        "timers"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.timer_interval
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let actor = ctx.fence.actor();
        let mut woken = 0;
        for _ in 0..TIMER_ROUNDS {
            let n = wake_due_steps(&ctx.store, TIMER_BATCH, &actor).await?;
            woken += n;
            if n < u64::from(TIMER_BATCH) {
                break;
            }
        }
        if woken > 0 {
            // Other engines hear the notification (PostgreSQL) or poll; this one is woken here.
            ctx.signals.wake_claimer();
        }
        Ok(ServiceReport::default().with("woken", woken))
    }
}
