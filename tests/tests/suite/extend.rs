//! Extending the deadlines of a run's attempts in flight, on both backends: the stored
//! deadline moves later, the attempt's own deadline (what `StepContext::deadline` answers and
//! what the agent enforces) follows on the instance running it, whether the operator acted
//! there or on another instance, and the attempt finishes without a timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sagaflow::{
    Engine, Error, HistoryKind, RunState, StepContext, StepError, StepState, Uuid, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};

/// What the test and the step share: the time left the step last saw, and the gate that
/// lets it finish.
#[derive(Clone, Default)]
struct Probe {
    left_ms: Arc<AtomicU64>,
    open: Arc<AtomicBool>,
}

/// `long@1`: `count` runs under a 20-second deadline until the test opens its gate, reading
/// the time it has left every 50 ms.
fn long(probe: &Probe) -> Workflow {
    Workflow::builder("long", 1)
        .step_using("count", probe.clone(), |p, ctx: StepContext| async move {
            loop {
                let left = u64::try_from(ctx.remaining().as_millis()).unwrap_or(u64::MAX);
                p.left_ms.store(left, Ordering::SeqCst);
                if p.open.load(Ordering::SeqCst) {
                    return Ok::<_, StepError>("counted");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .deadline(Duration::from_secs(20))
        .build()
        .expect("valid")
}

async fn worker(db: &TestDb, probe: &Probe, workers: bool) -> Engine {
    fast_builder(db)
        .with_workflow(long(probe))
        .with_workers(workers)
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

async fn complete_by(engine: &Engine, id: Uuid) -> sagaflow::Step {
    let steps = engine.steps(id).await.expect("steps");
    steps.into_iter().next().expect("one step")
}

/// Extends through `operator` and checks both deadlines moved, then lets the step finish.
async fn extend_and_finish(worker: &Engine, operator: &Engine, probe: &Probe, b: &str) {
    let id = worker.start("long", &()).await.expect("start");
    eventually(Duration::from_secs(20), "the step to run", || async {
        probe.left_ms.load(Ordering::SeqCst) > 0
    })
    .await;
    let before = complete_by(worker, id).await;
    assert_eq!(before.state, StepState::Running, "[{b}]");
    let op = operator
        .operator()
        .on_behalf_of("ops:night-shift", "the bank is slow tonight");
    assert!(
        matches!(
            op.extend(id, Duration::ZERO).await,
            Err(Error::ActionNotAllowed { .. })
        ),
        "[{b}] a zero extension is refused"
    );
    op.extend(id, Duration::from_secs(600))
        .await
        .expect("extend");

    let after = complete_by(worker, id).await;
    let moved = after.complete_by.expect("a deadline") - before.complete_by.expect("a deadline");
    assert_eq!(
        moved.num_milliseconds(),
        600_000,
        "[{b}] the stored deadline moved by ten minutes"
    );
    // Twenty seconds at most before; over ten minutes once the attempt follows.
    eventually(
        Duration::from_secs(10),
        "the attempt's deadline to move",
        || async { probe.left_ms.load(Ordering::SeqCst) > 600_000 },
    )
    .await;

    probe.open.store(true, Ordering::SeqCst);
    let run = expect_state(worker, id, RunState::Completed, b).await;
    assert_eq!(run.output.expect("output")["count"], "counted", "[{b}]");
    let history = worker.history(id).await.expect("history");
    let extended = history
        .iter()
        .find(|h| h.kind == HistoryKind::OperatorExtend)
        .expect("the extension in history");
    assert_eq!(extended.actor, "ops:night-shift", "[{b}]");
    let detail = extended.detail.as_ref().expect("detail");
    assert_eq!(detail["by_ms"], 600_000, "[{b}] {detail}");
    assert_eq!(detail["steps"][0], "count", "[{b}] {detail}");
    assert_eq!(
        detail["reason"], "the bank is slow tonight",
        "[{b}] {detail}"
    );
    assert!(
        !history.iter().any(|h| h.kind == HistoryKind::Timeout),
        "[{b}] no timeout"
    );

    // Nothing is in flight any more.
    assert!(
        matches!(
            op.extend(id, Duration::from_secs(60)).await,
            Err(Error::ActionNotAllowed { .. })
        ),
        "[{b}] a finished run has nothing to extend"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_attempt_gets_the_time_on_the_instance_that_extended_it() {
    for db in backends().await {
        let probe = Probe::default();
        let engine = worker(&db, &probe, true).await;
        extend_and_finish(&engine, &engine, &probe, db.backend).await;
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_extended_from_another_instance_follows_the_stored_deadline() {
    for db in backends().await {
        let probe = Probe::default();
        let engine = worker(&db, &probe, true).await;
        let console = worker(&db, &Probe::default(), false).await;
        extend_and_finish(&engine, &console, &probe, db.backend).await;
        console.shutdown().await;
        engine.shutdown().await;
    }
}
