//! Registering and unregistering workflow definitions on a running engine, and the fleet's
//! instances with what each of them runs.
//!
//! A change builds a new registry from the current one and swaps it in whole (copy on
//! write): the scheduler's next claim and evaluation passes use the new claim filter, starts
//! see the new definitions at once, and attempts in flight finish with the definitions they
//! started with. The instance's row records the `name@version` keys it runs after every
//! change, which is how the supervisor leader tells that due steps of a workflow wait for an
//! instance (the `no_instance_for_workflow` alert).

use sagaflow_engine::{Error, Registry, Result, Timestamp, Workflow};
use serde::Serialize;

use crate::engine::Engine;

/// One engine instance of the fleet sharing the database, as [`Engine::instances`] lists
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
#[derive(utoipa::ToSchema)]
pub struct InstanceInfo {
    /// The instance's id (what `locked_by` of the steps it runs holds).
    pub id: String,
    /// Whether it heartbeat recently enough to count as alive.
    pub live: bool,
    /// When its current process registered (database clock).
    #[schema(value_type = chrono::DateTime<chrono::Utc>)]
    pub started_at: Timestamp,
    /// When it stopped gracefully, if it did.
    #[schema(value_type = Option<chrono::DateTime<chrono::Utc>>)]
    pub stopped_at: Option<Timestamp>,
    /// Milliseconds since its last heartbeat (database clock).
    pub silent_ms: i64,
    /// The `name@version` keys of the workflows it runs, sorted; `None` for an instance of
    /// a release that did not record them.
    pub workflows: Option<Vec<String>>,
}

