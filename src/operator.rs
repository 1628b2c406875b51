//! Operator actions on runs (SAS-7), through the same transition rules as the engine.

use sagaflow_engine::operator::Audit;
use sagaflow_engine::signals::RunEvent;
use sagaflow_engine::store::EvalApplied;
use sagaflow_engine::{Error, OperatorAction, Result, RunState, operator};
use uuid::Uuid;

use crate::engine::Engine;

/// What an [`OperatorAction`] takes beyond its run: the step of the actions that act on one
/// ([`OperatorAction::needs_step`]), and how much more time `extend` gives.
///
/// ```
/// use std::time::Duration;
/// use sagaflow::ActionArgs;
///
/// let retry = ActionArgs::default().with_step("charge");
/// let extend = ActionArgs::default().with_extension(Duration::from_secs(600));
/// # assert_eq!(retry.step.as_deref(), Some("charge"));
/// # assert_eq!(extend.extension, Some(Duration::from_secs(600)));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActionArgs {
    /// The step, for `retry`, `mark_compensated` and `rollback`.
    pub step: Option<String>,
    /// How much more time `extend` gives the attempts in flight.
    pub extension: Option<std::time::Duration>,
    /// The run's new input, for `rollback` (checked as a start's is); `None` keeps it.
    pub input: Option<serde_json::Value>,
}

impl ActionArgs {
    /// Names the step the action acts on.
    #[must_use]
    pub fn with_step(mut self, step: impl Into<String>) -> Self {
        self.step = Some(step.into());
        self
    }

    /// Sets the new input `rollback` runs forward with.
    #[must_use]
    pub fn with_input(mut self, input: serde_json::Value) -> Self {
        self.input = Some(input);
        self
    }

    /// Sets how much more time `extend` gives.
    #[must_use]
    pub fn with_extension(mut self, by: std::time::Duration) -> Self {
        self.extension = Some(by);
        self
    }
}

/// Operator actions on runs (each recorded in the run's history; each resolves the run's open
/// alerts, recording who and why).
#[derive(Debug, Clone)]
pub struct Operator<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) audit: Audit,
}

