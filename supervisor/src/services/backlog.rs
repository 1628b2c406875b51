//! The backlog service: compares the queue of each workflow that declares a backlog alert
//! ([`sagaflow_engine::BacklogAlert`]) with its thresholds, raises one `backlog_growing` alert
//! per workflow while it is past them, and resolves it once the queue is back under both. It
//! is not listed when no workflow declares one.

use std::collections::HashMap;
use std::time::Duration;

use sagaflow_engine::store::NewAlert;
use sagaflow_engine::{AlertKind, BacklogAlert, Result};

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// Checks workflows' queues against their backlog thresholds.
#[derive(Debug)]
pub(crate) struct Backlog {
    thresholds: HashMap<String, BacklogAlert>,
}

impl Backlog {
    /// The service for `config`, or `None` when no workflow declares a backlog alert.
    pub(crate) fn from_config(config: &SupervisorConfig) -> Option<Self> {
        (!config.backlog_alerts.is_empty()).then(|| Self {
            thresholds: config.backlog_alerts.iter().cloned().collect(),
        })
    }
}

fn backlog_key(workflow: &str) -> String {
    format!("backlog_growing:{workflow}")
}

#[async_trait::async_trait]
impl MaintenanceService for Backlog {
    fn name(&self) -> &'static str {
        "backlog"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.backlog_interval
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let queues: HashMap<String, (i64, i64)> = ctx
            .store
            .backlog_by_workflow()
            .await?
            .into_iter()
            .map(|b| (b.workflow, (b.ready, b.oldest_ready_ms)))
            .collect();
        let (mut raised, mut resolved) = (0, 0);
        for (workflow, threshold) in &self.thresholds {
            let (ready, oldest_ms) = queues.get(workflow).copied().unwrap_or((0, 0));
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
                    if ctx.store.alert_resolve_key(&key).await? {
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
