//! Idempotent intake: a business key returns the run that holds it, active or finished, for
//! as long as the workflow's key policy says; a unique index keeps it so under concurrency.

use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Statement, TransactionTrait};
use sagaflow::{
    Engine, Error, KeyPolicy, OnDuplicate, RunState, StartOptions, StepContext, StepError, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Job {
    fail: bool,
}

/// One step that succeeds, or is refused (nothing to undo: the run ends `Compensated`).
fn job(policy: KeyPolicy) -> Workflow {
    Workflow::builder("job", 1)
        .input::<Job>()
        .business_keys(policy)
        .step("only", |ctx: StepContext| async move {
            let job: Job = ctx.input()?;
            if job.fail {
                Err(StepError::refused("declined", "refused"))
            } else {
                Ok("done")
            }
        })
        .build()
        .expect("valid")
}

async fn finish(engine: &Engine, key: &str, fail: bool, backend: &str) -> sagaflow::Started {
    let started = engine
        .start_with("job", &Job { fail }, StartOptions::keyed(key))
        .await
        .expect("start");
    let end = if fail {
        RunState::Compensated
    } else {
        RunState::Completed
    };
    expect_state(engine, started.id, end, backend).await;
    started
}

async fn runs_with_key(engine: &Engine, key: &str) -> i64 {
    let conn = engine.connection();
    let sql = format!("SELECT COUNT(*) AS n FROM sagaflow_runs_all WHERE business_key = '{key}'");
    let row = conn
        .query_one_raw(Statement::from_string(conn.get_database_backend(), sql))
        .await
        .expect("count")
        .expect("row");
    row.try_get::<i64>("", "n").expect("n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_key_resubmitted_after_the_run_finished_returns_that_run() {
    for db in backends().await {
        let engine = sagaflow_testkit::engine(&db, vec![job(KeyPolicy::default())]).await;
        let first = finish(&engine, "o-1", false, db.backend).await;
        let again = engine
            .start_with("job", &Job { fail: false }, StartOptions::keyed("o-1"))
            .await
            .expect("resubmit");
        assert_eq!(
            (again.id, again.created, again.state),
            (first.id, false, RunState::Completed),
            "[{}] no second run for a finished order",
            db.backend
        );
        let err = engine
            .start_with(
                "job",
                &Job { fail: false },
                StartOptions::keyed("o-1").on_duplicate(OnDuplicate::Reject),
            )
            .await
            .expect_err("reject");
        assert!(
            matches!(err, Error::DuplicateKey { existing, state: RunState::Completed, .. } if existing == first.id),
            "[{}] {err}",
            db.backend
        );
        let found = engine.run_by_key("job", "o-1").await.expect("lookup");
        assert_eq!(
            found.map(|r| (r.id, r.state)),
            Some((first.id, RunState::Completed))
        );
        assert!(
            engine
                .run_by_key("job", "o-2")
                .await
                .expect("lookup")
                .is_none()
        );
        assert_eq!(runs_with_key(&engine, "o-1").await, 1, "[{}]", db.backend);

        // Starting inside the caller's transaction follows the same rule.
        let txn = engine.connection().begin().await.expect("begin");
        let inside = engine
            .start_in(
                &txn,
                "job",
                &Job { fail: false },
                StartOptions::keyed("o-1"),
            )
            .await
            .expect("start_in");
        txn.commit().await.expect("commit");
        assert_eq!((inside.id, inside.created), (first.id, false));
        engine.shutdown().await;
    }
}

async fn two_engines(db: &TestDb) -> (Engine, Engine) {
    let start = |id: &str| {
        fast_builder(db)
            .with_workflow(job(KeyPolicy::default()))
            .with_instance_id(id)
            .start()
    };
    (
        start("key-a").await.expect("engine a"),
        start("key-b").await.expect("engine b"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_key_concurrent_starts_on_two_instances_create_one_run() {
    for db in backends().await {
        sagaflow_testkit::init_logging();
        let (a, b) = two_engines(&db).await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..32 {
            let engine = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.spawn(async move {
                engine
                    .start_with("job", &Job { fail: false }, StartOptions::keyed("race"))
                    .await
            });
        }
        let mut ids = Vec::new();
        let mut created = 0;
        while let Some(r) = tasks.join_next().await {
            let started = r.expect("task").expect("start");
            created += usize::from(started.created);
            ids.push(started.id);
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(
            ids.len(),
            1,
            "[{}] every caller got the same run",
            db.backend
        );
        assert_eq!(created, 1, "[{}] exactly one start created it", db.backend);
        assert_eq!(runs_with_key(&a, "race").await, 1, "[{}]", db.backend);
        expect_state(&a, ids[0], RunState::Completed, db.backend).await;
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_key_policies_decide_when_a_key_is_free_again() {
    for db in backends().await {
        // Taken while active only: a finished run frees its key.
        let engine = sagaflow_testkit::engine(&db, vec![job(KeyPolicy::WhileActive)]).await;
        let first = finish(&engine, "k", false, db.backend).await;
        let second = finish(&engine, "k", false, db.backend).await;
        assert!(second.created && second.id != first.id, "[{}]", db.backend);
        let newest = engine.run_by_key("job", "k").await.expect("lookup");
        assert_eq!(newest.map(|r| r.id), Some(second.id), "the newest run");
        engine.shutdown().await;
    }
    for db in backends().await {
        // A run that failed (compensated) frees its key; a completed one does not.
        let engine = sagaflow_testkit::engine(&db, vec![job(KeyPolicy::AllowAfterFailure)]).await;
        let failed = finish(&engine, "k", true, db.backend).await;
        let retried = finish(&engine, "k", false, db.backend).await;
        assert!(
            retried.created && retried.id != failed.id,
            "[{}]",
            db.backend
        );
        let again = engine
            .start_with("job", &Job { fail: false }, StartOptions::keyed("k"))
            .await
            .expect("start");
        assert_eq!(
            (again.id, again.created),
            (retried.id, false),
            "[{}] a completed run keeps its key",
            db.backend
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_key_is_freed_when_its_run_is_purged() {
    for db in backends().await {
        let engine = sagaflow_testkit::engine(&db, vec![job(KeyPolicy::WhileRetained)]).await;
        let first = finish(&engine, "p", false, db.backend).await;
        // Retention with a zero age: purged as soon as the database clock moved on.
        eventually(
            Duration::from_secs(5),
            "the finished run to be purged",
            || async {
                engine
                    .store()
                    .run_purge_finished(0, 100)
                    .await
                    .expect("purge")
                    > 0
            },
        )
        .await;
        let next = engine
            .start_with("job", &Job { fail: false }, StartOptions::keyed("p"))
            .await
            .expect("start");
        assert!(next.created && next.id != first.id, "[{}]", db.backend);
        assert_ne!(next.id, Uuid::nil());
        expect_state(&engine, next.id, RunState::Completed, db.backend).await;
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_key_overlapping_batches_on_two_instances_all_succeed() {
    const KEYS: usize = 16;
    for db in backends().await {
        sagaflow_testkit::init_logging();
        let (a, b) = two_engines(&db).await;
        let mut tasks = tokio::task::JoinSet::new();
        // Each instance group-commits its starts; the two walk the keys in opposite orders,
        // so their batches overlap with the keys in different orders.
        for round in 0..4 {
            for k in 0..KEYS {
                for (engine, key) in [(a.clone(), k), (b.clone(), KEYS - 1 - k)] {
                    tasks.spawn(async move {
                        let key = format!("o-{key}");
                        let started = engine
                            .start_with("job", &Job { fail: false }, StartOptions::keyed(&key))
                            .await;
                        (key, round, started)
                    });
                }
            }
        }
        let mut ids: std::collections::HashMap<String, Uuid> = std::collections::HashMap::new();
        while let Some(r) = tasks.join_next().await {
            let (key, round, started) = r.expect("task");
            let started =
                started.unwrap_or_else(|e| panic!("[{}] {key} round {round}: {e}", db.backend));
            let first = *ids.entry(key.clone()).or_insert(started.id);
            assert_eq!(
                first, started.id,
                "[{}] one run per key ({key})",
                db.backend
            );
        }
        assert_eq!(ids.len(), KEYS);
        for key in ids.keys() {
            assert_eq!(runs_with_key(&a, key).await, 1, "[{}] {key}", db.backend);
        }
        a.shutdown().await;
        b.shutdown().await;
    }
}
