//! An operator's corrected input: a run parked for an operator because of what it was
//! given takes a new input, checked like a start's, and resumes.

use std::sync::Arc;

use sagaflow_engine::definition::Workflow;
use sagaflow_engine::{Error, Result, RunState, operator};
use uuid::Uuid;

use crate::operator::Operator;

impl Operator<'_> {
    /// Replaces the input of a run that is `Paused` or in `Error` (set aside for a damaged
    /// row, or not) and resumes it as [`resume`](Self::resume) or [`release`](Self::release)
    /// would: the failed steps of the phase it stopped in are retried with the new input.
    /// The input is checked as a start's is, against the version the run is pinned to (its
    /// JSON Schema and input type, and the engine's
    /// [`max_input_bytes`](crate::EngineBuilder::with_max_input_bytes)); a refused input
    /// changes nothing. The history event (`operator_replace_input`) keeps the old input and
    /// the new one, with the actor and reason.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (naming the field when the schema found it),
    /// [`Error::PayloadTooLarge`], [`Error::ActionNotAllowed`] for a run in any other state,
    /// [`Error::VersionNotFound`] when this engine does not know the run's version,
    /// [`Error::RunNotFound`], [`Error::Db`].
    pub async fn replace_input(&self, run_id: Uuid, input: serde_json::Value) -> Result<RunState> {
        let store = &self.engine.inner.store;
        let (run, wf) = self.engine.run_and_workflow(run_id).await?;
        let json = self.checked_input(&run, &wf, &input)?;
        let a = operator::replace_input(store, run_id, &wf, &json, &self.audit).await?;
        tracing::info!(%run_id, by = %self.audit.actor, "run input replaced");
        Ok(self.after(a))
    }
}

impl Operator<'_> {
    /// `input` as a run's new input: checked as a start's is, against the version `wf` the
    /// run is pinned to and the engine's input limit; as JSON text.
    pub(crate) fn checked_input(
        &self,
        run: &sagaflow_engine::store::RunRow,
        wf: &Workflow,
        input: &serde_json::Value,
    ) -> Result<String> {
        wf.check_input(input)?;
        let json = input.to_string();
        let limit = self.engine.inner.max_input_bytes;
        if json.len() > limit {
            return Err(Error::PayloadTooLarge {
                what: format!("input of workflow `{}`", run.workflow),
                size: json.len(),
                limit,
            });
        }
        Ok(json)
    }

    /// Rolls a run that has not passed its pivot back to step `to` and goes forward again
    /// from there, under the same run id: the steps after it (every step but `to` and
    /// those it depends on) that did or may have done something are compensated in reverse
    /// order, the others dropped; then they start afresh under new idempotency keys (their
    /// effects were undone: a new call must not be answered with the old one's result),
    /// reading `input` when given (checked as a start's is). Meanwhile the run is
    /// `compensating`, its error envelope saying `rollback` (with `details.to`); the error it
    /// held before comes back when it goes forward. Recorded in the history as
    /// `operator_rollback` with who and why; the run's open alerts are resolved. A
    /// compensation that fails stops the run in `error` as any undo does: `resume` goes on
    /// with the rollback, `compensate` undoes everything instead.
    ///
    /// Refused, changing nothing, when it cannot be done safely: the run is not running or
    /// in error, or is undoing already; `to` is not a completed step of it; a step is in
    /// flight or waiting (wait, or cancel); a pivot completed or may have acted (past the
    /// point of no return nothing before it is undone); a step to undo is retriable (those
    /// are never compensated); nothing after `to` has started.
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine, run: sagaflow::Uuid) -> sagaflow::Result<()> {
    /// let op = engine.operator().on_behalf_of("ops:ann", "charged the wrong amount");
    /// let input = serde_json::json!({ "order_id": "o-1", "amount_cents": 1999 });
    /// op.rollback(run, "reserve_stock", Some(input)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] naming the reason; [`Error::InvalidInput`],
    /// [`Error::PayloadTooLarge`] for a refused `input`; [`Error::VersionNotFound`] when this
    /// engine does not know the run's version; [`Error::RunNotFound`], [`Error::Db`],
    /// [`Error::CorruptRow`].
    pub async fn rollback(
        &self,
        run_id: Uuid,
        to: &str,
        input: Option<serde_json::Value>,
    ) -> Result<RunState> {
        let store = &self.engine.inner.store;
        let (run, wf) = self.engine.run_and_workflow(run_id).await?;
        let json = input
            .map(|v| self.checked_input(&run, &wf, &v))
            .transpose()?;
        let a = operator::rollback(store, run_id, &wf, to, json.as_deref(), &self.audit).await?;
        tracing::info!(%run_id, step = to, by = %self.audit.actor, "run rolled back to a step");
        Ok(self.after(a))
    }
}

impl crate::Engine {
    /// A run's row and the workflow version it is pinned to.
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; as [`pinned_workflow`](Self::pinned_workflow).
    pub(crate) async fn run_and_workflow(
        &self,
        run_id: Uuid,
    ) -> Result<(sagaflow_engine::store::RunRow, Arc<Workflow>)> {
        let run = self
            .inner
            .store
            .run_get(run_id)
            .await?
            .ok_or(Error::RunNotFound(run_id))?;
        let wf = self.pinned_workflow(&run).await?;
        Ok((run, wf))
    }

    /// The workflow version `run` is pinned to, as [`workflow_version`](Self::workflow_version)
    /// finds it.
    ///
    /// # Errors
    /// [`Error::VersionNotFound`] when this engine knows it neither way; [`Error::Db`].
    pub(crate) async fn pinned_workflow(
        &self,
        run: &sagaflow_engine::store::RunRow,
    ) -> Result<Arc<Workflow>> {
        self.workflow_version(&run.workflow, run.version)
            .await?
            .ok_or_else(|| Error::VersionNotFound {
                name: run.workflow.clone(),
                version: run.version,
                run_id: run.id,
            })
    }

    /// A version of a workflow: registered with this engine, else published (rebuilt from
    /// its description, without code); `None` when neither.
    pub(crate) async fn workflow_version(
        &self,
        name: &str,
        version: i32,
    ) -> Result<Option<Arc<Workflow>>> {
        if let Some(wf) = self.inner.scheduler.registry().get(name, version) {
            return Ok(Some(wf.clone()));
        }
        let Some(published) = self.inner.store.definition_get(name, version).await? else {
            return Ok(None);
        };
        match published.description {
            Ok(d) => Workflow::from_description(&d).map(|w| Some(Arc::new(w))),
            Err(_) => Ok(None),
        }
    }
}
