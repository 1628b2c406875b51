//! Supervisor settings.

use std::time::Duration;

use sagaflow_engine::{Error, Result};

/// Name of the leader lease row.
pub const LEASE_NAME_DEFAULT: &str = "sagaflow_supervisor";
/// How long a lease lasts without renewal.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(15);
/// How often the leader renews (and followers try to take over).
pub const RENEW_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// How often the leader sweeps for expired steps (SAS-10: often enough to unblock, rarely
/// enough to be cheap).
pub const SWEEP_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// Expired steps handled per sweep transaction.
pub const SWEEP_BATCH_DEFAULT: u32 = 256;
/// How often an engine instance heartbeats.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_millis(500);
/// How long an instance may stay silent before it counts as dead (four missed heartbeats):
/// the leader then releases its in-flight steps (as interruptions) and may take over a lease
/// it held. With the 1 s sweep this rescues a dead instance's work within about 3 s.
pub const INSTANCE_STALE_AFTER_DEFAULT: Duration = Duration::from_secs(2);
/// How long finished runs and their history are kept (AT-5).
pub const RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Supervisor settings.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// This instance's id in the lease.
    pub holder: String,
    /// Lease name (one per group of engines sharing a database).
    pub lease_name: String,
    /// Lease lifetime.
    pub lease_ttl: Duration,
    /// Renewal period; must be shorter than the lease lifetime.
    pub renew_interval: Duration,
    /// Sweep period.
    pub sweep_interval: Duration,
    /// Steps per sweep transaction.
    pub sweep_batch: u32,
    /// Finished runs older than this are deleted; `None` keeps them forever.
    pub retention: Option<Duration>,
    /// An instance silent for longer is dead (see [`INSTANCE_STALE_AFTER_DEFAULT`]).
    pub instance_stale_after: Duration,
}

impl SupervisorConfig {
    /// Defaults with the given holder id.
    pub fn new(holder: impl Into<String>) -> Self {
        Self {
            holder: holder.into(),
            lease_name: LEASE_NAME_DEFAULT.into(),
            lease_ttl: LEASE_TTL_DEFAULT,
            renew_interval: RENEW_INTERVAL_DEFAULT,
            sweep_interval: SWEEP_INTERVAL_DEFAULT,
            sweep_batch: SWEEP_BATCH_DEFAULT,
            retention: Some(RETENTION_DEFAULT),
            instance_stale_after: INSTANCE_STALE_AFTER_DEFAULT,
        }
    }

    /// Checks cross-field rules (LE-1: renew more often than the lease expires).
    ///
    /// # Errors
    /// [`Error::Config`].
    pub fn validate(&self) -> Result<()> {
        if self.holder.is_empty() {
            return Err(Error::Config(
                "supervisor holder id must not be empty".into(),
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_ttl {
            return Err(Error::Config(format!(
                "renew interval ({:?}) must be positive and shorter than the lease TTL ({:?})",
                self.renew_interval, self.lease_ttl
            )));
        }
        if self.instance_stale_after.is_zero() {
            return Err(Error::Config(
                "the instance staleness must be positive".into(),
            ));
        }
        if self.sweep_interval.is_zero() || self.sweep_batch == 0 {
            return Err(Error::Config(
                "sweep interval and batch must be positive".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_interval_must_be_shorter_than_the_lease() {
        let mut c = SupervisorConfig::new("a");
        assert!(c.validate().is_ok());
        c.renew_interval = c.lease_ttl;
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        c.renew_interval = Duration::ZERO;
        assert!(c.validate().is_err());
        assert!(SupervisorConfig::new("").validate().is_err());
    }
}
