//! Failure handling: retries with stable keys, hung agents, thresholds, terminal failures,
//! failing compensations, panics (SAS-2, SAS-3, SAS-4, SAS-7).

use sagaflow::AlertKind;
use sagaflow::EntityState;
use sagaflow::HistoryKind;
use std::time::Duration;

use sagaflow::{RunState, StepState};
use sagaflow_testkit::services::{Operation, OrderStatus, Scripted};
use sagaflow_testkit::{backends, engine, expect_state};

use crate::fixtures::{Behave, Log, chain, failing_undo, order_rig, submit_order};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_failures_are_retried_with_the_same_idempotency_key() {
    for db in backends().await {
        let log = Log::default();
        let wf = chain(
            &log,
            "retry",
            5000,
            5,
            |attempt| {
                if attempt < 3 {
                    Behave::Retryable
                } else {
                    Behave::Ok(2.into())
                }
            },
            |_| Behave::Ok(3.into()),
            |_| Behave::Ok(serde_json::Value::Null),
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("retry", &()).await.expect("start");
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        let b: Vec<String> = log
            .entries()
            .into_iter()
            .filter(|e| e.starts_with("b:"))
            .collect();
        assert_eq!(b.len(), 3, "[{}] {b:?}", db.backend);
        let keys: Vec<&str> = b
            .iter()
            .map(|e| e.splitn(3, ':').nth(2).expect("key"))
            .collect();
        assert!(
            keys.iter().all(|k| *k == keys[0]),
            "[{}] keys differ: {keys:?}",
            db.backend
        );
        assert_eq!(keys[0], format!("{id}:b"));
        let c_key = log
            .entries()
            .into_iter()
            .find(|e| e.starts_with("c:"))
            .expect("c ran");
        assert!(!c_key.ends_with(keys[0]), "steps must not share keys");
        let retries = engine
            .history(id)
            .await
            .expect("history")
            .iter()
            .filter(|h| h.kind == HistoryKind::Retry)
            .count();
        assert_eq!(retries, 2, "[{}]", db.backend);
        engine.shutdown().await;

        // The same through the order saga and its remote ledger: charged exactly once.
        let rig = order_rig(&db, 2000, 4).await;
        rig.services
            .script("charge", vec![Scripted::Transient, Scripted::Transient]);
        let (id, order) = submit_order(&rig.engine, 1).await;
        expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        let report = rig.services.ledger().check_orders(&[order.order_id]);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.applied.charge, 1);
        assert_eq!(rig.services.fault_counts().transient, 2);
        rig.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_is_requeued_with_a_longer_deadline_and_its_effect_applied_once() {
    for db in backends().await {
        // The first ship call applies the effect and never answers (response lost).
        let rig = order_rig(&db, 300, 4).await;
        rig.services.script("ship", vec![Scripted::Hang]);
        let (id, order) = submit_order(&rig.engine, 7).await;
        expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        let history = rig.engine.history(id).await.expect("history");
        let timeout = history
            .iter()
            .find(|h| h.kind == HistoryKind::Timeout)
            .expect("a supervisor timeout entry");
        assert_eq!(timeout.step.as_deref(), Some("ship"));
        let detail = timeout.detail.clone().expect("detail");
        assert_eq!(
            detail["details"]["failure_count"], 1,
            "[{}] FailureCount incremented",
            db.backend
        );
        assert_eq!(
            detail["details"]["deadline_ms"], 600,
            "[{}] deadline doubled",
            db.backend
        );
        assert!(timeout.actor.starts_with("supervisor:"));
        let report = rig
            .services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.applied.ship, 1, "[{}] shipped once", db.backend);
        let ship = rig.services.ledger().records_for_order(&order.order_id);
        let ship = ship
            .iter()
            .find(|r| r.operation == Operation::Ship)
            .expect("ship record");
        assert_eq!(
            ship.replays, 1,
            "[{}] the retry was absorbed by the idempotency key",
            db.backend
        );
        rig.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaching_the_threshold_compensates_in_reverse_order() {
    for db in backends().await {
        let log = Log::default();
        // c hangs on every attempt; after 2 timeouts it fails and the saga unwinds. Its outcome
        // is unknown, so it is compensated first, then b, then a.
        let wf = chain(
            &log,
            "threshold",
            200,
            2,
            |_| Behave::Ok(2.into()),
            |_| Behave::Hang,
            |_| Behave::Ok(serde_json::Value::Null),
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("threshold", &()).await.expect("start");
        expect_state(&engine, id, RunState::Compensated, db.backend).await;
        let undo: Vec<String> = log
            .entries()
            .into_iter()
            .filter(|e| e.starts_with("undo_"))
            .map(|e| e.split(':').next().expect("name").to_owned())
            .collect();
        assert_eq!(undo, vec!["undo_c", "undo_b", "undo_a"], "[{}]", db.backend);
        assert_eq!(log.count("c:"), 2, "[{}] two attempts of c", db.backend);
        let h = engine.history(id).await.expect("history");
        assert_eq!(
            h.iter().filter(|h| h.kind == HistoryKind::Timeout).count(),
            2
        );
        assert!(h.iter().any(|h| h.kind == HistoryKind::Timeout
            && h.to.and_then(EntityState::step) == Some(StepState::Failed)));
        // Compensation keys differ from forward keys.
        let undo_b = log
            .entries()
            .into_iter()
            .find(|e| e.starts_with("undo_b:"))
            .expect("undo_b");
        assert!(undo_b.ends_with(&format!("{id}:b:compensate")), "{undo_b}");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_failure_compensates_what_completed() {
    for db in backends().await {
        let rig = order_rig(&db, 2000, 4).await;
        rig.services.script("charge", vec![Scripted::Permanent]);
        let (id, order) = submit_order(&rig.engine, 3).await;
        let run = expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        assert!(
            run.error
                .as_ref()
                .is_some_and(|e| e.to_string().contains("permanent")),
            "{:?}",
            run.error
        );
        let report = rig
            .services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!((report.applied.reserve, report.applied.release), (1, 1));
        assert_eq!(
            (
                report.applied.charge,
                report.applied.refund,
                report.applied.ship
            ),
            (0, 0, 0)
        );
        assert_eq!(report.count(OrderStatus::Compensated), 1);
        let h = rig.engine.history(id).await.expect("history");
        assert_eq!(
            h.iter().filter(|h| h.kind == HistoryKind::Retry).count(),
            0,
            "terminal failures are not retried"
        );
        rig.engine.shutdown().await;

        // Failing at the pivot unwinds both earlier steps: refund before release.
        let rig = order_rig(&db, 2000, 4).await;
        rig.services.script("ship", vec![Scripted::Permanent]);
        let (id, order) = submit_order(&rig.engine, 4).await;
        expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        let records = rig.services.ledger().records_for_order(&order.order_id);
        let seq = |op: Operation| {
            records
                .iter()
                .find(|r| r.operation == op)
                .map(|r| r.seq)
                .expect("applied")
        };
        assert!(
            seq(Operation::Refund) < seq(Operation::Release),
            "[{}] reverse order",
            db.backend
        );
        assert!(
            rig.services
                .ledger()
                .check_orders(&[order.order_id])
                .violations
                .is_empty()
        );
        rig.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_that_keeps_failing_ends_in_error_with_an_alert() {
    for db in backends().await {
        let log = Log::default();
        let wf = failing_undo(&log, "stuck");
        let engine = engine(&db, vec![wf]).await;
        let mut alerts = engine.subscribe_alerts();
        let id = engine.start("stuck", &()).await.expect("start");
        expect_state(&engine, id, RunState::Error, db.backend).await;
        assert_eq!(
            log.count("undo_b:"),
            3,
            "[{}] compensation retried up to its threshold",
            db.backend
        );
        assert_eq!(log.count("undo_a:"), 0, "a must wait for b's compensation");
        let stored = engine.run_alerts(id).await.expect("alerts");
        assert_eq!(stored.len(), 1, "[{}] {stored:?}", db.backend);
        let a = &stored[0];
        assert_eq!(
            (&a.kind, a.step.as_deref()),
            (&AlertKind::RunError, Some("b"))
        );
        assert!(a.reason.contains("compensation"), "{}", a.reason);
        assert!(a.actions.iter().any(|x| x == "retry"));
        assert_eq!(
            a.attempts, 3,
            "[{}] the alert counts the attempts of the compensation that failed",
            db.backend
        );
        let delivered = tokio::time::timeout(Duration::from_secs(5), alerts.recv())
            .await
            .expect("delivered")
            .expect("alert");
        assert_eq!(delivered.id, a.id);
        let steps = engine.steps(id).await.expect("steps");
        let b = steps.iter().find(|s| s.name == "b").expect("b");
        assert_eq!(b.state, StepState::CompensationFailed);
        assert_eq!(
            (
                b.attempts.forward,
                b.attempts.compensation,
                b.phase_attempts()
            ),
            (1, 3, 3),
            "[{}] phase counters apart",
            db.backend
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_counts_its_own_attempts_from_one() {
    for db in backends().await {
        let log = Log::default();
        // b completes at its first attempt; c refuses, so b is compensated: its compensation
        // fails twice, then succeeds.
        let wf = chain(
            &log,
            "undo_thrice",
            2000,
            5,
            |_| Behave::Ok(2.into()),
            |_| Behave::Terminal,
            |attempt| {
                if attempt < 3 {
                    Behave::Retryable
                } else {
                    Behave::Ok(serde_json::Value::Null)
                }
            },
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("undo_thrice", &()).await.expect("start");
        expect_state(&engine, id, RunState::Compensated, db.backend).await;
        let seen = |step: &str| -> Vec<String> {
            log.entries()
                .into_iter()
                .filter(|e| e.starts_with(&format!("{step}:")))
                .map(|e| e.split(':').nth(1).expect("attempt").to_owned())
                .collect()
        };
        assert_eq!(seen("b"), ["1"], "[{}] forward attempts of b", db.backend);
        assert_eq!(
            seen("undo_b"),
            ["1", "2", "3"],
            "[{}] compensation attempts of b count from 1",
            db.backend
        );
        assert!(engine.open_alerts().await.expect("alerts").is_empty());
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_step_is_a_failed_attempt_not_a_crashed_engine() {
    for db in backends().await {
        let log = Log::default();
        let wf = chain(
            &log,
            "panicky",
            2000,
            3,
            |attempt| {
                if attempt == 1 {
                    Behave::Panic
                } else {
                    Behave::Ok(2.into())
                }
            },
            |_| Behave::Ok(3.into()),
            |_| Behave::Ok(serde_json::Value::Null),
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("panicky", &()).await.expect("start");
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        let h = engine.history(id).await.expect("history");
        let retry = h
            .iter()
            .find(|h| h.kind == HistoryKind::Retry)
            .expect("retry after panic");
        assert!(
            retry
                .detail
                .as_ref()
                .is_some_and(|d| d.to_string().contains("panic")),
            "{:?}",
            retry.detail
        );
        // The engine still serves new runs.
        let id2 = engine.start("panicky", &()).await.expect("start again");
        expect_state(&engine, id2, RunState::Completed, db.backend).await;
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_once_timed_out_is_compensated_even_if_it_failed_otherwise_later() {
    for db in backends().await {
        // c hangs (maybe applied), then fails retryably at the threshold: its outcome stays
        // unknown, so the saga undoes c as well, first.
        let log = Log::default();
        let wf = chain(
            &log,
            "sticky",
            200,
            2,
            |_| Behave::Ok(2.into()),
            |attempt| {
                if attempt == 1 {
                    Behave::Hang
                } else {
                    Behave::Retryable
                }
            },
            |_| Behave::Ok(serde_json::Value::Null),
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("sticky", &()).await.expect("start");
        expect_state(&engine, id, RunState::Compensated, db.backend).await;
        let undo: Vec<String> = log
            .entries()
            .into_iter()
            .filter(|e| e.starts_with("undo_"))
            .map(|e| e.split(':').next().expect("name").to_owned())
            .collect();
        assert_eq!(undo, vec!["undo_c", "undo_b", "undo_a"], "[{}]", db.backend);
        engine.shutdown().await;

        // The order saga: a charge that hung (and took the money) then was refused is
        // refunded; the compensation learns the charge by replaying it under its key.
        let rig = order_rig(&db, 300, 2).await;
        rig.services
            .script("charge", vec![Scripted::Hang, Scripted::Permanent]);
        let (id, order) = submit_order(&rig.engine, 11).await;
        expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        let report = rig
            .services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert!(
            report.violations.is_empty(),
            "[{}] {:?}",
            db.backend,
            report.violations
        );
        assert_eq!(
            (report.applied.charge, report.applied.refund),
            (1, 1),
            "[{}]",
            db.backend
        );
        assert_eq!((report.applied.reserve, report.applied.release), (1, 1));
        rig.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pivot_with_an_unknown_outcome_stops_for_an_operator_and_a_retry_settles_it() {
    for db in backends().await {
        // ship hangs (the parcel left) and is then refused: compensating would refund a
        // shipped order, so the run stops in Error; retrying ship replays the shipment.
        let rig = order_rig(&db, 300, 2).await;
        rig.services
            .script("ship", vec![Scripted::Hang, Scripted::Permanent]);
        let (id, order) = submit_order(&rig.engine, 12).await;
        expect_state(&rig.engine, id, RunState::Error, db.backend).await;
        let alerts = rig.engine.run_alerts(id).await.expect("alerts");
        assert!(
            alerts
                .iter()
                .any(|a| a.reason.contains("may have taken effect")),
            "{alerts:?}"
        );
        let report = rig
            .services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert_eq!(
            (report.applied.refund, report.applied.release),
            (0, 0),
            "[{}] nothing undone",
            db.backend
        );
        rig.engine
            .operator()
            .retry(id, "ship")
            .await
            .expect("retry");
        expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        let report = rig
            .services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert!(
            report.violations.is_empty(),
            "[{}] {:?}",
            db.backend,
            report.violations
        );
        assert_eq!(report.applied.ship, 1, "[{}] shipped once", db.backend);
        rig.engine.shutdown().await;
    }
}
