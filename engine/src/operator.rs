//! Operator actions on a run (SAS-7: "the operator can fix the cause and retry the step by
//! hand"). Each locks the run, asks [`crate::transition::operator`] for the writes (which
//! checks the preconditions), applies them, records them in the history, resolves the run's
//! open alerts, and marks the run for evaluation.

use uuid::Uuid;

use crate::interleave::{Point, Unit};
use crate::store::{EvalApplied, PlanWrite, RunRow, StepRow, Store};
use crate::transition::operator as decide;
use crate::{Error, Result};

/// Who acts, and why: recorded with the action in the run's history (the actor in its
/// `actor` column, the reason in its `detail`; the time is the database's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audit {
    /// Who acts: `operator` for the Rust API by default, `api:<token name>` over HTTP.
    pub actor: String,
    /// Why, in the operator's words.
    pub reason: Option<String>,
    /// The state the run was listed in, when the action was chosen from a list (a bulk
    /// action's filter): under the run's lock, a run found in another state is left as it
    /// is. `None`: whatever state the action allows.
    pub listed_as: Option<crate::RunState>,
}

impl Default for Audit {
    fn default() -> Self {
        Self {
            actor: "operator".into(),
            reason: None,
            listed_as: None,
        }
    }
}

impl Audit {
    /// An actor and a reason.
    pub fn new(actor: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            actor: actor.into(),
            reason: Some(reason.into()),
            listed_as: None,
        }
    }

    /// Why an action resolved its run's alerts: its name (`event` without `operator_`) and
    /// the reason, such as `resume: card service is back`.
    fn resolution(&self, event: &str) -> String {
        let action = event.strip_prefix("operator_").unwrap_or(event);
        match &self.reason {
            Some(reason) => format!("{action}: {reason}"),
            None => action.to_owned(),
        }
    }

    /// The history detail of an action: its own detail (a JSON object) with the reason added.
    fn detail(&self, own: Option<String>) -> Option<String> {
        let Some(reason) = &self.reason else {
            return own;
        };
        let mut detail = own
            .and_then(|d| {
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&d).ok()
            })
            .unwrap_or_default();
        detail.insert("reason".into(), reason.clone().into());
        Some(serde_json::Value::Object(detail).to_string())
    }
}

async fn act<F>(store: &Store, run_id: Uuid, audit: &Audit, plan: F) -> Result<EvalApplied>
where
    F: FnOnce(&RunRow, &[StepRow]) -> Result<PlanWrite>,
{
    act_with_input(store, run_id, audit, None, None, plan).await
}

/// The version of its workflow an action on a run was prepared for (its definition read, its
/// input checked), before the unit of work locked the run.
#[derive(Debug, Clone, Copy)]
struct PreparedFor {
    /// The action, as an error names it.
    action: &'static str,
    /// The run's version when it was read.
    version: i32,
}

/// Refuses, under the run's lock, an action prepared for another version than the run has
/// now (a migration moved it meanwhile): its plan and input check would be the old
/// version's.
fn check_prepared(run: &RunRow, prepared: Option<PreparedFor>) -> Result<()> {
    match prepared {
        Some(p) if p.version != run.version => Err(Error::ActionNotAllowed {
            action: p.action,
            run_id: run.id,
            reason: format!(
                "the run moved to version {} of its workflow while the action was prepared for \
                 version {}; nothing was changed: act again",
                run.version, p.version
            ),
        }),
        _ => Ok(()),
    }
}

