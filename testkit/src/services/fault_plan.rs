//! What to inject: the random fault rates of a service ([`FaultPlan`]), the scripted
//! outcomes tests queue per call ([`Scripted`]), and the tally of injected faults
//! ([`FaultCounts`]).

use std::ops::{Add, AddAssign};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Random fault rates and latency of one simulated service. `Default` injects nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultPlan {
    /// Share of calls (0.0..=1.0) that fail with [`ServiceError::Transient`](super::ServiceError::Transient)
    /// without applying.
    pub transient: f64,
    /// Share of calls (0.0..=1.0) that apply their effect and then never answer.
    pub hang: f64,
    /// Share of calls (0.0..=1.0) that apply their effect and then lose the answer (a reset
    /// connection, a 502 or a 504, in turn).
    #[serde(default)]
    pub lose_reply: f64,
    /// Share of orders (0.0..=1.0) whose call of an operation fails with
    /// [`ServiceError::Permanent`](super::ServiceError::Permanent). Decided by a hash of
    /// `(seed, operation, order)`, so every retry of such a call fails again. Never applied to
    /// compensations (`release`, `refund`, `cancel_flight`, `cancel_hotel`).
    pub permanent: f64,
    /// Seed of the random decisions and of the permanent-order hash. A call's fate is a function
    /// of the seed, its operation, the order it concerns and how many times that operation was
    /// called for that order before, so a seed reproduces the same faults in every run,
    /// whatever order concurrent calls arrive in (idempotency keys, which embed run ids, play
    /// no part).
    pub seed: u64,
    /// Simulated processing time, slept after applying and before answering.
    pub latency: Duration,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self {
            transient: 0.0,
            hang: 0.0,
            lose_reply: 0.0,
            permanent: 0.0,
            seed: 0,
            latency: Duration::ZERO,
        }
    }
}

impl FaultPlan {
    /// No faults, no latency, seeded with `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            ..Self::default()
        }
    }
}

/// A scripted outcome for one call, consumed before the random plan applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Scripted {
    /// Behave normally (apply or replay).
    Ok,
    /// Fail transiently without applying.
    Transient,
    /// Apply the effect, then never answer.
    Hang,
    /// Fail permanently without applying (this one call only).
    Permanent,
    /// Apply the effect, then drop the connection without an answer.
    ResetAfterApply,
    /// Apply the effect, then answer 502 Bad Gateway.
    BadGatewayAfterApply,
    /// Apply the effect, then answer 504 Gateway Timeout.
    GatewayTimeoutAfterApply,
    /// Refuse with 409 Conflict without applying.
    RefuseNotApplied,
    /// Answer 429 Too Many Requests with `Retry-After: 1`, without applying.
    BusyNotApplied,
}

/// Number of injected faults, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// Transient failures returned.
    pub transient: u64,
    /// Calls that applied and then hung.
    pub hang: u64,
    /// Permanent failures returned.
    pub permanent: u64,
    /// Calls that applied and then lost their answer.
    #[serde(default)]
    pub lost_reply: u64,
    /// Calls refused without applying as a conflict or as busy.
    #[serde(default)]
    pub refused: u64,
}

impl FaultCounts {
    /// All injected faults.
    pub fn total(&self) -> u64 {
        self.transient + self.hang + self.permanent + self.lost_reply + self.refused
    }
}

impl Add for FaultCounts {
    type Output = FaultCounts;

    fn add(self, rhs: FaultCounts) -> FaultCounts {
        FaultCounts {
            transient: self.transient + rhs.transient,
            hang: self.hang + rhs.hang,
            permanent: self.permanent + rhs.permanent,
            lost_reply: self.lost_reply + rhs.lost_reply,
            refused: self.refused + rhs.refused,
        }
    }
}

impl AddAssign for FaultCounts {
    fn add_assign(&mut self, rhs: FaultCounts) {
        *self = *self + rhs;
    }
}
