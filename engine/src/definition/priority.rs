//! Claim priorities: their range, a workflow's default, and the lane its retried attempts
//! are queued in.
//!
//! A run's priority (its start's, or its workflow's default) is copied onto each of its step
//! rows, and the claim takes due steps highest priority first. A step queued again after an
//! attempt that did not succeed is queued at its run's priority moved by the workflow's
//! [`RetryLane`]: always from the run's priority, so retries never accumulate. While a step
//! waits, the supervisor's aging raises its priority one level per aging period, so that low
//! priorities still progress under a sustained load of higher ones.

/// The lowest priority a run may have.
pub const PRIORITY_MIN: i32 = -1_000;

/// The highest priority a run may have, and the highest a step's priority is raised to by a
/// retry lane or by aging.
pub const PRIORITY_MAX: i32 = 1_000;

/// Whether `priority` is within [`PRIORITY_MIN`]..=[`PRIORITY_MAX`]; the reason when not.
///
/// # Errors
/// The reason, in words (`5000 is outside -1000..=1000`).
pub fn check_priority(priority: i32) -> Result<i32, String> {
    if (PRIORITY_MIN..=PRIORITY_MAX).contains(&priority) {
        Ok(priority)
    } else {
        Err(format!(
            "{priority} is outside {PRIORITY_MIN}..={PRIORITY_MAX}"
        ))
    }
}

/// Where a workflow's retried attempts queue, relative to new work of the same priority
/// (the "next try priority" of job systems).
///
/// A step is retried when an attempt did not succeed and the step is queued again: after a
/// retryable failure (once its backoff has passed), a deferral, a timeout or an
/// interruption. The retried step's priority is its run's priority plus the lane's offset,
/// bounded by [`PRIORITY_MIN`] and [`PRIORITY_MAX`].
///
/// # Examples
///
/// ```
/// use sagaflow_engine::definition::RetryLane;
///
/// assert_eq!(RetryLane::Ahead.retry_priority(5), 6);
/// assert_eq!(RetryLane::Behind.retry_priority(5), 4);
/// assert_eq!(RetryLane::Same.retry_priority(5), 5);
/// assert_eq!(RetryLane::Ahead.retry_priority(1_000), 1_000, "bounded");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryLane {
    /// At the run's priority, in the order the retries fall due among new work: a retry
    /// waits behind the steps due before it and goes ahead of those due after it. The
    /// default.
    #[default]
    Same,
    /// One level above the run's priority: a retried step is claimed before new work of the
    /// same priority, so a run that has begun finishes first (work in progress before new
    /// work).
    Ahead,
    /// One level below the run's priority: a retried step waits until no new work of the
    /// same priority is due, so a failing dependency does not crowd out fresh work.
    Behind,
}

impl RetryLane {
    /// The offset from the run's priority.
    pub const fn offset(self) -> i32 {
        match self {
            Self::Same => 0,
            Self::Ahead => 1,
            Self::Behind => -1,
        }
    }

    /// The priority a retried step of a run of `run_priority` is queued at.
    pub fn retry_priority(self, run_priority: i32) -> i32 {
        run_priority
            .saturating_add(self.offset())
            .clamp(PRIORITY_MIN, PRIORITY_MAX)
    }

    /// The published spelling: `same`, `ahead` or `behind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::Ahead => "ahead",
            Self::Behind => "behind",
        }
    }

    /// The lane of a published spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "same" => Some(Self::Same),
            "ahead" => Some(Self::Ahead),
            "behind" => Some(Self::Behind),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_priority_comes_from_the_run_priority_and_stays_in_range() {
        for run in [PRIORITY_MIN, -1, 0, 7, PRIORITY_MAX] {
            assert_eq!(RetryLane::Same.retry_priority(run), run);
        }
        assert_eq!(RetryLane::Ahead.retry_priority(7), 8);
        assert_eq!(RetryLane::Behind.retry_priority(7), 6);
        assert_eq!(RetryLane::Ahead.retry_priority(PRIORITY_MAX), PRIORITY_MAX);
        assert_eq!(RetryLane::Behind.retry_priority(PRIORITY_MIN), PRIORITY_MIN);
        // Out of range in (a row written by hand), in range out.
        assert_eq!(RetryLane::Ahead.retry_priority(i32::MAX), PRIORITY_MAX);
        assert_eq!(RetryLane::Behind.retry_priority(i32::MIN), PRIORITY_MIN);
    }

    #[test]
    fn lanes_read_back_what_they_publish() {
        for lane in [RetryLane::Same, RetryLane::Ahead, RetryLane::Behind] {
            assert_eq!(RetryLane::parse(lane.as_str()), Some(lane));
        }
        assert_eq!(RetryLane::parse("sideways"), None);
        assert_eq!(RetryLane::default(), RetryLane::Same);
    }

    #[test]
    fn priorities_outside_the_range_are_named() {
        assert_eq!(check_priority(PRIORITY_MAX), Ok(PRIORITY_MAX));
        assert_eq!(check_priority(PRIORITY_MIN), Ok(PRIORITY_MIN));
        assert_eq!(
            check_priority(5_000).expect_err("out of range"),
            "5000 is outside -1000..=1000"
        );
    }
}
