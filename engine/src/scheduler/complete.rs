//! The completion loop: agent responses → fenced batch writes.

use std::sync::Arc;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use uuid::Uuid;

use super::evaluate::plan_and_apply;
use super::{ErrorStreak, Scheduler, pause};
use crate::crash::{CrashHook, CrashPoint};
use crate::interleave::{Point, Unit};
use crate::model::Alert;
use crate::protocol::AgentResponse;
use crate::store::{
    Damage, DeadlineGuard, EvalApplied, NewRun, Park, RunStart, StepFinish, Store, WaitWrite, Wake,
};
use crate::transition::{self, StepChange, Trigger};
use crate::{Error, Registry, StepError};

/// Attempts to write a batch before leaving it to the supervisor (its leases then expire and
/// the steps are re-queued; idempotency keys make the re-run safe).
const WRITE_ATTEMPTS: u32 = 5;
/// Slack added to a retry's due time before waking the claimer, so the row is due by then.
const RETRY_WAKE_MARGIN: Duration = Duration::from_millis(5);
/// Longest retry or deferral delay the completion loop keeps a wake-up timer for; a step due
/// later (a long deferral) is found by the claim loop's polling, so the timers stay few.
const RETRY_WAKE_MAX_MS: i64 = 120_000;

pub(super) async fn run(
    s: Arc<Scheduler>,
    cancel: CancellationToken,
    rx: Arc<Mutex<mpsc::Receiver<AgentResponse>>>,
) {
    let mut streak = ErrorStreak::default();
    let mut batch = Vec::with_capacity(s.config.complete_batch);
    // Due times of the retries and deferrals this loop wrote: the claim loop is woken when
    // each becomes due rather than at its next idle poll. Bounded by the results written
    // within the longest delay kept (`RETRY_WAKE_MAX_MS`).
    let mut retries: BinaryHeap<Reverse<Instant>> = BinaryHeap::new();
    loop {
        let next = retries.peek().map(|Reverse(t)| *t);
        tokio::select! {
            // Writers take turns at the channel: one waits for responses while the others
            // write theirs, so a batch's round trips and commit overlap the next batch's.
            n = async { rx.lock().await.recv_many(&mut batch, s.config.complete_batch).await } => if n == 0 { return },
            () = async { if let Some(t) = next { tokio::time::sleep_until(t).await } else { std::future::pending().await } } => {
                let now = Instant::now();
                while retries.peek().is_some_and(|Reverse(t)| *t <= now) {
                    retries.pop();
                }
                s.signals.wake_claimer();
                continue;
            }
            () = cancel.cancelled() => return,
        }
        if batch
            .iter()
            .any(|r| s.crashes(CrashPoint::AfterEffect, &r.lease))
        {
            return;
        }
        for r in batch
            .iter()
            .filter(|r| r.lease.state == crate::StepState::Running)
        {
            s.store.pause_answer(&r.lease.step).await;
        }
        // Attempts the fence stopped answer nothing: the instance releases their steps as
        // interruptions once a heartbeat lands, or the supervisor does when it counts the
        // instance dead.
        batch.retain(|r| !s.in_flight.ended(&r.lease));
        if batch.is_empty() {
            continue;
        }
        // An attempt that ends frees room under its resource's limits: claim again at once.
        let frees_resource = batch.iter().any(|r| s.holds_resource(&r.lease));
        let finishes: Vec<StepFinish> = batch.drain(..).map(|r| attempt_end(&s, r)).collect();
        let registry = s.registry();
        let mut written = false;
        for _ in 0..WRITE_ATTEMPTS {
            let write = finish_batch_in(
                &s.store,
                &registry,
                &finishes,
                &s.config.owner,
                true,
                s.config.freeze_in_transaction.as_deref(),
                s.config.crash.as_deref(),
            );
            // Shutdown does not wait for a write stuck on the database: the transaction is
            // dropped (rolled back) and the attempts are released as interruptions.
            let result = tokio::select! {
                r = write => r,
                () = cancel.cancelled() => return,
            };
            match result {
                Ok(outcome) => {
                    let applied = outcome.applied;
                    for a in &outcome.evaluated {
                        super::evaluate::after_eval(&s, a);
                    }
                    for a in &outcome.set_aside {
                        s.signals.alert(a);
                    }
                    if !outcome.failed.is_empty() {
                        // Left marked: the evaluation loop retries them and raises alerts.
                        s.signals.wake_evaluator();
                    }
                    streak.succeeded("writing step results");
                    if frees_resource {
                        s.signals.wake_claimer();
                    }
                    // The row's `available_at` was computed by the database during the write,
                    // so measure from after it, with a margin for clock granularity.
                    let base = Instant::now() + RETRY_WAKE_MARGIN;
                    for (f, ok) in finishes.iter().zip(&applied) {
                        if let (Trigger::FailedWillRetry | Trigger::Deferred, Some(delay_ms), true) =
                            (f.change.on, f.change.due_in_ms, ok)
                            && delay_ms <= RETRY_WAKE_MAX_MS
                        {
                            retries.push(Reverse(
                                base + Duration::from_millis(u64::try_from(delay_ms).unwrap_or(0)),
                            ));
                        }
                    }
                    let lost = applied.iter().filter(|a| !**a).count();
                    if lost > 0 {
                        tracing::debug!(lost, "results dropped: their leases were lost (SAS-3)");
                    }
                    written = true;
                    break;
                }
                Err(e) => {
                    streak.failed("writing step results", &e);
                    if !pause(&cancel, s.config.error_pause).await {
                        return;
                    }
                }
            }
        }
        if !written {
            tracing::warn!(
                results = finishes.len(),
                "giving up on writing step results; the supervisor will re-queue them at their deadline"
            );
        }
    }
}

