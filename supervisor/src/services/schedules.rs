//! The schedules service: fires the recurring schedules that are due (`sagaflow_schedules`,
//! declared in code with `Schedule::cron` and written by every engine at its start).
//!
//! For each due schedule, one transaction moves its next tick with a conditional update
//! (`WHERE name = $1 AND next_tick_at = $2`) and starts the runs of the ticks its
//! [`MissedTicks`](sagaflow_engine::cron::MissedTicks) policy fires, through the engine's own
//! intake, each with the business key `schedule:<name>:<tick>`: a leader that finds the same
//! tick due (a second pass, a new leader after a failover) updates no row and rolls back, so
//! every tick is fired once across instances, failovers and restarts. The runs' history
//! says `scheduled` by `schedule:<name>`.
//!
//! Between passes the service sleeps until the earliest next tick, at most one sweep interval
//! (the leader's ordinary wake-up, which also notices schedules written or resumed meanwhile).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use sagaflow_engine::cron::tick_key;
use sagaflow_engine::store::{DueSchedule, NewRun, RunInsertOutcome, ScheduleTick, Txn};
use sagaflow_engine::{Error, Result};

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport};

/// Schedules fired per pass at most.
pub(crate) const SCHEDULE_BATCH: u32 = 100;

/// The shortest pause between two passes.
const SCHEDULE_TICK_MIN: Duration = Duration::from_millis(10);

/// Builds the run a schedule starts: the engine's validation of the workflow and input, and
/// the rows its intake writes. The engine gives the supervisor one
/// ([`Supervisor::set_schedule_starter`](crate::Supervisor::set_schedule_starter)); until then
/// no schedule fires.
#[async_trait::async_trait]
pub trait ScheduleStarter: std::fmt::Debug + Send + Sync + 'static {
    /// The run of the newest version of `workflow` with `input` and `business_key`, not yet
    /// stored.
    ///
    /// # Errors
    /// As starting the workflow would fail: [`Error::WorkflowNotFound`],
    /// [`Error::InvalidInput`], [`Error::Shutdown`], …
    async fn prepare(
        &self,
        workflow: &str,
        input: &serde_json::Value,
        business_key: String,
    ) -> Result<NewRun>;
}

/// Where the engine's [`ScheduleStarter`] is put once the engine exists.
pub(crate) type StarterSlot = Arc<OnceLock<Arc<dyn ScheduleStarter>>>;

/// Fires due schedules.
#[derive(Debug)]
pub(crate) struct Schedules {
    starter: StarterSlot,
    /// The pause before the next pass, as the last pass found it.
    pause: Mutex<Option<Duration>>,
}

impl Schedules {
    /// The service, firing through the starter `slot` holds (once it holds one).
    pub(crate) fn new(slot: StarterSlot) -> Self {
        Self {
            starter: slot,
            pause: Mutex::new(None),
        }
    }

    /// Fires the due ticks of `d` (found due at `now`) in one transaction. Returns the runs
    /// inserted, and the schedule's next tick; `None` when another pass fired it meanwhile.
    async fn fire(
        &self,
        ctx: &LeaderContext,
        starter: &dyn ScheduleStarter,
        d: &DueSchedule,
        now: i64,
    ) -> Result<Option<(Vec<NewRun>, i64)>> {
        let plan = d
            .spec
            .catch_up(d.next_tick_at, now, d.missed)
            .map_err(|reason| Error::InvalidSchedule {
                name: d.name.clone(),
                reason,
            })?;
        // Built before the transaction: building may read published definitions.
        let mut runs = Vec::with_capacity(plan.fire.len());
        for &tick in &plan.fire {
            let run = starter
                .prepare(&d.workflow, &d.input, tick_key(&d.name, tick))
                .await?;
            runs.push((tick, run));
        }
        let txn = ctx.store.executor().begin().await?;
        let result = write(ctx, &txn, d, plan.fire.last().copied(), plan.next, &runs).await;
        match result {
            Ok(Some(inserted)) => {
                txn.commit().await?;
                let fresh = runs
                    .into_iter()
                    .map(|(_, r)| r)
                    .filter(|r| inserted.contains(&r.id))
                    .collect();
                Ok(Some((fresh, plan.next)))
            }
            Ok(None) => {
                txn.rollback().await?;
                Ok(None)
            }
            Err(e) => {
                let _ = txn.rollback().await;
                Err(e)
            }
        }
    }
}

/// The writes of one firing on `txn`: the conditional move of the next tick, then the runs
/// and their history. `None` when the tick was no longer due (nothing is to be kept).
async fn write(
    ctx: &LeaderContext,
    txn: &Txn,
    d: &DueSchedule,
    fired: Option<i64>,
    next: i64,
    runs: &[(i64, NewRun)],
) -> Result<Option<Vec<uuid::Uuid>>> {
    if !ctx
        .store
        .schedule_advance(
            txn,
            &ScheduleTick {
                name: &d.name,
                due: d.next_tick_at,
                next,
                fired,
            },
        )
        .await?
    {
        return Ok(None);
    }
    let mut inserted = Vec::with_capacity(runs.len());
    let mut history = Vec::with_capacity(runs.len());
    let mut last = None;
    for (tick, run) in runs {
        match ctx.store.run_insert(txn, run).await? {
            RunInsertOutcome::Inserted(id) => {
                inserted.push(id);
                history.push((id, tick_key(&d.name, *tick), run.initial_state()));
                last = Some(id);
            }
            RunInsertOutcome::Duplicate { existing, .. } => last = Some(existing),
        }
    }
    ctx.store
        .schedule_started(txn, &d.name, &history, last)
        .await?;
    Ok(Some(inserted))
}

#[async_trait::async_trait]
impl MaintenanceService for Schedules {
    fn name(&self) -> &'static str {
        "schedules"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        let pause = *self.pause.lock().unwrap_or_else(PoisonError::into_inner);
        pause.unwrap_or(config.sweep_interval).clamp(
            SCHEDULE_TICK_MIN,
            config.sweep_interval.max(SCHEDULE_TICK_MIN),
        )
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let Some(starter) = self.starter.get() else {
            return Ok(ServiceReport::default());
        };
        let due = ctx.store.schedules_due(SCHEDULE_BATCH).await?;
        let mut next = due.next_tick_at;
        let mut started = 0_u64;
        let mut failed = false;
        let full = due.due.len() >= SCHEDULE_BATCH as usize;
        for d in &due.due {
            match self.fire(ctx, starter.as_ref(), d, due.now).await {
                Ok(Some((runs, tick))) => {
                    next = Some(next.map_or(tick, |n| n.min(tick)));
                    started += runs.len() as u64;
                    for r in &runs {
                        sagaflow_engine::metrics::run_started(&r.workflow);
                    }
                }
                Ok(None) => {}
                Err(e @ Error::LeaseLost { .. }) => return Err(e),
                Err(e) => {
                    failed = true;
                    tracing::warn!(schedule = %d.name, error = %e, "a due schedule could not fire; retried at the next pass");
                }
            }
        }
        if started > 0 {
            ctx.signals.wake_claimer();
        }
        let pause = if full {
            Some(SCHEDULE_TICK_MIN)
        } else if failed {
            None
        } else {
            next.map(|t| Duration::from_millis(u64::try_from(t - due.now).unwrap_or(0)))
        };
        *self.pause.lock().unwrap_or_else(PoisonError::into_inner) = pause;
        Ok(ServiceReport::default().with("scheduled_runs", started))
    }
}
