//! Resource limits in words, as the `sagaflow` command and the console show them.

use crate::{Rate, ResourceLimits};

/// The limits of a remote resource in words: `8 in flight, 2 per key, 20/s burst 1`, or
/// `unlimited`. The one place that says how each limit reads to an operator, shared by the
/// `sagaflow resources` command and the console's resources page.
///
/// A rate reads as attempts per period, the period in the largest unit that divides it
/// (`20/s`, `100/min`, `5/250ms`, `10/30s`), as `sagaflow resources set --rate` takes it.
///
/// ```
/// use std::time::Duration;
/// use sagaflow::{Resource, describe_limits};
///
/// let payments = Resource::new("payments-api")
///     .max_in_flight(8)
///     .max_in_flight_per_key(2)
///     .rate(20, Duration::from_secs(1));
/// assert_eq!(describe_limits(payments.limits()), "8 in flight, 2 per key, 20/s burst 1");
/// assert_eq!(describe_limits(&Default::default()), "unlimited");
/// ```
pub fn describe_limits(limits: &ResourceLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.max_in_flight {
        parts.push(format!("{n} in flight"));
    }
    if let Some(n) = limits.max_in_flight_per_key {
        parts.push(format!("{n} per key"));
    }
    if let Some(rate) = &limits.rate {
        parts.push(format!("{} burst {}", describe_rate(rate), rate.burst));
    }
    if parts.is_empty() {
        "unlimited".to_owned()
    } else {
        parts.join(", ")
    }
}

/// A rate as `limit/period`, the period in the largest unit that divides it.
fn describe_rate(rate: &Rate) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1_000, "s"),
    ];
    let ms = rate.period_ms;
    let (n, unit) = UNITS
        .iter()
        .find(|(size, _)| ms > 0 && ms.is_multiple_of(*size))
        .map_or((ms, "ms"), |(size, unit)| (ms / size, *unit));
    if n == 1 && unit != "ms" {
        format!("{}/{unit}", rate.limit)
    } else {
        format!("{}/{n}{unit}", rate.limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(limit: u32, period_ms: u64, burst: u32) -> Option<Rate> {
        Some(Rate {
            limit,
            period_ms,
            burst,
        })
    }

    #[test]
    fn each_limit_reads_in_words() {
        let all = ResourceLimits {
            max_in_flight: Some(8),
            max_in_flight_per_key: Some(2),
            rate: rate(20, 1_000, 1),
        };
        assert_eq!(
            describe_limits(&all),
            "8 in flight, 2 per key, 20/s burst 1"
        );
        let only_key = ResourceLimits {
            max_in_flight_per_key: Some(3),
            ..ResourceLimits::default()
        };
        assert_eq!(describe_limits(&only_key), "3 per key");
        assert_eq!(describe_limits(&ResourceLimits::default()), "unlimited");
        for (period_ms, text) in [
            (60_000, "100/min burst 4"),
            (250, "100/250ms burst 4"),
            (30_000, "100/30s burst 4"),
            (1_500, "100/1500ms burst 4"),
            (7_200_000, "100/2h burst 4"),
            (86_400_000, "100/d burst 4"),
        ] {
            let limits = ResourceLimits {
                rate: rate(100, period_ms, 4),
                ..ResourceLimits::default()
            };
            assert_eq!(describe_limits(&limits), text, "{period_ms} ms");
        }
    }
}
