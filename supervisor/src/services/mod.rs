//! The leader's maintenance services, one file each. To add one: write a type implementing
//! [`MaintenanceService`] in a new file here and push it in [`maintenance_services`].

use std::sync::Arc;

use sagaflow_engine::Signals;

use crate::config::SupervisorConfig;
use crate::service::MaintenanceService;

pub(crate) mod aging;
pub(crate) mod coverage;
pub(crate) mod delivery;
pub(crate) mod primaries;
pub(crate) mod queue;
pub(crate) mod rescue;
pub(crate) mod retention;
pub(crate) mod schedules;
pub(crate) mod timers;

pub(crate) use rescue::Rescue;

/// The services the leader starts at the beginning of each term, in this order. `rescue` is
/// passed in because the supervisor also drives it directly (`sweep_once`, `request_sweep`).
pub(crate) fn maintenance_services(
    config: &SupervisorConfig,
    rescue: Arc<Rescue>,
    signals: &Arc<Signals>,
    starter: &schedules::StarterSlot,
) -> Vec<Arc<dyn MaintenanceService>> {
    let mut services: Vec<Arc<dyn MaintenanceService>> =
        vec![rescue, Arc::new(delivery::Delivery::new(signals.clone()))];
    services.extend(retention::Retention::from_config(config).map(|s| Arc::new(s) as _));
    services.extend(aging::Aging::from_config(config).map(|s| Arc::new(s) as _));
    services.push(Arc::new(queue::QueueWatch::new(config)));
    services.push(Arc::new(timers::Timers));
    services.push(Arc::new(schedules::Schedules::new(starter.clone())));
    services.push(Arc::new(coverage::Coverage));
    services.push(Arc::new(primaries::Primaries));
    services
}
