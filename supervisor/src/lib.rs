//! The supervisor (SAS-4, SAS-6, LE-1..3): a leader loop and the maintenance services it runs.
//!
//! One instance at a time holds the leader lease, an explicit term fencing every write. The
//! leader loop ([`Supervisor`], `leader.rs`) elects, renews, and steps down when it cannot
//! renew in time; while, and only while, it holds the lease it runs a list of maintenance
//! services, each in its own task, each ticking, paging through what it owns, writing in
//! bulk fenced by the term, returning counts and logging only when something changed. The
//! services (`services/`, one file each, listed in `services/mod.rs`):
//!
//! - **rescue** (`services/rescue.rs`): steps still `Running`/`Compensating` past their
//!   `CompleteBy` (a hung agent, SAS-3) or held by an instance whose heartbeat went stale (a
//!   crashed, frozen or stopped one). The transition module decides: a timeout increments
//!   `FailureCount` and re-queues with a longer deadline or, at the threshold, fails the step;
//!   an interruption re-queues without counting a failure, up to the step's interruption cap.
//!   The scheduler then compensates the run or raises an alert.
//! - **retention** (`services/retention.rs`, AT-5): deletes finished runs and silent
//!   instances past [`SupervisorConfig::retention`].
//! - **aging** (`services/aging.rs`): raises the priority of queued steps one level per
//!   [`SupervisorConfig::priority_aging`] period they wait, so that low priorities progress
//!   under a sustained load of higher ones.
//!
//! - **schedules** (`services/schedules.rs`): fires the recurring schedules that are due, each
//!   tick once across instances and failovers, missed ticks as the schedule's policy says.
//!
//! Adding a service is one file in `services/` implementing the crate's `MaintenanceService`
//! trait (`service.rs`) and one line in `services/mod.rs`. The supervisor knows no business
//! logic and never compensates itself; it detects and requests. The services are cancelled
//! the moment a renewal fails (LE-2).
//!
//! Stall detection (LE-3, `stall.rs`) watches the rescue service: the lease is renewed only
//! while sweeps make progress, so a leader whose sweep hangs gives the lease up after
//! [`SupervisorConfig::stall_after`]; followers, outside any term, raise a
//! `supervisor_stalled` alert (`AlertKind::SupervisorStalled`) when no leader has completed a sweep
//! for [`SupervisorConfig::stall_alert_after`].
//!
//! # What this crate owns, and what it may use
//!
//! It owns the leader loop and its maintenance services. It depends on `sagaflow-engine` (the
//! store, the transitions that decide a rescue, the alert and signal types) and on nothing
//! else of sagaflow; the engine and the agents do not depend on it. The facade starts it
//! beside the scheduler.

mod config;
mod gate;
mod leader;
mod service;
mod services;
mod stall;
mod stats;

pub use config::{
    BACKLOG_INTERVAL_DEFAULT, DELIVERY_INTERVAL_DEFAULT, HEARTBEAT_INTERVAL_DEFAULT,
    INSTANCE_STALE_AFTER_DEFAULT, LEASE_NAME_DEFAULT, LEASE_TTL_DEFAULT, PRIORITY_AGING_DEFAULT,
    RENEW_INTERVAL_DEFAULT, RETENTION_DEFAULT, RETENTION_INTERVAL_DEFAULT, STALL_ALERT_FACTOR,
    SWEEP_BATCH_DEFAULT, SWEEP_INTERVAL_DEFAULT, SWEEP_STALL_MIN, SWEEP_STALL_SWEEPS_DEFAULT,
    SupervisorConfig, TIMER_INTERVAL_DEFAULT,
};
#[doc(hidden)]
pub use gate::SweepGate;
pub use leader::Supervisor;
pub use services::schedules::ScheduleStarter;
pub use stats::SupervisorStats;
