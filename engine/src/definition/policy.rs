//! Per-step retry and deadline policies, with per-workflow defaults.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Default number of failed attempts (errors and timeouts) after which a step fails.
pub const MAX_FAILURES_DEFAULT: u32 = 5;
/// Default number of interruptions (attempts lost with their engine instance: a crash, a
/// frozen process, a shutdown) after which a step is treated as poison: the run stops in
/// `Error` with a `poison_step` alert instead of crashing engines forever.
pub const MAX_INTERRUPTIONS_DEFAULT: u32 = 5;
/// Default cap on deferrals ([`StepError::try_again_after`](crate::StepError::try_again_after)):
/// a step is deferred without counting a failure only while its attempt number within the
/// phase is at most this; a later deferral is an ordinary retryable failure.
pub const MAX_DEFERRALS_DEFAULT: u32 = 100;
/// Default ceiling of the delay a deferral may ask for: a longer `Retry-After` is cut to it,
/// so a hostile or broken remote cannot park a step for a year.
pub const MAX_DEFERRAL_DELAY_DEFAULT: Duration = Duration::from_secs(3600);
/// Default first retry delay.
pub const INITIAL_BACKOFF_DEFAULT: Duration = Duration::from_millis(200);
/// Default ceiling of the retry delay.
pub const MAX_BACKOFF_DEFAULT: Duration = Duration::from_secs(60);
/// Default time a step attempt may take before the supervisor treats it as failed (SAS-3).
pub const DEADLINE_DEFAULT: Duration = Duration::from_secs(30);
/// Default ceiling to which the supervisor extends a step's deadline.
pub const DEADLINE_CAP_DEFAULT: Duration = Duration::from_secs(600);

/// How a step is retried after a retryable failure or a timeout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Failed attempts (errors and timeouts) at which the step fails for good: the
    /// supervisor's failure threshold (SAS-4). `None` retries forever (the default for
    /// retriable steps).
    pub max_failures: Option<u32>,
    /// Delay before the first retry.
    pub initial_backoff: Duration,
    /// Ceiling of the delay.
    pub max_backoff: Duration,
    /// Whether to randomise each delay (recommended: spreads retry storms).
    pub jitter: bool,
    /// Interruptions (attempts lost with their engine instance) a step may take; one more
    /// stops the run in `Error` with a `poison_step` alert. Interruptions never count as
    /// failures.
    pub max_interruptions: u32,
    /// Attempts of a phase during which a deferral
    /// ([`StepError::try_again_after`](crate::StepError::try_again_after)) costs no failure:
    /// a deferral answered by an attempt whose number within the phase is above this is an
    /// ordinary retryable failure (counted, with backoff).
    pub max_deferrals: u32,
    /// Ceiling of the delay of one deferral.
    pub max_deferral_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_failures: Some(MAX_FAILURES_DEFAULT),
            initial_backoff: INITIAL_BACKOFF_DEFAULT,
            max_backoff: MAX_BACKOFF_DEFAULT,
            jitter: true,
            max_interruptions: MAX_INTERRUPTIONS_DEFAULT,
            max_deferrals: MAX_DEFERRALS_DEFAULT,
            max_deferral_delay: MAX_DEFERRAL_DELAY_DEFAULT,
        }
    }
}

impl RetryPolicy {
    /// Sets the failure threshold.
    #[must_use]
    pub fn with_max_failures(mut self, n: u32) -> Self {
        self.max_failures = Some(n);
        self
    }

    /// Retries without limit.
    #[must_use]
    pub fn with_unlimited_failures(mut self) -> Self {
        self.max_failures = None;
        self
    }

    /// Sets the first and the largest delay.
    #[must_use]
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets how many interruptions a step may take before it is treated as poison.
    #[must_use]
    pub fn with_max_interruptions(mut self, n: u32) -> Self {
        self.max_interruptions = n;
        self
    }

    /// Sets how many attempts of a phase may be deferred without counting a failure (see
    /// [`RetryPolicy::max_deferrals`]).
    #[must_use]
    pub fn with_max_deferrals(mut self, n: u32) -> Self {
        self.max_deferrals = n;
        self
    }

    /// Sets the ceiling of one deferral's delay.
    #[must_use]
    pub fn with_max_deferral_delay(mut self, max: Duration) -> Self {
        self.max_deferral_delay = max;
        self
    }

