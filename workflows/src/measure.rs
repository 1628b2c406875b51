//! Small measurement helpers shared by the benchmark and the chaos command.
//!
//! Nearest-rank percentiles over a sorted sample are all these commands need; a histogram
//! crate would add a dependency for one line of arithmetic.

use std::time::Duration;

/// The `p`-th percentile (0..=100) of `sorted`, by nearest rank; zero for an empty sample.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `d` in milliseconds with two decimals, e.g. `1.82 ms`.
pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let sample: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&sample, 50.0), Duration::from_millis(51));
        assert_eq!(percentile(&sample, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&sample, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(ms(Duration::from_micros(1820)), "1.82 ms");
    }
}
