//! Pausing runs, on both backends: a paused run claims no new step (queued steps are parked,
//! a step re-queued by the supervisor waits too), resuming takes it back where it was; a
//! workflow that pauses instead of compensating parks a failed run with an alert, and the
//! operator either fixes the cause and resumes or compensates.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use sagaflow::{
    AlertKind, Engine, Error, HistoryKind, OnFailure, RetryPolicy, RunState, StepContext,
    StepError, StepState, Uuid, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, eventually_some, expect_state, fast_builder};

async fn engine(db: &TestDb, wf: Workflow) -> Engine {
    fast_builder(db)
        .with_workflow(wf)
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

async fn step_state(engine: &Engine, id: Uuid, name: &str) -> sagaflow::Step {
    engine
        .steps(id)
        .await
        .expect("steps")
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no step {name}"))
}

/// `paced@1`: `flaky` fails its first attempt and is retried an hour later; `ship` follows.
fn paced(attempts: &Arc<AtomicU32>) -> Workflow {
    Workflow::builder("paced", 1)
        .step_using("flaky", attempts.clone(), |n, _: StepContext| async move {
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(StepError::retryable("busy", "the warehouse is busy"))
            } else {
                Ok("reserved")
            }
        })
        .retry(RetryPolicy {
            initial_backoff: Duration::from_secs(3600),
            max_backoff: Duration::from_secs(3600),
            jitter: false,
            ..RetryPolicy::default()
        })
        .step("ship", |_: StepContext| async {
            Ok::<_, StepError>("shipped")
        })
        .after(["flaky"])
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_starts_no_step_until_it_is_resumed() {
    for db in backends().await {
        let b = db.backend;
        let attempts = Arc::new(AtomicU32::new(0));
        let engine = engine(&db, paced(&attempts)).await;
        let id = engine.start("paced", &()).await.expect("start");
        // The first attempt failed: `flaky` is queued for an hour from now.
        eventually(
            Duration::from_secs(20),
            "the retry to be queued",
            || async {
                let s = step_state(&engine, id, "flaky").await;
                s.state == StepState::Ready && s.attempts.failures == 1
            },
        )
        .await;

        let op = engine
            .operator()
            .on_behalf_of("ops:night-shift", "warehouse migration tonight");
        assert_eq!(
            op.pause(id).await.expect("pause"),
            RunState::Paused,
            "[{b}]"
        );
        let run = engine.run(id).await.expect("read").expect("run");
        assert_eq!(run.state, RunState::Paused, "[{b}]");
        let error = run.error.expect("a paused envelope");
        assert_eq!(error["code"], "paused", "[{b}] {error}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("warehouse migration tonight")),
            "[{b}] {error}"
        );
        let flaky = step_state(&engine, id, "flaky").await;
        assert_eq!(
            (flaky.state, flaky.available_at),
            (StepState::Ready, None),
            "[{b}] the queued retry is parked"
        );
        assert!(
            matches!(op.pause(id).await, Err(Error::ActionNotAllowed { .. })),
            "[{b}] a paused run is not paused twice"
        );
        let history = engine.history(id).await.expect("history");
        let paused = history
            .iter()
            .find(|h| h.kind == HistoryKind::OperatorPause)
            .expect("the pause in history");
        assert_eq!(paused.actor, "ops:night-shift", "[{b}]");
        assert_eq!(
            paused.detail.as_ref().and_then(|d| d["reason"].as_str()),
            Some("warehouse migration tonight"),
            "[{b}]"
        );

        // Resuming makes the parked retry due at once (not in an hour), and the run goes on.
        let op = op.on_behalf_of("ops:morning", "migration done");
        assert_eq!(
            op.resume(id).await.expect("resume"),
            RunState::Running,
            "[{b}]"
        );
        let run = expect_state(&engine, id, RunState::Completed, b).await;
        assert!(
            run.error.is_none(),
            "[{b}] the pause envelope is gone: {:?}",
            run.error
        );
        assert_eq!(attempts.load(Ordering::SeqCst), 2, "[{b}]");
        let history = engine.history(id).await.expect("history");
        assert!(
            history
                .iter()
                .any(|h| h.kind == HistoryKind::OperatorResume && h.actor == "ops:morning"),
            "[{b}] the resume in history"
        );
        engine.shutdown().await;
    }
}

/// `slow@1`: `wait` overruns its deadline on its first attempt (the supervisor re-queues it)
/// and answers at once afterwards; `done` follows.
fn slow(attempts: &Arc<AtomicU32>) -> Workflow {
    Workflow::builder("slow", 1)
        .step_using("wait", attempts.clone(), |n, _: StepContext| async move {
            if n.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Ok::<_, StepError>(())
        })
        .deadline(Duration::from_millis(300))
        .step("done", |_: StepContext| async { Ok::<_, StepError>(()) })
        .after(["wait"])
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_the_supervisor_requeues_for_a_paused_run_waits_parked() {
    for db in backends().await {
        let b = db.backend;
        let attempts = Arc::new(AtomicU32::new(0));
        let engine = engine(&db, slow(&attempts)).await;
        let id = engine.start("slow", &()).await.expect("start");
        eventually(Duration::from_secs(20), "the first attempt", || async {
            attempts.load(Ordering::SeqCst) == 1
        })
        .await;
        let op = engine.operator().on_behalf_of("ops", "hold it");
        // Paused while its attempt is in flight (or, on a slow machine, already re-queued).
        assert_eq!(
            op.pause(id).await.expect("pause"),
            RunState::Paused,
            "[{b}]"
        );
        // The timeout and the parking are one transaction: once the timeout is recorded, the
        // re-queued step is parked, never due.
        eventually_some(Duration::from_secs(20), "the timeout", || async {
            let history = engine.history(id).await.ok()?;
            history
                .iter()
                .any(|h| h.step.as_deref() == Some("wait") && h.kind == HistoryKind::Timeout)
                .then_some(())
        })
        .await;
        let wait = step_state(&engine, id, "wait").await;
        assert_eq!(
            (wait.state, wait.available_at, wait.attempts.forward),
            (StepState::Ready, None, 1),
            "[{b}] re-queued, parked, not attempted again"
        );
        assert_eq!(
            step_state(&engine, id, "done").await.state,
            StepState::NotStarted,
            "[{b}]"
        );
        op.resume(id).await.expect("resume");
        expect_state(&engine, id, RunState::Completed, b).await;
        assert_eq!(attempts.load(Ordering::SeqCst), 2, "[{b}]");
        engine.shutdown().await;
    }
}

/// `careful@1` pauses instead of compensating: `reserve` (undone by `release`), then
/// `charge`, which is declined until `fixed` is set.
fn careful(fixed: &Arc<AtomicBool>, released: &Arc<AtomicBool>) -> Workflow {
    Workflow::builder("careful", 1)
        .on_failure(OnFailure::Pause)
        .step("reserve", |_: StepContext| async {
            Ok::<_, StepError>("r-1")
        })
        .compensate_using(released.clone(), |r, _: StepContext| async move {
            r.store(true, Ordering::SeqCst);
            Ok::<_, StepError>(())
        })
        .step_using("charge", fixed.clone(), |f, _: StepContext| async move {
            if f.load(Ordering::SeqCst) {
                Ok("charged")
            } else {
                Err(StepError::refused("card_declined", "the card was declined"))
            }
        })
        .after(["reserve"])
        .build()
        .expect("valid")
}

/// Starts a `careful` run and waits for it to be parked; checks the envelope and the alert.
async fn parked(engine: &Engine, b: &str) -> Uuid {
    let id = engine.start("careful", &()).await.expect("start");
    let run = expect_state(engine, id, RunState::Paused, b).await;
    let error = run.error.expect("a paused envelope");
    assert_eq!(error["code"], "paused", "[{b}] {error}");
    assert_eq!(
        error["details"]["cause"]["code"], "card_declined",
        "[{b}] the failure is kept: {error}"
    );
    let alerts = engine.run_alerts(id).await.expect("alerts");
    let alert = alerts
        .iter()
        .find(|a| a.kind == AlertKind::RunPaused && a.resolved_at.is_none())
        .unwrap_or_else(|| panic!("[{b}] an open run_paused alert: {alerts:?}"));
    assert_eq!(alert.step.as_deref(), Some("charge"), "[{b}]");
    assert_eq!(alert.actions, ["resume", "compensate", "cancel"], "[{b}]");
    assert!(
        alert.reason.contains("card_declined"),
        "[{b}] {}",
        alert.reason
    );
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_that_pauses_on_failure_parks_the_run_and_resume_retries_the_step() {
    for db in backends().await {
        let b = db.backend;
        let (fixed, released) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let engine = engine(&db, careful(&fixed, &released)).await;
        let id = parked(&engine, b).await;
        assert!(
            !released.load(Ordering::SeqCst),
            "[{b}] nothing compensated"
        );
        assert_eq!(
            step_state(&engine, id, "reserve").await.state,
            StepState::Completed,
            "[{b}]"
        );

        fixed.store(true, Ordering::SeqCst);
        let op = engine.operator().on_behalf_of("ops", "card replaced");
        op.resume(id).await.expect("resume");
        let run = expect_state(&engine, id, RunState::Completed, b).await;
        assert_eq!(run.output.expect("output")["charge"], "charged", "[{b}]");
        assert!(
            !released.load(Ordering::SeqCst),
            "[{b}] still nothing compensated"
        );
        let open = engine.run_alerts(id).await.expect("alerts");
        assert!(
            open.iter().all(|a| a.resolved_at.is_some()),
            "[{b}] the alert is resolved by the action: {open:?}"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_run_compensates_or_cancels_when_the_operator_says_so() {
    for db in backends().await {
        let b = db.backend;
        let (fixed, released) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let engine = engine(&db, careful(&fixed, &released)).await;

        let id = parked(&engine, b).await;
        let op = engine.operator().on_behalf_of("ops", "customer gave up");
        op.compensate(id).await.expect("compensate");
        let run = expect_state(&engine, id, RunState::Compensated, b).await;
        assert!(released.load(Ordering::SeqCst), "[{b}] reserve undone");
        assert_eq!(
            run.error.expect("error")["code"],
            "card_declined",
            "[{b}] the failure that parked it, not the pause"
        );

        released.store(false, Ordering::SeqCst);
        let id = parked(&engine, b).await;
        op.cancel(id).await.expect("cancel");
        expect_state(&engine, id, RunState::Compensated, b).await;
        assert!(released.load(Ordering::SeqCst), "[{b}] reserve undone");
        engine.shutdown().await;
    }
}
