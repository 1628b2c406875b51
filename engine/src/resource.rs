//! Flow control per remote resource: the limits a step's attempts obey when the step
//! declares the remote service it calls ([`WorkflowBuilder::resource`]).
//!
//! Limits are kept in the database (`sagaflow_resources`), so that every instance of a fleet
//! obeys the same ones: the application's code declares defaults
//! ([`Resource`], published at each engine's start), and an operator may override them at
//! run time ([`Store::resource_override`](crate::Store::resource_override)). They are applied
//! when steps are claimed, in the claiming transaction, with the resource's row locked: a
//! limit holds across instances, and nothing is counted in memory. Attempts in flight are
//! counted from the running steps themselves, so a limit is released by whatever ends an
//! attempt (success, failure, timeout, the death of its instance) without a counter to drift.
//!
//! [`WorkflowBuilder::resource`]: crate::WorkflowBuilder::resource

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;

mod breaker;
mod window;

pub use breaker::{Breaker, BreakerGate, BreakerState, BreakerStatus};
pub use window::{Window, WindowGate, Windows};

/// A resource's name is shown and typed by operators, and is a metrics label: at most this
/// many characters.
const NAME_MAX: usize = 100;

/// The limits of one remote resource. `None` leaves that dimension unlimited.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourceLimits {
    /// Attempts of its steps in flight at most, across every instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_in_flight: Option<u32>,
    /// Attempts in flight at most per flow key (a tenant, a customer: see
    /// [`WorkflowBuilder::flow_key`](crate::WorkflowBuilder::flow_key)). Due steps are
    /// shared fairly between keys: each claim serves first the keys with the fewest attempts
    /// in flight. Runs without a key share one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_in_flight_per_key: Option<u32>,
    /// Attempts started at most per period, across every instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// When its steps may be called, in a named time zone; outside every window they wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub windows: Option<Windows>,
    /// Attempts started in batches, with a pause after each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Batch>,
    /// A circuit breaker: after failures, its steps wait a cool-down, then one probe decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker: Option<Breaker>,
}

/// A rate: `limit` attempts per `period_ms`, evenly spaced, with up to `burst` at once after
/// a quiet spell (the generic cell rate algorithm, on the database's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Attempts per period.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub limit: u32,
    /// The period, in milliseconds.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86_400_000))]
    pub period_ms: u64,
    /// Attempts that may start at once after a quiet spell; 1 spaces every attempt evenly.
    #[serde(default = "one")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub burst: u32,
}

fn one() -> u32 {
    1
}

/// Attempts started in batches of `size`, with a pause of `pause_ms` after each full batch
/// (across every instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Batch {
    /// Attempts per batch.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub size: u32,
    /// The pause after a batch, in milliseconds.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub pause_ms: u64,
}

impl Rate {
    /// The time between two attempts, in microseconds (at least 1).
    pub fn interval_us(&self) -> i64 {
        let period_us = i64::try_from(self.period_ms)
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000);
        (period_us / i64::from(self.limit.max(1))).max(1)
    }

    /// How many attempts may start at `now_us` given the stored theoretical arrival time
    /// `tat_us`, and, when none may, how long until one may (microseconds).
    pub fn allowance(&self, tat_us: i64, now_us: i64) -> (u32, i64) {
        let t = self.interval_us();
        let tolerance = t.saturating_mul(i64::from(self.burst.max(1)) - 1);
        let tat = tat_us.max(now_us);
        let earliest = tat - tolerance;
        if earliest > now_us {
            return (0, earliest - now_us);
        }
        let n = (now_us - earliest) / t + 1;
        (u32::try_from(n).unwrap_or(u32::MAX), 0)
    }

    /// The theoretical arrival time after `n` attempts started at `now_us`.
    pub fn advance(&self, tat_us: i64, now_us: i64, n: u32) -> i64 {
        tat_us
            .max(now_us)
            .saturating_add(self.interval_us().saturating_mul(i64::from(n)))
    }
}