/// [`act`], writing `input` as the run's new input in the same unit of work when given, and
/// refused when the run is no longer at the version the action was `prepared` for.
async fn act_with_input<F>(
    store: &Store,
    run_id: Uuid,
    audit: &Audit,
    input: Option<&str>,
    prepared: Option<PreparedFor>,
    plan: F,
) -> Result<EvalApplied>
where
    F: FnOnce(&RunRow, &[StepRow]) -> Result<PlanWrite>,
{
    let mut tx = store.begin().await?;
    let (run, restarted_as) = tx
        .run_lock_for_action(run_id)
        .await?
        .ok_or(Error::RunNotFound(run_id))?;
    check_prepared(&run, prepared)?;
    // A damaged step row is reported to the operator, who repairs it first.
    let steps = tx
        .steps_lock(&[run_id])
        .await?
        .take(run_id)
        .map_err(|d| d.to_error())?;
    tx.pause_point(Unit::Operator, Point::AfterReads).await;
    let mut write = plan(&run, &steps)?;
    if let Some(listed) = audit.listed_as
        && listed != run.state
    {
        // Chosen from a list read before the lock: the run changed since (another operator
        // resumed it, it finished…) and is no longer what the action was meant for.
        return Err(Error::ActionNotAllowed {
            action: write.event.strip_prefix("operator_").unwrap_or(write.event),
            run_id,
            reason: format!(
                "the run was {listed} when it was listed and is {} now: left as it is",
                run.state
            ),
        });
    }
    if let Some(newer) = restarted_as {
        // What the run did is the newer run's now: acting here could undo what it reuses.
        return Err(Error::ActionNotAllowed {
            action: write.event.strip_prefix("operator_").unwrap_or(write.event),
            run_id,
            reason: format!(
                "the run was restarted as run {newer}, which owns what it did: act on that run"
            ),
        });
    }
    write.detail = audit.detail(write.detail.take());
    if write.resolve_alerts {
        write.resolution = Some(audit.resolution(write.event));
    }
    if let Some(input) = input {
        tx.run_set_input(run_id, input).await?;
    }
    let plans = vec![(run, write)];
    let cancelled = crate::metrics::cancelled_runs(&plans);
    let applied = tx.plan_apply(plans, &audit.actor).await?;
    tx.happened.runs_moved(&applied, &cancelled);
    let applied = applied
        .into_iter()
        .next()
        .ok_or(Error::RunNotFound(run_id))?;
    tx.pause_point(Unit::Operator, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit().await?);
    Ok(applied)
}

/// Retries one failed step (or failed compensation) of a run in `Error`.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` and the step is `Failed` or
/// `CompensationFailed`; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn retry(store: &Store, run_id: Uuid, step: &str, audit: &Audit) -> Result<EvalApplied> {
    act(store, run_id, audit, |run, steps| {
        decide::retry(run, steps, step)
    })
    .await
}

/// Asks for the run to be compensated: a running run stops starting new steps and undoes
/// what completed; a run in `Error` retries its failed compensations.
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a finished run; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn compensate(store: &Store, run_id: Uuid, audit: &Audit) -> Result<EvalApplied> {
    act(store, run_id, audit, decide::compensate).await
}

/// Cancels a run that is not finished: it stops starting steps, undoes what completed, and
/// ends `Compensated` with an error envelope saying it was cancelled (and why). Stopping its
/// attempts in flight is the scheduler's part ([`crate::scheduler::Scheduler::cancel_attempts`]).
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a finished run; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn cancel(store: &Store, run_id: Uuid, audit: &Audit) -> Result<EvalApplied> {
    let reason = audit.reason.clone();
    act(store, run_id, audit, |run, steps| {
        decide::cancel(run, steps, reason.as_deref())
    })
    .await
}

/// Gives the run's attempts in flight `by` more time (their stored deadlines move later).
/// Moving the local deadlines of the instances running them is the scheduler's part
/// ([`crate::scheduler::Scheduler::extend_attempts`]).
///
/// # Errors
/// [`Error::ActionNotAllowed`] when nothing is in flight or `by` is out of range;
/// [`Error::RunNotFound`]; [`Error::Db`].
pub async fn extend(
    store: &Store,
    run_id: Uuid,
    by: std::time::Duration,
    audit: &Audit,
) -> Result<EvalApplied> {
    act(store, run_id, audit, |run, steps| {
        decide::extend(run, steps, by)
    })
    .await
}

/// Pauses a pending, running or compensating run: it claims no new step until resumed;
/// attempts in flight finish and are recorded.
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a run in any other state; [`Error::RunNotFound`];
/// [`Error::Db`].
pub async fn pause(store: &Store, run_id: Uuid, audit: &Audit) -> Result<EvalApplied> {
    let reason = audit.reason.clone();
    act(store, run_id, audit, |run, steps| {
        crate::transition::pause::pause(run, steps, reason.as_deref())
    })
    .await
}

