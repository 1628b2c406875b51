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

use sagaflow_engine::resource::{BreakerState, ResourceView};
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
        let resources = ctx.store.resource_list().await?;
        sagaflow_engine::metrics::set_resource_gauges(&resources);
        let (mut raised, mut resolved) = breaker_alerts(ctx, &resources).await?;
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
                    raised += ctx.alert_raise(&alert).await?;
                }
                None => {
                    resolved += ctx
                        .alert_resolve(&key, "the queue fell back under its thresholds")
                        .await?;
                }
            }
        }
        Ok(ServiceReport::default()
            .with("alerts_raised", raised)
            .with("alerts_resolved", resolved))
    }
}

fn breaker_key(resource: &str) -> String {
    format!("breaker_open:{resource}")
}

/// Raises one `breaker_open` alert per resource whose breaker has not closed within its
/// policy's `alert_after_ms` of opening (on the database clock), and resolves it once the
/// breaker closes. Returns the alerts raised and resolved.
async fn breaker_alerts(ctx: &LeaderContext, resources: &[ResourceView]) -> Result<(u64, u64)> {
    let (mut raised, mut resolved) = (0, 0);
    let mut now_ms = None;
    for r in resources {
        let key = breaker_key(&r.name);
        let open_since = r
            .breaker
            .opened_at_ms
            .filter(|_| r.breaker.state != BreakerState::Closed);
        let too_long = match (open_since, r.limits.breaker) {
            (Some(since), Some(policy)) => {
                let now = match now_ms {
                    Some(n) => n,
                    None => *now_ms.insert(ctx.store.now_ms().await?),
                };
                let open_ms = now - since;
                (open_ms >= i64::try_from(policy.alert_after_ms).unwrap_or(i64::MAX))
                    .then_some(open_ms)
            }
            _ => None,
        };
        let closed = r.breaker.state == BreakerState::Closed || r.limits.breaker.is_none();
        if let Some(open_ms) = too_long {
            let alert = NewAlert {
                    run_id: None,
                    step: None,
                    kind: AlertKind::BreakerOpen,
                    reason: format!(
                        "the circuit breaker of resource `{}` has been open for {} s: its steps wait",
                        r.name,
                        open_ms / 1000
                    ),
                    attempts: 0,
                    actions: vec![
                        "check the remote service the resource names; the breaker probes it again after each cool-down".into(),
                        "the alert resolves itself when a probe succeeds and the breaker closes".into(),
                    ],
                    open_key: Some(key),
                };
            raised += ctx.alert_raise(&alert).await?;
        } else if closed {
            resolved += ctx
                .alert_resolve(&key, "the circuit breaker closed")
                .await?;
        }
    }
    Ok((raised, resolved))
}
