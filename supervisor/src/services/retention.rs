//! The retention service (AT-5): owns finished runs older than
//! [`SupervisorConfig::retention`] and the rows of instances silent for as long. Each pass
//! deletes every due run, in bounded statements, then, on PostgreSQL, makes the history
//! partitions of the coming days and drops those no kept run needs any more (see
//! `Store::history_partitions_maintain`); it is not listed when retention is off.

use std::time::Duration;

use sagaflow_engine::Result;
use sagaflow_engine::store::PartitionPass;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport, millis};

/// Finished runs deleted per statement.
const RETENTION_BATCH: u32 = 1000;

/// Deletes finished runs and silent instances past the retention age.
#[derive(Debug)]
pub(crate) struct Retention {
    /// Age in milliseconds past which rows go.
    age_ms: i64,
}

impl Retention {
    /// The service for `config`, or `None` when finished runs are kept forever.
    pub(crate) fn from_config(config: &SupervisorConfig) -> Option<Self> {
        config.retention.map(|age| Self {
            age_ms: millis(age),
        })
    }
}

#[async_trait::async_trait]
impl MaintenanceService for Retention {
    fn name(&self) -> &'static str {
        "retention"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.retention_interval
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        // Silent instances first: a failure there must not hold back the run purge.
        let instances = match ctx.store.instance_purge(self.age_ms).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "purging silent instances failed");
                0
            }
        };
        // Every due run, a batch per statement: a pass that took one batch would fall
        // behind any load above a batch per interval.
        let runs = ctx
            .store
            .run_purge_due(self.age_ms, RETENTION_BATCH)
            .await?;
        // On PostgreSQL the history of the runs gone, and the finished runs of a day, go
        // with the day's partitions.
        let partitions = match ctx.store.history_partitions_maintain(self.age_ms).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "maintaining the history partitions failed");
                PartitionPass::default()
            }
        };
        Ok(ServiceReport::default()
            .with("runs_purged", runs)
            .with("finished_runs_dropped", partitions.runs_dropped)
            .with("instances_purged", instances)
            .with("history_partitions_created", partitions.created)
            .with("history_partitions_dropped", partitions.dropped)
            .with("history_rows_moved", partitions.moved_rows)
            .with("history_partitions_busy", partitions.busy))
    }
}
