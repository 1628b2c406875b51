//! The agent pool: executes dispatched attempts under their deadlines.

use std::any::Any;

use sagaflow_engine::StepError;
use sagaflow_engine::protocol::{AgentRequest, AgentResponse, Dispatch};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Runs step attempts received on the scheduler's request channel.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentPool;

impl AgentPool {
    /// Spawns the pool's receive loop on `tracker`. Each attempt runs in its own task; how
    /// many run at once is bounded by the scheduler's in-flight slots, which travel with each
    /// dispatch. Stops when `cancel` fires or the channel closes; attempts still running are
    /// cancelled and report nothing.
    pub fn spawn(
        tracker: &TaskTracker,
        cancel: CancellationToken,
        mut requests: mpsc::Receiver<Dispatch>,
    ) {
        let t = tracker.clone();
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    d = requests.recv() => match d {
                        Some(d) => { t.spawn(execute(d, cancel.clone())); }
                        None => return,
                    },
                    () = cancel.cancelled() => return,
                }
            }
        });
    }
}

/// Runs one attempt; answers unless the deadline passed or the engine is shutting down.
async fn execute(d: Dispatch, shutdown: CancellationToken) {
    let Dispatch {
        request,
        reply,
        permit,
    } = d;
    let AgentRequest {
        lease,
        action,
        context,
    } = request;
    // The deadline can move while the attempt runs (an operator's `extend`): a handle on it.
    let timer = context.clone();
    let token = context.cancellation().clone();
    // Its own task, so that a panic in the step is contained and reported as a failure.
    // The step's code runs in the attempt's span: its own events carry the run, step,
    // attempt, idempotency key and trace id.
    let span = context.span().clone();
    let mut handle = tokio::spawn(async move { action.run(context).await }.instrument(span));
    let joined = tokio::select! {
        r = &mut handle => Some(r),
        () = timer.deadline_reached() => None,
        () = shutdown.cancelled() => None,
        // The run was cancelled (the token is also a child of `shutdown`, which the check
        // below tells apart): the attempt stops and says so at once, its outcome unknown.
        () = token.cancelled(), if !shutdown.is_cancelled() => {
            handle.abort();
            if shutdown.is_cancelled() {
                return;
            }
            tracing::debug!(run_id = %lease.run_id, step = %lease.step, attempt = lease.attempt, "attempt stopped: its run was cancelled");
            let result = Err(StepError::terminal_unknown(
                "cancelled",
                "the attempt was stopped because its run was cancelled; its effect may have happened",
            ));
            let _ = reply.send(AgentResponse { lease, result }).await;
            drop(permit);
            return;
        }
    };
    let Some(joined) = joined else {
        // SAS-3: past the deadline the attempt stops and reports nothing.
        token.cancel();
        handle.abort();
        tracing::debug!(run_id = %lease.run_id, step = %lease.step, attempt = lease.attempt, "attempt abandoned at its deadline");
        return;
    };
    if tokio::time::Instant::now() >= timer.deadline() {
        return;
    }
    let result = match joined {
        Ok(r) => r,
        Err(e) if e.is_panic() => {
            let msg = panic_message(e.into_panic());
            tracing::warn!(run_id = %lease.run_id, step = %lease.step, panic = %msg, "step panicked");
            Err(StepError::retryable(
                "panic",
                format!("the step panicked: {msg}"),
            ))
        }
        Err(_) => return,
    };
    let _ = reply.send(AgentResponse { lease, result }).await;
    drop(permit);
}

fn panic_message(p: Box<dyn Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
