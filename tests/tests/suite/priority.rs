//! Priorities, on both backends: higher-priority runs are claimed first; a workflow's default
//! priority applies to runs started without one and a start's priority overrides it; a retry
//! lane puts retried steps ahead of or behind new work, computed from the run's priority so
//! retries never accumulate; and aging lets a low-priority run through a sustained load of
//! higher-priority work, which without aging it waits out entirely.
//!
//! Claim orders are read with one engine claiming one step at a time, after the runs were
//! queued while no worker ran.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, DbBackend, Statement};
use sagaflow::{
    Engine, PRIORITY_MAX, PRIORITY_MIN, RetryLane, RetryPolicy, RunState, StartOptions,
    StepContext, StepError, Uuid, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Tag {
    tag: String,
}

fn tag(t: &str) -> Tag {
    Tag { tag: t.to_owned() }
}

/// What the steps of a test ran, in order: `tag` or `tag:attempt`.
type Log = Arc<Mutex<Vec<String>>>;

fn entries(log: &Log) -> Vec<String> {
    log.lock().expect("log").clone()
}

/// `name@1`: one step that appends the run's tag to `log`.
fn tagged(name: &str, log: &Log, priority: i32) -> Workflow {
    let log = log.clone();
    Workflow::builder(name, 1)
        .input::<Tag>()
        .priority(priority)
        .step("only", move |ctx: StepContext| {
            let log = log.clone();
            async move {
                let t: Tag = ctx.input()?;
                log.lock().expect("log").push(t.tag);
                Ok::<_, StepError>(())
            }
        })
        .build()
        .expect("valid")
}

/// A builder that claims one step at a time, without aging (unless a test turns it on).
fn one_at_a_time(db: &TestDb) -> sagaflow::EngineBuilder {
    fast_builder(db)
        .with_claim_batch(1)
        .with_max_in_flight(1)
        .with_priority_aging(None)
}

/// Queues runs with a client-only engine (nothing is claimed), then runs them with one
/// engine claiming one step at a time; returns what ran, in order, and the runs' ids.
async fn claim_order(
    db: &TestDb,
    workflows: impl Fn() -> Vec<Workflow>,
    runs: &[(&str, &str, Option<i32>)],
    log: &Log,
) -> Vec<Uuid> {
    let b = db.backend;
    let mut client = fast_builder(db).with_workers(false);
    for wf in workflows() {
        client = client.with_workflow(wf);
    }
    let client = client.start().await.expect("client");
    let mut ids = Vec::new();
    for (workflow, t, priority) in runs {
        let opts = StartOptions {
            priority: *priority,
            ..StartOptions::default()
        };
        let started = client
            .start_with(workflow, &tag(t), opts)
            .await
            .expect("start");
        ids.push(started.id);
    }
    client.shutdown().await;
    let mut worker = one_at_a_time(db);
    for wf in workflows() {
        worker = worker.with_workflow(wf);
    }
    let worker = worker.start().await.expect("worker");
    for id in &ids {
        expect_state(&worker, *id, RunState::Completed, b).await;
    }
    worker.shutdown().await;
    assert_eq!(entries(log).len(), runs.len(), "[{b}] each ran once");
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_higher_priority_runs_are_claimed_first() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let runs = [
            ("plain", "a", None),
            ("plain", "low", Some(-5)),
            ("plain", "b", None),
            ("plain", "high", Some(10)),
            ("plain", "c", Some(0)),
            ("plain", "top", Some(PRIORITY_MAX)),
        ];
        claim_order(&db, || vec![tagged("plain", &log, 0)], &runs, &log).await;
        assert_eq!(
            entries(&log),
            ["top", "high", "a", "b", "c", "low"],
            "[{b}] by priority, then in the order queued"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_a_workflows_default_applies_unless_the_start_gives_one() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let workflows = || vec![tagged("plain", &log, 0), tagged("urgent", &log, 5)];
        let runs = [
            ("plain", "plain-a", None),
            ("urgent", "urgent", None),
            ("urgent", "urgent-demoted", Some(-1)),
            ("plain", "plain-top", Some(9)),
            ("plain", "plain-b", None),
        ];
        let ids = claim_order(&db, workflows, &runs, &log).await;
        assert_eq!(
            entries(&log),
            [
                "plain-top",
                "urgent",
                "plain-a",
                "plain-b",
                "urgent-demoted"
            ],
            "[{b}] the workflow's default between the explicit priorities"
        );
        let engine = one_at_a_time(&db)
            .with_workers(false)
            .with_workflow(tagged("plain", &log, 0))
            .with_workflow(tagged("urgent", &log, 5))
            .start()
            .await
            .expect("reader");
        let mut priorities = Vec::new();
        for id in ids {
            priorities.push(engine.run(id).await.expect("read").expect("run").priority);
        }
        assert_eq!(priorities, [0, 5, -1, 9, 0], "[{b}] as stored on the runs");
        engine.shutdown().await;
    }
}

/// `lane_<name>@1`: one step that logs `<name>:<attempt>`; its first attempt never answers
/// (an interruption re-queues it when its engine stops), later ones succeed.
fn stuck_once(name: &'static str, lane: RetryLane, log: &Log) -> Workflow {
    let log = log.clone();
    Workflow::builder(format!("lane_{name}"), 1)
        .retries(lane)
        .step("work", move |ctx: StepContext| {
            let log = log.clone();
            async move {
                log.lock()
                    .expect("log")
                    .push(format!("{name}:{}", ctx.attempt()));
                if ctx.attempt() == 1 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, StepError>(())
            }
        })
        .build()
        .expect("valid")
}

/// The priority stored on each step row of a run.
async fn step_priorities(engine: &Engine, run: Uuid) -> Vec<i32> {
    let conn = engine.connection();
    let backend = conn.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => "SELECT priority FROM sagaflow_steps WHERE run_id = $1 ORDER BY id",
        _ => "SELECT priority FROM sagaflow_steps WHERE run_id = ? ORDER BY id",
    };
    let rows = conn
        .query_all_raw(Statement::from_sql_and_values(backend, sql, [run.into()]))
        .await
        .expect("step rows");
    rows.iter()
        .map(|r| r.try_get::<i32>("", "priority").expect("priority"))
        .collect()
}

