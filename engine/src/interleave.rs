//! Pause points, for tests: a unit of work given a [`PauseHook`] stops at a named point (after
//! its reads, before its writes, before its commit) until the test releases it, so that the
//! test can run another writer in between and then check what the two left behind.
//!
//! Crash points ([`crate::crash`]) stop an engine dead; pause points hold one transaction open
//! with its locks, which is how two writers meet in production. Each unit of work names its
//! points with a [`Unit`] and a [`Point`]; the interleaving tests list every pair and hold it
//! against every competing writer. A store without a hook pays one `Option` check per point.

use std::sync::{Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

/// A unit of work that writes step or run rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// An evaluation (`plan_and_apply`): the evaluation loop, every completion batch and every
    /// operator action evaluate runs this way.
    Evaluate,
    /// An operator action on one run (cancel, compensate, retry, pause, resume, release…).
    Operator,
    /// The move of one run to another version of its workflow.
    Migrate,
    /// The retention purge of finished runs.
    Purge,
    /// The rescue of attempts past their deadline or lost with their instance (the
    /// supervisor's sweep, an instance's release of its own).
    Rescue,
    /// A completion batch: the ends of attempts written (fenced by their attempt), then
    /// their runs evaluated, in one transaction.
    Complete,
    /// The delivery of an event or a callback to a run: the waiting step it wakes, or the
    /// event kept for a later wait.
    Deliver,
    /// The leader's timer pass: waiting steps whose time came are woken. One statement
    /// reads and writes, so it has no point between the two.
    Wake,
    /// The claim of a remote resource's steps, within the resource's limits: one
    /// transaction holding the resource's row. One statement reads and claims the steps.
    Claim,
    /// The read of a run's page (the console's and the HTTP API's run): it writes nothing,
    /// so it is not in [`Unit::ALL`]. Its one point, [`Point::AfterReads`], holds it after
    /// the run's row and before its steps, history and alerts, which must be read as of the
    /// same moment.
    Page,
}

impl Unit {
    /// Every unit that writes, in the order the interleaving matrix lists them.
    pub const ALL: [Unit; 9] = [
        Self::Evaluate,
        Self::Operator,
        Self::Migrate,
        Self::Purge,
        Self::Rescue,
        Self::Complete,
        Self::Deliver,
        Self::Wake,
        Self::Claim,
    ];

    /// The points the unit stops at: every unit stops before its commit; a unit whose reads
    /// and writes are separate statements also stops after its reads (which is before its
    /// first write).
    pub const fn points(self) -> &'static [Point] {
        match self {
            Self::Wake | Self::Claim => &[Point::BeforeCommit],
            Self::Page => &[Point::AfterReads],
            _ => &Point::ALL,
        }
    }

    /// The unit's name, as tests and docs print it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Evaluate => "evaluate",
            Self::Operator => "operator",
            Self::Migrate => "migrate",
            Self::Purge => "purge",
            Self::Rescue => "rescue",
            Self::Complete => "complete",
            Self::Deliver => "deliver",
            Self::Wake => "wake",
            Self::Claim => "claim",
            Self::Page => "page",
        }
    }
}

/// Where, inside a unit of work, a hook can hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Point {
    /// Its rows are read (and locked, where it locks them) and nothing is written yet: after
    /// its reads is before its writes.
    AfterReads,
    /// Its writes are done and its transaction is not committed.
    BeforeCommit,
}

impl Point {
    /// Every point, in the order the interleaving matrix lists them.
    pub const ALL: [Point; 2] = [Self::AfterReads, Self::BeforeCommit];

    /// The point's name, as tests and docs print it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AfterReads => "after_reads",
            Self::BeforeCommit => "before_commit",
        }
    }
}

/// A pause armed at one point: the unit that reaches it waits until [`Held::release`] (or
/// until the `Held` is dropped, so that a failing test never leaves a transaction hanging).
#[derive(Debug)]
pub struct Held {
    reached: CancellationToken,
    release: CancellationToken,
}

impl Held {
    /// Waits until a unit of work stopped at the point.
    pub async fn reached(&self) {
        self.reached.cancelled().await;
    }

    /// Whether a unit of work stopped at the point.
    pub fn has_reached(&self) -> bool {
        self.reached.is_cancelled()
    }

    /// Lets the held unit of work go on.
    pub fn release(&self) {
        self.release.cancel();
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release.cancel();
    }
}

/// Test hook: the pause points armed for one store. Give it to one [`crate::Store`] (with
/// [`crate::Store::with_pause_hook`]); each armed point holds the first unit of work that
/// reaches it, once. Never set outside tests.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct PauseHook {
    armed: Mutex<Vec<(Unit, Point, CancellationToken, CancellationToken)>>,
    /// Answers held: the step's name, with the tokens of its [`Held`].
    answers: Mutex<Vec<(String, CancellationToken, CancellationToken)>>,
}

impl PauseHook {
    /// A hook armed at nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Holds the next unit of work `unit` that reaches `point`.
    pub fn hold(&self, unit: Unit, point: Point) -> Held {
        let held = Held {
            reached: CancellationToken::new(),
            release: CancellationToken::new(),
        };
        self.armed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((unit, point, held.reached.clone(), held.release.clone()));
        held
    }

    /// Holds the answer of the next forward attempt of the step named `step` (in any
    /// workflow) when it reaches the engine: its action returned (its effect happened) and
    /// nothing of its result is written, as at [`crate::crash::CrashPoint::AfterEffect`];
    /// the attempt stays `running` until the test releases it, then its end is written as
    /// usual. The completion writer that received it waits with it.
    pub fn hold_answer(&self, step: impl Into<String>) -> Held {
        let held = Held {
            reached: CancellationToken::new(),
            release: CancellationToken::new(),
        };
        self.answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((step.into(), held.reached.clone(), held.release.clone()));
        held
    }

    /// Stops here if the answer of a forward attempt of `step` is held, until the test
    /// releases it.
    pub(crate) async fn reach_answer(&self, step: &str) {
        let release = {
            let mut armed = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(i) = armed.iter().position(|a| a.0 == step) else {
                return;
            };
            let (_, reached, release) = armed.swap_remove(i);
            reached.cancel();
            release
        };
        tracing::debug!(step, "answer held (test hook)");
        release.cancelled().await;
    }

    /// Stops here if `point` of `unit` is armed, until the test releases it.
    pub(crate) async fn reach(&self, unit: Unit, point: Point) {
        let release = {
            let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(i) = armed.iter().position(|a| a.0 == unit && a.1 == point) else {
                return;
            };
            let (_, _, reached, release) = armed.swap_remove(i);
            reached.cancel();
            release
        };
        tracing::debug!(
            unit = unit.as_str(),
            point = point.as_str(),
            "held at a pause point (test hook)"
        );
        release.cancelled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{PauseHook, Point, Unit};

    #[tokio::test]
    async fn holds_the_armed_unit_once_until_released() {
        let hook = std::sync::Arc::new(PauseHook::new());
        // Not armed: passes at once.
        hook.reach(Unit::Evaluate, Point::AfterReads).await;
        let held = hook.hold(Unit::Evaluate, Point::AfterReads);
        let h = hook.clone();
        let task = tokio::spawn(async move {
            h.reach(Unit::Migrate, Point::AfterReads).await;
            h.reach(Unit::Evaluate, Point::AfterReads).await;
        });
        held.reached().await;
        assert!(!task.is_finished());
        held.release();
        task.await.expect("unit of work");
        // Fired once: the next one passes.
        hook.reach(Unit::Evaluate, Point::AfterReads).await;
    }
}
