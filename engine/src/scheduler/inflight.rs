//! The attempts in flight on this instance, by run, so that cancelling a run stops its
//! forward attempts: their cancellation tokens fire, and the agents answer for them at once
//! with a `cancelled` failure whose outcome is unknown (the remote call may have acted).
//!
//! The instance that takes the `cancel` action fires its own attempts' tokens at once. The
//! other instances learn of it by asking the database, once a [`CANCEL_POLL`], which of the
//! runs they have attempts of were cancelled; they ask only while they have some.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{ErrorStreak, Scheduler, pause};
use crate::protocol::StepLease;
use crate::transition::operator::is_cancelled;
use crate::{StepContext, StepState};

/// How often an instance with attempts in flight asks which of their runs were cancelled.
pub const CANCEL_POLL: Duration = Duration::from_secs(1);

/// Stored deadlines later than the local one by less than this are not extensions.
const EXTENSION_MARGIN: Duration = Duration::from_millis(500);

/// One attempt: its step, fencing token, phase, cancellation token and deadline.
#[derive(Debug)]
struct Attempt {
    step_id: i64,
    attempt: i32,
    forward: bool,
    token: CancellationToken,
    deadline: Arc<watch::Sender<Instant>>,
}

/// Attempts in flight, by run.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    runs: Mutex<HashMap<Uuid, Vec<Attempt>>>,
    /// Attempts stopped by the fence (step id, fencing token): their answers are not written.
    fenced: Mutex<std::collections::HashSet<(i64, i32)>>,
}

impl InFlight {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<Uuid, Vec<Attempt>>) -> T) -> T {
        f(&mut self.runs.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records an attempt handed to an agent.
    pub(crate) fn started(&self, lease: &StepLease, context: &StepContext) {
        let attempt = Attempt {
            step_id: lease.step_id,
            attempt: lease.attempt,
            forward: lease.state == StepState::Running,
            token: context.cancellation().clone(),
            deadline: context.deadline_cell(),
        };
        self.with(|runs| runs.entry(lease.run_id).or_default().push(attempt));
        crate::metrics::in_flight(1.0);
    }

    /// Forgets an attempt its agent answered for; `true` when the fence stopped it (its answer
    /// must not be written: the step is released as an interruption instead).
    pub(crate) fn ended(&self, lease: &StepLease) -> bool {
        self.forget(lease);
        self.fenced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(lease.step_id, lease.attempt))
    }

