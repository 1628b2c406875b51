//! Restart from a step: a run in `error`, `compensated` or `completed` becomes the source of
//! a new run that takes over the outputs of the steps before the named step and runs from
//! there.

use sagaflow_engine::{Error, Result, operator};
use serde_json::Value;
use uuid::Uuid;

use crate::operator::Operator;
use crate::start::{OnDuplicate, StartOptions};

use sagaflow_engine::operator::Restarted;

impl Operator<'_> {
    /// Starts a new run from step `step` of the run `run_id`, which is in `error`,
    /// `compensated` or `completed`: the steps `step` depends on (directly or not) are taken
    /// over as completed, with the source's outputs and idempotency keys (so that undoing one
    /// undoes the effect the source applied, once); `step` and every other step run again,
    /// under the new run's keys. The new run is of the source's workflow version, with the
    /// source's input or `input` (checked as a start's is), its priority, and its business
    /// key, which it takes over (another run holding the key refuses the restart). The two
    /// runs name each other ([`Run::restarted_from`](crate::Run::restarted_from),
    /// [`Run::restarted_as`](crate::Run::restarted_as)); both histories record who and why;
    /// the source's open alerts are resolved. A run is restarted once: after that, restart
    /// the newer run; a source in `error` takes no other operator action (the newer run owns
    /// what it did).
    ///
    /// Refused, changing nothing, when the run is in another state, is a child run (restart
    /// its parent), was restarted already, its workflow has no such step, or a step `step`
    /// depends on is not completed in it (it failed or was undone; a compensated run undid
    /// everything and kept no outputs, so it restarts only from a step with no
    /// dependencies), or started a child run.
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine, run: sagaflow::Uuid) -> sagaflow::Result<()> {
    /// let op = engine.operator().on_behalf_of("ops:ann", "carrier fixed its address check");
    /// let restarted = op.restart_from(run, "ship", None).await?;
    /// println!("run {} goes on from `ship`, reusing {:?}", restarted.id, restarted.reused);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::ActionNotAllowed`] naming the reason; [`Error::InvalidInput`],
    /// [`Error::PayloadTooLarge`] for a refused `input`; [`Error::DuplicateKey`];
    /// [`Error::VersionNotFound`] when this engine does not know the run's version;
    /// [`Error::RunNotFound`], [`Error::Shutdown`], [`Error::Db`], [`Error::CorruptRow`].
    pub async fn restart_from(
        &self,
        run_id: Uuid,
        step: &str,
        input: Option<Value>,
    ) -> Result<Restarted> {
        let engine = self.engine;
        let store = &engine.inner.store;
        let source = store
            .run_view(run_id)
            .await?
            .ok_or(Error::RunNotFound(run_id))?;
        let run = &source.run;
        let wf = engine.pinned_workflow(run).await?;
        let input = match input {
            Some(v) => v,
            None => serde_json::from_str(&run.input).map_err(|e| Error::CorruptRow {
                table: "sagaflow_runs",
                id: run_id.to_string(),
                reason: format!("input: {e}"),
            })?,
        };
        let mut opts = StartOptions::default()
            .version(run.version)
            .priority(source.priority)
            .on_duplicate(OnDuplicate::Reject);
        opts.business_key = run.business_key.clone();
        let new = engine.prepare(&run.workflow, &input, &opts).await?;
        let restarted = operator::restart(store, run_id, &wf, step, &new, &self.audit).await?;
        tracing::info!(
            source = %run_id,
            run_id = %restarted.id,
            step,
            by = %self.audit.actor,
            "run restarted from a step"
        );
        engine.wake();
        Ok(restarted)
    }
}
