//! Supervisor settings.

use std::time::Duration;

use sagaflow_engine::{BacklogAlert, Error, Result};

use crate::gate::SweepGate;

/// Default timer pass interval: a timer fires, and a wait times out, at most this late
/// (plus a claim). Each pass is one indexed statement that reads only the steps due.
pub const TIMER_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Name of the leader lease row.
pub const LEASE_NAME_DEFAULT: &str = "sagaflow_supervisor";
/// How long a lease lasts without renewal.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(15);
/// How often the leader renews (and followers try to take over).
pub const RENEW_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// How often the leader sweeps for expired steps (SAS-10: often enough to unblock, rarely
/// enough to be cheap).
pub const SWEEP_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// How many sweep intervals may pass without a completed sweep before the leader gives up
/// its lease (LE-3), unless [`SupervisorConfig::sweep_stall_after`] says otherwise; never
/// less than [`SWEEP_STALL_MIN`]. With the 1 s sweep that is 5 s: a leader that renews but no
/// longer sweeps (a wedged connection, a task that never returns) is replaced sooner than one
/// whose lease lapsed, while a slow but working sweep (each rescue batch counts as progress,
/// and every statement of it is bounded by the session limits) is left alone.
pub const SWEEP_STALL_SWEEPS_DEFAULT: u32 = 5;
/// The least default stall threshold: with very short sweep intervals (tests use 100 ms), a
/// few intervals would let one slow sweep on a loaded machine cost the leadership.
pub const SWEEP_STALL_MIN: Duration = Duration::from_secs(5);
/// Followers raise a `supervisor_stalled` alert when no leader has completed a sweep for
/// this many times the stall threshold: long enough that a stalled leader would have
/// stepped down and been replaced, so the alert means leaders keep stalling term after term
/// (or one cannot step down).
pub const STALL_ALERT_FACTOR: u32 = 2;
/// Expired steps handled per sweep transaction.
pub const SWEEP_BATCH_DEFAULT: u32 = 256;
/// How often an engine instance heartbeats.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_millis(500);
/// How long an instance may stay silent before it counts as dead (four missed heartbeats):
/// the leader then releases its in-flight steps (as interruptions) and may take over a lease
/// it held. With the 1 s sweep this rescues a dead instance's work within about 3 s.
pub const INSTANCE_STALE_AFTER_DEFAULT: Duration = Duration::from_secs(2);
/// How often the leader delivers the outbox's notices when nothing wakes it sooner (a notice
/// stored on the leader's own instance wakes it at once).
pub const DELIVERY_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// How often the leader reads the workflows' queues: to set the metrics' queue gauges and
/// to compare the queues of workflows with a backlog alert to their thresholds.
pub const BACKLOG_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// How long finished runs and their history are kept (AT-5).
pub const RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default interval of the retention pass: how often the leader deletes what the retention
/// lets go.
pub const RETENTION_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
/// The aging period: a queued step gains one priority level per minute it waits, so a step
/// of priority 0 passes fresh work of priority 10 after about ten minutes of sustained load.
pub const PRIORITY_AGING_DEFAULT: Duration = Duration::from_secs(60);

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
    /// How often the leader applies the retention (see [`RETENTION_INTERVAL_DEFAULT`]).
    pub retention_interval: Duration,
    /// The aging period: a queued step gains one priority level per period it waits (see
    /// [`PRIORITY_AGING_DEFAULT`]); `None` turns aging off, and a step then waits for as long
    /// as steps of higher priority are due.
    pub priority_aging: Option<Duration>,
    /// An instance silent for longer is dead (see [`INSTANCE_STALE_AFTER_DEFAULT`]).
    pub instance_stale_after: Duration,
    /// A leader that has completed no sweep (and committed no rescue batch) for this long
    /// stops renewing and steps down (LE-3); `None`: [`SWEEP_STALL_SWEEPS_DEFAULT`] sweep
    /// intervals. At least two sweep intervals. The check runs before each renewal, so a
    /// stalled leader steps down within this plus one renew interval.
    pub sweep_stall_after: Option<Duration>,
    /// How often pending notices are delivered to the sinks (see
    /// [`DELIVERY_INTERVAL_DEFAULT`]).
    pub delivery_interval: Duration,
    /// Workflows with a backlog alert, by name.
    pub backlog_alerts: Vec<(String, BacklogAlert)>,
    /// How often their queues are checked (see [`BACKLOG_INTERVAL_DEFAULT`]).
    pub backlog_interval: Duration,
    /// How often the timer pass wakes parked steps whose time came (see
    /// [`TIMER_INTERVAL_DEFAULT`]): the precision of timers and wait timeouts.
    pub timer_interval: Duration,
    /// Test hook (see [`SweepGate`]); `None` in production.
    #[doc(hidden)]
    pub sweep_gate: Option<SweepGate>,
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
            retention_interval: RETENTION_INTERVAL_DEFAULT,
            priority_aging: Some(PRIORITY_AGING_DEFAULT),
            instance_stale_after: INSTANCE_STALE_AFTER_DEFAULT,
            sweep_stall_after: None,
            delivery_interval: DELIVERY_INTERVAL_DEFAULT,
            backlog_alerts: Vec::new(),
            backlog_interval: BACKLOG_INTERVAL_DEFAULT,
            timer_interval: TIMER_INTERVAL_DEFAULT,
            sweep_gate: None,
        }
    }

    /// How long the leader may go without a completed sweep before it steps down:
    /// [`SupervisorConfig::sweep_stall_after`] or its default.
    pub fn stall_after(&self) -> Duration {
        self.sweep_stall_after.unwrap_or_else(|| {
            self.sweep_interval
                .saturating_mul(SWEEP_STALL_SWEEPS_DEFAULT)
                .max(SWEEP_STALL_MIN)
        })
    }

    /// How long no leader may go without a completed sweep before followers raise a
    /// `supervisor_stalled` alert ([`STALL_ALERT_FACTOR`] × [`SupervisorConfig::stall_after`]).
    pub fn stall_alert_after(&self) -> Duration {
        self.stall_after().saturating_mul(STALL_ALERT_FACTOR)
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
        if self.delivery_interval.is_zero()
            || self.backlog_interval.is_zero()
            || self.timer_interval.is_zero()
            || self.retention_interval.is_zero()
        {
            return Err(Error::Config(
                "the delivery, backlog, timer and retention intervals must be positive".into(),
            ));
        }
        if self
            .priority_aging
            .is_some_and(|p| p < Duration::from_millis(1))
        {
            return Err(Error::Config(
                "the priority aging period must be at least 1 ms (or off)".into(),
            ));
        }
        if self.sweep_interval.is_zero() || self.sweep_batch == 0 {
            return Err(Error::Config(
                "sweep interval and batch must be positive".into(),
            ));
        }
        if self.stall_after() < self.sweep_interval.saturating_mul(2) {
            return Err(Error::Config(format!(
                "the sweep stall threshold ({:?}) must be at least two sweep intervals ({:?})",
                self.stall_after(),
                self.sweep_interval
            )));
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

    #[test]
    fn aging_is_on_by_default_and_its_period_must_be_positive() {
        let mut c = SupervisorConfig::new("a");
        assert_eq!(c.priority_aging, Some(PRIORITY_AGING_DEFAULT));
        c.priority_aging = None;
        assert!(c.validate().is_ok(), "off");
        c.priority_aging = Some(Duration::from_millis(100));
        assert!(c.validate().is_ok());
        c.priority_aging = Some(Duration::ZERO);
        let e = c.validate().expect_err("a zero period");
        assert!(e.to_string().contains("aging"), "{e}");
    }

    #[test]
    fn the_stall_threshold_follows_the_sweep_interval_unless_set() {
        let mut c = SupervisorConfig::new("a");
        assert_eq!(c.stall_after(), Duration::from_secs(5));
        assert_eq!(c.stall_alert_after(), Duration::from_secs(10));
        c.sweep_interval = Duration::from_secs(2);
        assert_eq!(c.stall_after(), Duration::from_secs(10));
        c.sweep_interval = Duration::from_millis(100);
        assert_eq!(c.stall_after(), SWEEP_STALL_MIN, "never below the floor");
        c.sweep_stall_after = Some(Duration::from_millis(200));
        assert!(c.validate().is_ok());
        assert_eq!(c.stall_alert_after(), Duration::from_millis(400));
        c.sweep_stall_after = Some(Duration::from_millis(150));
        assert!(matches!(c.validate(), Err(Error::Config(_))));
        c.sweep_stall_after = Some(Duration::ZERO);
        assert!(c.validate().is_err());
    }
}