    /// Forgets the attempts the fence stopped (their steps were released: a late answer
    /// would miss its fenced write anyway).
    pub(crate) fn clear_fenced(&self) {
        self.fenced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    fn forget(&self, lease: &StepLease) {
        let removed = self.with(|runs| {
            let Some(list) = runs.get_mut(&lease.run_id) else {
                return 0;
            };
            let before = list.len();
            list.retain(|a| (a.step_id, a.attempt) != (lease.step_id, lease.attempt));
            let removed = before - list.len();
            if list.is_empty() {
                runs.remove(&lease.run_id);
            }
            removed
        });
        forgotten(removed);
    }

    /// The runs with attempts in flight. Attempts whose token already fired (abandoned at
    /// their deadline, which answers nothing) are forgotten on the way.
    fn runs(&self) -> Vec<Uuid> {
        let (ids, removed) = self.with(|runs| {
            let mut removed = 0;
            runs.retain(|_, list| {
                let before = list.len();
                list.retain(|a| !a.token.is_cancelled());
                removed += before - list.len();
                !list.is_empty()
            });
            (runs.keys().copied().collect(), removed)
        });
        forgotten(removed);
        ids
    }

    /// The attempts in flight, as (step row id, fencing token).
    fn attempts(&self) -> Vec<(i64, i32)> {
        self.with(|runs| {
            runs.values()
                .flatten()
                .filter(|a| !a.token.is_cancelled())
                .map(|a| (a.step_id, a.attempt))
                .collect()
        })
    }

    /// Moves the local deadline of each attempt of `to` ((step id, attempt) → deadline) to
    /// its new one, if that is later by more than `margin`; returns the attempts moved. One
    /// pass over the attempts in flight, however many are given.
    pub(crate) fn extend(
        &self,
        to: &std::collections::HashMap<(i64, i32), Instant>,
        margin: Duration,
    ) -> Vec<(i64, i32)> {
        self.with(|runs| {
            runs.values()
                .flatten()
                .filter_map(|a| {
                    let at = to.get(&(a.step_id, a.attempt))?;
                    StepContext::extend_deadline(&a.deadline, *at, margin)
                        .then_some((a.step_id, a.attempt))
                })
                .collect()
        })
    }

    /// Moves the local deadlines of the run's attempts later by `by`; returns how many.
    pub(crate) fn extend_run(&self, run_id: Uuid, by: Duration) -> usize {
        self.with(|runs| {
            let Some(list) = runs.get(&run_id) else {
                return 0;
            };
            list.iter()
                .filter(|a| !a.token.is_cancelled())
                .filter(|a| {
                    let at = *a.deadline.borrow() + by;
                    StepContext::extend_deadline(&a.deadline, at, Duration::ZERO)
                })
                .count()
        })
    }

    /// Fires the tokens of the run's forward attempts; returns how many.
    pub(crate) fn cancel_forward(&self, run_id: Uuid) -> usize {
        self.with(|runs| {
            let Some(list) = runs.get(&run_id) else {
                return 0;
            };
            let mut fired = 0;
            for a in list.iter().filter(|a| a.forward && !a.token.is_cancelled()) {
                a.token.cancel();
                fired += 1;
            }
            fired
        })
    }

    /// Fires the tokens of every attempt in flight, of both phases, and remembers them as
    /// stopped by the fence; returns how many.
    pub(crate) fn cancel_all(&self) -> usize {
        let stopped: Vec<(i64, i32)> = self.with(|runs| {
            runs.values()
                .flatten()
                .filter(|a| !a.token.is_cancelled())
                .map(|a| (a.step_id, a.attempt))
                .collect()
        });
        self.fenced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(stopped.iter().copied());
        self.with(|runs| {
            for a in runs.values().flatten() {
                a.token.cancel();
            }
        });
        stopped.len()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // The attempts of an engine that stopped are no longer in flight here.
        let left = self.with(|runs| runs.values().map(Vec::len).sum());
        forgotten(left);
    }
}

/// Takes `n` forgotten attempts off the in-flight gauge.
fn forgotten(n: usize) {
    if n > 0 {
        #[allow(clippy::cast_precision_loss)] // at most the in-flight limit
        crate::metrics::in_flight(-(n as f64));
    }
}

/// Every [`CANCEL_POLL`] while attempts are in flight: fires the tokens of those whose runs
/// were cancelled by an operator of another instance.
pub(super) async fn watch(s: Arc<Scheduler>, cancel: CancellationToken) {
    let mut streak = ErrorStreak::default();
    while pause(&cancel, CANCEL_POLL).await {
        let runs = s.in_flight.runs();
        if runs.is_empty() {
            continue;
        }
        match s.store.runs_compensating_among(&runs).await {
            Ok(compensating) => {
                streak.succeeded("looking for cancelled runs");
                let cancelled = compensating
                    .into_iter()
                    .filter(|(_, error)| error.as_deref().is_some_and(is_cancelled))
                    .map(|(id, _)| id);
                for run_id in cancelled {
                    let fired = s.in_flight.cancel_forward(run_id);
                    if fired > 0 {
                        tracing::info!(%run_id, attempts = fired, "attempts of a cancelled run stopped");
                    }
                }
            }
            Err(e) => streak.failed("looking for cancelled runs", &e),
        }
        follow_extensions(&s, &mut streak).await;
    }
}

/// Moves the local deadlines of attempts whose deadline an operator extended (on this
/// instance or another): the stored deadline is the one that counts (AT-2).
async fn follow_extensions(s: &Scheduler, streak: &mut ErrorStreak) {
    let attempts = s.in_flight.attempts();
    if attempts.is_empty() {
        return;
    }
    // Taken before the read: a slow answer then shortens the local deadline, never stretches it.
    let now = Instant::now();
    match s.store.step_deadlines(&attempts).await {
        Ok(left) => {
            streak.succeeded("reading deadlines in flight");
            let to: std::collections::HashMap<(i64, i32), Instant> = left
                .into_iter()
                .map(|(step_id, attempt, left_ms)| {
                    let ms = u64::try_from(left_ms).unwrap_or(0);
                    ((step_id, attempt), now + Duration::from_millis(ms))
                })
                .collect();
            // The local deadline was set from the stored one at the claim; moves of less
            // than the margin are the two clocks' reading delays, not extensions.
            for (step_id, attempt) in s.in_flight.extend(&to, EXTENSION_MARGIN) {
                tracing::debug!(step_id, attempt, "deadline in flight extended");
            }
        }
        Err(e) => streak.failed("reading deadlines in flight", &e),
    }
}
