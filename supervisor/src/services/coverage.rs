//! The coverage service: raises one `no_instance_for_workflow` alert per workflow version
//! whose steps are due while no live instance runs it (none has it registered: it was
//! unregistered everywhere, or only instances that lack it are up), and resolves the alert
//! once one does, or once nothing of it is due. Its runs are never dropped: they wait.
//!
//! One pass is one grouped statement over the due steps and one over the instances (see
//! `Store::workflows_uncovered`), plus one over the open alerts of this kind.

use std::collections::HashSet;
use std::time::Duration;

use sagaflow_engine::store::NewAlert;
use sagaflow_engine::{AlertKind, Result};

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// Watches that every workflow with due steps has an instance that runs it.
#[derive(Debug, Default)]
pub(crate) struct Coverage;

/// The open key of the alert about `workflow_key`.
fn coverage_key(workflow_key: &str) -> String {
    format!("no_instance_for_workflow:{workflow_key}")
}

#[async_trait::async_trait]
impl MaintenanceService for Coverage {
    fn name(&self) -> &'static str {
        "coverage"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.backlog_interval
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let stale_ms =
            i64::try_from(ctx.config.instance_stale_after.as_millis()).unwrap_or(i64::MAX);
        let uncovered = ctx.store.workflows_uncovered(stale_ms).await?;
        let (mut raised, mut resolved) = (0, 0);
        let mut waiting = HashSet::new();
        for u in &uncovered {
            let key = coverage_key(&u.workflow_key);
            let alert = NewAlert {
                run_id: None,
                step: None,
                kind: AlertKind::NoInstanceForWorkflow,
                reason: format!(
                    "{} step(s) of workflow {} are due (the oldest for {} s) and no live engine \
                     instance runs it: they wait until one registers it",
                    u.due,
                    u.workflow_key,
                    u.oldest_due_ms / 1000
                ),
                attempts: 0,
                actions: vec![
                    "start an engine instance that registers this workflow version, or register it on a running one (Engine::register)".into(),
                    "the alert resolves itself once an instance runs the workflow".into(),
                ],
                open_key: Some(key.clone()),
            };
            raised += ctx.alert_raise(&alert).await?;
            waiting.insert(key);
        }
        for key in ctx
            .store
            .alert_open_keys(&AlertKind::NoInstanceForWorkflow)
            .await?
        {
            if !waiting.contains(&key) {
                resolved += ctx
                    .alert_resolve(
                        &key,
                        "an instance runs the workflow, or none of its steps is due any more",
                    )
                    .await?;
            }
        }
        Ok(ServiceReport::default()
            .with("alerts_raised", raised)
            .with("alerts_resolved", resolved))
    }
}