fn at(ms: i64) -> Timestamp {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

impl Engine {
    /// Registers a workflow definition on this running instance: starts on this instance
    /// accept it at once, its steps are claimed here from the scheduler's next pass, its
    /// description is published as at start, and this instance's row records that it runs
    /// it. Other instances are not changed: those without the definition never claim its
    /// steps.
    ///
    /// Registering a `name@version` this instance already runs, with the same description,
    /// puts the given code in place of the old one (attempts in flight finish with the old
    /// code).
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine) -> sagaflow::Result<()> {
    /// use sagaflow::{StepContext, StepError, Workflow};
    /// let refund = Workflow::builder("refund", 1)
    ///     .step("pay_back", |_: StepContext| async { Ok::<_, StepError>(()) })
    ///     .build()?;
    /// engine.register(refund).await?;
    /// assert!(engine.workflows().contains(&"refund@1".to_owned()));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Nothing changes on an error.
    /// [`Error::InvalidDefinition`] when the same name and version is registered here, or
    /// published by any engine, with another step graph or other policies (give a changed
    /// workflow a new version), or for a workflow rebuilt from its published description;
    /// [`Error::Config`] for a step that calls a resource this engine did not declare, or on
    /// an engine of published workflows (it runs no code); [`Error::Shutdown`] once shut
    /// down; [`Error::Db`].
    pub async fn register(&self, wf: Workflow) -> Result<()> {
        let inner = &self.inner;
        if inner.published {
            return Err(Error::Config(
                "an engine of published workflows runs no code of its own: register workflows \
                 on the engines that run them"
                    .into(),
            ));
        }
        self.check_running()?;
        for step in wf.steps() {
            if let Some(r) = step.resource()
                && !inner.declared_resources.iter().any(|d| d == r)
            {
                return Err(Error::Config(format!(
                    "step `{}` of workflow `{}` calls resource `{r}`, which this engine did not \
                     declare: add with_resource(Resource::new(\"{r}\")) with its limits at start",
                    step.name(),
                    wf.name()
                )));
            }
        }
        let _changing = inner.registration.lock().await;
        let current = inner.scheduler.registry();
        let description = wf.describe();
        let different = |whose: &str| Error::InvalidDefinition {
            workflow: wf.name().to_owned(),
            reason: format!(
                "version {} is {whose} with another step graph or other policies: give the \
                 changed workflow a new version",
                wf.version()
            ),
        };
        if let Some(registered) = current.get_registered(wf.name(), wf.version())
            && registered.describe() != description
        {
            return Err(different("registered on this instance"));
        }
        if let Some(published) = inner.store.definition_get(wf.name(), wf.version()).await? {
            let same = published.description.as_ref() == Ok(&description);
            if !same {
                return Err(different(&format!(
                    "published (by instance `{}`)",
                    published.published_by
                )));
            }
        }
        let mut next: Registry = (*current).clone();
        next.replace(wf)?;
        let changed = inner
            .store
            .definitions_publish(std::slice::from_ref(&description), self.instance_id())
            .await?;
        self.record_workflows(&next).await?;
        inner.scheduler.set_registry(std::sync::Arc::new(next));
        for a in &changed {
            self.deliver_alert(a);
        }
        tracing::info!(
            instance = self.instance_id(),
            workflow = %description.name,
            version = description.version,
            "workflow registered"
        );
        Ok(())
    }

    /// Unregisters a workflow version from this running instance: from the scheduler's next
    /// pass it claims no more of its steps and starts here refuse it (they use the newest
    /// version still registered, if any). Attempts already in flight finish and are recorded
    /// as usual, and their runs are evaluated with the definition they started with. Runs
    /// are never dropped: their next steps wait for an instance that runs the version
    /// (while none does, the supervisor raises a `no_instance_for_workflow` alert). The
    /// published description stays.
    ///
    /// # Errors
    /// [`Error::WorkflowNotFound`] when this instance does not run `name@version`;
    /// [`Error::Shutdown`] once shut down; [`Error::Db`] (nothing changes then).
    pub async fn unregister(&self, name: &str, version: i32) -> Result<()> {
        self.check_running()?;
        let inner = &self.inner;
        let _changing = inner.registration.lock().await;
        let mut next: Registry = (*inner.scheduler.registry()).clone();
        next.unregister(name, version)?;
        self.record_workflows(&next).await?;
        inner.scheduler.set_registry(std::sync::Arc::new(next));
        tracing::info!(
            instance = self.instance_id(),
            workflow = name,
            version,
            "workflow unregistered"
        );
        Ok(())
    }

    /// The `name@version` keys of the workflows this instance runs now, sorted.
    pub fn workflows(&self) -> Vec<String> {
        let mut keys = self.inner.scheduler.registry().keys();
        keys.sort();
        keys
    }

    /// The engine instances registered on the database (every instance with workers that
    /// used it and was not forgotten yet), by id, with what each of them runs. An instance
    /// counts as live while its heartbeat is younger than this engine's
    /// [staleness](crate::EngineBuilder::with_heartbeat).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn instances(&self) -> Result<Vec<InstanceInfo>> {
        let stale = i64::try_from(self.inner.stale_after.as_millis()).unwrap_or(i64::MAX);
        let rows = self.reads().instance_list().await?;
        Ok(rows
            .into_iter()
            .map(|r| InstanceInfo {
                live: r.stopped_at.is_none() && r.heartbeat_at > 0 && r.silent_ms < stale,
                id: r.id,
                started_at: at(r.started_at),
                stopped_at: r.stopped_at.map(at),
                silent_ms: r.silent_ms,
                workflows: r.workflows,
            })
            .collect())
    }

    fn check_running(&self) -> Result<()> {
        if let Some(fatal) = self.inner.signals.fatal() {
            return Err(fatal);
        }
        if self.inner.cancel.is_cancelled() {
            return Err(Error::Shutdown);
        }
        Ok(())
    }

    /// Records in this instance's row the workflows of `registry` (an instance without
    /// workers has no row).
    async fn record_workflows(&self, registry: &Registry) -> Result<()> {
        let Some(incarnation) = &self.inner.incarnation else {
            return Ok(());
        };
        let recorded = self
            .inner
            .store
            .instance_set_workflows(self.instance_id(), incarnation, &registry.keys())
            .await?;
        if !recorded {
            tracing::warn!(
                instance = self.instance_id(),
                "another process registered this instance id; its row does not record this \
                 process's workflows"
            );
        }
        Ok(())
    }
}
