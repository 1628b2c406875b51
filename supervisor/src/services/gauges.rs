//! The queue gauges service: sets the metrics' queue gauges (steps ready, scheduled and
//! running, and the age of the oldest ready step, per workflow) from the database, so that
//! an application exporting through its own metrics recorder sees them move without a
//! scrape handler of sagaflow's. Only the leader refreshes them: the figures are the
//! database's, the same on every instance.

use std::time::Duration;

use sagaflow_engine::Result;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// How often the leader refreshes the queue gauges.
pub(crate) const QUEUE_GAUGES_INTERVAL: Duration = Duration::from_secs(15);

/// Refreshes the queue gauges.
#[derive(Debug, Default)]
pub(crate) struct QueueGauges;

#[async_trait::async_trait]
impl MaintenanceService for QueueGauges {
    fn name(&self) -> &'static str {
        "queue_gauges"
    }

    fn interval(&self, _config: &SupervisorConfig) -> Duration {
        QUEUE_GAUGES_INTERVAL
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        sagaflow_engine::metrics::refresh_queue_gauges(&ctx.store).await?;
        Ok(ServiceReport::default())
    }
}
