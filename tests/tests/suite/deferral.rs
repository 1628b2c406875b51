//! Deferrals: a remote's "come back after this delay, nothing was done"
//! (`StepError::try_again_after`) queues the step again after the delay on the database
//! clock without counting a failure, up to a cap past which it is an ordinary failure.

use std::time::Duration;

use sagaflow::{
    HistoryEvent, HistoryKind, RetryPolicy, RunState, StepContext, StepError, StepState, Workflow,
};
use sagaflow_testkit::{backends, engine, eventually_some, expect_state};

use crate::fixtures::{Behave, Log, logged};

fn events<'a>(
    history: &'a [HistoryEvent],
    step: &str,
    kind: &HistoryKind,
) -> Vec<&'a HistoryEvent> {
    history
        .iter()
        .filter(|h| h.step.as_deref() == Some(step) && &h.kind == kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_a_retry_after_delays_the_next_attempt_by_that_much_without_spending_one() {
    for db in backends().await {
        let log = Log::default();
        let seen = log.clone();
        // One failure would fail the step for good: the run completes only if the deferral
        // counts none.
        let wf = Workflow::builder("defer_once", 1)
            .default_retry(RetryPolicy::default().with_max_failures(1))
            .step("a", move |ctx: StepContext| {
                let log = seen.clone();
                async move {
                    log.push(format!("a:{}", ctx.attempt()));
                    if ctx.attempt() == 1 {
                        Err(StepError::try_again_after(
                            "busy",
                            "the remote answered 503 with Retry-After: 2",
                            Duration::from_secs(2),
                        ))
                    } else {
                        Ok(serde_json::json!("done"))
                    }
                }
            })
            .build()
            .expect("workflow");
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("defer_once", &()).await.expect("start");

        let deferred = eventually_some(Duration::from_secs(10), "a deferred event", || async {
            let history = engine.history(id).await.expect("history");
            events(&history, "a", &HistoryKind::Deferred)
                .first()
                .map(|h| (*h).clone())
        })
        .await;
        // Read while the step waits out its delay (2 s, the read takes milliseconds).
        let steps = engine.steps(id).await.expect("steps");
        let a = steps.iter().find(|s| s.name == "a").expect("step a");
        assert_eq!(a.state, StepState::Ready, "[{}] queued again", db.backend);
        assert_eq!(
            a.attempts.failures, 0,
            "[{}] no failure counted",
            db.backend
        );
        assert_eq!(a.attempts.forward, 1, "[{}]", db.backend);
        assert!(!a.maybe_applied, "[{}] nothing was applied", db.backend);
        let due = a.available_at.expect("a due time");
        // Both times come from the database clock: `available_at` is the deferral write's
        // now + 2 s, and the history row is written just after, in the same transaction.
        let ahead = (due - deferred.at).num_milliseconds();
        assert!(
            (1000..=2000).contains(&ahead),
            "[{}] due {ahead} ms after the deferral was recorded",
            db.backend
        );
        let detail = deferred.detail.clone().expect("detail");
        assert_eq!(detail["retry_after_ms"], 2000, "[{}] {detail}", db.backend);
        assert_eq!(detail["outcome"], "not_applied", "[{}]", db.backend);
        assert_eq!(detail["code"], "busy", "[{}]", db.backend);
        assert!(deferred.step_entered("a", StepState::Ready));

        let run = expect_state(&engine, id, RunState::Completed, db.backend).await;
        assert_eq!(
            run.failed_attempts, 0,
            "[{}] a deferral is no failure",
            db.backend
        );
        assert_eq!(log.entries(), vec!["a:1", "a:2"], "[{}]", db.backend);
        let history = engine.history(id).await.expect("history");
        let completed = events(&history, "a", &HistoryKind::Completed);
        let completed = completed.first().expect("a completed");
        // The next claim (and so the completion) is not before the due time.
        assert!(
            completed.at >= due,
            "[{}] completed at {} before its due time {due}",
            db.backend,
            completed.at
        );
        // The fencing token grew with the second claim.
        assert_eq!(deferred.attempt, Some(1), "[{}]", db.backend);
        assert_eq!(completed.attempt, Some(2), "[{}]", db.backend);
        assert!(events(&history, "a", &HistoryKind::Retry).is_empty());
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_deferrals_past_the_cap_fall_back_to_failures_and_a_long_delay_is_capped() {
    for db in backends().await {
        let log = Log::default();
        let always_later = log.clone();
        // Asks for an hour every time; the policy cuts each delay to 20 ms and defers the
        // first 3 attempts only. Attempts 4 and 5 are failures (threshold 2): the step fails,
        // and the run unwinds without compensating it (nothing was applied).
        let wf = Workflow::builder("defer_forever", 1)
            .default_retry(
                RetryPolicy::default()
                    .with_max_failures(2)
                    .with_backoff(Duration::from_millis(5), Duration::from_millis(10))
                    .with_max_deferrals(3)
                    .with_max_deferral_delay(Duration::from_millis(20)),
            )
            .step("first", logged(&log, "first", |_| Behave::Ok(1.into())))
            .compensate(logged(&log, "undo_first", |_| {
                Behave::Ok(serde_json::Value::Null)
            }))
            .step("busy", move |ctx: StepContext| {
                let log = always_later.clone();
                async move {
                    log.push(format!("busy:{}", ctx.attempt()));
                    Err::<serde_json::Value, _>(StepError::try_again_after(
                        "busy",
                        "the remote answered 429 with Retry-After: 3600",
                        Duration::from_secs(3600),
                    ))
                }
            })
            .after(["first"])
            .compensate(logged(&log, "undo_busy", |_| {
                Behave::Ok(serde_json::Value::Null)
            }))
            .build()
            .expect("workflow");
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("defer_forever", &()).await.expect("start");
        let run = expect_state(&engine, id, RunState::Compensated, db.backend).await;

        assert_eq!(
            log.count("busy:"),
            5,
            "[{}] {:?}",
            db.backend,
            log.entries()
        );
        assert_eq!(
            log.count("undo_busy"),
            0,
            "[{}] nothing to undo",
            db.backend
        );
        assert_eq!(log.count("undo_first"), 1, "[{}]", db.backend);
        let history = engine.history(id).await.expect("history");
        let deferred = events(&history, "busy", &HistoryKind::Deferred);
        assert_eq!(deferred.len(), 3, "[{}] the cap", db.backend);
        for d in &deferred {
            let detail = d.detail.as_ref().expect("detail");
            assert_eq!(
                detail["retry_after_ms"], 20,
                "[{}] capped delay",
                db.backend
            );
        }
        assert_eq!(
            deferred.iter().map(|d| d.attempt).collect::<Vec<_>>(),
            vec![Some(1), Some(2), Some(3)],
            "[{}] fencing tokens",
            db.backend
        );
        assert_eq!(events(&history, "busy", &HistoryKind::Retry).len(), 1);
        assert_eq!(events(&history, "busy", &HistoryKind::Failed).len(), 1);
        assert_eq!(
            run.failed_attempts, 2,
            "[{}] only the attempts past the cap count",
            db.backend
        );
        engine.shutdown().await;
    }
}
