//! The supervisor (SAS-4, SAS-6, LE-1..3).
//!
//! One instance at a time holds the leader lease; only the leader sweeps. A sweep lists steps
//! still `Running`/`Compensating` past their `CompleteBy` (a crashed agent and a hung one look
//! the same, SAS-3), increments their `FailureCount`, and either re-queues them with a longer
//! deadline or, at the threshold, fails them, after which the scheduler compensates the run
//! or raises an alert. The supervisor knows no business logic and never compensates itself;
//! it detects and requests. Every write is fenced by the lease term, and the leader's work is
//! cancelled the moment a renewal fails.

mod config;
mod leader;
mod sweep;

pub use config::{
    LEASE_NAME_DEFAULT, LEASE_TTL_DEFAULT, RENEW_INTERVAL_DEFAULT, RETENTION_DEFAULT,
    SWEEP_BATCH_DEFAULT, SWEEP_INTERVAL_DEFAULT, SupervisorConfig,
};
pub use leader::{Supervisor, SupervisorStats};
pub use sweep::decide;
