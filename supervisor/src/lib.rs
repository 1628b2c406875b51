//! The supervisor (SAS-4, SAS-6, LE-1..3).
//!
//! One instance at a time holds the leader lease; only the leader sweeps. A sweep lists steps
//! still `Running`/`Compensating` past their `CompleteBy` (a hung agent, SAS-3) or held by an
//! instance whose heartbeat went stale (a crashed, frozen or stopped one). The transition
//! module decides: a timeout increments `FailureCount` and re-queues with a longer deadline
//! or, at the threshold, fails the step; an interruption re-queues without counting a
//! failure, up to the step's interruption cap. The scheduler then compensates the run or
//! raises an alert. The supervisor knows no business logic and never compensates itself;
//! it detects and requests. Every write is fenced by the lease term, and the leader's work is
//! cancelled the moment a renewal fails.
//!
//! The lease is renewed only while the sweep loop makes progress: a leader whose sweep hangs
//! gives the lease up after [`SupervisorConfig::stall_after`], and followers raise a
//! `supervisor_stalled` alert ([`SUPERVISOR_STALLED`]) when no leader has completed a sweep
//! for [`SupervisorConfig::stall_alert_after`] (LE-3).

mod config;
mod gate;
mod leader;
mod stall;

pub use config::{
    HEARTBEAT_INTERVAL_DEFAULT, INSTANCE_STALE_AFTER_DEFAULT, LEASE_NAME_DEFAULT,
    LEASE_TTL_DEFAULT, RENEW_INTERVAL_DEFAULT, RETENTION_DEFAULT, STALL_ALERT_FACTOR,
    SWEEP_BATCH_DEFAULT, SWEEP_INTERVAL_DEFAULT, SWEEP_STALL_MIN, SWEEP_STALL_SWEEPS_DEFAULT,
    SupervisorConfig,
};
#[doc(hidden)]
pub use gate::SweepGate;
pub use leader::{Supervisor, SupervisorStats};
pub use stall::SUPERVISOR_STALLED;
