//! The claim: many concurrent claimers, every step claimed exactly once (AT-3, AT-7, SAS-7).
//!
//! Claimers log the ids they took; the logs must hold every step exactly once. The
//! full-size variants spread 100 claimers over several real processes (the suite binary
//! re-runs itself as `claim::child_claimers`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sagaflow::internals::store;
use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, TransactionTrait};
use sagaflow_testkit::{ChildTest, TestDb, backends};
use uuid::Uuid;

const KEY: &str = "claim@1";

/// Queues `n` single-step runs of `claim@1`, 5,000 per transaction.
async fn seed(store: &Store, n: usize) {
    let mut left = n;
    while left > 0 {
        let k = left.min(5_000);
        let runs: Vec<store::NewRun> = (0..k)
            .map(|_| {
                let id = Uuid::now_v7();
                store::NewRun {
                    id,
                    workflow: "claim".into(),
                    version: 1,
                    business_key: None,
                    input: "null".into(),
                    priority: 0,
                    retry_priority: 0,
                    notify: false,
                    start: store::RunStart::Now,
                    trace: None,
                    flow_key: None,
                    steps: vec![store::NewStep {
                        name: "only".into(),
                        max_failures: 3,
                        max_interruptions: 5,
                        deadline_ms: 600_000,
                        deadline_cap_ms: 600_000,
                        idempotency_key: format!("{id}:only"),
                        ready: true,
                        resource: None,
                    }],
                }
            })
            .collect();
        let txn = store.connection().begin().await.expect("begin");
        store.run_insert_many(&txn, &runs).await.expect("insert");
        txn.commit().await.expect("commit");
        left -= k;
    }
    assert_eq!(store.step_queue_depth().await.expect("depth"), n as i64);
}

