//! Concurrent first starts with real processes: several engines started at the same instant
//! on a fresh database all migrate it, start and run sagas (the migrations are serialised by
//! `sagaflow_migrations::migrate`; see docs/storage.md, "Concurrent starts").
//!
//! The suite binary re-runs itself as child engines (the ignored test `child_engine`, as in
//! `crash.rs` and `failover.rs`). Each child starts its process and runtime, prints `READY`,
//! and then blocks on its stdin; once every child is ready, the parent writes `go` to all of
//! them back to back, so their engines connect and migrate the same fresh database at the
//! same moment. Each child then submits and completes its own order sagas and exits through
//! a clean shutdown.

use std::time::Duration;

use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow::{Engine, RunState};
use sagaflow_testkit::services::Services;
use sagaflow_testkit::{ChildTest, TestDb, backends, eventually, expect_state};
use sagaflow_workflows::order::{OrderApis, order_saga};
use tokio::io::AsyncWriteExt;

use crate::fixtures::{Log, failing_undo, order_rig, order_settings, submit_order};

/// Engine processes started at once.
const PROCESSES: usize = 4;
/// Order sagas each process submits and waits for.
const ORDERS_EACH: usize = 3;

/// A child engine process, held at the start line.
fn spawn_starter(db_url: &str, index: usize) -> ChildTest {
    ChildTest::spawn(
        "first_start::child_engine",
        &[
            ("SAGAFLOW_FIRST_START_CHILD", "1".into()),
            ("SAGAFLOW_FIRST_START_DB", db_url.into()),
            ("SAGAFLOW_FIRST_START_INDEX", index.to_string()),
        ],
    )
}

/// Starts [`PROCESSES`] engine processes on `db` at the same instant and checks that every
/// one of them started and completed its sagas.
async fn start_together(db: &TestDb) {
    let mut starters: Vec<ChildTest> = (0..PROCESSES).map(|i| spawn_starter(&db.url, i)).collect();
    eventually(
        Duration::from_secs(60),
        "every child process to wait at the start line",
        || async { starters.iter().all(|s| s.printed("READY")) },
    )
    .await;
    // Back to back: the engines start within a fraction of a millisecond of each other.
    for s in &mut starters {
        s.stdin.write_all(b"go\n").await.expect("write to child");
    }
    for s in &mut starters {
        s.stdin.flush().await.expect("flush child stdin");
    }
    for (i, s) in starters.into_iter().enumerate() {
        let done = s.printed("DONE");
        let (status, said) = s.finish(Duration::from_secs(120)).await;
        let done = done || said.lines().any(|l| l.starts_with("DONE"));
        assert!(
            status.success(),
            "[{}] child {i} exited with {status} (its stderr is above); stdout:\n{said}",
            db.backend
        );
        assert!(
            done,
            "[{}] child {i} exited without completing its runs; stdout:\n{said}",
            db.backend
        );
    }
    let store = Store::connect(&db.url, Some(2)).await.expect("connect");
    let counts = store.run_count_by_state().await.expect("counts");
    let completed = (PROCESSES * ORDERS_EACH) as u64;
    assert_eq!(
        (counts.get(RunState::Completed), counts.total()),
        (completed, completed),
        "[{}] every run of every process completed",
        db.backend
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_start_of_four_engine_processes_on_a_fresh_database() {
    for db in backends().await {
        start_together(&db).await;
    }
}

/// A start over a schema that is there but not recorded (the worst a half-applied
/// migration can leave: every statement done, none recorded) completes and records every
/// migration again instead of failing on the first existing table: each migration is
/// re-runnable. The engine then runs sagas on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_over_an_unrecorded_schema_reapplies_every_migration() {
    for db in backends().await {
        let recorded = async |store: &Store| {
            let rows = store
                .connection()
                .query_all_raw(Statement::from_string(
                    store.connection().get_database_backend(),
                    "SELECT version FROM sagaflow_migrations ORDER BY version",
                ))
                .await
                .expect("read the migration table");
            rows.iter()
                .map(|r| r.try_get::<String>("", "version").expect("version"))
                .collect::<Vec<_>>()
        };
        let store = Store::connect(&db.url, Some(2)).await.expect("first start");
        let applied = recorded(&store).await;
        assert!(!applied.is_empty(), "[{}] nothing recorded", db.backend);
        store
            .connection()
            .execute_unprepared("DELETE FROM sagaflow_migrations")
            .await
            .expect("forget the applied migrations");
        drop(store);

        let store = Store::connect(&db.url, Some(2))
            .await
            .unwrap_or_else(|e| panic!("[{}] start over an unrecorded schema: {e}", db.backend));
        assert_eq!(recorded(&store).await, applied, "[{}]", db.backend);
        let rig = order_rig(&db, 1500, 5).await;
        let (id, _) = submit_order(&rig.engine, 0).await;
        expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        rig.engine.shutdown().await;
    }
}

/// Steps claimed before the attempt counters existed get them from their history when the
/// migration adds them: a step whose compensation failed three times has one forward and three
/// compensation attempts, out of four claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_counters_of_earlier_steps_are_taken_from_their_history() {
    for db in backends().await {
        let log = Log::default();
        let wf = failing_undo(&log, "older");
        let engine = sagaflow_testkit::engine(&db, vec![wf]).await;
        let id = engine.start("older", &()).await.expect("start");
        expect_state(&engine, id, RunState::Error, db.backend).await;
        engine.shutdown().await;

        // The schema as the migration finds it: columns of defaults, the migration unrecorded.
        let store = Store::connect(&db.url, Some(2)).await.expect("store");
        for sql in [
            "UPDATE sagaflow_steps SET forward_attempts = 0, compensation_attempts = 0",
            "DELETE FROM sagaflow_migrations WHERE version = 'm0005_attempts_apart'",
        ] {
            store
                .connection()
                .execute_unprepared(sql)
                .await
                .expect("roll the counters back");
        }
        drop(store);

        let store = Store::connect(&db.url, Some(2)).await.expect("migrate");
        let mut counters: Vec<_> = store
            .run_steps(id)
            .await
            .expect("steps")
            .into_iter()
            .map(|s| {
                (
                    s.name,
                    s.forward_attempts,
                    s.compensation_attempts,
                    s.attempt,
                )
            })
            .collect();
        counters.sort();
        let expected = [
            ("a".to_owned(), 1, 0, 1),
            ("b".to_owned(), 1, 3, 4),
            ("c".to_owned(), 1, 0, 1),
        ];
        assert_eq!(counters, expected, "[{}]", db.backend);
    }
}

