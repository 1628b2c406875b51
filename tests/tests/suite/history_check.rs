//! The history checker (`sagaflow::check`, `sagaflow check`), on both backends: order sagas
//! that complete, retry, compensate (after a hang that may have charged the card) or stop for
//! an operator leave a history it finds nothing wrong with, engines running or not; rows
//! corrupted by hand are reported one violation per broken invariant, naming the run, the
//! step and the history lines; the command exits 0 on a clean database and 6 on a corrupted
//! one.
//!
//! Build the binary first: `cargo build --workspace --bins`.

use std::collections::BTreeSet;
use std::time::Duration;

use sagaflow::check::{Invariant, check};
use sagaflow::sea_orm::{ConnectionTrait, Database, Statement};
use sagaflow::{RunState, StartOptions, StartTime, Uuid};
use sagaflow_testkit::services::Scripted;
use sagaflow_testkit::{TestDb, backends, check_engine_history, check_history, expect_state};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order};

use crate::cli::{code, sagaflow, stdout};
use crate::fixtures::{order_rig, submit_order};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_sagas_that_complete_compensate_or_stop_leave_a_clean_history() {
    for db in backends().await {
        let b = db.backend;
        let rig = order_rig(&db, 300, 2).await;
        let (done, _) = submit_order(&rig.engine, 0).await;
        expect_state(&rig.engine, done, RunState::Completed, b).await;
        // One transient failure, retried.
        rig.services.script("charge", vec![Scripted::Transient]);
        let (retried, _) = submit_order(&rig.engine, 1).await;
        expect_state(&rig.engine, retried, RunState::Completed, b).await;
        // The pivot refused: the charge and the stock are undone.
        rig.services.script("ship", vec![Scripted::Permanent]);
        let (undone, _) = submit_order(&rig.engine, 2).await;
        expect_state(&rig.engine, undone, RunState::Compensated, b).await;
        // A charge that hung (it may have taken the money) then was refused: compensated.
        rig.services
            .script("charge", vec![Scripted::Hang, Scripted::Permanent]);
        let (hung, _) = submit_order(&rig.engine, 3).await;
        expect_state(&rig.engine, hung, RunState::Compensated, b).await;
        // A pivot that may have shipped: stopped in error with an alert for an operator.
        rig.services
            .script("ship", vec![Scripted::Hang, Scripted::Permanent]);
        let (stopped, _) = submit_order(&rig.engine, 4).await;
        expect_state(&rig.engine, stopped, RunState::Error, b).await;

        // While the engine runs (one snapshot), and after it stopped.
        let report = check_engine_history(&rig.engine).await;
        assert_eq!(report.runs_checked, 5, "[{b}]");
        rig.engine.shutdown().await;
        let report = check_history(&db).await;
        assert_eq!(report.runs_checked, 5, "[{b}]");
        assert!(
            report.to_string().contains("no violation"),
            "[{b}] {report}"
        );
    }
}

