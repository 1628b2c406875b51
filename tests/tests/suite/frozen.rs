//! A frozen instance cannot hold the others hostage: the engine's PostgreSQL sessions run with
//! `idle_in_transaction_session_timeout` and `lock_timeout`, so the locks of a process frozen
//! mid-transaction are released by the server and the healthy instance's rescue and claims go
//! on. PostgreSQL only: on SQLite one process writes at a time by design (see
//! docs/storage.md), and a process frozen while writing holds the file's lock until it dies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sagaflow::internals::scheduler::Freeze;
use sagaflow::{DeadlinePolicy, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{eventually, fast_builder, postgres_db};

/// The lease of `fast_builder`.
const LEASE: Duration = Duration::from_secs(2);
/// Beyond the lease: the default `idle_in_transaction_session_timeout` (5 s), after which the
/// server ends the frozen session and releases its locks.
const SESSION_LIMIT: Duration = Duration::from_secs(5);

fn quick() -> Workflow {
    Workflow::builder("quick", 1)
        .default_deadline(DeadlinePolicy::new(
            Duration::from_millis(300),
            Duration::from_millis(1_200),
        ))
        .step("a", |_: StepContext| async { Ok::<_, StepError>(()) })
        .step("b", |_: StepContext| async { Ok::<_, StepError>(()) })
        .after(["a"])
        .build()
        .expect("workflow")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_frozen_in_a_transaction_holds_nobody_hostage() {
    const RUNS: usize = 8;
    sagaflow_testkit::init_logging();
    let Some(db) = postgres_db().await else {
        return;
    };
    // The frozen instance: no supervisor, freezes in its first result batch, holding the
    // locks of the runs and steps it wrote.
    let freeze = Arc::new(Freeze::default());
    let frozen = fast_builder(&db)
        .with_instance_id("frozen")
        .with_supervisor(false)
        .with_workflow(quick())
        .with_freeze_in_transaction(freeze.clone())
        .start()
        .await
        .expect("frozen instance");
    let mut ids = Vec::new();
    for n in 0..RUNS {
        ids.push(frozen.start("quick", &n).await.expect("start"));
    }
    tokio::time::timeout(Duration::from_secs(10), freeze.reached.notified())
        .await
        .expect("the instance froze mid-transaction");
    let froze_at = Instant::now();

    // The healthy instance leads, rescues the frozen instance's steps once the server has
    // ended its session, and runs everything to completion.
    let healthy = fast_builder(&db)
        .with_instance_id("healthy")
        .with_workflow(quick())
        .start()
        .await
        .expect("healthy instance");
    let fresh = healthy.start("quick", &100).await.expect("start");
    let bound = LEASE + SESSION_LIMIT;
    eventually(
        bound,
        "every run completed by the healthy instance",
        || async {
            let mut done = 0;
            for id in ids.iter().chain([&fresh]) {
                if let Ok(Some(r)) = healthy.run(*id).await {
                    done += usize::from(r.state == RunState::Completed);
                }
            }
            done == RUNS + 1
        },
    )
    .await;
    eprintln!(
        "[postgres] all runs completed {:?} after the freeze (bound {bound:?})",
        froze_at.elapsed()
    );
    healthy.shutdown().await;
    tokio::time::timeout(Duration::from_secs(10), frozen.shutdown())
        .await
        .expect("the frozen instance shuts down");
}
