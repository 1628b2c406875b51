//! Cancelling a run, on both backends: its attempt in flight is stopped (the step's
//! cancellation token fires) long before its deadline, what completed is compensated in
//! reverse order, and the run ends compensated with the reason in its history. An operator on
//! another instance cancels as well as one on the instance running the attempt. A run stopped
//! in error at a pivot that may have acted is not undone past it by a cancel.

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

/// `paid@1`: `reserve` (undone by `unreserve`), then `charge`, the pivot, then `ship`,
/// retriable; each step logs its name.
fn paid(log: &Log) -> Workflow {
    let step = |name: &'static str| {
        let log = log.clone();
        move |_: StepContext| {
            log.push(name);
            async { Ok::<_, StepError>(()) }
        }
    };
    Workflow::builder("paid", 1)
        .step("reserve", step("reserve"))
        .compensate(step("unreserve"))
        .step("charge", step("charge"))
        .after(["reserve"])
        .pivot()
        .step("ship", step("ship"))
        .after(["charge"])
        .retriable()
        .build()
        .expect("valid")
}

/// A cancel that meets the pivot in flight (its effect happened, its answer is not written
/// yet) comes too late: the run never ends `compensated` with the pivot's effect standing; it
/// waits for the pivot, then goes forward and completes, and its history says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_that_meets_the_pivot_in_flight_lets_the_run_finish() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let t = sagaflow_testkit::SagaTest::new([paid(&log)]).on(&db).await;
        let answer = t.hold_answer("charge");
        let id = t.start("paid", &()).await;
        tokio::time::timeout(Duration::from_secs(20), answer.reached())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the pivot's answer never came"));
        t.engine()
            .operator()
            .cancel(id)
            .await
            .unwrap_or_else(|e| panic!("[{b}] cancel: {e}"));
        answer.release();
        let run = t.expect(id, RunState::Completed).await;
        assert!(run.error.is_none(), "[{b}] {:?}", run.error);
        assert_eq!(log.entries(), ["reserve", "charge", "ship"], "[{b}]");
        let history = t.history(id).await;
        assert!(
            history
                .iter()
                .any(|e| e.kind == HistoryKind::OperatorCancel),
            "[{b}] {history:?}"
        );
        assert!(
            history.iter().any(|e| e
                .detail
                .as_ref()
                .is_some_and(|d| d.to_string().contains("point of no return"))),
            "[{b}] the history says why the cancel did not stand: {history:?}"
        );
        let report = sagaflow_testkit::check_engine_history(t.engine()).await;
        assert!(report.is_clean(), "[{b}] {report}");
        t.shutdown().await;
    }
}

/// A run stopped in `error` because its pivot may have shipped, then cancelled: the cancel
/// undoes nothing past the pivot (no refund, no release), the run stops in `error` again
/// with its cancel's envelope holding the failure as its cause, and its history passes the
/// checker. (The chaos run found such a run compensated past its shipped pivot.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_run_stopped_at_an_uncertain_pivot_undoes_nothing() {
    use sagaflow_testkit::check_engine_history;
    use sagaflow_testkit::services::{Operation, Scripted};

    use crate::fixtures::{order_rig, submit_order};

    for db in backends().await {
        let b = db.backend;
        let rig = order_rig(&db, 300, 2).await;
        // The shipment may have left: its first attempt hangs past the deadline.
        rig.services
            .script("ship", vec![Scripted::Hang, Scripted::Permanent]);
        let (id, _) = submit_order(&rig.engine, 0).await;
        expect_state(&rig.engine, id, RunState::Error, b).await;
        let shipped = rig.services.ledger().applied_count(Operation::Ship);

        let now = rig.engine.operator().cancel(id).await.expect("cancel");
        assert_eq!(now, RunState::Compensating, "[{b}]");
        eventually(
            Duration::from_secs(30),
            "stopped in error again",
            || async {
                rig.engine.run(id).await.ok().flatten().is_some_and(|r| {
                    r.state == RunState::Error
                        && r.error.as_ref().is_some_and(|e| e["code"] == "cancelled")
                })
            },
        )
        .await;
        let run = rig.engine.run(id).await.expect("read").expect("run");
        let envelope = run.error.expect("error");
        assert!(
            envelope["details"]["cause"].is_object(),
            "[{b}] the failure is kept as the cause: {envelope}"
        );
        let ledger = rig.services.ledger();
        assert_eq!(ledger.applied_count(Operation::Refund), 0, "[{b}]");
        assert_eq!(ledger.applied_count(Operation::Release), 0, "[{b}]");
        assert_eq!(ledger.applied_count(Operation::Ship), shipped, "[{b}]");
        let open = rig.engine.run_alerts(id).await.expect("alerts");
        assert!(
            open.iter().any(|a| a.resolved_at.is_none()),
            "[{b}] {open:?}"
        );
        let report = check_engine_history(&rig.engine).await;
        assert_eq!(report.runs_checked, 1, "[{b}]");
        rig.engine.shutdown().await;
    }
}