/// What a completion batch did.
#[derive(Debug)]
pub struct FinishOutcome {
    /// Per item, whether its fenced write applied.
    pub applied: Vec<bool>,
    /// The evaluations of the runs concerned.
    pub evaluated: Vec<EvalApplied>,
    /// Runs whose evaluation failed (left marked for the evaluation loop).
    pub failed: Vec<(Uuid, Error)>,
    /// Alerts raised for runs set aside for a damaged row.
    pub set_aside: Vec<Alert>,
}

/// One completion batch as one unit of work: lock the batch's runs (in id order), write the
/// decided attempt ends (fenced), evaluate the runs on what is now stored, apply their plans,
/// commit. One commit moves many runs forward.
///
/// # Errors
/// [`Error::Db`].
pub async fn finish_batch(
    store: &Store,
    registry: &Registry,
    items: &[StepFinish],
    actor: &str,
) -> Result<FinishOutcome, Error> {
    finish_batch_in(store, registry, items, actor, false, None, None).await
}

async fn finish_batch_in(
    store: &Store,
    registry: &Registry,
    items: &[StepFinish],
    actor: &str,
    own: bool,
    freeze: Option<&super::Freeze>,
    crash: Option<&CrashHook>,
) -> Result<FinishOutcome, Error> {
    let mut tx = store.begin().await?;
    let run_ids: Vec<Uuid> = items.iter().map(|i| i.run_id).collect();
    let runs = tx.runs_lock(&run_ids, false).await?;
    // The steps the evaluation below reads, locked now in the order every unit takes them:
    // the attempts' writes would otherwise lock some of them first, out of that order.
    tx.steps_lock_ahead(&run_ids).await?;
    tx.pause_point(Unit::Complete, Point::AfterReads).await;
    let applied = tx.attempts_write(items, None).await?;
    let parks: Vec<Park> = items
        .iter()
        .zip(&applied)
        .filter_map(|(i, ok)| match &i.wait {
            WaitWrite::Set(p) if *ok => Some((**p).clone()),
            _ => None,
        })
        .collect();
    if !parks.is_empty() {
        tx.parks_follow_up(&parks, actor).await?;
    }
    let outcomes = breaker_outcomes(registry, items, &applied);
    if !outcomes.is_empty() {
        tx.resource_outcomes(&outcomes).await?;
    }
    if let Some(freeze) = freeze {
        freeze.freeze().await;
    }
    if let Some(crash) = crash
        && items.iter().any(|i| {
            crash.hit(
                CrashPoint::BeforeCommit,
                &i.name,
                i.change.from == crate::StepState::Compensating,
            )
        })
    {
        // Dead before the commit: the crash cancelled the loop, which drops this write
        // and rolls the transaction back, as the database does for a lost connection.
        std::future::pending::<()>().await;
    }
    // Attempts that found their data undecodable (and still held their lease) set their runs
    // aside; every other result of the batch is written and evaluated as usual.
    let damaged: HashMap<Uuid, Damage> = items
        .iter()
        .zip(&applied)
        .filter(|(i, ok)| **ok && i.change.on == Trigger::SetAside)
        .filter_map(|(i, _)| i.error.as_ref().map(|e| (i.run_id, damage(i.run_id, e))))
        .collect();
    let out = plan_and_apply(&mut tx, registry, runs, damaged, actor).await?;
    tx.pause_point(Unit::Complete, Point::BeforeCommit).await;
    if own {
        // The scheduler's own batch (`actor` is its instance id): it wakes its own claim loop
        // in process, so its notification (steps readied) is for the other engines only.
        crate::metrics::record(tx.commit_from(Wake::CLAIM, actor).await?);
    } else {
        crate::metrics::record(tx.commit().await?);
    }
    Ok(FinishOutcome {
        applied,
        evaluated: out.applied,
        failed: out.failed,
        set_aside: out.set_aside,
    })
}

