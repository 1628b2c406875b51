//! The evaluation loop: runs marked dirty → transition module → writes, alerts, events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{ErrorStreak, Scheduler, pause};
use crate::interleave::{Point, Unit};
use crate::model::{Alert, AlertKind};
use crate::signals::RunEvent;
use crate::store::{Damage, EvalApplied, NewAlert, PlanWrite, RunRow, StepRow, StoreTx, Wake};
use crate::transition;
use crate::{Error, Registry, RunState};

/// Runs evaluated per poll.
const EVAL_BATCH: u32 = 128;
/// How long a run this engine cannot evaluate (unknown version) is left alone before another
/// try.
const POISON_RETRY: Duration = Duration::from_secs(60);
/// How often to look for unfinished runs of versions this engine does not have.
const VERSION_CHECK_EVERY: Duration = Duration::from_secs(60);

pub(super) async fn run(s: Arc<Scheduler>, cancel: CancellationToken) {
    let mut streak = ErrorStreak::default();
    // Runs this engine cannot evaluate (a version it lacks): alerted once, retried after
    // POISON_RETRY (another engine may have taken them), never in a hot loop.
    let mut poisoned: HashMap<Uuid, tokio::time::Instant> = HashMap::new();
    let mut last_version_check: Option<tokio::time::Instant> = None;
    loop {
        if last_version_check.is_none_or(|t| t.elapsed() >= VERSION_CHECK_EVERY) {
            last_version_check = Some(tokio::time::Instant::now());
            if let Err(e) = check_versions(&s).await {
                streak.failed("checking workflow versions", &e);
            }
        }
        let dirty = match s.store.run_list_dirty(&s.catalog().keys, EVAL_BATCH).await {
            Ok(d) => {
                streak.succeeded("evaluating runs");
                d
            }
            Err(e) => {
                streak.failed("evaluating runs", &e);
                if !pause(&cancel, s.config.error_pause).await {
                    return;
                }
                continue;
            }
        };
        poisoned.retain(|_, since| since.elapsed() < POISON_RETRY);
        let dirty: Vec<Uuid> = dirty
            .into_iter()
            .filter(|id| !poisoned.contains_key(id))
            .collect();
        let mut progressed = false;
        match evaluate_dirty(&s, &dirty).await {
            Ok(out) => {
                for a in &out.applied {
                    progressed |= after_eval(&s, a);
                }
                for a in &out.set_aside {
                    s.signals.alert(a);
                }
                for (id, e) in out.failed {
                    poisoned.insert(id, tokio::time::Instant::now());
                    raise(&s, unevaluable_alert(id, &e)).await;
                }
            }
            Err(e) => streak.failed("evaluating runs", &e),
        }
        if progressed {
            continue;
        }
        tokio::select! {
            () = s.signals.evaluator_woken() => {}
            () = tokio::time::sleep(s.config.empty_poll_pause) => {}
            () = cancel.cancelled() => return,
        }
    }
}

/// What an evaluation of several runs did.
#[derive(Debug, Default)]
pub struct Evaluated {
    /// Runs evaluated and their plans applied.
    pub applied: Vec<EvalApplied>,
    /// Runs whose plan could not be made for a reason other than damage (a version this
    /// engine lacks): left marked for evaluation.
    pub failed: Vec<(Uuid, Error)>,
    /// Alerts raised for runs set aside for a damaged row.
    pub set_aside: Vec<Alert>,
}

/// Evaluates runs marked dirty, in one unit of work (those no longer dirty are skipped).
async fn evaluate_dirty(s: &Scheduler, ids: &[Uuid]) -> Result<Evaluated, Error> {
    if ids.is_empty() {
        return Ok(Evaluated::default());
    }
    let mut tx = s.store.begin().await?;
    let runs = tx.runs_lock(ids, true).await?;
    let registry = s.registry();
    let out = plan_and_apply(&mut tx, &registry, runs, HashMap::new(), &s.config.owner).await?;
    tx.pause_point(Unit::Evaluate, Point::BeforeCommit).await;
    // Steps it readied wake this engine's claim loop in process (`after_eval`): the
    // notification is for the other engines.
    crate::metrics::record(tx.commit_from(Wake::CLAIM, &s.config.owner).await?);
    Ok(out)
}

