//! The running phase: submitting every order, following the runs through events (and the
//! database when events stall) until all are terminal, and reporting how the phase ended.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use sagaflow::{Engine, Error as EngineError, RunState, StartOptions};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use super::alerts::alert_line;
use super::logging::LogWriter;
use super::progress::Progress;
use super::text::{runs, secs};
use super::tracker::Tracker;
use super::{DemoError, DemoResult};

/// What the submitter reports about each order.
enum Submission {
    Accepted(Order, uuid::Uuid),
    /// The order's key is held by a run already on the database, in this state.
    Earlier(Order, uuid::Uuid, RunState),
    Rejected(Order, String),
    Done,
}

/// How the running phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PhaseEnd {
    /// Every accepted run reached a terminal state.
    AllTerminal,
    /// The timeout passed first.
    TimedOut,
    /// Ctrl-C came first.
    Interrupted,
}

/// Submits `orders` and follows their runs until all are terminal, the timeout passes or
/// the user interrupts.
pub(crate) async fn run_orders(
    engine: &Engine,
    orders: Vec<Order>,
    timeout: Duration,
    logs: &LogWriter,
    tracker: &mut Tracker,
) -> DemoResult<PhaseEnd> {
    let total = orders.len();
    let mut events = engine.subscribe();
    let mut alerts = engine.subscribe_alerts();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let submitter = spawn_submitter(engine.clone(), orders, tx);

    let mut progress = Progress::new(total, logs);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last_change = Instant::now();
    let mut last_done = 0;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);

    let end = loop {
        if tracker.submitted_all && tracker.unfinished().is_empty() {
            break PhaseEnd::AllTerminal;
        }
        tokio::select! {
            msg = rx.recv(), if !tracker.submitted_all => match msg {
                Some(Submission::Accepted(order, id)) => tracker.accept(order, id),
                Some(Submission::Earlier(order, id, state)) => {
                    if tracker.earlier.is_empty() {
                        progress.println(
                            "  ↻ some orders already have a run on this database (an earlier demo's): \
                             those runs are followed to their end, not started again",
                        );
                    }
                    tracker.adopt(order, id, state);
                }
                Some(Submission::Rejected(order, why)) => {
                    progress.println(&format!("  ✘ {} not started: {why}", order.order_id));
                    tracker.rejected.push((order, why));
                }
                Some(Submission::Done) | None => tracker.submitted_all = true,
            },
            ev = events.recv() => match ev {
                Ok(e) => tracker.see(e.run_id, e.state),
                Err(broadcast::error::RecvError::Lagged(_)) => tracker.reconcile(engine).await?,
                Err(broadcast::error::RecvError::Closed) => return Err(DemoError::EventsClosed),
            },
            a = alerts.recv() => if let Ok(a) = a {
                progress.println(&alert_line(tracker, &a));
            },
            _ = tick.tick() => {
                // Events are the fast path; after 2 s without progress, ask the database.
                if last_change.elapsed() > Duration::from_secs(2) {
                    tracker.reconcile(engine).await?;
                    last_change = Instant::now();
                }
            },
            () = tokio::time::sleep_until(deadline) => break PhaseEnd::TimedOut,
            _ = &mut ctrl_c => break PhaseEnd::Interrupted,
        }
        let done = tracker.tally().done();
        if done != last_done {
            last_done = done;
            last_change = Instant::now();
        }
        progress.update(tracker);
    };
    progress.update(tracker);
    progress.finish(logs);
    if end != PhaseEnd::AllTerminal {
        submitter.abort();
    }
    if let Ok(Err(e)) = submitter.await {
        return Err(DemoError::engine("submitting orders failed", e));
    }
    Ok(end)
}

/// Starts one run per order (keyed by the order id), reporting each on `tx`.
fn spawn_submitter(
    engine: Engine,
    orders: Vec<Order>,
    tx: mpsc::UnboundedSender<Submission>,
) -> JoinHandle<Result<(), EngineError>> {
    tokio::spawn(async move {
        for order in orders {
            let opts = StartOptions::keyed(order.order_id.clone());
            // The order's key returns the run that holds it, if any: an order is never run
            // twice, even by a demo run again on the same database.
            let msg = match engine.start_with(ORDER_WORKFLOW, &order, opts).await {
                Ok(s) if s.created => Submission::Accepted(order, s.id),
                Ok(s) => Submission::Earlier(order, s.id, s.state),
                Err(e) => {
                    let _ = tx.send(Submission::Rejected(order, e.to_string()));
                    return Err(e);
                }
            };
            if tx.send(msg).is_err() {
                break;
            }
        }
        let _ = tx.send(Submission::Done);
        Ok(())
    })
}

/// Prints how the running phase ended. Returns the exit code when the demo cannot go on
/// (timed out: 1, interrupted: 130), `None` when every run is terminal.
pub(crate) async fn report_end(
    end: PhaseEnd,
    engine: &Engine,
    tracker: &Tracker,
    elapsed: Duration,
    orders: usize,
) -> Option<ExitCode> {
    let (what, code) = match end {
        PhaseEnd::AllTerminal => {
            println!(
                "  All {} reached a terminal state in {}.   {}",
                runs(tracker.runs.len() + tracker.earlier.len()),
                secs(elapsed),
                tracker.tally().line()
            );
            return None;
        }
        PhaseEnd::TimedOut => ("Timed out", 1),
        PhaseEnd::Interrupted => ("Interrupted", 130),
    };
    let unfinished = tracker.unfinished();
    println!(
        "  ✘ {what} after {}: {} not finished.",
        secs(elapsed),
        runs(unfinished.len())
    );
    const SHOWN: usize = 30;
    for id in unfinished.iter().take(SHOWN) {
        let state = engine
            .run(*id)
            .await
            .ok()
            .flatten()
            .map_or_else(|| "unknown".to_owned(), |r| r.state.to_string());
        let steps = engine
            .steps(*id)
            .await
            .map(|s| {
                s.iter()
                    .map(|s| format!("{}={}", s.name, s.state))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        println!(
            "      - {} (run {id}) is {state}: {steps}",
            tracker.name(*id)
        );
    }
    if unfinished.len() > SHOWN {
        println!("      … and {} more", unfinished.len() - SHOWN);
    }
    if !tracker.submitted_all {
        println!(
            "      ({} orders were never submitted)",
            orders - tracker.runs.len() - tracker.earlier.len() - tracker.rejected.len()
        );
    }
    Some(ExitCode::from(code))
}
