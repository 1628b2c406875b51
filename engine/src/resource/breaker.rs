//! A resource's circuit breaker: its policy, its stored state, and the decision each claim
//! makes from them.
//!
//! Attempts' ends add to counters in the resource's row (in the transaction that writes
//! them); the claim for the resource, which holds the row, reads the counters and moves the
//! breaker: `closed` opens when a threshold is crossed, `open` turns `half_open` after the
//! cool-down, `half_open` lets one probe through (when nothing of the resource is in
//! flight) and closes on its success or opens again on its failure.

use serde::{Deserialize, Serialize};

/// When a breaker opens and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Breaker {
    /// Opens after this many failures in a row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_failures: Option<u32>,
    /// Opens when at least this percentage of the attempts of a window failed…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_percent: Option<u8>,
    /// …of at least this many attempts…
    #[serde(default = "min_calls_default")]
    pub min_calls: u32,
    /// …in a window of this many milliseconds.
    #[serde(default = "window_default")]
    pub window_ms: u64,
    /// How long it stays open before a probe, in milliseconds.
    pub cool_down_ms: u64,
    /// An alert is raised when it has not closed this long after opening (milliseconds).
    #[serde(default = "alert_after_default")]
    pub alert_after_ms: u64,
}

fn min_calls_default() -> u32 {
    10
}

fn window_default() -> u64 {
    60_000
}

fn alert_after_default() -> u64 {
    300_000
}

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Attempts go through.
    Closed,
    /// Steps wait for the cool-down.
    Open,
    /// One probe goes through; its result closes or opens the breaker.
    HalfOpen,
}

impl BreakerState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    /// The state named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "closed" => Some(Self::Closed),
            "open" => Some(Self::Open),
            "half_open" => Some(Self::HalfOpen),
            _ => None,
        }
    }
}

/// A breaker's stored state and counters (times in epoch milliseconds of the database clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BreakerStatus {
    /// The state.
    pub state: BreakerState,
    /// When it entered the state.
    pub since_ms: i64,
    /// When it last left `closed`, while it has not closed again.
    pub opened_at_ms: Option<i64>,
    /// Failures in a row.
    pub consecutive_failures: i64,
    /// Attempts ended in the current window (in `half_open`: since the probe began).
    pub window_calls: i64,
    /// Of which failed.
    pub window_failed: i64,
    /// When the current window began.
    pub window_at_ms: i64,
}

impl Default for BreakerStatus {
    fn default() -> Self {
        Self {
            state: BreakerState::Closed,
            since_ms: 0,
            opened_at_ms: None,
            consecutive_failures: 0,
            window_calls: 0,
            window_failed: 0,
            window_at_ms: 0,
        }
    }
}

/// What a claim may do, by the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerGate {
    /// Claim as the other limits allow.
    Pass,
    /// Claim one probe, and only when nothing of the resource is in flight.
    Probe,
    /// Claim nothing; the cool-down ends in this many milliseconds.
    Wait(i64),
}

impl Breaker {
    /// Checks the policy.
    ///
    /// # Errors
    /// The reason.
    pub fn check(&self) -> Result<(), String> {
        if self.consecutive_failures.is_none() && self.failure_percent.is_none() {
            return Err("a breaker needs consecutive_failures or failure_percent".into());
        }
        if self.consecutive_failures == Some(0) {
            return Err("a breaker's consecutive_failures must be at least 1".into());
        }
        if self.failure_percent.is_some_and(|p| p == 0 || p > 100) {
            return Err("a breaker's failure_percent must be 1 to 100".into());
        }
        if self.min_calls == 0 || self.window_ms == 0 || self.cool_down_ms == 0 {
            return Err(
                "a breaker's min_calls, window_ms and cool_down_ms must be at least 1".into(),
            );
        }
        Ok(())
    }

    /// Whether the counters cross a threshold.
    fn tripped(&self, s: &BreakerStatus) -> bool {
        let consecutive = self
            .consecutive_failures
            .is_some_and(|n| s.consecutive_failures >= i64::from(n));
        let ratio = self.failure_percent.is_some_and(|p| {
            s.window_calls >= i64::from(self.min_calls)
                && s.window_failed * 100 >= i64::from(p) * s.window_calls
        });
        consecutive || ratio
    }

