//! The queue service: reads each workflow's queue from the database once per pass (steps
//! ready, scheduled and running, and the age of the oldest ready step) and
//!
//! - sets the metrics' queue gauges from it, so that an application exporting through its
//!   own metrics recorder sees them move without a scrape handler of sagaflow's (the
//!   figures are the database's, the same on every instance: the leader sets them);
//! - compares the queues of workflows that declare a backlog alert
//!   ([`sagaflow_engine::BacklogAlert`]) with their thresholds, raises one
//!   `backlog_growing` alert per workflow while it is past them, and resolves it once the
//!   queue is back under both.

use std::collections::HashMap;
use std::time::Duration;

use sagaflow_engine::store::NewAlert;
use sagaflow_engine::{AlertKind, BacklogAlert, Result};

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// Watches the workflows' queues.
#[derive(Debug)]
pub(crate) struct QueueWatch {
    thresholds: HashMap<String, BacklogAlert>,
}

impl QueueWatch {
    /// The service for `config`.
    pub(crate) fn new(config: &SupervisorConfig) -> Self {
        Self {
            thresholds: config.backlog_alerts.iter().cloned().collect(),
        }
    }
}

fn backlog_key(workflow: &str) -> String {
    format!("backlog_growing:{workflow}")
}

#[async_trait::async_trait]
impl MaintenanceService for QueueWatch {
    fn name(&self) -> &'static str {
        "queue"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.backlog_interval
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let queues = ctx.store.queue_by_workflow().await?;
        sagaflow_engine::metrics::set_queue_gauges(&queues);
        sagaflow_engine::metrics::set_resource_gauges(&ctx.store.resources().await?);
        let (mut raised, mut resolved) = (0, 0);
        for (workflow, threshold) in &self.thresholds {
            let (ready, oldest_ms) = queues
                .iter()
                .find(|q| &q.workflow == workflow)
                .map_or((0, 0), |q| (q.ready, q.oldest_ready_ms));
            let oldest =
                (ready > 0).then(|| Duration::from_millis(u64::try_from(oldest_ms).unwrap_or(0)));
            let key = backlog_key(workflow);
            match threshold.exceeded(u64::try_from(ready).unwrap_or(0), oldest) {
                Some(why) => {
                    let alert = NewAlert {
                        run_id: None,
                        step: None,
                        kind: AlertKind::BacklogGrowing,
                        reason: format!("the queue of workflow `{workflow}` is growing: {why}"),
                        attempts: 0,
                        actions: vec![
                            "add engine instances or raise max_in_flight; look for a slow or failing remote service in the step durations".into(),
                            "the alert resolves itself when the queue falls back under its thresholds".into(),
                        ],
                        open_key: Some(key),
                    };
                    if let Some(a) = ctx.store.alert_insert(&alert).await? {
                        ctx.signals.alert(&a);
                        raised += 1;
                    }
                }
                None => {
                    if ctx
                        .store
                        .alert_resolve_key(&key, "the queue fell back under its thresholds")
                        .await?
                    {
                        resolved += 1;
                    }
                }
            }
        }
        Ok(ServiceReport::default()
            .with("backlog_raised", raised)
            .with("backlog_resolved", resolved))
    }
}