/// Runs `workers` claimers in this process until the queue is empty; returns each one's log.
async fn claim_until_empty(store: &Store, workers: usize, tag: &str) -> Vec<Vec<i64>> {
    let keys = Arc::new(vec![KEY.to_owned()]);
    let mut tasks = Vec::with_capacity(workers);
    for c in 0..workers {
        let (store, keys, owner) = (store.clone(), keys.clone(), format!("{tag}-{c}"));
        tasks.push(tokio::spawn(async move {
            let mut log = Vec::new();
            let mut timeouts = 0;
            loop {
                // Like the engine's claim loop, a claim that failed is paused and asked
                // again. On PostgreSQL, SKIP LOCKED does not skip the wait for a newer
                // version of a row that another claimer is writing, and on a loaded machine
                // a hundred claimers can queue behind each other past `lock_timeout`; on
                // SQLite, where claimers in several processes take the file's write lock in
                // turn, past the busy timeout (`SQLITE_BUSY`). A transient error, bounded
                // here, that claims nothing.
                let batch = match store.step_claim(&owner, &keys, 25).await {
                    Ok(batch) => batch,
                    Err(e)
                        if timeouts < 10
                            && (e.sqlstate().as_deref() == Some("55P03")
                                || e.sqlite_code().is_some_and(|c| c & 0xff == 5)) =>
                    {
                        timeouts += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                    Err(e) => panic!("claim: {e:?}"),
                };
                if batch.is_empty() {
                    return log;
                }
                for s in batch {
                    assert_eq!(s.attempt, 1, "step {} claimed a second time", s.id);
                    log.push(s.id);
                }
            }
        }));
    }
    let mut logs = Vec::with_capacity(workers);
    for t in tasks {
        logs.push(
            tokio::time::timeout(Duration::from_secs(300), t)
                .await
                .expect("claimers finish")
                .expect("claimer"),
        );
    }
    logs
}

fn check(logs: &[Vec<i64>], n: usize, backend: &str) {
    let all: Vec<i64> = logs.iter().flatten().copied().collect();
    let unique: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(all.len(), n, "[{backend}] claims logged");
    assert_eq!(unique.len(), n, "[{backend}] a step was claimed twice");
    let busy = logs.iter().filter(|l| !l.is_empty()).count();
    assert!(
        busy > 1,
        "[{backend}] claims were spread over claimers ({busy} busy)"
    );
}

/// Runs the claim in `processes` child processes with `workers` claimers each.
async fn claim_in_processes(db: &TestDb, processes: usize, workers: usize) -> Vec<Vec<i64>> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut children = Vec::new();
    for p in 0..processes {
        let out = dir.path().join(format!("claims-{p}.log"));
        let child = ChildTest::spawn(
            "claim::child_claimers",
            &[
                ("SAGAFLOW_CLAIM_CHILD", "1".into()),
                ("SAGAFLOW_CLAIM_DB", db.url.clone()),
                ("SAGAFLOW_CLAIM_WORKERS", workers.to_string()),
                ("SAGAFLOW_CLAIM_TAG", format!("p{p}")),
                ("SAGAFLOW_CLAIM_OUT", out.display().to_string()),
            ],
        );
        children.push((child, out));
    }
    let mut logs = Vec::new();
    for (child, out) in children {
        let (status, _) = child.finish(Duration::from_secs(300)).await;
        assert!(
            status.success(),
            "[{}] claimer process failed: {status}",
            db.backend
        );
        let text = std::fs::read_to_string(&out).expect("claim log");
        for line in text.lines() {
            let (_, ids) = line.split_once(':').expect("`worker: ids`");
            logs.push(
                ids.split_whitespace()
                    .map(|i| i.parse().expect("id"))
                    .collect(),
            );
        }
    }
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_steps_fifty_claimers_each_step_claimed_exactly_once() {
    for db in backends().await {
        let store = Store::connect(&db.url, Some(60)).await.expect("connect");
        seed(&store, 10_000).await;
        let logs = claim_until_empty(&store, 50, "claimer").await;
        check(&logs, 10_000, db.backend);
        assert_eq!(store.step_queue_depth().await.expect("depth"), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_size_claim_on_postgres_100k_steps_100_workers_over_4_processes() {
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    let store = Store::connect(&db.url, Some(4)).await.expect("connect");
    seed(&store, 100_000).await;
    let logs = claim_in_processes(&db, 4, 25).await;
    assert_eq!(logs.len(), 100);
    check(&logs, 100_000, db.backend);
    assert_eq!(store.step_queue_depth().await.expect("depth"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_size_claim_on_sqlite_in_one_process_and_in_two_processes_on_one_file() {
    let db = sagaflow_testkit::sqlite_db();
    let store = Store::connect(&db.url, None).await.expect("connect");
    seed(&store, 100_000).await;
    let logs = claim_until_empty(&store, 100, "one").await;
    check(&logs, 100_000, "sqlite, 1 process");
    drop(store);

    let db = sagaflow_testkit::sqlite_db();
    let store = Store::connect(&db.url, None).await.expect("connect");
    seed(&store, 100_000).await;
    let logs = claim_in_processes(&db, 2, 50).await;
    assert_eq!(logs.len(), 100);
    check(&logs, 100_000, "sqlite, 2 processes");
}

/// A claimer process. Ignored in normal runs; the full-size claim tests start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as a child process of the full-size claim tests"]
async fn child_claimers() {
    if std::env::var("SAGAFLOW_CLAIM_CHILD").as_deref() != Ok("1") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let workers: usize = var("SAGAFLOW_CLAIM_WORKERS").parse().expect("workers");
    let store = Store::connect(
        &var("SAGAFLOW_CLAIM_DB"),
        Some(u32::try_from(workers).unwrap_or(25).min(30)),
    )
    .await
    .expect("connect");
    let logs = claim_until_empty(&store, workers, &var("SAGAFLOW_CLAIM_TAG")).await;
    let mut text = String::new();
    for (w, log) in logs.iter().enumerate() {
        let ids: Vec<String> = log.iter().map(i64::to_string).collect();
        text.push_str(&format!("{w}: {}\n", ids.join(" ")));
    }
    std::fs::write(var("SAGAFLOW_CLAIM_OUT"), text).expect("write claim log");
}

/// A claim brings what its steps need: the run's input for every step, the outputs of the
/// run's completed steps for a step that depends on them, none for one that does not. On
/// PostgreSQL the claim and these reads are one statement; the answer is the same on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_brings_the_runs_input_and_the_outputs_its_steps_need() {
    for db in backends().await {
        let store = Store::connect(&db.url, Some(60)).await.expect("connect");
        let b = db.backend;
        let step = |name: &str, id: Uuid, ready: bool| store::NewStep {
            name: name.into(),
            max_failures: 3,
            max_interruptions: 5,
            deadline_ms: 600_000,
            deadline_cap_ms: 600_000,
            idempotency_key: format!("{id}:{name}"),
            ready,
            resource: None,
        };
        let (a, z) = (Uuid::now_v7(), Uuid::now_v7());
        let runs: Vec<store::NewRun> = [(a, r#"{"order":"a"}"#), (z, r#"{"order":"z"}"#)]
            .into_iter()
            .map(|(id, input)| store::NewRun {
                id,
                workflow: "claim".into(),
                version: 1,
                business_key: None,
                input: input.into(),
                priority: 0,
                retry_priority: 0,
                notify: false,
                start: store::RunStart::Now,
                trace: None,
                flow_key: None,
                steps: vec![step("first", id, true), step("second", id, false)],
            })
            .collect();
        let txn = store.connection().begin().await.expect("begin");
        store.run_insert_many(&txn, &runs).await.expect("insert");
        txn.commit().await.expect("commit");
        let keys = vec![KEY.to_owned()];
        let needs = |c: &store::ClaimedStep| c.name == "second";

        let (claimed, inputs) = store
            .step_claim_with_inputs("w", &keys, 10, needs)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 2, "[{b}] both first steps");
        assert!(
            claimed.iter().all(|c| c.name == "first"),
            "[{b}] {claimed:?}"
        );
        assert_eq!(inputs.inputs[&a], r#"{"order":"a"}"#, "[{b}]");
        assert_eq!(inputs.inputs[&z], r#"{"order":"z"}"#, "[{b}]");
        assert!(inputs.outputs.is_empty(), "[{b}] {:?}", inputs.outputs);

        // Run `a`'s first step completes with an output and its second becomes ready; run
        // `z` is left as it is.
        for sql in [
            "UPDATE sagaflow_steps SET state = 'completed', output = '{\"reserved\":3}', \
             locked_by = NULL WHERE name = 'first' AND run_id = $1",
            "UPDATE sagaflow_steps SET state = 'ready', available_at = 0 \
             WHERE name = 'second' AND run_id = $1",
        ] {
            store
                .connection()
                .execute_raw(sagaflow::sea_orm::Statement::from_sql_and_values(
                    store.connection().get_database_backend(),
                    sql.replace("$1", if b == "postgres" { "$1" } else { "?" }),
                    [a.into()],
                ))
                .await
                .expect("move run a on");
        }
        let (claimed, inputs) = store
            .step_claim_with_inputs("w", &keys, 10, needs)
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1, "[{b}] {claimed:?}");
        assert_eq!((claimed[0].run_id, claimed[0].name.as_str()), (a, "second"));
        assert_eq!(inputs.inputs[&a], r#"{"order":"a"}"#, "[{b}]");
        assert_eq!(
            inputs
                .outputs
                .get(&(a, "first".to_owned()))
                .map(String::as_str),
            Some(r#"{"reserved":3}"#),
            "[{b}]"
        );
        assert_eq!(inputs.outputs.len(), 1, "[{b}] {:?}", inputs.outputs);
    }
}