impl ResourceLimits {
    /// Checks the limits.
    ///
    /// # Errors
    /// A reason for a zero limit, a zero period, a zero burst, or a period over a day.
    pub fn check(&self) -> Result<(), String> {
        if self.max_in_flight == Some(0) || self.max_in_flight_per_key == Some(0) {
            return Err("a concurrency limit must be at least 1 (leave it out for none)".into());
        }
        if let Some(r) = self.rate {
            if r.limit == 0 || r.period_ms == 0 || r.burst == 0 {
                return Err("a rate needs a limit, a period and a burst of at least 1".into());
            }
            if r.period_ms > 86_400_000 {
                return Err("a rate's period is at most a day (86,400,000 ms)".into());
            }
        }
        if let Some(w) = &self.windows {
            w.check()?;
        }
        if let Some(b) = self.batch
            && (b.size == 0 || b.pause_ms == 0)
        {
            return Err("a batch needs a size and a pause of at least 1".into());
        }
        if let Some(b) = &self.breaker {
            b.check()?;
        }
        Ok(())
    }

    /// Whether nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        self.max_in_flight.is_none()
            && self.max_in_flight_per_key.is_none()
            && self.rate.is_none()
            && self.windows.is_none()
            && self.batch.is_none()
            && self.breaker.is_none()
    }
}

/// A remote resource and the limits the application's code gives it; declared with
/// `EngineBuilder::with_resource`.
///
/// ```
/// use std::time::Duration;
/// use sagaflow_engine::resource::Resource;
///
/// // At most 20 calls a second and 8 at a time to the payment provider, 2 per customer.
/// let payments = Resource::new("payments-api")
///     .max_in_flight(8)
///     .max_in_flight_per_key(2)
///     .rate(20, Duration::from_secs(1));
/// assert_eq!(payments.limits().max_in_flight, Some(8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Resource {
    name: String,
    limits: ResourceLimits,
    /// Declarations that did not parse, reported by [`Resource::check`].
    invalid: Vec<String>,
}

impl Resource {
    /// A resource without limits.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            limits: ResourceLimits::default(),
            invalid: Vec::new(),
        }
    }

    /// At most `n` attempts in flight across every instance.
    pub fn max_in_flight(mut self, n: u32) -> Self {
        self.limits.max_in_flight = Some(n);
        self
    }

    /// At most `n` attempts in flight per flow key, shared fairly between keys.
    pub fn max_in_flight_per_key(mut self, n: u32) -> Self {
        self.limits.max_in_flight_per_key = Some(n);
        self
    }

    /// At most `limit` attempts started per `period`, evenly spaced (burst 1).
    pub fn rate(mut self, limit: u32, period: Duration) -> Self {
        self.limits.rate = Some(Rate {
            limit,
            period_ms: u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
            burst: 1,
        });
        self
    }

    /// Lets up to `n` attempts start at once after a quiet spell (with [`Resource::rate`]).
    pub fn burst(mut self, n: u32) -> Self {
        if let Some(r) = &mut self.limits.rate {
            r.burst = n;
        }
        self
    }

    /// Calls only within these windows of the time zone `time_zone` (an IANA name such as
    /// `Europe/Moscow`), each written `DAYS HH:MM-HH:MM`: `MON-FRI 00:00-06:00`,
    /// `SAT,SUN 00:00-24:00`, `FRI 22:00-02:00` (past midnight). A window that does not parse
    /// is kept as written and refused when the engine starts, naming it.
    pub fn windows<I, S>(mut self, time_zone: impl Into<String>, open: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut windows = Vec::new();
        for w in open {
            match w.as_ref().parse::<Window>() {
                Ok(w) => windows.push(w),
                Err(e) => self.invalid.push(e),
            }
        }
        self.limits.windows = Some(Windows {
            time_zone: time_zone.into(),
            open: windows,
        });
        self
    }

    /// Starts attempts in batches of `size`, pausing `pause` after each.
    pub fn batch(mut self, size: u32, pause: Duration) -> Self {
        self.limits.batch = Some(Batch {
            size,
            pause_ms: u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
        });
        self
    }

    /// A circuit breaker (see [`Breaker`] and [`Resource::breaker_after`]).
    pub fn breaker(mut self, breaker: Breaker) -> Self {
        self.limits.breaker = Some(breaker);
        self
    }

    /// A circuit breaker that opens after `failures` failures in a row and probes again
    /// after `cool_down` (an alert after 5 minutes open).
    pub fn breaker_after(self, failures: u32, cool_down: Duration) -> Self {
        self.breaker(Breaker {
            consecutive_failures: Some(failures),
            failure_percent: None,
            min_calls: 10,
            window_ms: 60_000,
            cool_down_ms: u64::try_from(cool_down.as_millis()).unwrap_or(u64::MAX),
            alert_after_ms: 300_000,
        })
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its limits.
    pub fn limits(&self) -> &ResourceLimits {
        &self.limits
    }

    /// Checks the name and the limits.
    ///
    /// # Errors
    /// [`Error::Config`] naming the resource and what is wrong.
    pub fn check(&self) -> Result<(), Error> {
        check_name(&self.name).map_err(Error::Config)?;
        if let Some(e) = self.invalid.first() {
            return Err(Error::Config(format!("resource `{}`: {e}", self.name)));
        }
        self.limits
            .check()
            .map_err(|e| Error::Config(format!("resource `{}`: {e}", self.name)))
    }
}

