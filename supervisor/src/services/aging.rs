//! The aging service: owns the priority of queued steps that have waited a whole aging
//! period ([`SupervisorConfig::priority_aging`]). Each pass raises them one level per period
//! waited, up to the highest priority, in one bounded statement on the database clock fenced
//! by the term (`Store::step_age`), so that low-priority work still progresses while higher
//! priorities keep arriving. It is not listed when aging is off.

use std::time::Duration;

use sagaflow_engine::Result;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport, millis};
use crate::stats::Counters;

/// Steps raised per pass at most: one statement's worth, through the aging index.
pub(crate) const AGING_BATCH: u32 = 1000;

/// The longest pause between two passes, whatever the period.
const AGING_TICK_MAX: Duration = Duration::from_secs(5);

/// The shortest pause between two passes, whatever the period.
const AGING_TICK_MIN: Duration = Duration::from_millis(10);

/// Raises the priority of long-waiting queued steps.
#[derive(Debug)]
pub(crate) struct Aging {
    period: Duration,
}

impl Aging {
    /// The service for `config`, or `None` when aging is off.
    pub(crate) fn from_config(config: &SupervisorConfig) -> Option<Self> {
        config.priority_aging.map(|period| Self { period })
    }
}

/// The pause between two passes for an aging `period`: a quarter of it, so that a step
/// gains its level at most a quarter period late, between 10 ms and 5 s.
pub(crate) fn tick(period: Duration) -> Duration {
    (period / 4).clamp(AGING_TICK_MIN, AGING_TICK_MAX)
}

#[async_trait::async_trait]
impl MaintenanceService for Aging {
    fn name(&self) -> &'static str {
        "aging"
    }

    fn interval(&self, _config: &SupervisorConfig) -> Duration {
        tick(self.period)
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let raised = ctx
            .store
            .step_age(&ctx.fence, millis(self.period), AGING_BATCH)
            .await?;
        Counters::add(&ctx.stats.aged, raised);
        Ok(ServiceReport::default().with("aged", raised))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_runs_four_times_a_period_within_bounds() {
        assert_eq!(tick(Duration::from_secs(60)), Duration::from_secs(5));
        assert_eq!(tick(Duration::from_secs(8)), Duration::from_secs(2));
        assert_eq!(tick(Duration::from_millis(200)), Duration::from_millis(50));
        assert_eq!(tick(Duration::from_millis(1)), Duration::from_millis(10));
        let off = SupervisorConfig {
            priority_aging: None,
            ..SupervisorConfig::new("a")
        };
        assert!(Aging::from_config(&off).is_none());
        assert!(Aging::from_config(&SupervisorConfig::new("a")).is_some());
    }
}
