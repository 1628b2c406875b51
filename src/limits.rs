//! Resource limits in words, as the `sagaflow` command and the console show them.

use crate::{BreakerState, Rate, ResourceLimits, ResourceView};

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
/// let kept = payments.compensation_share(2, 5);
/// assert_eq!(
///     describe_limits(kept.limits()),
///     "8 in flight, 2 per key, 20/s burst 1, kept for compensations: 2 in flight, 5/s"
/// );
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
    if let Some(w) = &limits.windows {
        let open: Vec<String> = w.open.iter().map(ToString::to_string).collect();
        parts.push(format!("open {} ({})", open.join(" and "), w.time_zone));
    }
    if let Some(b) = limits.batch {
        parts.push(format!(
            "batches of {} with {} pauses",
            b.size,
            describe_ms(b.pause_ms)
        ));
    }
    if let Some(b) = &limits.breaker {
        let mut when = Vec::new();
        if let Some(n) = b.consecutive_failures {
            when.push(format!("{n} failures in a row"));
        }
        if let Some(p) = b.failure_percent {
            when.push(format!(
                "{p}% of {}+ failing in {}",
                b.min_calls,
                describe_ms(b.window_ms)
            ));
        }
        parts.push(format!(
            "breaker after {}, cool-down {}",
            when.join(" or "),
            describe_ms(b.cool_down_ms)
        ));
    }
    if let Some(share) = limits.compensation_share {
        let mut kept = Vec::new();
        if share.in_flight > 0 {
            kept.push(format!("{} in flight", share.in_flight));
        }
        if let Some(rate) = limits.rate.filter(|_| share.rate > 0) {
            kept.push(describe_rate(&Rate {
                limit: share.rate,
                ..rate
            }));
        }
        parts.push(format!("kept for compensations: {}", kept.join(", ")));
    }
    if parts.is_empty() {
        "unlimited".to_owned()
    } else {
        parts.join(", ")
    }
}

/// A resource's circuit breaker and batch pause in words, for the `sagaflow resources` command
/// and the console: `closed`, `open (3 failures in a row)`, `half-open: probing`, or `none`
/// for a resource without a breaker; `, batch pause` while a batch's pause lasts.
pub fn describe_state(r: &ResourceView) -> String {
    let b = &r.breaker;
    let mut s = match (&r.limits.breaker, b.state) {
        (None, BreakerState::Closed) => "no breaker".to_owned(),
        (_, BreakerState::Closed) => "closed".to_owned(),
        (_, BreakerState::Open) => format!(
            "open ({} failures in a row, {} of {} in the window)",
            b.consecutive_failures, b.window_failed, b.window_calls
        ),
        (_, BreakerState::HalfOpen) => "half-open: probing".to_owned(),
    };
    if r.batch_resume_at_ms.is_some() {
        s.push_str(", batch pause");
    }
    s
}

/// A span of milliseconds in the largest unit that divides it: (count, unit).
fn in_unit(ms: u64) -> (u64, &'static str) {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1_000, "s"),
    ];
    UNITS
        .iter()
        .find(|(size, _)| ms > 0 && ms.is_multiple_of(*size))
        .map_or((ms, "ms"), |(size, unit)| (ms / size, *unit))
}

/// A span of milliseconds in words: `600ms`, `30s`, `5min`.
fn describe_ms(ms: u64) -> String {
    let (n, unit) = in_unit(ms);
    format!("{n}{unit}")
}

/// A rate as `limit/period`, the period in the largest unit that divides it.
fn describe_rate(rate: &Rate) -> String {
    let (n, unit) = in_unit(rate.period_ms);
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
            ..ResourceLimits::default()
        };
        assert_eq!(
            describe_limits(&all),
            "8 in flight, 2 per key, 20/s burst 1"
        );
        let night = crate::Resource::new("warehouse")
            .windows("Europe/Moscow", ["MON-FRI 00:00-06:00"])
            .batch(50, std::time::Duration::from_secs(30))
            .breaker_after(5, std::time::Duration::from_secs(60));
        assert_eq!(
            describe_limits(night.limits()),
            "open MON-FRI 00:00-06:00 (Europe/Moscow), batches of 50 with 30s pauses, \
             breaker after 5 failures in a row, cool-down 1min"
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

    #[test]
    fn a_breaker_reads_as_its_state() {
        let mut r = crate::ResourceView {
            name: "partner".into(),
            limits: crate::Resource::new("partner")
                .breaker_after(3, std::time::Duration::from_secs(30))
                .limits()
                .clone(),
            defaults: ResourceLimits::default(),
            override_limits: None,
            override_by: None,
            override_reason: None,
            in_flight: 0,
            compensations_in_flight: 0,
            waiting: 0,
            compensations_waiting: 0,
            breaker: crate::BreakerStatus::default(),
            batch_resume_at_ms: None,
        };
        assert_eq!(describe_state(&r), "closed");
        r.breaker.state = BreakerState::Open;
        r.breaker.consecutive_failures = 3;
        r.breaker.window_calls = 4;
        r.breaker.window_failed = 3;
        r.batch_resume_at_ms = Some(1);
        assert_eq!(
            describe_state(&r),
            "open (3 failures in a row, 3 of 4 in the window), batch pause"
        );
        r.breaker.state = BreakerState::HalfOpen;
        r.limits = ResourceLimits::default();
        r.batch_resume_at_ms = None;
        assert_eq!(describe_state(&r), "half-open: probing");
    }
}
