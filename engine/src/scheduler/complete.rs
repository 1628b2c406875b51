//! The completion loop: agent responses → fenced batch writes.

use std::sync::Arc;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{ErrorStreak, Scheduler, pause};
use crate::protocol::AgentResponse;
use crate::store::{StepFinish, StepFinishKind};
use crate::{StepError, StepState};

/// Attempts to write a batch before leaving it to the supervisor (its leases then expire and
/// the steps are re-queued; idempotency keys make the re-run safe).
const WRITE_ATTEMPTS: u32 = 5;
/// Slack added to a retry's due time before waking the claimer, so the row is due by then.
const RETRY_WAKE_MARGIN: Duration = Duration::from_millis(5);

pub(super) async fn run(
    s: Arc<Scheduler>,
    cancel: CancellationToken,
    rx: Arc<Mutex<mpsc::Receiver<AgentResponse>>>,
) {
    let mut streak = ErrorStreak::default();
    let mut batch = Vec::with_capacity(s.config.complete_batch);
    // Due times of the retries this loop wrote: the claim loop is woken when each becomes due
    // rather than at its next idle poll. Bounded by the number of steps in flight.
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
                s.hub.claim.notify_one();
                continue;
            }
            () = cancel.cancelled() => return,
        }
        let finishes: Vec<StepFinish> = batch.drain(..).map(|r| decide(&s, r)).collect();
        let mut written = false;
        for _ in 0..WRITE_ATTEMPTS {
            let registry = s.registry.clone();
            let planner = move |run: &crate::RunRow, steps: &[crate::StepRow]| {
                super::evaluate::plan_run(&registry, run, steps)
            };
            match s
                .store
                .step_finish_batch(&finishes, &s.config.owner, &planner)
                .await
            {
                Ok(outcome) => {
                    let applied = outcome.applied;
                    for a in &outcome.evaluated {
                        super::evaluate::after_eval(&s, a);
                    }
                    if !outcome.failed.is_empty() {
                        // Left marked: the evaluation loop retries them and raises alerts.
                        s.hub.eval.notify_one();
                    }
                    streak.succeeded("writing step results");
                    // The row's `available_at` was computed by the database during the write,
                    // so measure from after it, with a margin for clock granularity.
                    let base = Instant::now() + RETRY_WAKE_MARGIN;
                    for (f, ok) in finishes.iter().zip(&applied) {
                        if let (StepFinishKind::Retry { delay_ms, .. }, true) = (&f.kind, ok) {
                            retries.push(Reverse(
                                base + Duration::from_millis(u64::try_from(*delay_ms).unwrap_or(0)),
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

/// Turns an agent's answer into the write: success, retry after backoff, or failure.
fn decide(s: &Scheduler, r: AgentResponse) -> StepFinish {
    let lease = r.lease;
    let compensation = lease.state == StepState::Compensating;
    let result = r.result.and_then(|v| {
        let json = v.to_string();
        if json.len() > s.config.max_payload_bytes {
            Err(StepError::terminal(
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
    let kind = match result {
        Ok(json) => StepFinishKind::Succeeded {
            output: (!compensation).then_some(json),
        },
        Err(error) => {
            let failures = lease.failure_count.saturating_add(1);
            if error.retryable && failures < lease.max_failures {
                let policy = s
                    .registry
                    .by_key(&lease.workflow_key)
                    .and_then(|w| w.step(&lease.step))
                    .map(|d| d.settings().retry)
                    .unwrap_or_default();
                let delay = policy.backoff(u32::try_from(failures).unwrap_or(u32::MAX));
                StepFinishKind::Retry {
                    delay_ms: crate::definition::millis(delay),
                    error,
                }
            } else {
                StepFinishKind::Failed { error }
            }
        }
    };
    StepFinish {
        id: lease.step_id,
        run_id: lease.run_id,
        name: lease.step,
        state: lease.state,
        attempt: lease.attempt,
        owner: lease.owner,
        kind,
    }
}