/// Waits until the database's clock is past its reading now (due times are milliseconds).
async fn clock_moves_on(engine: &sagaflow::Engine) {
    let then = engine.store().now_ms().await.expect("clock");
    eventually(
        Duration::from_secs(5),
        "the database clock moves on",
        || async {
            engine
                .store()
                .now_ms()
                .await
                .is_ok_and(|now| now > then + 1)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_retry_lanes_put_retried_steps_ahead_of_or_behind_new_work() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let lanes = || {
            vec![
                stuck_once("ahead", RetryLane::Ahead, &log),
                stuck_once("same", RetryLane::Same, &log),
                stuck_once("behind", RetryLane::Behind, &log),
            ]
        };
        let builder = |b: sagaflow::EngineBuilder| {
            lanes()
                .into_iter()
                .fold(b, sagaflow::EngineBuilder::with_workflow)
                .with_workflow(tagged("plain", &log, 0))
        };
        // Three slots, taken by the three first attempts, which never answer. This engine
        // knows only the lanes' workflows: it claims none of the new work.
        let first = lanes()
            .into_iter()
            .fold(fast_builder(&db), sagaflow::EngineBuilder::with_workflow)
            .with_max_in_flight(3)
            .with_priority_aging(None)
            .start()
            .await
            .expect("first engine");
        let client = builder(fast_builder(&db).with_workers(false))
            .start()
            .await
            .expect("client");
        let mut stuck = Vec::new();
        for lane in ["ahead", "same", "behind"] {
            let workflow = format!("lane_{lane}");
            stuck.push(first.start(&workflow, &()).await.expect("start"));
        }
        eventually(Duration::from_secs(20), "three first attempts", || async {
            entries(&log).len() == 3
        })
        .await;
        // New work queued before the retries.
        let mut ids = Vec::new();
        for t in ["old-1", "old-2"] {
            ids.push(client.start("plain", &tag(t)).await.expect("start"));
        }
        // Due times tie at the millisecond: the database's clock moves on before the retries
        // are queued, so that "old" work is older by its due time, whatever the machine.
        clock_moves_on(&client).await;
        // Stopping interrupts the three attempts: each step is queued again, a retry.
        first.shutdown().await;
        clock_moves_on(&client).await;
        let mut ran = entries(&log);
        ran.sort();
        assert_eq!(
            ran,
            ["ahead:1", "behind:1", "same:1"],
            "[{b}] nothing else ran"
        );
        let expected = [[1], [0], [-1]];
        for (run, want) in stuck.iter().zip(expected) {
            assert_eq!(
                step_priorities(&client, *run).await,
                want,
                "[{b}] the run's priority moved by its lane"
            );
        }
        // New work queued after the retries.
        for t in ["new-1", "new-2"] {
            ids.push(client.start("plain", &tag(t)).await.expect("start"));
        }
        // The release marked the three runs for evaluation, which moves nothing of theirs
        // (their steps are queued). A claim skips the steps of a run while it is evaluated
        // (docs/reliability.md): unmarked, so that the worker's first claims see every
        // queued step and the order is the claim's alone.
        for run in &stuck {
            let conn = client.connection();
            conn.execute_raw(sagaflow::sea_orm::Statement::from_sql_and_values(
                conn.get_database_backend(),
                "UPDATE sagaflow_runs SET dirty = FALSE WHERE id = $1",
                [(*run).into()],
            ))
            .await
            .expect("unmark");
        }
        client.shutdown().await;

        log.lock().expect("log").clear();
        let worker = builder(one_at_a_time(&db)).start().await.expect("worker");
        for id in stuck.iter().chain(&ids) {
            expect_state(&worker, *id, RunState::Completed, b).await;
        }
        assert_eq!(
            entries(&log),
            [
                "ahead:2", "old-1", "old-2", "same:2", "new-1", "new-2", "behind:2"
            ],
            "[{b}] ahead before all new work; same in its turn by due time; behind after all"
        );
        worker.shutdown().await;
    }
}

/// `flaky_<name>@1` with `lane`: a step whose first two attempts fail (retryable) and whose
/// third never answers; logs `<name>:<attempt>`.
fn flaky(name: &'static str, lane: RetryLane, log: &Log) -> Workflow {
    let log = log.clone();
    Workflow::builder(format!("flaky_{name}"), 1)
        .retries(lane)
        .default_retry(
            RetryPolicy::default()
                .with_max_failures(5)
                .with_backoff(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .step("work", move |ctx: StepContext| {
            let log = log.clone();
            async move {
                log.lock()
                    .expect("log")
                    .push(format!("{name}:{}", ctx.attempt()));
                if ctx.attempt() >= 3 {
                    std::future::pending::<()>().await;
                }
                Err::<(), _>(StepError::retryable("flaky", "try again").not_applied())
            }
        })
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_a_retry_is_queued_from_its_runs_priority_and_never_accumulates() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let engine = fast_builder(&db)
            .with_workflow(flaky("ahead", RetryLane::Ahead, &log))
            .with_workflow(flaky("behind", RetryLane::Behind, &log))
            .with_priority_aging(None)
            .start()
            .await
            .expect("engine");
        let start = async |workflow: &str, priority: i32| {
            engine
                .start_with(workflow, &(), StartOptions::default().priority(priority))
                .await
                .expect("start")
                .id
        };
        let runs = [
            (start("flaky_ahead", 7).await, 8),
            (start("flaky_ahead", PRIORITY_MAX).await, PRIORITY_MAX),
            (start("flaky_behind", 7).await, 6),
            (start("flaky_behind", PRIORITY_MIN).await, PRIORITY_MIN),
        ];
        // Two failures each, then a third attempt in flight: its row keeps the priority of
        // its last queueing.
        eventually(Duration::from_secs(20), "every third attempt", || async {
            let log = entries(&log);
            ["ahead", "behind"]
                .iter()
                .all(|n| log.iter().filter(|e| *e == &format!("{n}:3")).count() == 2)
        })
        .await;
        for (run, want) in runs {
            assert_eq!(
                step_priorities(&engine, run).await,
                [want],
                "[{b}] after two retries: the run's priority moved once, within the range"
            );
        }
        engine.shutdown().await;
    }
}

/// A sustained load of priority-5 runs against one low-priority run, one step at a time.
struct Starvation {
    /// High-priority runs stored so far.
    submitted: AtomicUsize,
    /// High-priority steps that have started.
    started: AtomicUsize,
    /// How many high-priority runs were stored and not yet started when the low one ran.
    queued_when_low_ran: Mutex<Option<usize>>,
}

/// `job@1`: a step of 10 ms of work that counts the high-priority steps and, for the run
/// tagged `low`, notes how much high-priority work was still queued.
fn job(load: &Arc<Starvation>) -> Workflow {
    let load = load.clone();
    Workflow::builder("job", 1)
        .input::<Tag>()
        .step("work", move |ctx: StepContext| {
            let load = load.clone();
            async move {
                let t: Tag = ctx.input()?;
                if t.tag == "low" {
                    let queued =
                        load.submitted.load(Ordering::SeqCst) - load.started.load(Ordering::SeqCst);
                    *load.queued_when_low_ran.lock().expect("note") = Some(queued);
                } else {
                    load.started.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok::<_, StepError>(())
            }
        })
        .build()
        .expect("valid")
}

/// High-priority work kept queued (`QUEUED` runs ahead of the engine) until `cap` runs were
/// stored or the low-priority run ran; returns how much was queued when it ran.
async fn starve(db: &TestDb, aging: Option<Duration>, cap: usize) -> (usize, Engine) {
    const QUEUED: usize = 40;
    let b = db.backend;
    let load = Arc::new(Starvation {
        submitted: AtomicUsize::new(0),
        started: AtomicUsize::new(0),
        queued_when_low_ran: Mutex::new(None),
    });
    let engine = one_at_a_time(db)
        .with_priority_aging(aging)
        .with_workflow(job(&load))
        .start()
        .await
        .expect("engine");
    let high = StartOptions::default().priority(5);
    for _ in 0..QUEUED {
        engine
            .start_with("job", &tag("high"), high.clone())
            .await
            .expect("start");
        load.submitted.fetch_add(1, Ordering::SeqCst);
    }
    let low = engine.start("job", &tag("low")).await.expect("start low");
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = tokio::spawn({
        let (engine, load, stop, high) = (engine.clone(), load.clone(), stop.clone(), high);
        async move {
            while !stop.load(Ordering::SeqCst) && load.submitted.load(Ordering::SeqCst) < cap {
                let queued =
                    load.submitted.load(Ordering::SeqCst) - load.started.load(Ordering::SeqCst);
                if queued >= QUEUED {
                    // The load generator's pace, not a wait for the outcome.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                engine
                    .start_with("job", &tag("high"), high.clone())
                    .await
                    .expect("start");
                load.submitted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    expect_state(&engine, low, RunState::Completed, b).await;
    stop.store(true, Ordering::SeqCst);
    feeder.await.expect("feeder");
    let queued = load
        .queued_when_low_ran
        .lock()
        .expect("note")
        .expect("the low run noted the queue");
    (queued, engine)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_priority_aging_lets_a_low_priority_run_through_sustained_high_load() {
    for db in backends().await {
        let b = db.backend;
        // A cap the engine cannot reach in the wait for the low run: without aging the
        // wait would time out.
        let (queued, engine) = starve(&db, Some(Duration::from_millis(150)), 100_000).await;
        assert!(
            queued >= 10,
            "[{b}] only {queued} high-priority runs were queued when the low one ran: the load was not sustained"
        );
        let stats = engine.supervisor().expect("a supervisor").stats();
        assert!(stats.aged > 0, "[{b}] the aging service raised no step");
        let ready = engine.stats().await.expect("stats").ready;
        assert!(ready > 0, "[{b}] high-priority work still queued");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_priority_without_aging_a_low_priority_run_waits_for_all_higher_work() {
    for db in backends().await {
        let b = db.backend;
        let (queued, engine) = starve(&db, None, 150).await;
        assert_eq!(
            queued, 0,
            "[{b}] without aging the low run ran while high-priority work was queued"
        );
        let stats = engine.supervisor().expect("a supervisor").stats();
        assert_eq!(stats.aged, 0, "[{b}] aging is off");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_aging_reads_its_index_on_both_backends() {
    for db in backends().await {
        let b = db.backend;
        let store = Store::connect(&db.url, Some(2)).await.expect("store");
        let plan = store.step_age_plan().await.expect("plan");
        assert!(
            plan.iter().any(|l| l.contains("sagaflow_steps_aging")),
            "[{b}] the aging statement does not read its index:\n{}",
            plan.join("\n")
        );
    }
}

/// The migration that adds the retry priority and the aging mark goes down and up again:
/// down, both columns and the aging index are gone; up again, a stored step's retry priority
/// is its priority and its wait counts from when it fell due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_the_retry_lane_and_aging_migration_goes_down_and_up_again() {
    use sagaflow::internals::store::{NewRun, NewStep, RunStart};
    use sagaflow_migrations::Migrator;
    use sea_orm_migration::MigratorTrait;

    for db in backends().await {
        let b = db.backend;
        let store = Store::connect(&db.url, Some(2)).await.expect("first start");
        let id = Uuid::now_v7();
        let run = NewRun {
            id,
            workflow: "m".into(),
            version: 1,
            business_key: None,
            input: "null".into(),
            priority: 5,
            retry_priority: 6,
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
        let marks = "SELECT CAST(retry_priority AS TEXT) || ' ' || \
                     CAST(aging_from = available_at AS TEXT) FROM sagaflow_steps";
        let index = if b == "postgres" {
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'sagaflow_steps_aging'"
        } else {
            "SELECT sql FROM sqlite_master WHERE name = 'sagaflow_steps_aging'"
        };
        let truth = if b == "postgres" { "true" } else { "1" };
        assert_eq!(
            one(marks).await.expect("marks"),
            Some(format!("6 {truth}")),
            "[{b}] as inserted"
        );
        assert!(one(index).await.expect("index").is_some(), "[{b}]");

        // m0015 and the migrations after it go down.
        let from_m0015 = Migrator::migrations()
            .iter()
            .rev()
            .position(|m| m.name() == "m0015_retry_lane_and_aging")
            .expect("m0015 is a migration")
            + 1;
        let from_m0015 = u32::try_from(from_m0015).expect("count");
        Migrator::down(conn, Some(from_m0015)).await.expect("down");
        assert!(one(marks).await.is_err(), "[{b}] the columns are gone");
        assert_eq!(one(index).await.expect("index"), None, "[{b}]");
        drop(store);

        let store = Store::connect(&db.url, Some(2)).await.expect("up again");
        let conn = store.connection();
        let row = conn
            .query_one_raw(Statement::from_string(conn.get_database_backend(), marks))
            .await
            .expect("marks")
            .map(|r| r.try_get_by_index::<String>(0).expect("text"));
        assert_eq!(
            row,
            Some(format!("5 {truth}")),
            "[{b}] backfilled from the priority and the due time"
        );
        // PostgreSQL: the backfill's UPDATE leaves HOT chains, so the index rebuilt after it is
        // usable only by snapshots newer than its creation (`indcheckxmin`); a transaction of
        // any other test still open on the server holds snapshots back for a moment.
        let uses_index = || async {
            store
                .step_age_plan()
                .await
                .is_ok_and(|plan| plan.iter().any(|l| l.contains("sagaflow_steps_aging")))
        };
        eventually(
            Duration::from_secs(20),
            &format!("[{b}] the aging statement uses its index"),
            uses_index,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_priority_runs_started_from_published_definitions_get_the_default_and_lane() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let urgent = || {
            Workflow::builder("urgent", 1)
                .priority(5)
                .retries(RetryLane::Ahead)
                .step("only", |_: StepContext| async { Ok::<_, StepError>(()) })
                .build()
                .expect("valid")
        };
        // The engine with the code publishes the definition, and runs nothing here.
        let coded = fast_builder(&db)
            .with_workflow(urgent())
            .with_workflow(tagged("plain", &log, 0))
            .with_workers(false)
            .start()
            .await
            .expect("engine with the code");
        let description = coded
            .definitions()
            .await
            .expect("definitions")
            .into_iter()
            .find(|d| d.name == "urgent")
            .expect("published")
            .description
            .expect("decodes");
        assert_eq!(
            (description.priority, description.retries.as_str()),
            (5, "ahead"),
            "[{b}]"
        );
        coded.shutdown().await;
        // An engine without the code (as `sagaflow serve` runs) starts from the description.
        let client = fast_builder(&db)
            .with_published_workflows()
            .start()
            .await
            .expect("engine of published workflows");
        let id = client.start("urgent", &()).await.expect("start");
        let run = client.run(id).await.expect("read").expect("run");
        assert_eq!(run.priority, 5, "[{b}] the published default");
        let conn = client.connection();
        let backend = conn.get_database_backend();
        let sql = match backend {
            DbBackend::Postgres => "SELECT retry_priority FROM sagaflow_steps WHERE run_id = $1",
            _ => "SELECT retry_priority FROM sagaflow_steps WHERE run_id = ?",
        };
        let row = conn
            .query_one_raw(Statement::from_sql_and_values(backend, sql, [id.into()]))
            .await
            .expect("step row")
            .expect("a step");
        let retry: i32 = row.try_get("", "retry_priority").expect("retry priority");
        assert_eq!(retry, 6, "[{b}] the published lane");
        client.shutdown().await;
    }
}