/// What names a remote resource for [`WorkflowBuilder::resource`]: its name, the
/// [`Resource`] declared, or a client of the service that knows which resource it calls
/// (`sagaflow::http::HttpAgent`).
///
/// [`WorkflowBuilder::resource`]: crate::WorkflowBuilder::resource
pub trait ResourceName {
    /// The resource's name.
    fn resource_name(&self) -> String;
}

impl ResourceName for &str {
    fn resource_name(&self) -> String {
        (*self).to_owned()
    }
}

impl ResourceName for String {
    fn resource_name(&self) -> String {
        self.clone()
    }
}

impl ResourceName for &String {
    fn resource_name(&self) -> String {
        (*self).clone()
    }
}

impl ResourceName for &Resource {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

/// Checks a resource name: 1 to 100 ASCII letters, digits, `_`, `-` and `.`.
///
/// # Errors
/// The reason.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= NAME_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "resource name `{name}` must be 1 to {NAME_MAX} ASCII letters, digits, `_`, `-` and `.`"
        ))
    }
}

/// A resource as stored: its limits, where they come from, and its load now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResourceView {
    /// Its name.
    pub name: String,
    /// The limits in force: the operator's override, else the code's defaults.
    pub limits: ResourceLimits,
    /// The limits the application's code declares.
    pub defaults: ResourceLimits,
    /// The limits an operator set at run time, in force until cleared.
    pub override_limits: Option<ResourceLimits>,
    /// Who set the override (`cli:alice`, `api:ops`).
    pub override_by: Option<String>,
    /// Why.
    pub override_reason: Option<String>,
    /// Attempts of its steps in flight now.
    pub in_flight: i64,
    /// Its steps due now and waiting for a claim (for a limit, or for a free slot).
    pub waiting: i64,
    /// Its circuit breaker's state (`closed` when it has none).
    pub breaker: BreakerStatus,
    /// When the pause after a full batch ends (epoch milliseconds), while it lasts.
    pub batch_resume_at_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_even_rate_lets_one_attempt_per_interval() {
        let r = Rate {
            limit: 10,
            period_ms: 1000,
            burst: 1,
        };
        assert_eq!(r.interval_us(), 100_000);
        // A quiet limiter lets one through, then asks to wait the interval.
        assert_eq!(r.allowance(0, 5_000_000), (1, 0));
        let tat = r.advance(0, 5_000_000, 1);
        assert_eq!(tat, 5_100_000);
        assert_eq!(r.allowance(tat, 5_000_000), (0, 100_000));
        assert_eq!(r.allowance(tat, 5_100_000), (1, 0));
        // Late by 2.5 intervals: still one at a time with burst 1.
        assert_eq!(r.allowance(tat, 5_350_000), (1, 0));
    }

    #[test]
    fn a_burst_lets_that_many_through_after_a_quiet_spell() {
        let r = Rate {
            limit: 10,
            period_ms: 1000,
            burst: 5,
        };
        assert_eq!(r.allowance(0, 10_000_000), (5, 0));
        let tat = r.advance(0, 10_000_000, 5);
        assert_eq!(r.allowance(tat, 10_000_000).0, 0);
        // One interval later, one more.
        assert_eq!(r.allowance(tat, 10_100_000), (1, 0));
    }

    #[test]
    fn zero_limits_and_long_periods_are_refused() {
        assert!(Resource::new("a").max_in_flight(0).check().is_err());
        assert!(
            Resource::new("a")
                .rate(0, Duration::from_secs(1))
                .check()
                .is_err()
        );
        assert!(
            Resource::new("a")
                .rate(1, Duration::from_secs(90_000))
                .check()
                .is_err()
        );
        assert!(Resource::new("bad name").check().is_err());
        assert!(
            Resource::new("payments-api")
                .max_in_flight(3)
                .check()
                .is_ok()
        );
    }
}
