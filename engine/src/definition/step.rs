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
use tracing::Span;
use uuid::Uuid;

use crate::StepError;
use crate::trace::TraceContext;

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

/// The largest progress report, in bytes of JSON ([`StepContext::progress`]).
pub const PROGRESS_MAX_BYTES: usize = 4 * 1024;

/// The shortest time between two progress reports of one attempt that are both written
/// ([`StepContext::progress`]): reports closer together are skipped.
pub const PROGRESS_MIN_INTERVAL: Duration = Duration::from_millis(200);

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
    /// The attempt's trace context: the run's trace, the attempt's span id.
    pub(crate) trace: Arc<TraceContext>,
    /// The attempt's span (disabled until the scheduler opens one).
    pub(crate) span: Span,
    /// The step's stored wait, when it resumes after one (see [`crate::wait`]).
    pub(crate) wait: Option<Arc<crate::wait::WaitState>>,
    /// What an attempt run by an engine reaches the engine through: its services (callback
    /// tokens, child undo) and the attempt's fence. `None` outside an engine.
    pub(crate) hook: Option<Arc<AttemptHook>>,
}

/// What the engine does for a running step beyond handing it its inputs: issue callback
/// tokens and undo child runs. A trait, so that definitions need not know the store; the
/// scheduler gives each attempt the engine's implementation.
#[async_trait::async_trait]
pub(crate) trait StepServices: Send + Sync {
    /// Issues a callback token for the attempt `(step_id, attempt)` of run `run_id` and
    /// stores its hash on the step; `None` when the attempt no longer holds the step.
    async fn callback_token(
        &self,
        run_id: Uuid,
        step_id: i64,
        attempt: i32,
    ) -> crate::Result<Option<String>>;

    /// Undoes the child run of the step `step_id` (compensates a completed child, cancels
    /// an unfinished one), recorded with `actor` and `reason`: `true` once nothing is left to
    /// undo, `false` while the child is being undone.
    async fn undo_child(&self, step_id: i64, actor: String, reason: String) -> crate::Result<bool>;

    /// Records `progress` (JSON) on the step `step_id` while the attempt `attempt` holds it;
    /// `false` when it no longer does.
    async fn progress(&self, step_id: i64, attempt: i32, progress: &str) -> crate::Result<bool>;
}

/// What [`StepContext::callback_token`] and a child step's compensation need: the engine's
/// services, the step row and its fence, and the token once issued (one per attempt).
pub(crate) struct AttemptHook {
    pub(crate) services: Arc<dyn StepServices>,
    pub(crate) step_id: i64,
    pub(crate) attempt: i32,
    pub(crate) issued: tokio::sync::Mutex<Option<String>>,
    /// When this attempt last wrote its progress (reports closer together are skipped).
    pub(crate) progressed: std::sync::Mutex<Option<Instant>>,
}

impl fmt::Debug for StepContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepContext")
            .field("run_id", &self.run_id)
            .field("step", &self.step)
            .field("attempt", &self.attempt)
            .field("idempotency_key", &self.idempotency_key)
            .field("trace_parent", &self.trace.traceparent())
            .finish_non_exhaustive()
    }
}

