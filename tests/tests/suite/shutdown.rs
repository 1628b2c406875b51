//! A graceful shutdown during an attempt is an interruption, not a failure: a rolling deploy
//! must not spend a step's failure threshold, nor stretch its deadline.

use sagaflow::HistoryKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sagaflow::{
    DeadlinePolicy, RetryPolicy, RunState, StepContext, StepError, StepState, Workflow,
};
use sagaflow_testkit::{backends, eventually, expect_state};

/// One step that hangs on its first attempt and succeeds afterwards; a single failure would
/// fail it for good.
fn hang_once(calls: Arc<AtomicU32>) -> Workflow {
    Workflow::builder("deploy", 1)
        .default_retry(RetryPolicy::default().with_max_failures(1))
        .default_deadline(DeadlinePolicy::new(
            Duration::from_secs(60),
            Duration::from_secs(120),
        ))
        .step("slow", move |_ctx: StepContext| {
            let calls = calls.clone();
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, StepError>("done")
            }
        })
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_mid_step_is_an_interruption_not_a_failure() {
    for db in backends().await {
        let calls = Arc::new(AtomicU32::new(0));
        let first = sagaflow_testkit::engine(&db, vec![hang_once(calls.clone())]).await;
        let id = first.start("deploy", &()).await.expect("start");
        eventually(
            Duration::from_secs(10),
            "the first attempt to run",
            || async { calls.load(Ordering::SeqCst) == 1 },
        )
        .await;
        first.shutdown().await;

        // Released at once, as an interruption: queued again, no failure counted, deadline
        // unchanged, and the step marked maybe applied (the attempt may have acted).
        let steps = first.steps(id).await.expect("steps");
        let slow = &steps[0];
        assert_eq!(slow.state, StepState::Ready, "[{}]", db.backend);
        assert_eq!(
            (
                slow.attempts.failures,
                slow.attempts.interruptions,
                slow.deadline
            ),
            (0, 1, Duration::from_secs(60)),
            "[{}] an interruption is not a failure",
            db.backend
        );
        assert!(slow.maybe_applied, "[{}]", db.backend);
        let history = first.history(id).await.expect("history");
        assert!(
            history
                .iter()
                .any(|h| h.kind == HistoryKind::Interrupted && h.step.as_deref() == Some("slow")),
            "[{}] the history names the interruption",
            db.backend
        );

        // The next instance (as after a rolling deploy) finishes the run, although the
        // failure threshold is 1.
        let second = sagaflow_testkit::engine(&db, vec![hang_once(calls.clone())]).await;
        expect_state(&second, id, RunState::Completed, db.backend).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        second.shutdown().await;
    }
}
