//! The primaries service: while the leader's store sees more than one server of the
//! database's cluster accept writes (a standby promoted while its primary still runs), one
//! open `split_brain` alert, raised on the primary the engines follow; resolved once only one
//! accepts writes (a server of the split that does not answer in time keeps it open: it may
//! still accept writes). The store notices (it asks every listed server every tenth check of
//! its primary, see `sagaflow_engine::store`); this service only tells the operator. With a
//! one-server URL there is nothing to see, and a pass reads nothing.

use std::time::Duration;

use sagaflow_engine::store::NewAlert;
use sagaflow_engine::{AlertKind, Result};

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// The open key of the one split-brain alert.
const KEY: &str = "split_brain";

/// Tells the operator of a split brain the store has seen.
#[derive(Debug, Default)]
pub(crate) struct Primaries;

#[async_trait::async_trait]
impl MaintenanceService for Primaries {
    fn name(&self) -> &'static str {
        "primaries"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.backlog_interval
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        if ctx.store.primary_moves().is_none() {
            return Ok(ServiceReport::default());
        }
        let (raised, resolved) = match ctx.store.primary_split_brain() {
            Some(seen) => {
                let alert = NewAlert {
                    run_id: None,
                    step: None,
                    kind: AlertKind::SplitBrain,
                    reason: format!(
                        "more than one primary of the database's cluster accepts writes: \
                         {seen}; the engines follow the newest timeline, and what the others \
                         accept is on no other server"
                    ),
                    attempts: 0,
                    actions: vec![
                        "fence the former primary: stop it, or make it a standby of the new one (pg_rewind)".into(),
                        "check it for writes accepted after the promotion (an engine that could reach only it)".into(),
                        "the alert resolves itself once only one server accepts writes (the former primary refuses connections or is a standby)".into(),
                    ],
                    open_key: Some(KEY.to_owned()),
                };
                (ctx.alert_raise(&alert).await?, 0)
            }
            None => (
                0,
                ctx.alert_resolve(KEY, "only one server of the cluster accepts writes")
                    .await?,
            ),
        };
        Ok(ServiceReport::default()
            .with("alerts_raised", raised)
            .with("alerts_resolved", resolved))
    }
}