/// The start-time and priority migration goes down to the schema before it and up again:
/// down, the due-steps index is the one of m0001 and the columns are gone; up again, a
/// queued step's priority is 0 and the claim takes it through the recreated index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_and_priority_migration_goes_down_and_up_again() {
    use sagaflow::internals::store::{NewRun, NewStep, RunStart};
    use sagaflow_migrations::Migrator;
    use sea_orm_migration::MigratorTrait;

    for db in backends().await {
        let b = db.backend;
        let store = Store::connect(&db.url, Some(2)).await.expect("first start");
        let id = sagaflow::Uuid::now_v7();
        let run = NewRun {
            id,
            workflow: "m".into(),
            version: 1,
            business_key: None,
            input: "null".into(),
            priority: 5,
            retry_priority: 5,
            notify: false,
            start: RunStart::Now,
            trace: None,
            flow_key: None,
            steps: vec![NewStep {
                name: "only".into(),
                max_failures: 3,
                max_interruptions: 5,
                deadline_ms: 60_000,
                deadline_cap_ms: 60_000,
                idempotency_key: format!("{id}:only"),
                ready: true,
                resource: None,
            }],
        };
        store.run_insert_batch(&[run]).await.expect("insert");
        let conn = store.connection();
        let one = async |sql: &str| -> Result<Option<String>, String> {
            let row = conn
                .query_one_raw(Statement::from_string(conn.get_database_backend(), sql))
                .await
                .map_err(|e| e.to_string())?;
            Ok(row.map(|r| r.try_get_by_index::<String>(0).expect("text")))
        };
        let index = if b == "postgres" {
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'sagaflow_steps_ready'"
        } else {
            "SELECT sql FROM sqlite_master WHERE name = 'sagaflow_steps_ready'"
        };
        let def = one(index).await.expect("index").expect("the index");
        assert!(def.contains("priority DESC, available_at"), "[{b}] {def}");

        // Down the migrations after it and itself (m0008 is the eighth).
        let from_m0008 = u32::try_from(Migrator::migrations().len() - 7).expect("count");
        Migrator::down(conn, Some(from_m0008)).await.expect("down");
        let def = one(index).await.expect("index").expect("the index");
        assert!(!def.contains("priority"), "[{b}] {def}");
        for sql in [
            "SELECT CAST(priority AS TEXT) FROM sagaflow_steps",
            "SELECT CAST(priority AS TEXT) FROM sagaflow_runs",
            "SELECT CAST(start_at AS TEXT) FROM sagaflow_runs",
        ] {
            assert!(one(sql).await.is_err(), "[{b}] still there: {sql}");
        }
        drop(store);

        let store = Store::connect(&db.url, Some(2)).await.expect("up again");
        let conn = store.connection();
        let one = async |sql: &str| {
            conn.query_one_raw(Statement::from_string(conn.get_database_backend(), sql))
                .await
                .expect("query")
                .map(|r| r.try_get_by_index::<String>(0).expect("text"))
        };
        let def = one(index).await.expect("the index");
        assert!(def.contains("priority DESC, available_at"), "[{b}] {def}");
        assert_eq!(
            one("SELECT CAST(priority AS TEXT) FROM sagaflow_steps")
                .await
                .as_deref(),
            Some("0"),
            "[{b}] backfilled"
        );
        let claimed = store
            .step_claim("m-test", &["m@1".to_owned()], 8)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "[{b}]");
    }
}

