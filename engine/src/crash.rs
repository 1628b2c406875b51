//! Crashes on purpose, for tests: an engine instance given a [`CrashHook`] stops dead at a
//! named point of a chosen step, in process, so that a test can then start a fresh instance
//! on the same database and watch the recovery.
//!
//! "Stops dead" means what a killed process does: nothing more is written (a transaction in
//! progress rolls back, as the database does when a connection dies), nothing is released
//! (the steps it holds stay `Running` under its id, its leader lease is left to expire), its
//! heartbeat stops and its step code is dropped. The instance's loops are cancelled at the
//! moment of the crash; an instance that crashed skips the graceful part of its shutdown.

use std::sync::{Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

/// Where, in the life of a step's attempt, an instance given a crash hook stops dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrashPoint {
    /// The step is claimed (`Running`, held by the instance, its deadline set) and its
    /// action was not called: nothing happened remotely.
    BeforeCall,
    /// The action returned (its effect happened) and nothing of its result was written: the
    /// step is still `Running`, and its next attempt repeats the call with the same
    /// idempotency key.
    AfterEffect,
    /// The completion transaction wrote the attempt's result and the run's next steps but
    /// did not commit: it rolls back, and the step is still `Running`.
    BeforeCommit,
}

impl std::fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::BeforeCall => "before_call",
            Self::AfterEffect => "after_effect",
            Self::BeforeCommit => "before_commit",
        })
    }
}

/// Test hook: the point at which one engine instance crashes, armed at any time with
/// [`CrashHook::arm`]. Give it to one engine only; it crashes once, at the first attempt of
/// the armed step that reaches the armed point. Never set outside tests.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct CrashHook {
    /// Step, point, and the phase (`Some(true)`: a compensation attempt only; `None`: any).
    armed: Mutex<Option<(String, CrashPoint, Option<bool>)>>,
    crashed: CancellationToken,
}

impl CrashHook {
    /// A hook armed at nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Crash at `point` of the next attempt (forward or compensation) of the step named
    /// `step`, in any workflow.
    pub fn arm(&self, step: impl Into<String>, point: CrashPoint) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((step.into(), point, None));
    }

    /// Crash at `point` of the next *compensation* attempt of the step named `step` (its
    /// forward attempts pass).
    pub fn arm_compensation(&self, step: impl Into<String>, point: CrashPoint) {
        *self.armed.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((step.into(), point, Some(true)));
    }

    /// What the hook is armed at, if it has not fired yet.
    pub fn armed(&self) -> Option<(String, CrashPoint)> {
        self.armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|(s, p, _)| (s.clone(), *p))
    }

    /// Whether the instance crashed.
    pub fn has_crashed(&self) -> bool {
        self.crashed.is_cancelled()
    }

    /// Waits until the instance crashed.
    pub async fn crashed(&self) {
        self.crashed.cancelled().await;
    }

    /// A token cancelled at the crash; the instance's own cancellation token is a child of
    /// it, so every loop stops at once.
    pub fn token(&self) -> CancellationToken {
        self.crashed.clone()
    }

    /// Crashes the instance if the hook is armed at `point` of `step` (in the phase of the
    /// attempt: `compensation`); `true` when the instance crashed, now or before (the caller
    /// must then stop without writing anything).
    pub(crate) fn hit(&self, point: CrashPoint, step: &str, compensation: bool) -> bool {
        if self.has_crashed() {
            return true;
        }
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        let fires = armed.as_ref().is_some_and(|(s, p, phase)| {
            *p == point && s == step && phase.is_none_or(|c| c == compensation)
        });
        if fires {
            *armed = None;
            tracing::warn!(step, %point, "crashing this engine instance on purpose (test hook)");
            self.crashed.cancel();
        }
        fires
    }
}

#[cfg(test)]
mod tests {
    use super::{CrashHook, CrashPoint};

    #[test]
    fn fires_once_at_the_armed_point_of_the_armed_step() {
        let hook = CrashHook::new();
        assert!(!hook.hit(CrashPoint::BeforeCall, "charge", false));
        hook.arm("charge", CrashPoint::AfterEffect);
        assert!(!hook.hit(CrashPoint::BeforeCall, "charge", false));
        assert!(!hook.hit(CrashPoint::AfterEffect, "reserve", false));
        assert!(!hook.has_crashed());
        assert!(hook.hit(CrashPoint::AfterEffect, "charge", false));
        assert!(hook.has_crashed());
        assert_eq!(hook.armed(), None);
        // Once dead, every point reports the crash.
        assert!(hook.hit(CrashPoint::BeforeCommit, "reserve", false));
        assert!(hook.token().is_cancelled());
    }

    #[test]
    fn a_compensation_point_lets_forward_attempts_pass() {
        let hook = CrashHook::new();
        hook.arm_compensation("charge", CrashPoint::BeforeCall);
        assert!(!hook.hit(CrashPoint::BeforeCall, "charge", false));
        assert!(hook.hit(CrashPoint::BeforeCall, "charge", true));
    }
}
