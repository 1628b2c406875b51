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
        let run = store
            .run_get(run_id)
            .await?
            .ok_or(Error::RunNotFound(run_id))?;
        let wf = self.engine.pinned_workflow(&run).await?;
        wf.check_input(&input)?;
        let json = input.to_string();
        let limit = self.engine.inner.max_input_bytes;
        if json.len() > limit {
            return Err(Error::PayloadTooLarge {
                what: format!("input of workflow `{}`", run.workflow),
                size: json.len(),
                limit,
            });
        }
        let a = operator::replace_input(store, run_id, &json, &self.audit).await?;
        tracing::info!(%run_id, by = %self.audit.actor, "run input replaced");
        Ok(self.after(a))
    }
}

impl crate::Engine {
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
