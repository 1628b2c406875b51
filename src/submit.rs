//! Group commit of run submissions.
//!
//! Concurrent `start`/`start_with` calls are queued to one task that inserts whatever is
//! waiting (up to [`SUBMIT_BATCH`]) at once: one commit, one fsync, for many runs.
//! Under light load a batch is a single run, so latency does not suffer; under heavy load the
//! acceptance rate is no longer bound by one commit per run (AT: accepting must stay cheap).
//! A batch the database refuses because of one of its runs is tried again run by run, so
//! that run fails alone and the others are accepted.

use std::sync::Arc;

use sagaflow_engine::signals::{RunEvent, Signals};
use sagaflow_engine::store::{NewRun, RunInsertOutcome};
use sagaflow_engine::{Result, Store};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Runs inserted per transaction at most.
pub(crate) const SUBMIT_BATCH: usize = 512;

pub(crate) struct Submission {
    pub(crate) run: NewRun,
    pub(crate) reply: oneshot::Sender<Result<RunInsertOutcome>>,
}

/// Spawns the submitter; returns the queue to send submissions to.
pub(crate) fn spawn(
    store: Store,
    signals: Arc<Signals>,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> mpsc::Sender<Submission> {
    let (tx, mut rx) = mpsc::channel::<Submission>(SUBMIT_BATCH * 4);
    tracker.spawn(async move {
        let mut batch = Vec::with_capacity(SUBMIT_BATCH);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, SUBMIT_BATCH) => if n == 0 { return },
                () = cancel.cancelled() => return,
            }
            let runs: Vec<NewRun> = batch.iter().map(|s| s.run.clone()).collect();
            match insert(&store, &runs).await {
                Ok(outcomes) => {
                    for (s, o) in batch.drain(..).zip(outcomes) {
                        accepted(&signals, &s.run, &o);
                        let _ = s.reply.send(Ok(o));
                    }
                    signals.wake_claimer();
                }
                Err(e) if batch.len() == 1 || !e.is_data_refused() => {
                    // Nothing of the batch was written. A failure of the whole write (a lost
                    // connection, a timeout) would fail each run alone too: each caller gets
                    // the error.
                    for s in batch.drain(..) {
                        let _ = s.reply.send(Err(e.clone()));
                    }
                }
                Err(_) => {
                    // The database refused the data of some run in the batch (a trigger, a
                    // constraint), and rolled back all of it: try each run alone, so that a
                    // bad run fails alone and the others are accepted.
                    let mut any_accepted = false;
                    for s in batch.drain(..) {
                        let outcome =
                            insert(&store, std::slice::from_ref(&s.run))
                                .await
                                .and_then(|o| {
                                    o.into_iter()
                                        .next()
                                        .ok_or(sea_orm::DbErr::RecordNotInserted.into())
                                });
                        if let Ok(o) = &outcome {
                            accepted(&signals, &s.run, o);
                        }
                        any_accepted |= outcome.is_ok();
                        let _ = s.reply.send(outcome);
                    }
                    if any_accepted {
                        signals.wake_claimer();
                    }
                }
            }
        }
    });
    tx
}

/// Publishes the first event of a run the batch created (the state it was stored in), right
/// after its commit and before its caller or this instance's claim loop hears of it, so
/// that a subscriber sees it before anything the run does next.
fn accepted(signals: &Signals, run: &NewRun, outcome: &RunInsertOutcome) {
    if matches!(outcome, RunInsertOutcome::Inserted(_)) {
        sagaflow_engine::metrics::run_started(&run.workflow);
        signals.publish(RunEvent {
            run_id: run.id,
            workflow: run.workflow.clone(),
            state: run.initial_state(),
        });
    }
}

async fn insert(store: &Store, runs: &[NewRun]) -> Result<Vec<RunInsertOutcome>> {
    store.run_insert_batch(runs).await
}