/// The ends of attempts of steps that call a resource, summed per resource for its circuit
/// breaker. A failure counts when it speaks of the remote's health: a retryable error, an
/// unknown outcome, a timeout. A definitive answer (a refusal the remote meant, such as a
/// declined card) counts as a success: the remote is up. Deferrals, interruptions (this
/// side's crash) and damaged rows do not count.
fn breaker_outcomes(
    registry: &Registry,
    items: &[StepFinish],
    applied: &[bool],
) -> Vec<crate::store::ResourceOutcomes> {
    let mut out: Vec<crate::store::ResourceOutcomes> = Vec::new();
    for (i, _) in items.iter().zip(applied).filter(|(_, ok)| **ok) {
        let Some(resource) = registry
            .by_key(&i.workflow_key)
            .and_then(|w| w.step(&i.name))
            .and_then(|d| d.resource())
        else {
            continue;
        };
        let failed = match i.change.on {
            Trigger::Succeeded => false,
            Trigger::FailedWillRetry | Trigger::FailedForGood => i
                .error
                .as_ref()
                .is_none_or(|e| e.retryable || e.may_have_applied()),
            Trigger::TimedOut | Trigger::TimedOutForGood => true,
            _ => continue,
        };
        let at = out
            .iter()
            .position(|o| o.resource == resource)
            .unwrap_or_else(|| {
                out.push(crate::store::ResourceOutcomes {
                    resource: resource.to_owned(),
                    ..Default::default()
                });
                out.len() - 1
            });
        let o = &mut out[at];
        if failed {
            o.failed += 1;
            o.trailing_failures += 1;
        } else {
            o.succeeded += 1;
            o.trailing_failures = 0;
        }
    }
    out
}

