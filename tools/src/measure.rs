//! Small measurement helpers shared by the benchmark and the chaos command: latency
//! percentiles (an HDR histogram, three significant digits) and milliseconds for humans.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Latencies recorded in microseconds, from 1 µs to one hour, with three significant digits.
#[derive(Debug, Clone)]
pub struct Latencies(Histogram<u64>);

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    /// An empty record.
    pub fn new() -> Self {
        // Bounds and precision are constants known to be valid for the crate.
        #[allow(clippy::expect_used)]
        let h = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        Self(h)
    }

    /// The latencies of `sample`.
    pub fn of(sample: impl IntoIterator<Item = Duration>) -> Self {
        let mut l = Self::new();
        for d in sample {
            l.record(d);
        }
        l
    }

    /// Records one latency (values past an hour count as an hour).
    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        self.0.saturating_record(us);
    }

    /// How many were recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `p`-th percentile (0..=100); zero when nothing was recorded.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.0.value_at_quantile(p / 100.0))
    }

    /// The largest latency recorded; zero when nothing was recorded.
    pub fn max(&self) -> Duration {
        if self.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.0.max())
    }
}

/// `d` in milliseconds with two decimals, e.g. `1.82 ms`.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= b / 500
    }

    #[test]
    fn percentiles_within_the_histogram_precision() {
        let l = Latencies::of((1..=100).map(Duration::from_millis));
        assert_eq!(l.len(), 100);
        assert!(
            close(l.percentile(50.0), Duration::from_millis(50)),
            "{:?}",
            l.percentile(50.0)
        );
        assert!(close(l.percentile(99.0), Duration::from_millis(99)));
        assert!(close(l.max(), Duration::from_millis(100)));
        assert_eq!(Latencies::new().percentile(50.0), Duration::ZERO);
        assert_eq!(ms(Duration::from_micros(1820)), "1.82 ms");
    }
}
