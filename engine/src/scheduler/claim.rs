//! The claim loop.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use super::{Catalog, ErrorStreak, Scheduler, pause};
use crate::crash::CrashPoint;
use crate::definition::StepContext;
use crate::protocol::{AgentRequest, AgentResponse, Dispatch, StepLease};
use crate::store::{ClaimedStep, ResourceAsk};
use crate::{Error, StepError, StepState};

pub(super) async fn run(
    s: Arc<Scheduler>,
    cancel: CancellationToken,
    agents: mpsc::Sender<Dispatch>,
    reply: mpsc::Sender<AgentResponse>,
) {
    let mut streak = ErrorStreak::default();
    let mut resource_streak = ErrorStreak::default();
    let mut turn = 0usize;
    // Resources held back for a time (a closed window, an open breaker, a batch's pause, the
    // rate): not asked again before then, so that a resource that waits for hours costs no
    // locking transaction on every pass. Capped at the idle poll pause, so that a change of
    // limits (or of a test clock) is seen within it.
    let mut held: HashMap<String, Instant> = HashMap::new();
    // Resources whose last claim took steps: asked again without an unlocked probe first.
    let mut busy: HashSet<String> = HashSet::new();
    let mut skip_plain = false;
    loop {
        // Wait for one free slot, then take as many more as are free (up to a batch).
        let first = tokio::select! {
            p = s.slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            () = cancel.cancelled() => return,
        };
        let mut permits = vec![first];
        while permits.len() < s.config.claim_batch as usize {
            match s.slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        if s.config
            .freeze_in_transaction
            .as_ref()
            .is_some_and(|f| f.is_frozen())
        {
            cancel.cancelled().await;
            return;
        }
        // An instance whose heartbeat is late claims nothing: another may soon count it
        // dead and take its steps over.
        if s.is_fenced() {
            drop(permits);
            tokio::select! {
                () = s.signals.claimer_woken() => {}
                () = tokio::time::sleep(s.config.empty_poll_pause) => {}
                () = cancel.cancelled() => return,
            }
            continue;
        }
        // A deleted or replaced SQLite file would take every claim and result into a file
        // nobody reads: stop here and say why (one stat per claim batch).
        if let Err(e) = s.store.check_file() {
            s.signals.fail(e);
            return;
        }
        let limit = u32::try_from(permits.len()).unwrap_or(u32::MAX);
        // What this pass claims for: the registry may change between passes.
        let cat = s.catalog();
        // Outputs of earlier steps are read only for steps with dependencies (a run's first
        // step has none). On PostgreSQL the claim and these reads are one statement.
        let needs_outputs = |c: &ClaimedStep| {
            cat.registry
                .by_key(&c.workflow_key)
                .and_then(|wf| wf.step(&c.name))
                .is_none_or(|d| !d.is_root())
        };
        // Each claimed step's local deadline is measured from here, before the first claim
        // statement of the pass was sent: the database's clock read during any claim of the
        // pass is later, so an attempt is stopped no later than its stored `complete_by`
        // (a later instant, after a slow resource claim, would let it run past it).
        let claimed_at = Instant::now();
        let claim = async {
            if skip_plain {
                Ok(Default::default())
            } else {
                s.store
                    .step_claim_with_inputs(&s.config.owner, &cat.keys, limit, needs_outputs)
                    .await
            }
        };
        let (mut claimed, mut inputs) = match claim.await {
            Ok(c) => {
                streak.succeeded("claiming steps");
                c
            }
            Err(e) => {
                // Claims that a failed read left behind stand: their deadlines expire and
                // the supervisor re-queues them.
                streak.failed("claiming steps", &e);
                drop(permits);
                if !pause(&cancel, s.config.error_pause).await {
                    return;
                }
                continue;
            }
        };
        // Steps of remote resources are claimed apart, within their limits, with the slots
        // the ordinary claim left.
        let mut idle_pause = s.config.empty_poll_pause;
        if claimed.len() < permits.len() && !cat.resources.is_empty() {
            turn = turn.wrapping_add(1);
            let room = u32::try_from(permits.len() - claimed.len()).unwrap_or(u32::MAX);
            let taken = claim_resources(
                &s,
                &cat,
                room,
                turn,
                &mut held,
                &mut busy,
                &mut resource_streak,
            )
            .await;
            if let Some(wait) = taken.wait {
                idle_pause = idle_pause.min(wait);
            }
            // When every registered step calls a resource, the ordinary claim has nothing to
            // take but rows queued before a step was given its resource: it is skipped while
            // the resources keep the loop busy, and asked again whenever they do not.
            let took = !taken.with_inputs.is_empty() || !taken.without_inputs.is_empty();
            skip_plain = !cat.plain_steps && took;
            inputs.extend(taken.inputs);
            claimed.extend(taken.with_inputs);
            if !taken.without_inputs.is_empty() {
                match resource_inputs(&s, &cat, &taken.without_inputs).await {
                    Ok(more_inputs) => {
                        inputs.extend(more_inputs);
                        claimed.extend(taken.without_inputs);
                    }
                    // The claims stand: their deadlines expire and the supervisor re-queues
                    // them, as after a failed read of the ordinary claim.
                    Err(e) => resource_streak.failed("reading the inputs of claimed steps", &e),
                }
            }
        }
        if claimed.is_empty() {
            drop(permits);
            tokio::select! {
                () = s.signals.claimer_woken() => {}
                () = tokio::time::sleep(idle_pause) => {}
                () = cancel.cancelled() => return,
            }
            continue;
        }
        for (c, permit) in claimed.into_iter().zip(permits.drain(..)) {
            match request(&s, &cat, &cancel, c, &inputs, claimed_at) {
                Ok(request) => {
                    if s.crashes(CrashPoint::BeforeCall, &request.lease) {
                        return;
                    }
                    if agents
                        .send(Dispatch {
                            request,
                            reply: reply.clone(),
                            permit,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Err(failed) => {
                    // Answer on the agent's behalf: the step cannot even start.
                    let (lease, error) = *failed;
                    drop(permit);
                    let _ = reply
                        .send(AgentResponse {
                            lease,
                            result: Err(error),
                        })
                        .await;
                }
            }
        }
        if !pause(&cancel, s.config.success_pause).await {
            return;
        }
    }
}

/// Builds the agent request of a claimed step, or the error that fails it at once.
/// What [`claim_resources`] took.
#[derive(Default)]
struct Taken {
    /// Steps claimed with what they need read in the claim (PostgreSQL)…
    with_inputs: Vec<ClaimedStep>,
    /// …which is this.
    inputs: crate::store::StepInputs,
    /// Steps whose inputs are still to read (SQLite).
    without_inputs: Vec<ClaimedStep>,
    /// When a limit held steps back for a time, how soon one may start.
    wait: Option<Duration>,
}

/// Claims up to `room` steps of the resources the registered workflows call, one resource
/// after the other, starting with a different one each `turn` so that none takes every free
/// slot for good. A resource whose claim fails (its stored limits unreadable, a database
/// error) is skipped: its steps wait, the others' go on.
async fn claim_resources(
    s: &Scheduler,
    cat: &Catalog,
    mut room: u32,
    turn: usize,
    held: &mut HashMap<String, Instant>,
    busy: &mut HashSet<String>,
    streak: &mut ErrorStreak,
) -> Taken {
    let mut taken = Taken::default();
    let n = cat.resources.len();
    let now = Instant::now();
    held.retain(|_, until| *until > now);
    let needs_outputs = |c: &ClaimedStep| {
        cat.registry
            .by_key(&c.workflow_key)
            .and_then(|wf| wf.step(&c.name))
            .is_none_or(|d| !d.is_root())
    };
    for i in 0..n {
        if room == 0 {
            break;
        }
        let name = &cat.resources[(turn + i) % n];
        if let Some(until) = held.get(name) {
            let d = *until - now;
            taken.wait = Some(taken.wait.map_or(d, |w| w.min(d)));
            continue;
        }
        let ask = ResourceAsk {
            owner: &s.config.owner,
            resource: name,
            workflow_keys: &cat.keys,
            limit: room,
            busy: busy.contains(name),
        };
        let claim = s.store.resource_claim(&ask, &needs_outputs);
        match claim.await {
            Ok(c) => {
                streak.succeeded("claiming steps of resources");
                if let Some(ms) = c.retry_in_ms {
                    let d = Duration::from_millis(ms).min(s.config.empty_poll_pause);
                    taken.wait = Some(taken.wait.map_or(d, |w| w.min(d)));
                    if c.claimed.is_empty() {
                        held.insert(name.clone(), now + d);
                    }
                }
                if c.claimed.is_empty() {
                    busy.remove(name);
                } else {
                    busy.insert(name.clone());
                }
                room = room.saturating_sub(u32::try_from(c.claimed.len()).unwrap_or(u32::MAX));
                match c.inputs {
                    Some(inputs) => {
                        taken.inputs.extend(inputs);
                        taken.with_inputs.extend(c.claimed);
                    }
                    None => taken.without_inputs.extend(c.claimed),
                }
            }
            Err(e) => {
                busy.remove(name);
                streak.failed("claiming steps of resources", &e);
            }
        }
    }
    taken
}

/// What steps claimed for resources need: their runs' inputs and, for steps with
/// dependencies, the outputs of their runs' completed steps.
async fn resource_inputs(
    s: &Scheduler,
    cat: &Catalog,
    claimed: &[ClaimedStep],
) -> crate::Result<crate::store::StepInputs> {
    let runs: Vec<uuid::Uuid> = claimed.iter().map(|c| c.run_id).collect();
    let with_outputs: Vec<uuid::Uuid> = claimed
        .iter()
        .filter(|c| {
            cat.registry
                .by_key(&c.workflow_key)
                .and_then(|wf| wf.step(&c.name))
                .is_none_or(|d| !d.is_root())
        })
        .map(|c| c.run_id)
        .collect();
    s.store.step_inputs(&runs, &with_outputs).await
}

fn request(
    s: &Scheduler,
    cat: &Catalog,
    cancel: &CancellationToken,
    c: ClaimedStep,
    inputs: &crate::store::StepInputs,
    claimed_at: Instant,
) -> Result<AgentRequest, Box<(StepLease, StepError)>> {
    let lease = StepLease {
        step_id: c.id,
        run_id: c.run_id,
        workflow_key: c.workflow_key.clone(),
        step: c.name.clone(),
        state: c.state,
        attempt: c.attempt,
        counters: c.counters,
        owner: s.config.owner.clone(),
        claimed_at,
    };
    let fail = |lease: StepLease, e: Error| {
        // Nothing was called: the step could not even start. Undecodable stored data sets
        // the run aside; anything else fails the step as refused.
        let error = match e {
            Error::CorruptRow { table, id, reason } => StepError::corrupt_row(table, id, reason),
            other => StepError::refused("engine", other.to_string()),
        };
        Box::new((lease, error))
    };
    let Some(wf) = cat.registry.by_key(&c.workflow_key) else {
        return Err(fail(lease, Error::WorkflowNotFound(c.workflow_key)));
    };
    // The run's first step, claimed for the first time: its wait is the run's start latency.
    let first_of_run = c.attempt == 1 && wf.position(&c.name) == Some(0);
    crate::metrics::claimed(&c.workflow_key, c.due_at, c.db_now, first_of_run);
    let Some(def) = wf.step(&c.name) else {
        return Err(fail(
            lease,
            Error::corrupt("sagaflow_steps", c.id, format!("unknown step `{}`", c.name)),
        ));
    };
    let compensation = c.state == StepState::Compensating;
    let action = if compensation {
        def.compensation().cloned()
    } else {
        Some(def.action().clone())
    };
    let Some(mut action) = action else {
        return Err(fail(
            lease,
            Error::corrupt(
                "sagaflow_steps",
                c.id,
                "compensating a step without compensation",
            ),
        ));
    };
    // A step resumed after a wait reads what woke it; one of the step's own code that waited
    // for a callback resumes with the callback's answer, without running its code again.
    let wait = match (&c.wait, compensation) {
        (Some(raw), false) => match serde_json::from_str::<crate::wait::WaitState>(raw) {
            Ok(w) => Some(w),
            Err(e) => {
                return Err(fail(
                    lease,
                    not_json("sagaflow_steps", c.id, "wait", raw, &e),
                ));
            }
        },
        _ => None,
    };
    if wait.is_some() && def.wait().is_none() {
        action = Arc::new(crate::wait::CallbackResume);
    }
    let hook = crate::definition::AttemptHook {
        services: s.services.clone(),
        step_id: c.id,
        attempt: c.attempt,
        issued: tokio::sync::Mutex::new(None),
        progressed: std::sync::Mutex::new(None),
    };
    let input = match inputs
        .inputs
        .get(&c.run_id)
        .map(|i| (i, serde_json::from_str::<serde_json::Value>(i)))
    {
        // The declared input type is checked again: a stored input edited (or written by
        // other code) since it was accepted is damage, not a business failure.
        Some((raw, Ok(v))) => match wf.check_input_type(&v) {
            Ok(()) => Arc::new(v),
            Err(e) => {
                let reason = match e {
                    Error::InvalidInput { reason, .. } => reason,
                    other => other.to_string(),
                };
                return Err(fail(
                    lease,
                    Error::corrupt(
                        "sagaflow_runs",
                        c.run_id,
                        format!(
                            "column `input` holds {}, which does not match the workflow's input type: {reason}",
                            crate::store::quote(raw)
                        ),
                    ),
                ));
            }
        },
        Some((raw, Err(e))) => {
            return Err(fail(
                lease,
                not_json("sagaflow_runs", c.run_id, "input", raw, &e),
            ));
        }
        None => {
            return Err(fail(
                lease,
                Error::corrupt(
                    "sagaflow_runs",
                    c.run_id,
                    "run row missing or its input unreadable",
                ),
            ));
        }
    };
    let mut deps = BTreeMap::new();
    for dep in wf.deps_of(wf.position(&c.name).unwrap_or_default()) {
        if let Some(raw) = inputs.outputs.get(&(c.run_id, dep.to_owned())) {
            match serde_json::from_str(raw) {
                Ok(v) => {
                    deps.insert(dep.to_owned(), v);
                }
                Err(e) => {
                    let row = format!("{}/{dep}", c.run_id);
                    return Err(fail(
                        lease,
                        not_json("sagaflow_steps", row, "output", raw, &e),
                    ));
                }
            }
        }
    }
    let output = match (&c.output, compensation) {
        (Some(raw), true) => match serde_json::from_str(raw) {
            Ok(v) => Some(Arc::new(v)),
            Err(e) => {
                return Err(fail(
                    lease,
                    not_json("sagaflow_steps", c.id, "output", raw, &e),
                ));
            }
        },
        _ => None,
    };
    // The deadline is the database's (AT-2); the local timer only measures what is left.
    let remaining = Duration::from_millis(u64::try_from(c.complete_by - c.db_now).unwrap_or(0));
    let key = if compensation {
        format!("{}:compensate", c.idempotency_key)
    } else {
        c.idempotency_key.clone()
    };
    let token = cancel.child_token();
    let context = StepContext::new(
        c.run_id,
        &c.name,
        u32::try_from(c.phase_attempt()).unwrap_or(0),
        &key,
        claimed_at + remaining,
        token,
        input,
        Arc::new(deps),
        output,
    )
    .with_forward_key(&c.idempotency_key)
    .traced(&inputs.trace_of(c.run_id), &c.workflow_key, compensation)
    .waiting(wait, Some(hook));
    s.in_flight.started(&lease, &context);
    // Fenced between the claim and here: the attempt is stopped before it acts.
    if s.is_fenced() {
        s.in_flight.cancel_all();
    }
    Ok(AgentRequest {
        lease,
        action,
        context,
    })
}

/// A stored column that is not JSON: damage of its run.
fn not_json(
    table: &'static str,
    row: impl ToString,
    column: &str,
    raw: &str,
    e: &serde_json::Error,
) -> Error {
    Error::corrupt(
        table,
        row,
        format!(
            "column `{column}` holds {}, which is not JSON: {e}",
            crate::store::quote(raw)
        ),
    )
}
