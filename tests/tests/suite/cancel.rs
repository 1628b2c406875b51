//! Cancelling a run, on both backends: its attempt in flight is stopped (the step's
//! cancellation token fires) long before its deadline, what completed is compensated in
//! reverse order, and the run ends compensated with the reason in its history. An operator on
//! another instance cancels as well as one on the instance running the attempt.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::{Engine, Error, HistoryKind, RunState, StepContext, StepError, Uuid, Workflow};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};

/// What the steps did, in order.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, e: impl Into<String>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e.into());
    }

    fn entries(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn has(&self, e: &str) -> bool {
        self.entries().iter().any(|x| x == e)
    }
}

/// `held@1`: `reserve` (undone by `release`) → `charge`, which waits for a minute (its
/// deadline is two) unless its cancellation token fires, and is undone by `refund`.
fn held(log: &Log) -> Workflow {
    Workflow::builder("held", 1)
        .step_using("reserve", log.clone(), |log, _: StepContext| async move {
            log.push("reserve");
            Ok::<_, StepError>(())
        })
        .compensate_using(log.clone(), |log, _: StepContext| async move {
            log.push("release");
            Ok::<_, StepError>(())
        })
        .step_using("charge", log.clone(), |log, ctx: StepContext| async move {
            // The token is watched from a task of its own: the attempt's future is dropped
            // when the token fires.
            let token = ctx.cancellation().clone();
            let seen = log.clone();
            tokio::spawn(async move {
                token.cancelled().await;
                seen.push("charge saw its token fire");
            });
            log.push("charge started");
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, StepError>(())
        })
        .after(["reserve"])
        .deadline(Duration::from_secs(120))
        .compensate_using(log.clone(), |log, _: StepContext| async move {
            log.push("refund");
            Ok::<_, StepError>(())
        })
        .build()
        .expect("valid")
}

async fn worker(db: &TestDb, log: &Log) -> Engine {
    fast_builder(db)
        .with_workflow(held(log))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

/// Starts a run and waits until `charge` is running.
async fn start_and_hold(engine: &Engine, log: &Log) -> Uuid {
    let id = engine.start("held", &()).await.expect("start");
    eventually(Duration::from_secs(20), "charge to start", || async {
        log.has("charge started")
    })
    .await;
    id
}

/// The run ended compensated because of the cancel: `charge` was stopped, both steps undone
/// (the charge's outcome is unknown, so it is refunded), the reason in history and error.
async fn expect_cancelled(engine: &Engine, id: Uuid, log: &Log, reason: &str, b: &str) {
    let run = expect_state(engine, id, RunState::Compensated, b).await;
    assert!(
        log.has("charge saw its token fire"),
        "[{b}] {:?}",
        log.entries()
    );
    let entries = log.entries();
    let (refund, release) = (
        entries.iter().position(|e| e == "refund"),
        entries.iter().position(|e| e == "release"),
    );
    assert!(
        matches!((refund, release), (Some(r), Some(l)) if r < l),
        "[{b}] undone in reverse order: {entries:?}"
    );
    let error = run.error.expect("an error envelope");
    assert_eq!(error["code"], "cancelled", "[{b}] {error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains(reason)),
        "[{b}] {error}"
    );
    let history = engine.history(id).await.expect("history");
    let cancel = history
        .iter()
        .find(|h| h.kind == HistoryKind::OperatorCancel)
        .expect("the cancel in history");
    assert_eq!(cancel.actor, "ops:night-shift", "[{b}]");
    assert_eq!(
        cancel.detail.as_ref().and_then(|d| d["reason"].as_str()),
        Some(reason),
        "[{b}]"
    );
    assert!(
        history
            .iter()
            .any(|h| h.step.as_deref() == Some("charge") && h.kind == HistoryKind::Failed),
        "[{b}] the stopped attempt is recorded as failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_stops_its_attempt_and_compensates_in_reverse_order() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let engine = worker(&db, &log).await;
        let id = start_and_hold(&engine, &log).await;
        let reason = "customer called to cancel the order";
        let at = Instant::now();
        let state = engine
            .operator()
            .on_behalf_of("ops:night-shift", reason)
            .cancel(id)
            .await
            .expect("cancel");
        assert_eq!(state, RunState::Compensating, "[{b}]");
        expect_cancelled(&engine, id, &log, reason, b).await;
        // Far sooner than the minute the attempt would have taken, or its deadline.
        assert!(
            at.elapsed() < Duration::from_secs(20),
            "[{b}] {:?}",
            at.elapsed()
        );

        // A finished run cannot be cancelled.
        let err = engine
            .operator()
            .cancel(id)
            .await
            .expect_err("cancel a compensated run");
        assert!(matches!(err, Error::ActionNotAllowed { .. }), "[{b}] {err}");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_from_another_instance_stops_its_attempt_there() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let engine = worker(&db, &log).await;
        // An instance that runs nothing: an operator's console elsewhere.
        let console = fast_builder(&db)
            .with_workflow(held(&Log::default()))
            .with_workers(false)
            .start()
            .await
            .expect("console start");
        let id = start_and_hold(&engine, &log).await;
        let reason = "duplicate order";
        console
            .operator()
            .on_behalf_of("ops:night-shift", reason)
            .cancel(id)
            .await
            .expect("cancel");
        expect_cancelled(&engine, id, &log, reason, b).await;
        console.shutdown().await;
        engine.shutdown().await;
    }
}
