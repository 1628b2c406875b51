//! Operator actions on runs in Error (SAS-7: fix the cause, retry by hand).

use sagaflow::HistoryKind;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sagaflow::{Error, RetryPolicy, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{backends, engine, expect_state};

use crate::fixtures::{Behave, Log, chain};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retry_after_fixing_the_cause_finishes_the_run() {
    for db in backends().await {
        // Forward: a retriable step after the pivot fails terminally → Error (nothing can be
        // undone); the operator fixes the cause and retries the step → Completed.
        let fixed = Arc::new(AtomicBool::new(false));
        let f = fixed.clone();
        let wf = Workflow::builder("notify", 1)
            .step("charge", |_ctx: StepContext| async {
                Ok::<_, StepError>("ch-1")
            })
            .pivot()
            .step("email", move |_ctx: StepContext| {
                let ok = f.load(Ordering::SeqCst);
                async move {
                    if ok {
                        Ok("sent")
                    } else {
                        Err(StepError::terminal_unknown(
                            "bad_address",
                            "mailbox does not exist",
                        ))
                    }
                }
            })
            .after(["charge"])
            .retriable()
            .retry(RetryPolicy::default().with_max_failures(2))
            .build()
            .expect("valid");
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("notify", &()).await.expect("start");
        expect_state(&engine, id, RunState::Error, db.backend).await;
        let open = engine.open_alerts().await.expect("alerts");
        assert!(
            open.iter()
                .any(|a| a.run_id == Some(id) && a.reason.contains("point of no return")),
            "{open:?}"
        );

        // Retrying a step that did not fail is refused with a clear error.
        let err = engine
            .operator()
            .retry(id, "charge")
            .await
            .expect_err("not failed");
        assert!(matches!(err, Error::ActionNotAllowed { .. }), "{err}");

        fixed.store(true, Ordering::SeqCst);
        assert_eq!(
            engine.operator().retry(id, "email").await.expect("retry"),
            RunState::Running
        );
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        let h = engine.history(id).await.expect("history");
        assert!(
            h.iter()
                .any(|h| h.kind == HistoryKind::OperatorRetry && h.actor == "operator"),
            "{h:?}"
        );
        assert!(
            engine
                .open_alerts()
                .await
                .expect("alerts")
                .iter()
                .all(|a| a.run_id != Some(id)),
            "alert resolved"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_retries_a_failed_compensation_until_the_run_is_compensated() {
    for db in backends().await {
        let log = Log::default();
        let healed = Arc::new(AtomicBool::new(false));
        let h2 = healed.clone();
        let wf = chain(
            &log,
            "heal",
            2000,
            2,
            |_| Behave::Ok(2.into()),
            |_| Behave::Terminal,
            move |_| {
                if h2.load(Ordering::SeqCst) {
                    Behave::Ok(serde_json::Value::Null)
                } else {
                    Behave::Retryable
                }
            },
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("heal", &()).await.expect("start");
        expect_state(&engine, id, RunState::Error, db.backend).await;
        // c failed forward, but the run was compensating: running c forward again is refused.
        let err = engine
            .operator()
            .retry(id, "c")
            .await
            .expect_err("forward retry while compensating");
        assert!(
            matches!(err, Error::ActionNotAllowed { .. })
                && err.to_string().contains("compensating"),
            "{err}"
        );
        healed.store(true, Ordering::SeqCst);
        assert_eq!(
            engine.operator().resume(id).await.expect("resume"),
            RunState::Compensating
        );
        expect_state(&engine, id, RunState::Compensated, db.backend).await;
        assert_eq!(
            log.count("undo_a:"),
            1,
            "a undone once b's compensation succeeded"
        );
        assert!(
            log.entries().iter().any(|e| e.starts_with("undo_b:3:")),
            "[{}] the compensation's attempts go on counting after the operator's retry: {:?}",
            db.backend,
            log.entries()
        );
        // A finished run accepts no more actions.
        let err = engine
            .operator()
            .compensate(id)
            .await
            .expect_err("finished");
        assert!(matches!(err, Error::ActionNotAllowed { .. }));
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_can_ask_a_running_run_to_compensate() {
    for db in backends().await {
        let log = Log::default();
        let wf = chain(
            &log,
            "cancel",
            60_000,
            3,
            |_| Behave::Ok(2.into()),
            |_| Behave::Hang,
            |_| Behave::Ok(serde_json::Value::Null),
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("cancel", &()).await.expect("start");
        sagaflow_testkit::eventually(Duration::from_secs(20), "c to start", || {
            let log = log.clone();
            async move { log.count("c:") == 1 }
        })
        .await;
        assert_eq!(
            engine.operator().compensate(id).await.expect("compensate"),
            RunState::Compensating
        );
        // c is still running (hung, long deadline): compensation of b waits for it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            log.count("undo_b:"),
            0,
            "b's compensation must wait for c to settle"
        );
        let run = engine.run(id).await.expect("run").expect("exists");
        assert_eq!(run.state, RunState::Compensating);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_can_record_a_compensation_done_by_hand() {
    for db in backends().await {
        let log = Log::default();
        let wf = chain(
            &log,
            "byhand",
            2000,
            2,
            |_| Behave::Ok(2.into()),
            |_| Behave::Terminal,
            |_| Behave::Terminal,
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("byhand", &()).await.expect("start");
        expect_state(&engine, id, RunState::Error, db.backend).await;
        assert_eq!(
            log.count("undo_b:"),
            1,
            "a terminal compensation failure is not retried"
        );
        let err = engine
            .operator()
            .mark_compensated(id, "a")
            .await
            .expect_err("a did not fail");
        assert!(matches!(err, Error::ActionNotAllowed { .. }), "{err}");
        assert_eq!(
            engine
                .operator()
                .mark_compensated(id, "b")
                .await
                .expect("mark"),
            RunState::Compensating
        );
        expect_state(&engine, id, RunState::Compensated, db.backend).await;
        assert_eq!(
            log.count("undo_a:"),
            1,
            "the rest of the saga was compensated"
        );
        assert_eq!(
            log.count("undo_b:"),
            1,
            "b's compensation was not run again"
        );
        let h = engine.history(id).await.expect("history");
        assert!(
            h.iter()
                .any(|h| h.kind == HistoryKind::OperatorMarkCompensated)
        );
        engine.shutdown().await;
    }
}
