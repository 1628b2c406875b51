//! A test clock: an offset added to the database clock an engine reads, so that a test can
//! move time ("advance 48 hours") at once, and deadlines, backoff, scheduled starts, rate
//! limits and time windows all see it.
//!
//! The engine takes every "now" from the database (statements say `{now}`); with a test
//! clock that becomes the database's now plus the offset, read afresh for each statement.
//! Only engines (and stores) given the clock see it: another instance on the same database
//! keeps the real time unless it is given the same clock. Production code never sets one.
//!
//! Process liveness is not business time: instance heartbeats, leader leases and the
//! leader's sweep progress stay on the database's wall clock (statements say `{wall_now}`),
//! so a jump of hours leaves every live instance alive and the leader in its term.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// A point in time on the database's clock.
pub type Timestamp = chrono::DateTime<chrono::Utc>;

/// An offset, shared by every engine and store given a clone of it, added to the database
/// clock they read.
///
/// ```
/// use std::time::Duration;
/// use sagaflow_engine::clock::TestClock;
///
/// let clock = TestClock::new();
/// clock.advance(Duration::from_secs(48 * 3600));
/// assert_eq!(clock.offset_ms(), 48 * 3600 * 1000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// A clock at the database's own time (offset zero).
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(millis(by), Ordering::SeqCst);
    }

    /// Sets the offset from the database's time, in milliseconds (negative: the past).
    pub fn set_offset_ms(&self, offset: i64) {
        self.0.store(offset, Ordering::SeqCst);
    }

    /// The offset from the database's time, in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl PartialEq for TestClock {
    /// Two handles are equal when they move the same clock.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TestClock {}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
