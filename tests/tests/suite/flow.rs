//! Happy paths: parallel branches, outputs along edges, status events, the order saga.

use sagaflow::HistoryKind;
use sagaflow::StepState;
use std::time::Duration;

use sagaflow::{RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::services::OrderStatus;
use sagaflow_testkit::{backends, engine, expect_state};

use crate::fixtures::{order_rig, submit_order};

fn diamond() -> Workflow {
    // a → (b, c) → d: b and c run concurrently and d sees both outputs (SAS-1).
    Workflow::builder("diamond", 1)
        .input::<i64>()
        .step("a", |ctx: StepContext| async move {
            Ok::<_, StepError>(ctx.input::<i64>()? + 1)
        })
        .step("b", |ctx: StepContext| async move {
            Ok::<_, StepError>(ctx.dep::<i64>("a")? * 10)
        })
        .after(["a"])
        .step("c", |ctx: StepContext| async move {
            Ok::<_, StepError>(ctx.dep::<i64>("a")? + 100)
        })
        .after(["a"])
        .step("d", |ctx: StepContext| async move {
            Ok::<_, StepError>(
                serde_json::json!({ "sum": ctx.dep::<i64>("b")? + ctx.dep::<i64>("c")? }),
            )
        })
        .after(["b", "c"])
        .build()
        .expect("diamond")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_branches_pass_outputs_along_edges() {
    sagaflow_testkit::init_logging();
    for db in backends().await {
        let engine = engine(&db, vec![diamond()]).await;
        let id = engine.start("diamond", &1).await.expect("start");
        let run = expect_state(&engine, id, RunState::Completed, db.backend).await;
        let out = run.output.expect("output");
        assert_eq!(out["a"], 2, "[{}]", db.backend);
        assert_eq!(out["b"], 20);
        assert_eq!(out["c"], 102);
        assert_eq!(out["d"]["sum"], 122);
        // AT-5: the finished run's steps left the hot table; the history kept them.
        assert!(
            engine.steps(id).await.expect("steps").is_empty(),
            "[{}] steps not archived",
            db.backend
        );
        let history = engine.history(id).await.expect("history");
        let completed = history
            .iter()
            .filter(|h| h.kind == HistoryKind::Completed)
            .count();
        assert_eq!(completed, 4, "[{}] history: {history:?}", db.backend);
        // b and c were queued by the same evaluation (parallel branches).
        let b = history
            .iter()
            .position(|h| h.step_entered("b", StepState::Ready));
        let c = history
            .iter()
            .position(|h| h.step_entered("c", StepState::Ready));
        let (b, c) = (b.expect("b readied"), c.expect("c readied"));
        assert_eq!(
            b.abs_diff(c),
            1,
            "[{}] b and c not readied together",
            db.backend
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_events_report_each_run_state() {
    for db in backends().await {
        let engine = engine(&db, vec![diamond()]).await;
        let mut events = engine.subscribe();
        let id = engine.start("diamond", &5).await.expect("start");
        let mut seen = Vec::new();
        let collect = async {
            while let Ok(e) = events.recv().await {
                if e.run_id == id {
                    seen.push(e.state);
                    if e.state == RunState::Completed {
                        break;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), collect)
            .await
            .expect("events in time");
        assert_eq!(
            seen,
            vec![RunState::Running, RunState::Completed],
            "[{}]",
            db.backend
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_sagas_complete_and_apply_each_effect_once() {
    for db in backends().await {
        let rig = order_rig(&db, 2000, 3).await;
        let mut ids = Vec::new();
        let mut orders = Vec::new();
        for n in 0..25 {
            let (id, o) = submit_order(&rig.engine, n).await;
            ids.push(id);
            orders.push(o.order_id);
        }
        for id in ids {
            expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        }
        let report = rig.services.ledger().check_orders(&orders);
        assert!(
            report.violations.is_empty(),
            "[{}] {:?}",
            db.backend,
            report.violations
        );
        assert_eq!(report.applied.reserve, 25);
        assert_eq!(report.applied.charge, 25);
        assert_eq!(report.applied.ship, 25);
        assert_eq!(report.count(OrderStatus::Shipped), 25);
        rig.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_submitted_elsewhere_is_picked_up_by_notification_not_polling() {
    // PostgreSQL only: SQLite has one process writing at a time.
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    let worker = sagaflow_testkit::fast_builder(&db)
        .with_workflow(diamond())
        .with_poll_interval(Duration::from_secs(60))
        .start()
        .await
        .expect("worker");
    let client = sagaflow_testkit::fast_builder(&db)
        .with_workflow(diamond())
        .with_workers(false)
        .start()
        .await
        .expect("client");
    // Let the worker's first polls pass so that only a wake-up can start the next run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let id = client.start("diamond", &3).await.expect("start");
    let run = client
        .wait(id, Duration::from_secs(20))
        .await
        .expect("wait");
    assert_eq!(run.state, RunState::Completed);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}: the worker was not woken by the notification",
        started.elapsed()
    );
    client.shutdown().await;
    worker.shutdown().await;
}

/// SQLite commits are synced to disk by default (`synchronous=FULL`); `SqliteSync::Normal`
/// trades the last commits before a power loss for fewer fsyncs, and runs the same sagas.
/// SQLite only: the setting is SQLite's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_durability_is_full_by_default_and_normal_on_request() {
    use sagaflow::SqliteSync;
    use sagaflow::sea_orm::{ConnectionTrait, Statement};
    for (sync, expected) in [(None, 2), (Some(SqliteSync::Normal), 1)] {
        let db = sagaflow_testkit::sqlite_db();
        let mut builder = sagaflow_testkit::fast_builder(&db).with_workflow(diamond());
        if let Some(sync) = sync {
            builder = builder.with_sqlite_sync(sync);
        }
        let engine = builder.start().await.expect("start");
        let row = engine
            .connection()
            .query_one_raw(Statement::from_string(
                engine.connection().get_database_backend(),
                "PRAGMA synchronous",
            ))
            .await
            .expect("pragma")
            .expect("a row");
        let level: i64 = row.try_get_by_index(0).expect("level");
        assert_eq!(level, expected, "{sync:?} on the pool");
        // The engine's own writes go through the fast path's connection (its writer, which a
        // transaction takes).
        use sagaflow::internals::store::Exec;
        let txn = engine.store().executor().begin().await.expect("begin");
        let row = txn
            .query_one(Statement::from_string(
                engine.connection().get_database_backend(),
                "PRAGMA synchronous",
            ))
            .await
            .expect("pragma")
            .expect("a row");
        let level: i64 = row.try_get("", "synchronous").expect("level");
        assert_eq!(level, expected, "{sync:?} on the engine's writer");
        txn.rollback().await.expect("rollback");
        let id = engine.start("diamond", &1).await.expect("start");
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        engine.shutdown().await;
    }
}

/// On SQLite, queries outside transactions run on read-only connections of their own: they
/// answer while a unit of work holds the writer (here one held open on purpose), instead of
/// queueing behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reads_answer_while_a_unit_of_work_holds_the_writer() {
    let db = sagaflow_testkit::sqlite_db();
    let engine = engine(&db, vec![diamond()]).await;
    let id = engine.start("diamond", &1).await.expect("start");
    expect_state(&engine, id, RunState::Completed, db.backend).await;
    let txn = engine.store().executor().begin().await.expect("begin");
    let run = tokio::time::timeout(Duration::from_secs(2), engine.run(id))
        .await
        .expect("answered while the writer is held")
        .expect("read")
        .expect("the run");
    assert_eq!(run.state, RunState::Completed);
    let counts = tokio::time::timeout(Duration::from_secs(2), engine.run_counts())
        .await
        .expect("answered while the writer is held")
        .expect("counts");
    assert_eq!(counts.total(), 1);
    txn.rollback().await.expect("rollback");
    engine.shutdown().await;
}
