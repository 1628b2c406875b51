//! Recurring schedules from the application's side: the checks at the engine's start, what
//! builds a scheduled run for the supervisor leader (the same validation and rows as
//! [`Engine::start_with`]), the listing, and an operator's pause and resume.

use std::sync::{Arc, Weak};

use sagaflow_engine::cron::{Schedule, ScheduleView};
use sagaflow_engine::store::NewRun;
use sagaflow_engine::{Error, Registry, Result};
use sagaflow_supervisor::ScheduleStarter;

use crate::engine::{Engine, Inner};
use crate::operator::Operator;
use crate::start::StartOptions;

/// Checks the schedules an engine declares: distinct names, a valid policy, a workflow the
/// engine knows (an engine of published workflows knows those the database holds: they are
/// checked when they fire) and an input its schema accepts.
pub(crate) fn check(schedules: &[Schedule], registry: &Registry, published: bool) -> Result<()> {
    let mut names = std::collections::HashSet::new();
    for s in schedules {
        let invalid = |reason: String| Error::InvalidSchedule {
            name: s.name().to_owned(),
            reason,
        };
        s.check()?;
        if !names.insert(s.name()) {
            return Err(invalid("the name is declared twice".into()));
        }
        if published {
            continue;
        }
        let wf = registry.latest(s.workflow_name()).map_err(|_| {
            invalid(format!(
                "workflow `{}` is not registered with this engine",
                s.workflow_name()
            ))
        })?;
        wf.check_input(s.input_value())
            .map_err(|e| invalid(format!("its input: {e}")))?;
    }
    Ok(())
}

/// Builds scheduled runs through an engine, without keeping it alive.
struct EngineStarter(Weak<Inner>);

impl std::fmt::Debug for EngineStarter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineStarter").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl ScheduleStarter for EngineStarter {
    async fn prepare(
        &self,
        workflow: &str,
        input: &serde_json::Value,
        business_key: String,
    ) -> Result<NewRun> {
        let inner = self.0.upgrade().ok_or(Error::Shutdown)?;
        let engine = Engine { inner };
        engine
            .prepare(workflow, input, &StartOptions::keyed(business_key))
            .await
    }
}

/// What builds the runs of `engine`'s schedules for its supervisor.
pub(crate) fn starter(engine: &Engine) -> Arc<dyn ScheduleStarter> {
    Arc::new(EngineStarter(Arc::downgrade(&engine.inner)))
}

impl Engine {
    /// The recurring schedules the fleet's engines declared, by name: workflow, expression,
    /// zone, next tick, last firing and run, and an operator's pause.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`].
    pub async fn schedules(&self) -> Result<Vec<ScheduleView>> {
        self.reads().schedule_list().await
    }
}

impl Operator<'_> {
    /// Pauses a schedule: no tick fires until it is resumed, on any instance. Recorded on the
    /// schedule with the operator and reason, and logged. Returns the schedule as it is now.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], [`Error::Db`].
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleView> {
        self.set_paused(name, true).await
    }

    /// Resumes a paused schedule: it is due at its first tick after now (the ticks that
    /// passed while it was paused are not fired). Logged with the operator and reason.
    /// Returns the schedule as it is now.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`], [`Error::InvalidSchedule`] when no tick follows now,
    /// [`Error::Db`].
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleView> {
        self.set_paused(name, false).await
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<ScheduleView> {
        let store = &self.engine.inner.store;
        let reason = self.audit.reason.as_deref().unwrap_or("");
        let mut stored = store
            .schedule_get(name)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))?;
        if !paused && !stored.paused {
            return Ok(stored);
        }
        let found = if paused {
            store
                .schedule_pause(name, &self.audit.actor, reason)
                .await?
        } else {
            let invalid = |reason| Error::InvalidSchedule {
                name: name.to_owned(),
                reason,
            };
            loop {
                let spec = sagaflow_engine::cron::CronSpec::parse(&stored.expression, &stored.zone)
                    .map_err(invalid)?;
                let now = store.now_ms().await?;
                let resume_at = spec.next_after(now).map_err(invalid)?;
                if store.schedule_resume(&stored, resume_at).await? {
                    break true;
                }
                // Changed since the read: resumed by another operator (whose first tick
                // may have fired since, and must not be set due again) or published with
                // another expression. Decide again from what it is now.
                match store.schedule_get(name).await? {
                    Some(now) if now.paused => stored = now,
                    Some(now) => return Ok(now),
                    None => break false,
                }
            }
        };
        if !found {
            return Err(Error::ScheduleNotFound(name.to_owned()));
        }
        tracing::info!(
            schedule = name,
            actor = %self.audit.actor,
            reason,
            "{}",
            if paused { "schedule paused" } else { "schedule resumed" }
        );
        store
            .schedule_get(name)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    }
}
