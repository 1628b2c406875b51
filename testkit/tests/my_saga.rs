//! The example of docs/testing.md: a user's saga tested on both backends.
use sagaflow::{RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{backends, engine, expect_state};
use std::sync::atomic::{AtomicU32, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_remote_is_retried_until_the_booking_completes() {
    for db in backends().await {
        let calls = std::sync::Arc::new(AtomicU32::new(0));
        let remote = calls.clone();
        let wf = Workflow::builder("book", 1)
            .step("reserve", move |_: StepContext| {
                let first = remote.fetch_add(1, Ordering::SeqCst) == 0;
                let busy = StepError::retryable("busy", "try again"); // the remote fails once
                async move { if first { Err(busy) } else { Ok("seat-12") } }
            })
            .build()
            .expect("valid workflow");
        let engine = engine(&db, vec![wf]).await; // short intervals, its own database
        let id = engine.start("book", &()).await.expect("start");
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "[{}] one retry",
            db.backend
        );
        engine.shutdown().await;
    }
}