    /// The delay of a deferral that asked for `asked`: capped by
    /// [`RetryPolicy::max_deferral_delay`].
    pub fn deferral_delay(&self, asked: Duration) -> Duration {
        asked.min(self.max_deferral_delay)
    }

    /// The interruption cap as stored.
    pub fn max_interruptions_stored(&self) -> i32 {
        i32::try_from(self.max_interruptions).unwrap_or(i32::MAX)
    }

    /// Turns jitter on or off.
    #[must_use]
    pub fn with_jitter(mut self, jitter: bool) -> Self {
        self.jitter = jitter;
        self
    }

    /// The threshold as stored (`i32::MAX` stands for "unlimited").
    pub fn max_failures_stored(&self) -> i32 {
        self.max_failures
            .map_or(i32::MAX, |n| i32::try_from(n).unwrap_or(i32::MAX))
    }

    /// Delay before the attempt that follows the `failures`-th failure (1-based):
    /// exponential with factor 2, capped, with optional jitter.
    pub fn backoff(&self, failures: u32) -> Duration {
        let mut builder = ExponentialBuilder::default()
            .with_min_delay(self.initial_backoff)
            .with_max_delay(self.max_backoff)
            .with_factor(2.0)
            .without_max_times();
        if self.jitter {
            builder = builder.with_jitter();
        }
        let n = usize::try_from(failures.saturating_sub(1))
            .unwrap_or(usize::MAX)
            .min(64);
        builder.build().nth(n).unwrap_or(self.max_backoff)
    }
}

/// How long an attempt may take, and how the supervisor extends it after a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadlinePolicy {
    /// The first attempt's deadline (`CompleteBy = now + initial`).
    pub initial: Duration,
    /// Each timeout doubles the deadline up to this cap.
    pub cap: Duration,
}

impl Default for DeadlinePolicy {
    fn default() -> Self {
        Self {
            initial: DEADLINE_DEFAULT,
            cap: DEADLINE_CAP_DEFAULT,
        }
    }
}

impl DeadlinePolicy {
    /// A policy with the given first deadline and cap.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        Self { initial, cap }
    }

    /// The deadline after one more timeout: doubled, capped.
    pub fn extend(&self, current: Duration) -> Duration {
        current.saturating_mul(2).min(self.cap).max(self.initial)
    }
}

/// Settings of one step; a workflow's defaults apply where a step sets nothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepSettings {
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Deadline policy.
    pub deadline: DeadlinePolicy,
}

/// A duration in whole milliseconds, saturating.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_without_jitter() {
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_millis(1000))
            .with_jitter(false);
        let delays: Vec<_> = (1..=6).map(|n| p.backoff(n).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn jitter_stays_within_bounds() {
        let p = RetryPolicy::default()
            .with_backoff(Duration::from_millis(100), Duration::from_secs(10));
        for n in 1..=5 {
            let base = 100u128 << (n - 1);
            let d = p.backoff(n).as_millis();
            assert!(
                d >= base && d <= base * 2,
                "attempt {n}: {d} ms not in [{base}, {}]",
                base * 2
            );
        }
    }

    #[test]
    fn deadline_extension_doubles_and_caps() {
        let p = DeadlinePolicy::new(Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(p.extend(Duration::from_secs(1)), Duration::from_secs(2));
        assert_eq!(p.extend(Duration::from_secs(4)), Duration::from_secs(5));
        assert_eq!(p.extend(Duration::from_secs(5)), Duration::from_secs(5));
    }

    #[test]
    fn a_deferral_delay_is_capped() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.deferral_delay(Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        assert_eq!(
            p.deferral_delay(Duration::from_secs(365 * 86_400)),
            MAX_DEFERRAL_DELAY_DEFAULT
        );
        let short = p.with_max_deferral_delay(Duration::from_millis(10));
        assert_eq!(
            short.deferral_delay(Duration::from_secs(1)),
            Duration::from_millis(10)
        );
    }

    #[test]
    fn unlimited_failures_are_stored_as_max() {
        assert_eq!(
            RetryPolicy::default()
                .with_unlimited_failures()
                .max_failures_stored(),
            i32::MAX
        );
        assert_eq!(RetryPolicy::default().max_failures_stored(), 5);
    }
}