    /// The breaker's next state at `now_ms` from its stored one, and what the claim may do.
    pub fn decide(&self, s: &BreakerStatus, now_ms: i64) -> (BreakerStatus, BreakerGate) {
        let cool_down = i64::try_from(self.cool_down_ms).unwrap_or(i64::MAX);
        let open = |s: &BreakerStatus| BreakerStatus {
            state: BreakerState::Open,
            since_ms: now_ms,
            opened_at_ms: s.opened_at_ms.or(Some(now_ms)),
            ..*s
        };
        match s.state {
            BreakerState::Closed if self.tripped(s) => {
                (open(s), BreakerGate::Wait(cool_down.max(1)))
            }
            BreakerState::Closed => {
                let window = i64::try_from(self.window_ms).unwrap_or(i64::MAX);
                if now_ms.saturating_sub(s.window_at_ms) >= window {
                    let fresh = BreakerStatus {
                        window_calls: 0,
                        window_failed: 0,
                        window_at_ms: now_ms,
                        ..*s
                    };
                    (fresh, BreakerGate::Pass)
                } else {
                    (*s, BreakerGate::Pass)
                }
            }
            BreakerState::Open => {
                let ends = s.since_ms.saturating_add(cool_down);
                if now_ms < ends {
                    return (*s, BreakerGate::Wait(ends - now_ms));
                }
                let half = BreakerStatus {
                    state: BreakerState::HalfOpen,
                    since_ms: now_ms,
                    window_calls: 0,
                    window_failed: 0,
                    window_at_ms: now_ms,
                    ..*s
                };
                (half, BreakerGate::Probe)
            }
            BreakerState::HalfOpen if s.window_failed > 0 => {
                (open(s), BreakerGate::Wait(cool_down.max(1)))
            }
            BreakerState::HalfOpen if s.window_calls > 0 => {
                let closed = BreakerStatus {
                    state: BreakerState::Closed,
                    since_ms: now_ms,
                    opened_at_ms: None,
                    consecutive_failures: 0,
                    window_calls: 0,
                    window_failed: 0,
                    window_at_ms: now_ms,
                };
                (closed, BreakerGate::Pass)
            }
            BreakerState::HalfOpen => (*s, BreakerGate::Probe),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker {
            consecutive_failures: Some(3),
            failure_percent: None,
            min_calls: 10,
            window_ms: 60_000,
            cool_down_ms: 1_000,
            alert_after_ms: 300_000,
        }
    }

    #[test]
    fn three_failures_in_a_row_open_then_a_probe_closes() {
        let b = breaker();
        let mut s = BreakerStatus {
            consecutive_failures: 2,
            ..BreakerStatus::default()
        };
        assert_eq!(b.decide(&s, 10).1, BreakerGate::Pass);
        s.consecutive_failures = 3;
        let (s, gate) = b.decide(&s, 10);
        assert_eq!(
            (s.state, gate),
            (BreakerState::Open, BreakerGate::Wait(1_000))
        );
        assert_eq!(s.opened_at_ms, Some(10));
        assert_eq!(b.decide(&s, 500).1, BreakerGate::Wait(510));
        let (s, gate) = b.decide(&s, 1_010);
        assert_eq!(
            (s.state, gate),
            (BreakerState::HalfOpen, BreakerGate::Probe)
        );
        // Until the probe's result is in, still one probe at a time.
        assert_eq!(b.decide(&s, 1_020).1, BreakerGate::Probe);
        let ok = BreakerStatus {
            window_calls: 1,
            ..s
        };
        let (s, gate) = b.decide(&ok, 1_030);
        assert_eq!((s.state, gate), (BreakerState::Closed, BreakerGate::Pass));
        assert_eq!((s.consecutive_failures, s.opened_at_ms), (0, None));
    }

    #[test]
    fn a_failed_probe_opens_again_and_keeps_the_first_opening() {
        let b = breaker();
        let half = BreakerStatus {
            state: BreakerState::HalfOpen,
            since_ms: 2_000,
            opened_at_ms: Some(1_000),
            window_calls: 1,
            window_failed: 1,
            ..BreakerStatus::default()
        };
        let (s, gate) = b.decide(&half, 2_100);
        assert_eq!(
            (s.state, gate),
            (BreakerState::Open, BreakerGate::Wait(1_000))
        );
        assert_eq!((s.since_ms, s.opened_at_ms), (2_100, Some(1_000)));
    }

    #[test]
    fn a_failure_ratio_opens_only_over_enough_calls_and_windows_roll() {
        let b = Breaker {
            consecutive_failures: None,
            failure_percent: Some(50),
            ..breaker()
        };
        let few = BreakerStatus {
            window_calls: 4,
            window_failed: 4,
            window_at_ms: 0,
            ..BreakerStatus::default()
        };
        assert_eq!(b.decide(&few, 100).1, BreakerGate::Pass);
        let many = BreakerStatus {
            window_calls: 10,
            window_failed: 5,
            ..few
        };
        assert_eq!(b.decide(&many, 100).0.state, BreakerState::Open);
        let under = BreakerStatus {
            window_calls: 10,
            window_failed: 4,
            ..few
        };
        let (s, _) = b.decide(&under, 60_000);
        assert_eq!((s.window_calls, s.window_at_ms), (0, 60_000));
        assert!(b.check().is_ok());
        assert!(
            Breaker {
                failure_percent: Some(0),
                ..b
            }
            .check()
            .is_err()
        );
        assert!(
            Breaker {
                consecutive_failures: None,
                failure_percent: None,
                ..b
            }
            .check()
            .is_err()
        );
    }
}