impl StepContext {
    /// Builds a context; used by the scheduler and by tests of step bodies. `attempt` is the
    /// 1-based attempt number within the phase (see [`StepContext::attempt`]). Its trace is
    /// the run id read as a trace id, with a new span id, and it has no span; the scheduler
    /// gives it the run's stored trace and the attempt's span.
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
            trace: Arc::new(TraceContext::of_run(run_id)),
            span: Span::none(),
            wait: None,
            hook: None,
        }
    }

    /// Gives the context the step's stored wait and what callback tokens need (the
    /// scheduler does, for every forward attempt).
    #[must_use]
    pub(crate) fn waiting(
        mut self,
        wait: Option<crate::wait::WaitState>,
        hook: Option<AttemptHook>,
    ) -> Self {
        self.wait = wait.map(Arc::new);
        self.hook = hook.map(Arc::new);
        self
    }

    /// Reports the attempt's progress (any JSON: `{"done": 40, "of": 100}`, a phase name…):
    /// stored on the step row while this attempt holds the step, shown with the step (the
    /// API's run, the console's run page, `sagaflow runs show`) and sent to whoever follows
    /// the run ([`Engine::follow`](../../sagaflow/struct.Engine.html#method.follow), the API's
    /// `GET /api/v1/runs/{id}/follow`, `sagaflow follow`). Best effort: the latest value
    /// wins, a report less than [`PROGRESS_MIN_INTERVAL`] after this attempt's previous
    /// written one is skipped, and a report that cannot be written does not fail the step.
    /// Each written report is one guarded update of the step row; a step that never reports
    /// costs nothing.
    ///
    /// Returns whether it was written: `false` when skipped, outside an engine, when the
    /// attempt no longer holds the step, or when the database did not take it.
    ///
    /// # Errors
    /// A terminal [`StepError`] when `progress` does not serialise, or its JSON is over
    /// [`PROGRESS_MAX_BYTES`]: a bug of the step's code.
    pub async fn progress<T: serde::Serialize + ?Sized>(
        &self,
        progress: &T,
    ) -> Result<bool, StepError> {
        let json = serde_json::to_string(progress)
            .map_err(|e| StepError::terminal_unknown("invalid_progress", e.to_string()))?;
        if json.len() > PROGRESS_MAX_BYTES {
            return Err(StepError::terminal_unknown(
                "invalid_progress",
                format!(
                    "a progress report is at most {PROGRESS_MAX_BYTES} bytes of JSON; this one is {}",
                    json.len()
                ),
            ));
        }
        let Some(hook) = self.hook.as_ref() else {
            return Ok(false);
        };
        {
            let mut last = hook
                .progressed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            if last.is_some_and(|at| now.duration_since(at) < PROGRESS_MIN_INTERVAL) {
                return Ok(false);
            }
            *last = Some(now);
        }
        match hook
            .services
            .progress(hook.step_id, hook.attempt, &json)
            .await
        {
            Ok(written) => Ok(written),
            Err(e) => {
                tracing::debug!(run_id = %self.run_id, step = %self.step, error = %e, "progress not recorded");
                Ok(false)
            }
        }
    }

    /// A callback token for this attempt: hand it to the remote, then end the attempt with
    /// [`await_callback`](Self::await_callback). The remote completes (or fails) the step
    /// later with one HTTP call carrying the token (`POST /api/v1/callbacks` with the
    /// `Sagaflow-Callback-Token` header, `POST /api/v1/callbacks/{token}`, or
    /// `deliver::complete_callback`); the token is its credential, so send it only to that
    /// remote. One token per attempt: calling this again returns the same one. It is signed
    /// with the database's callback key (a forged one is refused without a database read)
    /// and stored (as its SHA-256) before it is returned, so a remote that answers at once is
    /// not lost, and it stops working when the attempt that waits for it ends.
    ///
    /// # Errors
    /// A retryable [`StepError`] when the token could not be stored (the database is
    /// unreachable, or this attempt lost its lease); a terminal one outside an engine.
    pub async fn callback_token(&self) -> Result<String, StepError> {
        let hook = self.hook.as_ref().ok_or_else(|| {
            StepError::terminal_unknown(
                "callback_unavailable",
                "callback tokens are issued to forward attempts run by an engine",
            )
        })?;
        let mut issued = hook.issued.lock().await;
        if let Some(t) = issued.as_ref() {
            return Ok(t.clone());
        }
        let issued_now = hook
            .services
            .callback_token(self.run_id, hook.step_id, hook.attempt)
            .await
            .map_err(|e| {
                StepError::retryable("callback_unavailable", e.to_string()).not_applied()
            })?;
        let Some(token) = issued_now else {
            return Err(StepError::retryable(
                "lease_lost",
                "the attempt no longer holds the step; its callback token was not issued",
            )
            .not_applied());
        };
        *issued = Some(token.clone());
        Ok(token)
    }

    /// Ends the attempt by parking the step until the callback of the token from
    /// [`callback_token`](Self::callback_token) arrives, at most `timeout`. Return it as
    /// the step's error: `return Err(ctx.await_callback(timeout).await)`. The step's code is
    /// not run again for the callback: the step completes with the callback's output, or
    /// fails with its error. Without a callback in time, the attempt counts as a retryable
    /// failure whose outcome is unknown (the remote may have acted): the retry policy runs
    /// the step again (a new token, the same idempotency key).
    pub async fn await_callback(&self, timeout: Duration) -> StepError {
        let token = match &self.hook {
            Some(hook) => hook.issued.lock().await.clone(),
            None => None,
        };
        let Some(token) = token else {
            return StepError::terminal_unknown(
                "callback_missing",
                "await_callback needs a token from callback_token first",
            );
        };
        let mut e = crate::wait::park(crate::wait::WaitRequest {
            on: crate::wait::WaitFor::Event {
                name: crate::wait::callback_event(&crate::wait::token_hash(&token)),
            },
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            start_child: None,
        });
        // The remote has the token: it may act before the callback.
        e.outcome = crate::Outcome::Unknown;
        e
    }

    /// The wait this attempt resumes after, if it does.
    pub fn resumed_wait(&self) -> Option<&crate::wait::WaitState> {
        self.wait.as_deref()
    }

    /// Gives the context the run's trace and opens the attempt's span under it (the
    /// scheduler does, for every attempt).
    #[must_use]
    pub(crate) fn traced(mut self, run: &TraceContext, workflow: &str, compensation: bool) -> Self {
        let (span, trace) = crate::trace::attempt_span(
            run,
            self.run_id,
            workflow,
            &self.step,
            compensation,
            self.attempt,
            &self.idempotency_key,
        );
        self.trace = Arc::new(trace);
        self.span = span;
        self
    }

    /// The `traceparent` header value to send downstream (W3C Trace Context): the run's
    /// trace id, this attempt's span id, and the run's trace flags. Every attempt of every
    /// step of a run carries the same trace id, on whichever instance it runs, after any
    /// restart: it is stored with the run.
    ///
    /// # Examples
    ///
    /// ```
    /// use sagaflow_engine::{StepContext, StepError};
    ///
    /// async fn charge(ctx: StepContext) -> Result<(), StepError> {
    ///     let _headers = [
    ///         ("idempotency-key", ctx.idempotency_key().to_owned()),
    ///         ("traceparent", ctx.trace_parent()),
    ///     ];
    ///     Ok(())
    /// }
    /// ```
    pub fn trace_parent(&self) -> String {
        self.trace.traceparent()
    }

    /// The `tracestate` given with the run's trace context, to send downstream with
    /// [`trace_parent`](Self::trace_parent).
    pub fn trace_state(&self) -> Option<&str> {
        self.trace.trace_state()
    }

    /// The run's trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        self.trace.trace_id()
    }

    /// The span of this attempt (`sagaflow.step`), which the step's code runs in: events it
    /// logs carry the run id, step, attempt, idempotency key and trace id. Enter it in tasks
    /// the step spawns to keep them in the attempt's trace.
    pub fn span(&self) -> &Span {
        &self.span
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