/// The damage an attempt reported with [`StepError::corrupt_row`].
fn damage(run_id: Uuid, e: &StepError) -> Damage {
    let detail = |k: &str| {
        e.details
            .as_ref()
            .and_then(|d| d[k].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    Damage {
        run_id,
        table: if detail("table") == "sagaflow_runs" {
            "sagaflow_runs"
        } else {
            "sagaflow_steps"
        },
        row: detail("row"),
        reason: e.message.clone(),
    }
}

/// Turns an agent's answer into the decided end of its attempt: success, retry after backoff,
/// deferral after the asked delay, or failure for good, with whether the effect may have
/// happened.
fn attempt_end(s: &Scheduler, r: AgentResponse) -> StepFinish {
    let lease = r.lease;
    let result = r.result.and_then(|v| {
        let json = v.to_string();
        if json.len() > s.config.max_payload_bytes {
            // The step acted and answered, but its answer cannot be kept: outcome unknown.
            Err(StepError::terminal_unknown(
                "output_too_large",
                format!(
                    "output is {} bytes, over the limit of {}",
                    json.len(),
                    s.config.max_payload_bytes
                ),
            ))
        } else {
            Ok(json)
        }
    });
    let c = lease.counters;
    let policy = || {
        s.registry()
            .by_key(&lease.workflow_key)
            .and_then(|w| w.step(&lease.step))
            .map(|d| d.settings().retry)
            .unwrap_or_default()
    };
    // A park: the step waits. Only forward steps wait; a child step's child is built here,
    // and a child that cannot be built fails the step.
    let (result, park) = match result {
        Err(mut e) if e.is_park() => match (lease.state, e.wait.take()) {
            (crate::StepState::Running, Some(request)) => match child_run(s, &lease, &request) {
                Ok(child) => (Err(e), Some((request, child))),
                Err(why) => (Err(why), None),
            },
            _ => (
                Err(StepError::terminal_unknown(
                    "wait_in_compensation",
                    "a compensation cannot wait; it must finish or fail",
                )),
                None,
            ),
        },
        other => (other, None),
    };
    let (on, output, mut error) = match result {
        Err(error) if park.is_some() => (Trigger::Parked, None, Some(error)),
        Ok(json) => (Trigger::Succeeded, Some(json), None),
        // Not the step's failure: its data could not be decoded. Nothing was called.
        Err(error) if error.is_corrupt_row() => (Trigger::SetAside, None, Some(error)),
        // The remote asked to come back later and did nothing: no failure, within the cap.
        Err(error) if error.is_deferral() => (
            transition::on_deferral(&c, policy().max_deferrals),
            None,
            Some(error),
        ),
        Err(error) => (
            transition::on_failure(error.retryable, &c),
            None,
            Some(error),
        ),
    };
    let delay_ms = match on {
        Trigger::FailedWillRetry => {
            let failures = u32::try_from(c.failure_count.saturating_add(1)).unwrap_or(u32::MAX);
            crate::definition::millis(policy().backoff(failures))
        }
        Trigger::Deferred => {
            let asked = error
                .as_ref()
                .and_then(StepError::retry_after)
                .unwrap_or_default();
            let delay = policy().deferral_delay(asked);
            // The stored envelope says the delay applied.
            if let Some(e) = error.as_mut() {
                e.retry_after_ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
            }
            crate::definition::millis(delay)
        }
        Trigger::Parked => park
            .as_ref()
            .map_or(0, |(r, _)| i64::try_from(r.timeout_ms).unwrap_or(i64::MAX)),
        _ => 0,
    };
    let unknown = error.as_ref().is_some_and(StepError::may_have_applied);
    let wait = match park {
        Some((request, child)) => {
            // A park is not a failure: the step's error column is left empty.
            error = None;
            WaitWrite::Set(Box::new(Park {
                run_id: lease.run_id,
                step_id: lease.step_id,
                step: lease.step.clone(),
                request: *request,
                child,
            }))
        }
        // Nothing ran: the next attempt resumes the same wait.
        None if on == Trigger::SetAside => WaitWrite::Keep,
        None => WaitWrite::Clear,
    };
    // A lease is always `Running` or `Compensating`, which have these edges; should that ever
    // change, the write changes nothing and matches no row.
    let change = transition::decide(lease.state, on, &c, unknown, delay_ms)
        .unwrap_or_else(|| StepChange::none(lease.state, on, &c));
    StepFinish {
        id: lease.step_id,
        run_id: lease.run_id,
        elapsed: Some(lease.claimed_at.elapsed()),
        workflow_key: lease.workflow_key,
        name: lease.step,
        attempt: lease.attempt,
        owner: lease.owner,
        change,
        output,
        error,
        guard: DeadlineGuard::Live,
        wait,
    }
}

/// The child run a child step's park starts: a run of the child's workflow with the asked
/// input, keyed `<parent run>:<step>` so that it is started once, traced under the parent.
fn child_run(
    s: &Scheduler,
    lease: &crate::protocol::StepLease,
    request: &crate::wait::WaitRequest,
) -> Result<Option<NewRun>, StepError> {
    let Some((workflow, input)) = &request.start_child else {
        return Ok(None);
    };
    let refuse = |why: String| StepError::terminal_unknown("child_refused", why).not_applied();
    let registry = s.registry();
    let wf = registry
        .latest(workflow)
        .map_err(|e| refuse(format!("cannot start child workflow `{workflow}`: {e}")))?;
    wf.check_input(input)
        .map_err(|e| refuse(format!("child input refused: {e}")))?;
    let json = input.to_string();
    if json.len() > s.config.max_payload_bytes {
        return Err(refuse(format!(
            "child input is {} bytes, over the limit of {}",
            json.len(),
            s.config.max_payload_bytes
        )));
    }
    let trace = crate::trace::TraceContext::of_run(lease.run_id).child();
    Ok(Some(NewRun::for_workflow(
        wf,
        json,
        Some(format!("{}:{}", lease.run_id, lease.step)),
        RunStart::Now,
        wf.priority(),
        false,
        trace,
    )))
}