/// Resumes a run in `Error` or `Paused` where it stopped: retries every failed step of the
/// phase it was in (forward steps, or compensations); a paused run's parked steps are due
/// again.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` or `Paused`;
/// [`Error::RunNotFound`]; [`Error::Db`].
pub async fn resume(store: &Store, run_id: Uuid, audit: &Audit) -> Result<EvalApplied> {
    act(store, run_id, audit, decide::resume).await
}

/// Records that an operator undid a step's effect by hand (e.g. refunded outside the system)
/// after its compensation failed: `CompensationFailed → Compensated`, and the run resumes
/// compensating the rest.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run is in `Error` and the step is
/// `CompensationFailed`; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn mark_compensated(
    store: &Store,
    run_id: Uuid,
    step: &str,
    audit: &Audit,
) -> Result<EvalApplied> {
    act(store, run_id, audit, |run, steps| {
        decide::mark_compensated(run, steps, step)
    })
    .await
}

/// Releases a run set aside for a damaged row, once the row is repaired: the run goes back to
/// the phase it was in and its parked steps are due again.
///
/// # Errors
/// [`Error::ActionNotAllowed`] unless the run was set aside; [`Error::CorruptRow`] while a
/// step row is still damaged; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn release(store: &Store, run_id: Uuid, audit: &Audit) -> Result<EvalApplied> {
    act(store, run_id, audit, decide::release).await
}

/// What undoing a child run found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildUndo {
    /// Nothing (more) to undo: the child was never started, or it is compensated.
    Done,
    /// The child is being undone (compensated, or cancelled while it ran); its end wakes the
    /// parent's compensation.
    Pending,
}

/// Undoes the child run started by the parent's step `parent_step`: a completed child
/// compensates, an unfinished one is cancelled (which compensates what it completed), one
/// already compensating is left to finish.
///
/// # Errors
/// [`Error::Db`].
pub async fn child_undo(store: &Store, parent_step: i64, audit: &Audit) -> Result<ChildUndo> {
    let Some((child, state)) = store.run_child_of_step(parent_step).await? else {
        return Ok(ChildUndo::Done);
    };
    let acted = match state {
        crate::RunState::Compensated => return Ok(ChildUndo::Done),
        crate::RunState::Compensating => return Ok(ChildUndo::Pending),
        crate::RunState::Completed => act(store, child, audit, decide::parent_compensates).await,
        _ => cancel(store, child, audit).await,
    };
    match acted {
        // A child that moved on meanwhile is looked at again on the next attempt.
        Ok(_) | Err(Error::ActionNotAllowed { .. }) => Ok(ChildUndo::Pending),
        Err(e) => Err(e),
    }
}

/// Replaces the input of a run that is `Paused` or in `Error` (set aside or not) with `input`
/// (JSON text the caller checked against `wf`, the run's workflow version when it read it)
/// and resumes it: the failed steps of the phase it stopped in are retried, its parked steps
/// are due again. The history event keeps the old input and the new one.
///
/// # Errors
/// [`Error::ActionNotAllowed`] for a run in any other state, or moved to another version
/// than `wf` since it was read; [`Error::CorruptRow`] while a
/// step row is damaged; [`Error::RunNotFound`]; [`Error::Db`].
pub async fn replace_input(
    store: &Store,
    run_id: Uuid,
    wf: &crate::definition::Workflow,
    input: &str,
    audit: &Audit,
) -> Result<EvalApplied> {
    let prepared = PreparedFor {
        action: decide::REPLACE_INPUT_ACTION,
        version: wf.version,
    };
    act_with_input(
        store,
        run_id,
        audit,
        Some(input),
        Some(prepared),
        |run, steps| decide::replace_input(run, steps, input),
    )
    .await
}

/// What a restart from a step did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Restarted {
    /// The new run.
    pub id: Uuid,
    /// The run it was restarted from.
    pub source: Uuid,
    /// The step it runs from.
    pub step: String,
    /// The steps it took over from the source as completed, in the workflow's order.
    pub reused: Vec<String>,
}