/// Evaluates runs locked by `tx`: reads their steps, asks the transition module for each
/// run's plan (by its pinned version), and applies the plans.
///
/// A run with a damaged row — its own row or a step's does not decode, its stored data does
/// not match its definition, or `damaged` names it (an attempt found its data undecodable) —
/// is set aside (`Error`, one `corrupt_row` alert) and costs nothing else: the other runs of
/// the batch are evaluated and written. A run whose version this engine lacks is left marked
/// for evaluation and returned with its error.
///
/// # Errors
/// [`Error::Db`].
pub async fn plan_and_apply(
    tx: &mut StoreTx<'_>,
    registry: &Registry,
    runs: Vec<Result<RunRow, Damage>>,
    mut damaged: HashMap<Uuid, Damage>,
    actor: &str,
) -> Result<Evaluated, Error> {
    let set_aside_from = transition::set_aside_rule().from;
    let mut aside: Vec<(Option<RunState>, Damage)> = Vec::new();
    // The workflows and phases of the set-aside runs whose rows decoded, for the metrics.
    let mut aside_of: Vec<(String, RunState)> = Vec::new();
    let mut set_aside = |phase: Option<RunState>, workflow: Option<&str>, d: Damage| {
        // A finished run is not reopened for damage found after it finished.
        if phase.is_none_or(|p| set_aside_from.contains(&p)) {
            if let (Some(p), Some(w)) = (phase, workflow) {
                aside_of.push((w.to_owned(), p));
            }
            aside.push((phase, d));
        }
    };
    let mut healthy = Vec::with_capacity(runs.len());
    for run in runs {
        match run {
            Ok(run) => match damaged.remove(&run.id) {
                Some(d) => set_aside(Some(run.state), Some(&run.workflow), d),
                None => healthy.push(run),
            },
            Err(d) => set_aside(None, None, d),
        }
    }
    for (run, d) in &damaged {
        // An attempt reported damage for a run whose row is gone: its step stays parked.
        tracing::warn!(run_id = %run, damage = %d, "a step of a missing run was parked");
    }
    let ids: Vec<Uuid> = healthy.iter().map(|r| r.id).collect();
    let mut steps = tx.steps_lock(&ids).await?;
    tx.pause_point(Unit::Evaluate, Point::AfterReads).await;
    let mut plans = Vec::with_capacity(healthy.len());
    let mut failed = Vec::new();
    for run in healthy {
        let rows = match steps.take(run.id) {
            Ok(rows) => rows,
            Err(d) => {
                set_aside(Some(run.state), Some(&run.workflow), d);
                continue;
            }
        };
        let planned = crate::trace::evaluate_span(&crate::trace::EvaluatedRun {
            id: run.id,
            workflow: &run.workflow,
            state: run.state.as_str(),
            trace_parent: run.trace_parent.as_deref(),
            trace_state: run.trace_state.as_deref(),
        })
        .in_scope(|| plan_run(registry, &run, &rows));
        match planned {
            Ok(p) => plans.push((run, p)),
            Err(e @ Error::CorruptRow { .. }) => {
                set_aside(Some(run.state), Some(&run.workflow), Damage::of(run.id, e));
            }
            Err(e) => failed.push((run.id, e)),
        }
    }
    if !failed.is_empty() {
        let ids: Vec<Uuid> = failed.iter().map(|(id, _)| *id).collect();
        tx.runs_mark_dirty(&ids).await?;
    }
    let set_aside = tx.run_set_aside(&aside, actor).await?;
    for (workflow, phase) in &aside_of {
        tx.happened.set_aside(workflow, *phase);
    }
    let cancelled = crate::metrics::cancelled_runs(&plans);
    let applied = tx.plan_apply(plans, actor).await?;
    tx.happened.runs_moved(&applied, &cancelled);
    Ok(Evaluated {
        applied,
        failed,
        set_aside,
    })
}

/// The plan for a run, decided by the transition module for its pinned version.
fn plan_run(registry: &Registry, run: &RunRow, steps: &[StepRow]) -> Result<PlanWrite, Error> {
    let wf = registry
        .get(&run.workflow, run.version)
        .ok_or_else(|| Error::VersionNotFound {
            name: run.workflow.clone(),
            version: run.version,
            run_id: run.id,
        })?;
    transition::plan(wf, run, steps)
}

/// Publishes what an evaluation did: wake-ups, status events, alerts. Returns whether the
/// run moved.
pub(super) fn after_eval(s: &Scheduler, a: &EvalApplied) -> bool {
    if a.ready > 0 {
        s.signals.wake_claimer();
    }
    if a.stale > 0 {
        s.signals.wake_evaluator();
    }
    if a.state != a.before.state {
        let trace_id = crate::trace::StoredTraceId(a.before.trace_parent.as_deref());
        tracing::debug!(run_id = %a.before.id, %trace_id, from = %a.before.state, to = %a.state, "run moved");
        s.signals.publish(RunEvent {
            run_id: a.before.id,
            workflow: a.before.workflow.clone(),
            state: a.state,
        });
    }
    if let Some(alert) = &a.alert {
        s.signals.alert(alert);
    }
    a.ready > 0 || a.stale > 0 || a.state != a.before.state
}

/// SAS-5 / versioning: a run pinned to a version this engine lacks is not guessed at; the
/// operator is told.
async fn check_versions(s: &Scheduler) -> Result<(), Error> {
    let registry = s.registry();
    for (key, count) in s.store.run_unfinished_keys().await? {
        if registry.by_key(&key).is_some() {
            continue;
        }
        let Some((name, _)) = key.rsplit_once('@') else {
            continue;
        };
        if registry.latest(name).is_err() {
            continue; // another application's workflow on a shared database
        }
        raise(
            s,
            NewAlert {
                run_id: None,
                step: None,
                kind: AlertKind::UnknownVersion,
                reason: format!(
                    "{count} unfinished run(s) of {key} are pinned to a version this engine does not have; \
                     they are left untouched until an engine with that version runs"
                ),
                attempts: 0,
                actions: vec!["deploy an engine that registers this version".into(), "resolve_alert".into()],
                open_key: Some(format!("unknown_version:{key}")),
            },
        )
        .await;
    }
    Ok(())
}

/// A run this engine cannot evaluate for a reason other than damage (its version is not
/// registered here): left alone and retried every minute.
fn unevaluable_alert(id: Uuid, e: &Error) -> NewAlert {
    NewAlert {
        run_id: Some(id),
        step: None,
        kind: AlertKind::UnknownVersion,
        reason: format!("run cannot be evaluated by this engine: {e}"),
        attempts: 0,
        actions: vec![
            "deploy an engine that registers this version; the run is re-evaluated every minute"
                .into(),
            "resolve_alert".into(),
        ],
        open_key: Some(format!("unknown_version:run:{id}")),
    }
}

async fn raise(s: &Scheduler, alert: NewAlert) {
    match s.store.alert_insert(&alert).await {
        Ok(Some(row)) => s.signals.alert(&row),
        Ok(None) => {}
        Err(e) => tracing::error!(error = %e, reason = %alert.reason, "could not store an alert"),
    }
}