/// The child engine. Ignored in normal runs; the test above starts it in a subprocess. It
/// prints `READY`, waits for a line on stdin, starts an engine on the fresh database, submits
/// orders `index * ORDERS_EACH ..` (keyed, so they never collide with another child's),
/// waits for each to complete, prints `DONE` and shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as the concurrent first start test's child process"]
async fn child_engine() {
    if std::env::var("SAGAFLOW_FIRST_START_CHILD").as_deref() != Ok("1") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let index: usize = var("SAGAFLOW_FIRST_START_INDEX").parse().expect("index");
    let services = Services::default();
    let wf = order_saga(OrderApis::from(&services), order_settings(1500, 5)).expect("saga");
    let builder = Engine::builder()
        .with_database_url(var("SAGAFLOW_FIRST_START_DB"))
        .with_instance_id(format!("first-start-{index}"))
        .with_workflow(wf)
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(100))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400));
    // On a line of its own: libtest has printed `test … ` without a newline.
    println!("\nREADY {index}");
    // stdin is read on a blocking thread (the suite's tokio has no `io-std`). The parent
    // writes `go`; if it dies instead, stdin closes and the child stops here.
    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await
    .expect("stdin reader")
    .expect("read stdin");
    assert_eq!(go.trim(), "go", "the parent went away before the start");
    let engine = builder.start().await.expect("child engine start");
    let from = index * ORDERS_EACH;
    let mut ids = Vec::new();
    for n in from..from + ORDERS_EACH {
        ids.push(submit_order(&engine, n).await.0);
    }
    for id in ids {
        let run = engine
            .wait(id, Duration::from_secs(60))
            .await
            .expect("run ended");
        assert_eq!(run.state, RunState::Completed, "run {id}: {:?}", run.error);
    }
    println!("DONE {index}");
    engine.shutdown().await;
}

/// Engines that start at the same moment with the same workflows, registered in opposite
/// orders, all start: each publishes its definitions (and resources) in key order, so two
/// starts lock the rows in the same order and never deadlock (PostgreSQL would abort one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_starting_at_once_with_workflows_in_opposite_orders_all_start() {
    use sagaflow::{Resource, StepContext, StepError, Workflow};
    const WORKFLOWS: usize = 24;
    let flow = |i: usize| {
        Workflow::builder(format!("w{i:02}"), 1)
            .step("only", |_: StepContext| async { Ok::<_, StepError>(()) })
            .resource(format!("r{i:02}"))
            .build()
            .expect("valid")
    };
    for db in backends().await {
        let b = db.backend;
        // Published once, so that the concurrent starts update rows that exist.
        let first = sagaflow_testkit::fast_builder(&db)
            .with_workers(false)
            .with_supervisor(false);
        let first = (0..WORKFLOWS).fold(first, |e, i| {
            e.with_workflow(flow(i))
                .with_resource(Resource::new(format!("r{i:02}")).max_in_flight(4))
        });
        first.start().await.expect("first").shutdown().await;
        for round in 0..3 {
            let starts = (0..4).map(|k| {
                let mut order: Vec<usize> = (0..WORKFLOWS).collect();
                if k % 2 == 1 {
                    order.reverse();
                }
                let e = order.into_iter().fold(
                    sagaflow_testkit::fast_builder(&db)
                        .with_workers(false)
                        .with_supervisor(false),
                    |e, i| {
                        e.with_workflow(flow(i))
                            .with_resource(Resource::new(format!("r{i:02}")).max_in_flight(4))
                    },
                );
                e.start()
            });
            let engines = futures_util::future::join_all(starts).await;
            for (k, e) in engines.into_iter().enumerate() {
                let e = e.unwrap_or_else(|e| panic!("[{b}] round {round}, engine {k}: {e}"));
                e.shutdown().await;
            }
        }
    }
}
