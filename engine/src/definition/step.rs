//! What a step runs: the [`StepAction`] trait and the [`StepContext`] handed to it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::StepError;

/// The body of a step or of its compensation.
///
/// An implementation calls one remote service (through an agent) and returns the step's
/// output as JSON. It must be idempotent with respect to
/// [`StepContext::idempotency_key`]: the same key arrives on every retry of the step.
#[async_trait::async_trait]
pub trait StepAction: Send + Sync + 'static {
    /// Runs one attempt.
    ///
    /// # Errors
    /// A [`StepError`]; retryable unless built with [`StepError::terminal`], and possibly
    /// applied unless marked [`StepError::not_applied`].
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError>;
}

/// Adapts an async closure returning any serialisable output into a [`StepAction`].
pub(crate) struct FnAction<F>(pub(crate) F);

#[async_trait::async_trait]
impl<F, Fut, O> StepAction for FnAction<F>
where
    F: Fn(StepContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, StepError>> + Send + 'static,
    O: Serialize + Send + 'static,
{
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        let out = (self.0)(ctx).await?;
        serde_json::to_value(out).map_err(StepError::from)
    }
}

/// Everything one attempt of a step (or compensation) may know.
#[derive(Clone)]
pub struct StepContext {
    pub(crate) run_id: Uuid,
    pub(crate) step: Arc<str>,
    pub(crate) attempt: u32,
    pub(crate) idempotency_key: Arc<str>,
    pub(crate) forward_key: Arc<str>,
    /// The local instant of the deadline; an operator's `extend` moves it later while the
    /// attempt runs.
    pub(crate) deadline: Arc<watch::Sender<Instant>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) input: Arc<serde_json::Value>,
    pub(crate) deps: Arc<BTreeMap<String, serde_json::Value>>,
    pub(crate) output: Option<Arc<serde_json::Value>>,
}

impl fmt::Debug for StepContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepContext")
            .field("run_id", &self.run_id)
            .field("step", &self.step)
            .field("attempt", &self.attempt)
            .field("idempotency_key", &self.idempotency_key)
            .finish_non_exhaustive()
    }
}

impl StepContext {
    /// Builds a context; used by the scheduler and by tests of step bodies. `attempt` is the
    /// 1-based attempt number within the phase (see [`StepContext::attempt`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        run_id: Uuid,
        step: &str,
        attempt: u32,
        idempotency_key: &str,
        deadline: Instant,
        cancel: CancellationToken,
        input: Arc<serde_json::Value>,
        deps: Arc<BTreeMap<String, serde_json::Value>>,
        output: Option<Arc<serde_json::Value>>,
    ) -> Self {
        let idempotency_key: Arc<str> = idempotency_key.into();
        Self {
            run_id,
            step: step.into(),
            attempt,
            forward_key: idempotency_key.clone(),
            idempotency_key,
            deadline: Arc::new(watch::Sender::new(deadline)),
            cancel,
            input,
            deps,
            output,
        }
    }

    /// The run this attempt belongs to.
    pub fn run_id(&self) -> Uuid {
        self.run_id
    }

    /// The step's name.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// 1-based number of this attempt within its phase: a step's forward attempts count
    /// 1, 2, … and its compensation's count again from 1. It counts every attempt of the
    /// phase (failures, timeouts, interruptions, and those before an operator's retry), so it
    /// only grows within a phase.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The stable idempotency key: the same on every retry of this step in this run, different
    /// for other steps, runs and for the compensation (SAS-2). Pass it to the remote service.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The idempotency key of the forward step. In a compensation of a step whose outcome is
    /// unknown (no output: an attempt timed out), replaying the forward call under this key
    /// tells whether it took effect, without applying it twice.
    pub fn forward_idempotency_key(&self) -> &str {
        &self.forward_key
    }

    /// Sets the forward step's key (the scheduler does, for compensations).
    #[must_use]
    pub fn with_forward_key(mut self, key: &str) -> Self {
        self.forward_key = key.into();
        self
    }

    /// Time left before the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// The local instant of the deadline. An operator can extend the deadline of an attempt
    /// in flight; this then answers the later instant.
    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// Completes when the deadline passes, following any extension made meanwhile.
    pub async fn deadline_reached(&self) {
        let mut changes = self.deadline.subscribe();
        loop {
            let at = *changes.borrow_and_update();
            tokio::select! {
                () = tokio::time::sleep_until(at) => return,
                changed = changes.changed() => if changed.is_err() {
                    tokio::time::sleep_until(at).await;
                    return;
                },
            }
        }
    }

    /// Moves the deadline to `at` if that is later by more than `margin`; returns whether it
    /// moved.
    pub(crate) fn extend_deadline(
        cell: &watch::Sender<Instant>,
        at: Instant,
        margin: Duration,
    ) -> bool {
        cell.send_if_modified(|d| {
            let later = at > *d + margin;
            if later {
                *d = at;
            }
            later
        })
    }

    /// The deadline's cell, shared with the scheduler's record of attempts in flight.
    pub(crate) fn deadline_cell(&self) -> Arc<watch::Sender<Instant>> {
        self.deadline.clone()
    }

    /// Cancelled when the deadline passes, the engine shuts down, or an operator cancels the
    /// run; the attempt's future is dropped at that moment anyway, the token lets blocking
    /// work (and tasks the step spawned) notice.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The run's input, typed.
    ///
    /// # Errors
    /// A [`StepError::corrupt_row`] when the stored input does not deserialise into `T`:
    /// nothing is called, and the run is set aside for an operator (the stored data and the
    /// code disagree; compensating would undo a business that did not fail).
    pub fn input<T: DeserializeOwned>(&self) -> Result<T, StepError> {
        T::deserialize(&*self.input).map_err(|e| {
            StepError::corrupt_row(
                "sagaflow_runs",
                self.run_id,
                format!(
                    "column `input` does not match the type step `{}` reads: {e}",
                    self.step
                ),
            )
        })
    }

    /// The output of a dependency, typed.
    ///
    /// # Errors
    /// A terminal [`StepError`] when `step` is not a dependency or its output does not
    /// deserialise into `T`.
    pub fn dep<T: DeserializeOwned>(&self, step: &str) -> Result<T, StepError> {
        let v = self.deps.get(step).ok_or_else(|| {
            StepError::refused(
                "dependency",
                format!("step `{}` has no dependency `{step}`", self.step),
            )
        })?;
        T::deserialize(v).map_err(|e| {
            StepError::corrupt_row(
                "sagaflow_steps",
                format!("{}/{step}", self.run_id),
                format!(
                    "column `output` of step `{step}` does not match the type step `{}` reads: {e}",
                    self.step
                ),
            )
        })
    }

    /// In a compensation: the output the step produced when it completed.
    ///
    /// # Errors
    /// A terminal [`StepError`] outside a compensation or when it does not deserialise.
    pub fn output<T: DeserializeOwned>(&self) -> Result<T, StepError> {
        let v = self.output.as_deref().ok_or_else(|| {
            StepError::refused("output", "only a compensation sees the step's output")
        })?;
        T::deserialize(v).map_err(|e| {
            StepError::corrupt_row(
                "sagaflow_steps",
                format!("{}/{}", self.run_id, self.step),
                format!("column `output` does not match the type the compensation reads: {e}"),
            )
        })
    }
}
