//! Migrating in-flight runs to another version of their workflow: the registration of
//! migrations and the operator's dry run and apply (see [`sagaflow_engine::migration`]).

use std::sync::Arc;

use sagaflow_engine::definition::Registry;
use sagaflow_engine::migration::{self, Migration, MigrationPlan, Versions};
use sagaflow_engine::{Error, Result, Workflow};
use uuid::Uuid;

use crate::builder::EngineBuilder;
use crate::operator::Operator;

impl EngineBuilder {
    /// Registers how runs of a workflow move from one version to the next: an operator's
    /// [`migration_plan`](Operator::migration_plan) shows what it would do to each
    /// unfinished run of the old version, and [`migrate`](Operator::migrate) applies it.
    /// Both versions must be registered; [`start`](Self::start) checks it. Without a
    /// registered migration, the operator's actions use the default mapping by step name.
    pub fn with_migration(mut self, m: Migration) -> Self {
        self.migrations.push(m);
        self
    }
}

/// Checks the registered migrations: both versions registered, one migration per workflow
/// and pair of versions.
pub(crate) fn check(migrations: &[Migration], registry: &Registry) -> Result<()> {
    for (i, m) in migrations.iter().enumerate() {
        m.check(registry)?;
        if migrations[..i]
            .iter()
            .any(|o| o.name() == m.name() && o.from() == m.from() && o.to() == m.to())
        {
            return Err(Error::Config(format!(
                "the migration of `{}` from {} to {} is registered twice",
                m.name(),
                m.from(),
                m.to()
            )));
        }
    }
    Ok(())
}

impl Operator<'_> {
    /// The dry run of a migration of workflow `name` from version `from` to `to`: for every
    /// unfinished run of `name@from`, whether it would migrate (each step's state before and
    /// after) or is refused (and why). Changes nothing. Uses the migration registered with
    /// [`EngineBuilder::with_migration`], else the default mapping by step name.
    ///
    /// # Errors
    /// [`Error::WorkflowNotFound`] when a version is neither registered nor published;
    /// [`Error::Db`].
    pub async fn migration_plan(&self, name: &str, from: i32, to: i32) -> Result<MigrationPlan> {
        let (m, old, new) = self.migration(name, from, to).await?;
        migration::plan(
            &self.engine.inner.store,
            Versions {
                migration: &m,
                old: &old,
                new: &new,
            },
        )
        .await
    }

    /// One page of [`migration_plan`](Self::migration_plan): at most `limit` runs (1 to
    /// [`PLAN_PAGE_MAX`](crate::migration::PLAN_PAGE_MAX)) after run `after`;
    /// [`MigrationPlan::next_after`] says where the next page starts. What the HTTP API and
    /// the console show, so that a dry run's cost is bounded by its page.
    ///
    /// # Errors
    /// As [`migration_plan`](Self::migration_plan).
    pub async fn migration_plan_page(
        &self,
        name: &str,
        from: i32,
        to: i32,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<MigrationPlan> {
        let (m, old, new) = self.migration(name, from, to).await?;
        migration::plan_page(
            &self.engine.inner.store,
            Versions {
                migration: &m,
                old: &old,
                new: &new,
            },
            after,
            limit,
        )
        .await
    }

    /// Applies a migration of workflow `name` from version `from` to `to` (as
    /// [`migration_plan`](Self::migration_plan) shows it): each unfinished run of
    /// `name@from` migrates in its own transaction under its row lock, decided afresh, and
    /// records a `migrated` event with the versions, the steps that changed, the actor and
    /// the reason ([`on_behalf_of`](Self::on_behalf_of)); a refused run is left as it is and
    /// reported with the reason.
    ///
    /// # Errors
    /// [`Error::WorkflowNotFound`] when a version is neither registered nor published;
    /// [`Error::Db`].
    pub async fn migrate(&self, name: &str, from: i32, to: i32) -> Result<MigrationPlan> {
        let (m, old, new) = self.migration(name, from, to).await?;
        let report = migration::apply(
            &self.engine.inner.store,
            Versions {
                migration: &m,
                old: &old,
                new: &new,
            },
            &self.audit,
        )
        .await?;
        tracing::info!(
            workflow = name,
            from,
            to,
            migrated = report.migrating(),
            refused = report.refused(),
            by = %self.audit.actor,
            "runs migrated"
        );
        let signals = &self.engine.inner.signals;
        signals.wake_evaluator();
        signals.wake_claimer();
        Ok(report)
    }

    /// The migration from `from` to `to` with both versions.
    async fn migration(
        &self,
        name: &str,
        from: i32,
        to: i32,
    ) -> Result<(Migration, Arc<Workflow>, Arc<Workflow>)> {
        if from == to {
            return Err(Error::InvalidQuery(format!(
                "a migration moves runs between two versions; both are {from}"
            )));
        }
        let m = self
            .engine
            .inner
            .migrations
            .get()
            .and_then(|ms| {
                ms.iter()
                    .find(|m| m.name() == name && m.from() == from && m.to() == to)
            })
            .cloned()
            .unwrap_or_else(|| Migration::new(name, from, to));
        let old = self.version_of(name, from).await?;
        let new = self.version_of(name, to).await?;
        Ok((m, old, new))
    }

    /// A version of a workflow: registered with this engine, or published.
    async fn version_of(&self, name: &str, version: i32) -> Result<Arc<Workflow>> {
        self.engine
            .workflow_version(name, version)
            .await?
            .ok_or_else(|| Error::WorkflowNotFound(format!("{name}@{version}")))
    }
}

impl crate::Engine {
    /// Spawns the loop that applies the automatic migrations ([`Migration::automatic`]) on
    /// this engine while it leads the supervisor, every `every`, until shutdown. Holds the
    /// engine weakly, so it never keeps a dropped engine alive.
    pub(crate) fn spawn_automatic_migrations(&self, every: std::time::Duration) {
        let automatic: Vec<Migration> = self
            .inner
            .migrations
            .get()
            .map(|ms| ms.iter().filter(|m| m.is_automatic()).cloned().collect())
            .unwrap_or_default();
        if automatic.is_empty() {
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        let cancel = self.inner.cancel.clone();
        self.inner.tracker.spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    () = cancel.cancelled() => return,
                }
                let Some(inner) = inner.upgrade() else { return };
                let engine = crate::Engine { inner };
                if !engine.supervisor().is_some_and(|s| s.is_leader()) {
                    continue;
                }
                let actor = format!("engine:{}", engine.instance_id());
                for m in &automatic {
                    let op = engine
                        .operator()
                        .on_behalf_of(actor.clone(), "automatic migration");
                    match op.migrate(m.name(), m.from(), m.to()).await {
                        Ok(r) if r.migrating() > 0 => tracing::info!(
                            workflow = m.name(),
                            from = m.from(),
                            to = m.to(),
                            migrated = r.migrating(),
                            "automatic migration"
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(
                            workflow = m.name(),
                            error = %e,
                            "automatic migration failed; trying again at the next pass"
                        ),
                    }
                }
            }
        });
    }
}
