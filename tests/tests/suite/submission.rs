//! Submission: typed errors for bad input, business keys, starting inside the caller's
//! transaction (SAS-7, JM-1).

use std::sync::Arc;

use sagaflow::sea_orm::TransactionTrait;
use sagaflow::{Error, OnDuplicate, RunState, StartOptions, StepContext, StepError, Workflow};
use sagaflow_testkit::{backends, engine, expect_state, sqlite_db};
use serde::Deserialize;
use tokio::sync::Semaphore;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[allow(dead_code)]
struct Input {
    order_id: String,
    qty: u32,
}

fn typed() -> Workflow {
    Workflow::builder("typed", 1)
        .input::<Input>()
        .step("only", |_ctx: StepContext| async { Ok::<_, StepError>(()) })
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_submissions_get_typed_errors_and_write_nothing() {
    for db in backends().await {
        let engine = sagaflow_testkit::fast_builder(&db)
            .with_workflow(typed())
            .with_max_input_bytes(1024)
            .start()
            .await
            .expect("start");
        let err = engine
            .start("nope", &serde_json::json!({}))
            .await
            .expect_err("unknown workflow");
        assert!(
            matches!(err, Error::WorkflowNotFound(ref n) if n == "nope"),
            "{err}"
        );
        let err = engine
            .start("typed", &serde_json::json!({ "order_id": 5, "qty": 1 }))
            .await
            .expect_err("bad input");
        // The input's schema says where: a JSON Pointer into the input.
        assert!(
            matches!(&err, Error::InvalidInput { field: Some(f), .. } if f.pointer == "/order_id"),
            "{err:?}"
        );
        assert!(err.to_string().contains("expected string"), "{err}");
        let big = serde_json::json!({ "order_id": "x".repeat(2000), "qty": 1 });
        let err = engine.start("typed", &big).await.expect_err("too large");
        assert!(
            matches!(err, Error::PayloadTooLarge { limit: 1024, .. }),
            "{err}"
        );
        let counts = engine.run_counts().await.expect("counts");
        assert!(
            counts.total() == 0,
            "[{}] nothing written: {counts:?}",
            db.backend
        );
        engine.shutdown().await;
    }
}

/// A one-step workflow whose step waits until the test opens the gate, so that its run stays
/// active for as long as the test needs.
fn gated(gate: Arc<Semaphore>) -> Workflow {
    Workflow::builder("gated", 1)
        .step("only", move |_ctx: StepContext| {
            let gate = gate.clone();
            async move {
                gate.acquire()
                    .await
                    .map_err(|e| StepError::retryable("gate", e.to_string()))?
                    .forget();
                Ok::<_, StepError>(())
            }
        })
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_business_key_returns_the_run_that_holds_it() {
    for db in backends().await {
        let gate = Arc::new(Semaphore::new(0));
        let engine = engine(&db, vec![gated(gate.clone())]).await;
        let input = serde_json::json!({ "order_id": "o-1" });
        let keyed = || StartOptions::keyed("o-1");
        let first = engine
            .start_with("gated", &input, keyed())
            .await
            .expect("first");
        assert!(first.created);
        let again = engine
            .start_with("gated", &input, keyed())
            .await
            .expect("return existing");
        assert_eq!(
            (again.id, again.created),
            (first.id, false),
            "[{}]",
            db.backend
        );
        let err = engine
            .start_with("gated", &input, keyed().on_duplicate(OnDuplicate::Reject))
            .await
            .expect_err("duplicate");
        match err {
            Error::DuplicateKey { existing, .. } if existing == first.id => {}
            other => panic!("[{}] expected DuplicateKey, got {other}", db.backend),
        }
        gate.add_permits(1);
        expect_state(&engine, first.id, RunState::Completed, db.backend).await;
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_in_the_callers_transaction_commits_or_rolls_back_with_it() {
    for db in backends().await {
        let engine = engine(&db, vec![typed()]).await;
        let input = serde_json::json!({ "order_id": "o-2", "qty": 2 });
        let txn = engine.connection().begin().await.expect("begin");
        let rolled = engine
            .start_in(&txn, "typed", &input, StartOptions::default())
            .await
            .expect("start in txn");
        txn.rollback().await.expect("rollback");
        assert!(
            engine.run(rolled.id).await.expect("read").is_none(),
            "[{}] rolled back with the caller",
            db.backend
        );

        let txn = engine.connection().begin().await.expect("begin");
        let kept = engine
            .start_in(&txn, "typed", &input, StartOptions::default())
            .await
            .expect("start in txn");
        txn.commit().await.expect("commit");
        engine.wake();
        expect_state(&engine, kept.id, RunState::Completed, db.backend).await;
        engine.shutdown().await;
    }
}

/// On SQLite the engine and the application share one file and its one write lock. While an
/// application's transaction holds it, the engine's writes wait, without blocking the runtime:
/// on this single-threaded runtime a busy wait inside the engine would stall the
/// application's own task, which could then never commit. Once it commits, both go through.
#[tokio::test(flavor = "current_thread")]
async fn on_sqlite_an_application_holding_the_write_lock_delays_the_engine_without_blocking_it() {
    let db = sqlite_db();
    let engine = engine(&db, vec![typed()]).await;
    let input = serde_json::json!({ "order_id": "o-3", "qty": 3 });
    let txn = engine.connection().begin().await.expect("begin");
    // The insert takes the file's write lock until the transaction ends.
    let held = engine
        .start_in(&txn, "typed", &input, StartOptions::default())
        .await
        .expect("start in txn");
    let waiting = tokio::spawn({
        let (engine, input) = (engine.clone(), input.clone());
        async move { engine.start("typed", &input).await }
    });
    let t0 = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(2),
        "the runtime was blocked for {:?}",
        t0.elapsed()
    );
    assert!(
        !waiting.is_finished(),
        "the engine's start waits for the application's lock"
    );
    txn.commit().await.expect("commit");
    let started = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
        .await
        .expect("the start goes through once the lock is released")
        .expect("task")
        .expect("start");
    engine.wake();
    expect_state(&engine, held.id, RunState::Completed, "sqlite").await;
    expect_state(&engine, started, RunState::Completed, "sqlite").await;
    engine.shutdown().await;
}

/// Makes the database refuse any run whose input mentions `poison`, as a constraint or a
/// trigger of the application's own might.
async fn refuse_poisoned_runs(engine: &sagaflow::Engine, backend: &str) {
    use sagaflow::sea_orm::ConnectionTrait;
    let sql: &[&str] = if backend == "postgres" {
        &[
            "CREATE FUNCTION refuse_poison() RETURNS trigger AS $$ BEGIN \
             IF NEW.input LIKE '%poison%' THEN RAISE EXCEPTION 'poisoned input'; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON sagaflow_runs FOR EACH ROW \
             EXECUTE FUNCTION refuse_poison()",
        ]
    } else {
        &[
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON sagaflow_runs \
           WHEN NEW.input LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poisoned input'); END",
        ]
    };
    for s in sql {
        engine
            .connection()
            .execute_unprepared(s)
            .await
            .expect("trigger");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refused_run_in_a_group_of_starts_fails_alone() {
    for db in backends().await {
        let engine = engine(&db, vec![typed()]).await;
        refuse_poisoned_runs(&engine, db.backend).await;
        // Concurrent starts share a group commit; one of them is refused by the database.
        let mut starts = tokio::task::JoinSet::new();
        for i in 0..32 {
            let engine = engine.clone();
            let order_id = if i == 17 {
                "poison".to_owned()
            } else {
                format!("o-{i}")
            };
            starts.spawn(async move {
                let input = serde_json::json!({ "order_id": order_id, "qty": 1 });
                (i, engine.start("typed", &input).await)
            });
        }
        let results = starts.join_all().await;
        for (i, r) in &results {
            if *i == 17 {
                let err = r.as_ref().expect_err("the poisoned run is refused");
                assert!(err.to_string().contains("poisoned input"), "{err}");
            } else {
                let id = *r
                    .as_ref()
                    .unwrap_or_else(|e| panic!("[{}] run {i}: {e}", db.backend));
                expect_state(&engine, id, RunState::Completed, db.backend).await;
            }
        }
        let counts = engine.run_counts().await.expect("counts");
        assert_eq!(counts.total(), 31, "[{}] {counts:?}", db.backend);
        engine.shutdown().await;
    }
}
