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
    /// Capacity kept for compensation attempts, out of `max_in_flight` and `rate`: an undo
    /// storm is not starved by forward traffic, and cannot starve it either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation_share: Option<CompensationShare>,
}

/// The part of a resource's concurrency and rate kept for compensation attempts (the calls of
/// an undo), apart from forward attempts: a bulkhead between the two kinds.
///
/// With `in_flight: k` of `max_in_flight: n`, forward attempts hold at most `n - k` slots and
/// compensation attempts at most `k`; with `rate: r` of a rate of `l` per period, forward
/// attempts start at most `l - r` per period and compensation attempts at most `r`, each kind
/// on a limiter of its own. A share idle on one side is not lent to the other, so that what
/// one kind is promised is free the moment it needs it. A dimension whose share is 0 is
/// shared by both kinds, as without a share. Per-key limits, windows, batches and the
/// breaker apply to both kinds together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CompensationShare {
    /// Of `max_in_flight`, the attempts in flight kept for compensations; less than
    /// `max_in_flight`, so that forward attempts keep at least one.
    #[serde(default)]
    pub in_flight: u32,
    /// Of the rate's `limit`, the attempts per period kept for compensations; less than the
    /// limit.
    #[serde(default)]
    pub rate: u32,
}

/// The limits one kind of attempt obeys under a [`CompensationShare`]: its own slots and
/// its own rate, where the share splits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane {
    /// Attempts of this kind in flight at most, when the share splits the concurrency.
    pub(crate) max_in_flight: Option<u32>,
    /// The rate of this kind, when the share splits the rate.
    pub(crate) rate: Option<Rate>,
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
    ///
    /// An attempt claimed late keeps up to half an interval of its lateness: the next one's
    /// time is counted from its slot, not from when the claim came. Every claim goes
    /// through a transaction and a timer, so it always comes a little late; counted from
    /// the claim, that lateness would be lost at each attempt (2.6 ms a claim cost 5 % of
    /// a rate of 20 a second, and would cost 20 % at 100). Half an interval keeps two
    /// attempts at least that far apart and a period to the attempts even spacing allows,
    /// and after a quiet spell the second attempt waits half an interval.
    pub fn advance(&self, tat_us: i64, now_us: i64, n: u32) -> i64 {
        let t = self.interval_us();
        tat_us
            .max(now_us.saturating_sub(t / 2))
            .saturating_add(t.saturating_mul(i64::from(n)))
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
        if let Some(share) = self.compensation_share {
            self.check_share(share)?;
        }
        Ok(())
    }

    fn check_share(&self, share: CompensationShare) -> Result<(), String> {
        if share.in_flight == 0 && share.rate == 0 {
            return Err(
                "a compensation share keeps at least one slot or one attempt per period \
                 (leave it out for none)"
                    .into(),
            );
        }
        if share.in_flight > 0 {
            match self.max_in_flight {
                None => {
                    return Err(
                        "a compensation share of attempts in flight needs max_in_flight".into(),
                    );
                }
                Some(max) if share.in_flight >= max => {
                    return Err(format!(
                        "a compensation share of {} attempts in flight must be less than \
                         max_in_flight ({max}), so that forward attempts keep one",
                        share.in_flight
                    ));
                }
                Some(_) => {}
            }
        }
        if share.rate > 0 {
            match self.rate {
                None => return Err("a compensation share of the rate needs a rate".into()),
                Some(r) if share.rate >= r.limit => {
                    return Err(format!(
                        "a compensation share of {} attempts per period must be less than \
                         the rate's limit ({}), so that forward attempts keep one",
                        share.rate, r.limit
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// The lanes of forward and of compensation attempts, `(forward, compensations)`, when a
    /// [`CompensationShare`] splits the concurrency or the rate; `None` when both kinds share
    /// every limit.
    pub(crate) fn lanes(&self) -> Option<(Lane, Lane)> {
        let share = self.compensation_share?;
        let flight = self
            .max_in_flight
            .filter(|_| share.in_flight > 0)
            .map(|max| (max.saturating_sub(share.in_flight), share.in_flight));
        let rate = self.rate.filter(|_| share.rate > 0).map(|r| {
            let lane = |limit: u32| Rate {
                limit,
                period_ms: r.period_ms,
                burst: r.burst.min(limit).max(1),
            };
            (lane(r.limit.saturating_sub(share.rate)), lane(share.rate))
        });
        if flight.is_none() && rate.is_none() {
            return None;
        }
        Some((
            Lane {
                max_in_flight: flight.map(|f| f.0),
                rate: rate.map(|r| r.0),
            },
            Lane {
                max_in_flight: flight.map(|f| f.1),
                rate: rate.map(|r| r.1),
            },
        ))
    }

    /// Whether nothing is limited.
    pub fn is_unlimited(&self) -> bool {
        self.max_in_flight.is_none()
            && self.max_in_flight_per_key.is_none()
            && self.rate.is_none()
            && self.windows.is_none()
            && self.batch.is_none()
            && self.breaker.is_none()
            && self.compensation_share.is_none()
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

    /// Keeps `in_flight` of [`Resource::max_in_flight`]'s slots and `rate` of
    /// [`Resource::rate`]'s attempts per period for compensation attempts (see
    /// [`CompensationShare`]); 0 leaves that dimension shared.
    pub fn compensation_share(mut self, in_flight: u32, rate: u32) -> Self {
        self.limits.compensation_share = Some(CompensationShare { in_flight, rate });
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
    /// Attempts of its steps in flight now, compensations included.
    pub in_flight: i64,
    /// Of those, compensation attempts.
    pub compensations_in_flight: i64,
    /// Its steps due now and waiting for a claim (for a limit, or for a free slot),
    /// compensations included.
    pub waiting: i64,
    /// Of those, compensations.
    pub compensations_waiting: i64,
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
        assert_eq!(tat, 5_050_000);
        assert_eq!(r.allowance(tat, 5_000_000), (0, 50_000));
        assert_eq!(r.allowance(tat, 5_050_000), (1, 0));
        // Late by 2.5 intervals: still one at a time with burst 1.
        assert_eq!(r.allowance(tat, 5_300_000), (1, 0));
    }

    #[test]
    fn a_late_claim_keeps_its_slot_up_to_half_an_interval() {
        let r = Rate {
            limit: 10,
            period_ms: 1000,
            burst: 1,
        };
        // Slot at 1.0 s, claimed 30 ms late: the next slot is 1.1 s, not 1.13 s.
        let tat = r.advance(1_000_000, 1_030_000, 1);
        assert_eq!(tat, 1_100_000);
        // Claims 30 ms late each: ten of them take ten intervals, not 1.3 s.
        let mut tat = 1_000_000;
        for _ in 0..10 {
            let now = tat + 30_000;
            assert_eq!(r.allowance(tat, now).0, 1);
            tat = r.advance(tat, now, 1);
        }
        assert_eq!(tat, 2_000_000);
        // Late by 80 ms: 50 ms are kept, 30 ms lost; the next attempt is 50 ms away.
        let tat = r.advance(1_000_000, 1_080_000, 1);
        assert_eq!(tat, 1_130_000);
        assert_eq!(r.allowance(tat, 1_080_000), (0, 50_000));
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

    #[test]
    fn a_compensation_share_splits_slots_and_rate_into_lanes() {
        let r = Resource::new("a")
            .max_in_flight(8)
            .rate(20, Duration::from_secs(1))
            .burst(10)
            .compensation_share(2, 5);
        r.check().expect("valid");
        let (forward, undo) = r.limits().lanes().expect("split");
        assert_eq!(
            (forward.max_in_flight, undo.max_in_flight),
            (Some(6), Some(2))
        );
        let (f, u) = (forward.rate.expect("rate"), undo.rate.expect("rate"));
        assert_eq!((f.limit, f.period_ms, f.burst), (15, 1000, 10));
        assert_eq!((u.limit, u.period_ms, u.burst), (5, 1000, 5));
        // Only the slots: the rate stays shared.
        let slots = Resource::new("a")
            .max_in_flight(3)
            .rate(20, Duration::from_secs(1))
            .compensation_share(1, 0);
        let (forward, undo) = slots.limits().lanes().expect("split");
        assert_eq!(
            (forward.max_in_flight, undo.max_in_flight),
            (Some(2), Some(1))
        );
        assert_eq!((forward.rate, undo.rate), (None, None));
        assert_eq!(Resource::new("a").max_in_flight(3).limits().lanes(), None);
    }

    #[test]
    fn a_compensation_share_leaves_forward_attempts_some_of_what_it_splits() {
        let refused = |r: Resource, says: &str| {
            let e = r.check().expect_err("refused").to_string();
            assert!(e.contains(says), "{e}");
        };
        refused(
            Resource::new("a").max_in_flight(2).compensation_share(2, 0),
            "less than max_in_flight (2)",
        );
        refused(
            Resource::new("a").compensation_share(1, 0),
            "needs max_in_flight",
        );
        refused(
            Resource::new("a")
                .rate(5, Duration::from_secs(1))
                .compensation_share(0, 5),
            "less than the rate's limit (5)",
        );
        refused(Resource::new("a").compensation_share(0, 1), "needs a rate");
        refused(
            Resource::new("a").max_in_flight(2).compensation_share(0, 0),
            "at least one slot",
        );
    }
}