/// Runs `sql` with `values` bound as `$1`, `$2`, … on `db`, and asserts it changed a row.
async fn corrupt(db: &TestDb, sql: &str, values: Vec<sagaflow::sea_orm::Value>) {
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    let done = conn
        .execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            sql,
            values,
        ))
        .await
        .unwrap_or_else(|e| panic!("[{}] {sql}: {e}", db.backend));
    assert!(done.rows_affected() >= 1, "[{}] {sql}", db.backend);
    let _ = conn.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_corrupted_by_hand_are_reported_one_violation_each() {
    for db in backends().await {
        let b = db.backend;
        let rig = order_rig(&db, 2000, 4).await;
        let (edge, _) = submit_order(&rig.engine, 0).await;
        expect_state(&rig.engine, edge, RunState::Completed, b).await;
        rig.services.script("ship", vec![Scripted::Permanent]);
        let (undone, _) = submit_order(&rig.engine, 1).await;
        expect_state(&rig.engine, undone, RunState::Compensated, b).await;
        let (renumbered, _) = submit_order(&rig.engine, 2).await;
        expect_state(&rig.engine, renumbered, RunState::Completed, b).await;
        let (untouched, _) = submit_order(&rig.engine, 3).await;
        expect_state(&rig.engine, untouched, RunState::Completed, b).await;
        // Starts in an hour: pending, its first step due then.
        let order = Order::sample(4);
        let mut later = StartOptions::keyed(order.order_id.clone());
        later.start = StartTime::After(Duration::from_secs(3600));
        let stuck = rig
            .engine
            .start_with(ORDER_WORKFLOW, &order, later)
            .await
            .expect("start later")
            .id;
        rig.engine.shutdown().await;

        // Clean as left: the library, and the command (exit 0).
        assert_eq!(check_history(&db).await.runs_checked, 5, "[{b}]");
        let o = sagaflow(&db.url, &["check"]).await;
        code(&o, 0, "check on a clean database");
        assert!(
            stdout(&o).contains("checked 5 run(s): no violation"),
            "[{b}] {}",
            stdout(&o)
        );

        // A compensated run given a step left in flight (after its compensation, at the next
        // attempt): in flight after the finish, and a row the history does not lead to.
        corrupt(
            &db,
            "INSERT INTO sagaflow_steps (run_id, workflow_key, name, state, attempt, max_failures, \
               deadline_ms, initial_deadline_ms, deadline_cap_ms, idempotency_key, updated_at) \
             SELECT $1, workflow_key, 'charge_card', 'running', \
               (SELECT MAX(attempt) + 1 FROM sagaflow_history WHERE run_id = $1 AND step = 'charge_card'), \
               max_failures, deadline_ms, initial_deadline_ms, deadline_cap_ms, idempotency_key, updated_at \
             FROM sagaflow_steps WHERE run_id = $2 AND name = 'reserve_stock'",
            vec![undone.into(), stuck.into()],
        )
        .await;
        // The same run loses the line of its stock's release. The row of that line also
        // holds the run's move to compensated when the same unit of work decided it
        // (`then_states`); that line is kept, as a row of its own.
        let conn = Database::connect(db.url.as_str()).await.expect("connect");
        conn.execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            "INSERT INTO sagaflow_history (run_id, event, from_state, to_state, actor, at) \
             SELECT run_id, 'state', 'compensating', 'compensated', actor, at \
             FROM sagaflow_history WHERE run_id = $1 AND step = 'reserve_stock' \
             AND to_state = 'compensated' AND then_states LIKE '%compensated%'",
            vec![undone.into()],
        ))
        .await
        .expect("keep the run's line");
        let _ = conn.close().await;
        corrupt(
            &db,
            "DELETE FROM sagaflow_history WHERE run_id = $1 AND step = 'reserve_stock' \
             AND to_state = 'compensated'",
            vec![undone.into()],
        )
        .await;
        // The same run's pivot, `ship`, recorded as completed after it was dropped: a line the
        // step's path does not lead to, and a pivot that acted in a compensated run that no
        // operator chose to compensate past it.
        corrupt(
            &db,
            "INSERT INTO sagaflow_history (run_id, step, event, from_state, to_state, actor, at) \
             VALUES ($1, 'ship', 'completed', 'running', 'completed', 'test', 0)",
            vec![undone.into()],
        )
        .await;
        // A shipped order's step sent back to running: no edge of the step table.
        corrupt(
            &db,
            "INSERT INTO sagaflow_history (run_id, step, event, from_state, to_state, actor, at) \
             VALUES ($1, 'ship', 'state', 'completed', 'running', 'test', 0)",
            vec![edge.into()],
        )
        .await;
        // A first attempt recorded as the third: two attempts never ended.
        corrupt(
            &db,
            "UPDATE sagaflow_history SET attempt = 3 WHERE run_id = $1 AND step = 'ship' \
             AND event = 'completed'",
            vec![renumbered.into()],
        )
        .await;
        // A pending run with no start time and nothing due.
        corrupt(
            &db,
            "UPDATE sagaflow_steps SET available_at = NULL WHERE run_id = $1",
            vec![stuck.into()],
        )
        .await;
        corrupt(
            &db,
            "UPDATE sagaflow_runs SET start_at = NULL WHERE id = $1",
            vec![stuck.into()],
        )
        .await;

        let conn = Database::connect(db.url.as_str()).await.expect("connect");
        let report = check(&conn).await.expect("check");
        let _ = conn.close().await;
        let found: BTreeSet<(Uuid, Invariant, Option<String>)> = report
            .violations
            .iter()
            .map(|v| (v.run_id, v.invariant, v.step.clone()))
            .collect();
        let step = |s: &str| Some(s.to_owned());
        let expected: BTreeSet<(Uuid, Invariant, Option<String>)> = [
            (undone, Invariant::InFlightAfterFinish, step("charge_card")),
            (undone, Invariant::Path, step("charge_card")),
            (undone, Invariant::Uncompensated, step("reserve_stock")),
            (undone, Invariant::Path, step("ship")),
            (undone, Invariant::Uncompensated, step("ship")),
            (edge, Invariant::Path, step("ship")),
            (renumbered, Invariant::OverlappingAttempts, step("ship")),
            (stuck, Invariant::Stuck, None),
        ]
        .into_iter()
        .collect();
        assert_eq!(found, expected, "[{b}] {report}");
        assert_eq!(report.violations.len(), 8, "[{b}] {report}");
        assert_eq!(report.runs_checked, 5);
        // Each names its workflow and shows the lines behind it.
        let text = report.to_string();
        assert!(text.contains("order@1"), "[{b}] {text}");
        assert!(
            text.contains("completed -> running (state, line #"),
            "[{b}] {text}"
        );
        assert!(
            text.contains("attempts 1 to 2 have no recorded end, yet a later one"),
            "[{b}] {text}"
        );
        for v in &report.violations {
            if v.invariant != Invariant::Stuck {
                assert!(!v.lines.is_empty(), "[{b}] {v}");
            }
        }

        // The command: every violation on standard output, exit 6; the same as JSON.
        let o = sagaflow(&db.url, &["check"]).await;
        code(&o, 6, "check on a corrupted database");
        let out = stdout(&o);
        assert!(out.contains("8 violation(s)"), "[{b}] {out}");
        assert!(out.contains(&stuck.to_string()), "[{b}] {out}");
        let o = sagaflow(&db.url, &["check", "--json"]).await;
        code(&o, 6, "check --json on a corrupted database");
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(json["runs_checked"], 5, "[{b}] {json}");
        assert_eq!(
            json["violations"].as_array().map(Vec::len),
            Some(8),
            "[{b}] {json}"
        );
    }
}