impl Operator<'_> {
    /// The longest reason, in characters, that the HTTP API, the console and the `sagaflow`
    /// command accept for an action; the reason is recorded with it.
    pub const REASON_MAX_CHARS: usize = 2_000;

    /// The same actions recorded as done by `actor` for `reason` (in the run's history:
    /// `actor` as the event's actor, the reason in its detail).
    #[must_use]
    pub fn on_behalf_of(mut self, actor: impl Into<String>, reason: impl Into<String>) -> Self {
        self.audit = Audit::new(actor, reason);
        self
    }

    /// The same actions, taken only on a run still in `state` when it is locked: for runs
    /// chosen from a list read before (a bulk action), which may have moved on since.
    pub(crate) fn if_still(mut self, state: RunState) -> Self {
        self.audit.listed_as = Some(state);
        self
    }

    /// Takes `action` on the run, with what it needs in `args`: the one entry point of the
    /// HTTP API, the console and the command line, which take any action by its name.
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine, run: sagaflow::Uuid) -> sagaflow::Result<()> {
    /// use sagaflow::{ActionArgs, OperatorAction};
    /// let action: OperatorAction = "retry".parse().expect("an action");
    /// let op = engine.operator().on_behalf_of("ops:ann", "card service is back");
    /// op.perform(action, run, &ActionArgs::default().with_step("charge")).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As the action's own method ([`retry`](Self::retry), [`resume`](Self::resume), …);
    /// [`Error::ActionNotAllowed`] too when `args` lacks the step of an action that
    /// [needs one](OperatorAction::needs_step), or the extension of `extend`.
    pub async fn perform(
        &self,
        action: OperatorAction,
        run_id: Uuid,
        args: &ActionArgs,
    ) -> Result<RunState> {
        let refuse = |reason: &str| Error::ActionNotAllowed {
            action: action.as_str(),
            run_id,
            reason: reason.to_owned(),
        };
        let step = || {
            args.step
                .as_deref()
                .ok_or_else(|| refuse("name the step to act on"))
        };
        match action {
            OperatorAction::Retry => self.retry(run_id, step()?).await,
            OperatorAction::Resume => self.resume(run_id).await,
            OperatorAction::Compensate => self.compensate(run_id).await,
            OperatorAction::Cancel => self.cancel(run_id).await,
            OperatorAction::Pause => self.pause(run_id).await,
            OperatorAction::Extend => {
                let by = args.extension.ok_or_else(|| refuse("say by how much"))?;
                self.extend(run_id, by).await
            }
            OperatorAction::Release => self.release(run_id).await,
            OperatorAction::MarkCompensated => self.mark_compensated(run_id, step()?).await,
            OperatorAction::Rollback => self.rollback(run_id, step()?, args.input.clone()).await,
            // The enum is non-exhaustive: an action a newer engine crate adds.
            _ => Err(refuse("this version of sagaflow does not take it")),
        }
    }

    /// Retries a failed step (or failed compensation) of a run in `Error`.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn retry(&self, run_id: Uuid, step: &str) -> Result<RunState> {
        let a = operator::retry(&self.engine.inner.store, run_id, step, &self.audit).await?;
        Ok(self.after(a))
    }

    /// Retries a failed step (or failed compensation) of a run in `Error`.
    ///
    /// # Errors
    /// As [`retry`](Self::retry).
    #[deprecated(since = "0.2.0", note = "renamed to `retry`")]
    pub async fn retry_step(&self, run_id: Uuid, step: &str) -> Result<RunState> {
        self.retry(run_id, step).await
    }

    /// Requests compensation of a run that is not finished.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn compensate(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::compensate(&self.engine.inner.store, run_id, &self.audit).await?;
        Ok(self.after(a))
    }

    /// Cancels a run that is not finished: its forward attempts in flight are stopped (their
    /// [`StepContext::cancellation`](crate::StepContext::cancellation) tokens fire and they
    /// count as failed with an unknown outcome; on other instances within
    /// [`CANCEL_POLL`](sagaflow_engine::scheduler::CANCEL_POLL)), no step starts any more, and what
    /// completed (or may have) is compensated in reverse order. The run ends `Compensated`,
    /// its error envelope saying `cancelled` with the reason, and the action is in its
    /// history.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] for a finished run, [`Error::RunNotFound`], [`Error::Db`].
    pub async fn cancel(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::cancel(&self.engine.inner.store, run_id, &self.audit).await?;
        let stopped = self.engine.inner.scheduler.cancel_attempts(run_id);
        tracing::info!(%run_id, stopped, by = %self.audit.actor, "run cancelled");
        Ok(self.after(a))
    }

    /// Gives the run's attempts in flight (forward steps and compensations) `by` more time:
    /// their stored deadlines move later, so the supervisor does not time them out, and the
    /// instances running them move their local deadlines too (this one at once, others
    /// within [`CANCEL_POLL`](sagaflow_engine::scheduler::CANCEL_POLL)); the steps see it in
    /// [`StepContext::deadline`](crate::StepContext::deadline). Later attempts get their
    /// step's usual deadline.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] when no attempt of the run is in flight, or `by` is zero
    /// or over a day; [`Error::RunNotFound`], [`Error::Db`].
    pub async fn extend(&self, run_id: Uuid, by: std::time::Duration) -> Result<RunState> {
        let a = operator::extend(&self.engine.inner.store, run_id, by, &self.audit).await?;
        let moved = self.engine.inner.scheduler.extend_attempts(run_id, by);
        tracing::info!(%run_id, by_ms = by.as_millis(), moved, by = %self.audit.actor, "deadlines extended");
        Ok(a.state)
    }

    /// Pauses a pending, running or compensating run: it claims no new step until
    /// [`resume`](Self::resume)d (or compensated, or cancelled). Attempts already in flight
    /// finish and their results are recorded; steps that become due meanwhile wait. The run's
    /// error envelope says `paused` with the reason.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] for a run in any other state, [`Error::RunNotFound`],
    /// [`Error::Db`].
    pub async fn pause(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::pause(&self.engine.inner.store, run_id, &self.audit).await?;
        Ok(self.after(a))
    }

    /// Resumes a run in `Error` or `Paused`, retrying the failed steps of the phase it
    /// stopped in; a paused run's waiting steps are due again and the error it held before
    /// the pause is put back.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn resume(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::resume(&self.engine.inner.store, run_id, &self.audit).await?;
        Ok(self.after(a))
    }

    /// Releases a run set aside for a damaged row (its error code is `corrupt_row`, and a
    /// `corrupt_row` alert names the table, row, column and value) once the row is repaired:
    /// the run goes back to the phase it was in, its parked steps are due again, and it is
    /// evaluated afresh (a row still damaged sets it aside again).
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] unless the run was set aside; [`Error::CorruptRow`] while a
    /// step row is still damaged; [`Error::RunNotFound`], [`Error::Db`].
    pub async fn release(&self, run_id: Uuid) -> Result<RunState> {
        let a = operator::release(&self.engine.inner.store, run_id, &self.audit).await?;
        Ok(self.after(a))
    }

    /// Records that the effect of `step` was undone by hand after its compensation failed;
    /// the run goes on compensating the remaining steps.
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`], [`Error::RunNotFound`], [`Error::Db`].
    pub async fn mark_compensated(&self, run_id: Uuid, step: &str) -> Result<RunState> {
        let a =
            operator::mark_compensated(&self.engine.inner.store, run_id, step, &self.audit).await?;
        Ok(self.after(a))
    }

    /// Marks an alert resolved (e.g. an `unknown_version` alert once the version is deployed),
    /// recording the actor as who resolved it and the reason as why
    /// ([`Alert::resolved_by`](crate::Alert::resolved_by),
    /// [`Alert::resolution`](crate::Alert::resolution); see [`on_behalf_of`](Self::on_behalf_of)).
    /// Returns whether an open alert was resolved.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn resolve_alert(&self, alert_id: i64) -> Result<bool> {
        let resolved = self
            .engine
            .inner
            .store
            .alert_resolve(alert_id, &self.audit.actor, self.audit.reason.as_deref())
            .await?;
        if resolved {
            tracing::info!(
                alert = alert_id,
                actor = %self.audit.actor,
                reason = self.audit.reason.as_deref().unwrap_or(""),
                "alert resolved"
            );
        }
        Ok(resolved)
    }

    /// Overrides the limits of a remote resource for every instance of the fleet (`Some`),
    /// or clears the override so that the limits the code declares apply again (`None`);
    /// the claims that follow obey the change. Returns whether the resource is known (some
    /// engine declared it). Recorded on the resource with the operator and reason.
    ///
    /// # Errors
    /// [`Error::Config`] for limits that are not valid (a zero limit, period or burst);
    /// [`Error::Db`].
    pub async fn set_resource_limits(
        &self,
        resource: &str,
        limits: Option<crate::ResourceLimits>,
    ) -> Result<bool> {
        let reason = self.audit.reason.as_deref().unwrap_or("");
        let known = self
            .engine
            .inner
            .store
            .resource_override(resource, limits, &self.audit.actor, reason)
            .await?;
        if known {
            // This instance's claim loop reads the new limits at once.
            self.engine.inner.signals.wake_claimer();
        }
        Ok(known)
    }

    /// Sends a dead-lettered notice again: its dead deliveries start afresh, tried by the
    /// supervisor leader as a new notice is (the sinks that delivered it are not tried again).
    /// Returns whether one of its deliveries was dead. Logged with the operator and reason.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn redeliver(&self, notice_id: i64) -> Result<bool> {
        let again = self
            .engine
            .inner
            .store
            .delivery_redeliver(notice_id)
            .await?;
        if again {
            tracing::info!(
                notice = notice_id,
                actor = %self.audit.actor,
                reason = self.audit.reason.as_deref().unwrap_or(""),
                "dead-lettered notice sent again"
            );
            self.engine.inner.signals.wake_delivery();
        }
        Ok(again)
    }

    pub(crate) fn after(&self, a: EvalApplied) -> RunState {
        let signals = &self.engine.inner.signals;
        signals.publish(RunEvent {
            run_id: a.before.id,
            workflow: a.before.workflow.clone(),
            state: a.state,
        });
        signals.wake_evaluator();
        signals.wake_claimer();
        a.state
    }
}