/// Restarts `new` (a run of the source's workflow version, built as a start builds it) from
/// step `from` of the run `source_id`, in one unit of work: the source is locked, the steps
/// `from` depends on are taken over as completed with the source's outputs and idempotency
/// keys ([`crate::transition::restart::restart`] says which, or refuses), the new run takes over the
/// source's business key, and the two runs are linked both ways and audited. The new run is
/// marked for evaluation, which queues the steps whose dependencies are done.
///
/// # Errors
/// [`Error::ActionNotAllowed`] with the reason the restart is refused;
/// [`Error::DuplicateKey`] when another run holds the business key; [`Error::RunNotFound`];
/// [`Error::Db`], [`Error::CorruptRow`].
pub async fn restart(
    store: &Store,
    source_id: Uuid,
    wf: &crate::definition::Workflow,
    from: &str,
    new: &crate::store::NewRun,
    audit: &Audit,
) -> Result<Restarted> {
    use crate::transition::restart as decide_restart;
    let mut tx = store.begin().await?;
    let (run, restarted_as) = tx
        .run_lock_for_restart(source_id)
        .await?
        .ok_or(Error::RunNotFound(source_id))?;
    check_prepared(
        &run,
        Some(PreparedFor {
            action: decide_restart::RESTART,
            version: wf.version,
        }),
    )?;
    let steps = tx
        .steps_lock(&[source_id])
        .await?
        .take(source_id)
        .map_err(|d| d.to_error())?;
    // A finished run's history is written: it says which keys its rollbacks gave.
    let keys = if run.state.is_final() {
        decide_restart::rekeyed(&tx.run_history(source_id).await?)
    } else {
        std::collections::HashMap::new()
    };
    tx.pause_point(Unit::Operator, Point::AfterReads).await;
    let source = decide_restart::Source {
        run: &run,
        restarted_as,
        steps: &steps,
        keys: &keys,
    };
    let reused = decide_restart::restart(wf, source, from)?;
    let names: Vec<String> = reused.iter().map(|r| r.name.clone()).collect();
    let mut source_detail = serde_json::json!({ "as": new.id, "step": from });
    let mut new_detail = serde_json::json!({ "from": source_id, "step": from, "reused": names });
    if let Some(reason) = &audit.reason {
        source_detail["reason"] = reason.clone().into();
        new_detail["reason"] = reason.clone().into();
    }
    let write = crate::store::RestartWrite {
        source: source_id,
        new,
        reused: &reused,
        actor: &audit.actor,
        source_detail: source_detail.to_string(),
        new_detail: new_detail.to_string(),
        resolution: audit.resolution("restart"),
    };
    match tx.run_restart(&write).await? {
        crate::store::RunInsertOutcome::Inserted(_) => {}
        crate::store::RunInsertOutcome::Duplicate { existing, state } => {
            return Err(Error::DuplicateKey {
                workflow: new.workflow.clone(),
                key: new.business_key.clone().unwrap_or_default(),
                existing,
                state,
            });
        }
    }
    tx.pause_point(Unit::Operator, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit().await?);
    crate::metrics::run_started(&new.workflow);
    Ok(Restarted {
        id: new.id,
        source: source_id,
        step: from.to_owned(),
        reused: names,
    })
}

/// Rolls the run back to step `to` of `wf` (the run's version), writing `input` as its new
/// input in the same unit of work when given: see
/// [`crate::transition::operator::rollback`].
///
/// # Errors
/// [`Error::ActionNotAllowed`] with the reason it cannot be done safely;
/// [`Error::RunNotFound`]; [`Error::Db`], [`Error::CorruptRow`].
pub async fn rollback(
    store: &Store,
    run_id: Uuid,
    wf: &crate::definition::Workflow,
    to: &str,
    input: Option<&str>,
    audit: &Audit,
) -> Result<EvalApplied> {
    let reason = audit.reason.clone();
    let prepared = PreparedFor {
        action: crate::OperatorAction::Rollback.as_str(),
        version: wf.version,
    };
    act_with_input(store, run_id, audit, input, Some(prepared), |run, steps| {
        decide::rollback(wf, run, steps, to, reason.as_deref())
    })
    .await
}
