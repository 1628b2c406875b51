//! The bad-input catalogue: one test per way the world hands the engine something broken.
//! Each asserts the typed error or the alert, and that the healthy runs in flight beside it
//! finished normally (a fault costs what it touches, never its neighbours). Select them with
//! `cargo test bad_input`.

use sagaflow::AlertKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use sagaflow::sea_orm::{ConnectionTrait, Database, Statement};
use sagaflow::{Engine, Error, Health, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{
    TestDb, backends, eventually, eventually_some, expect_state, fast_builder, sqlite_db,
};
use sagaflow_workflows::order::ORDER_WORKFLOW;
use uuid::Uuid;

use crate::fixtures::{Log, OrderRig, order_rig, submit_order};

/// Healthy order sagas in flight beside the fault.
struct Neighbours {
    rig: OrderRig,
    ids: Vec<Uuid>,
    backend: &'static str,
}

const NEIGHBOURS: usize = 8;

async fn neighbours(db: &TestDb, first: usize) -> Neighbours {
    let rig = order_rig(db, 2_000, 3).await;
    let mut ids = Vec::new();
    for n in first..first + NEIGHBOURS {
        ids.push(submit_order(&rig.engine, n).await.0);
    }
    Neighbours {
        rig,
        ids,
        backend: db.backend,
    }
}

impl Neighbours {
    /// Every healthy run completed, and the engine is still healthy.
    async fn finished_normally(&self) {
        for id in &self.ids {
            expect_state(&self.rig.engine, *id, RunState::Completed, self.backend).await;
        }
        assert!(
            matches!(self.rig.engine.health(), Health::Running),
            "[{}] the neighbours' engine is {:?}",
            self.backend,
            self.rig.engine.health()
        );
    }

    async fn stop(self) {
        self.rig.engine.shutdown().await;
    }
}

async fn neighbours_finish(db: &TestDb, check: impl AsyncFnOnce(&Neighbours)) {
    let n = neighbours(db, 0).await;
    check(&n).await;
    n.finished_normally().await;
    n.stop().await;
}

/// Starts an engine with one trivial workflow, `w`, on `url`.
async fn start_trivial(url: impl Into<String>) -> Result<Engine, Error> {
    Engine::builder()
        .with_database_url(url)
        .with_workflow(
            Workflow::builder("w", 1)
                .step("a", noop())
                .build()
                .expect("wf"),
        )
        .start()
        .await
}

/// Starts an engine (one trivial workflow) on `url` and returns why it could not start.
async fn start_fails(url: impl Into<String>, why: &str) -> Error {
    start_trivial(url).await.expect_err(why)
}

fn noop()
-> impl Fn(StepContext) -> std::future::Ready<Result<(), StepError>> + Send + Sync + 'static {
    |_| std::future::ready(Ok(()))
}

/// An invalid definition fails at build time naming the problem, while the neighbours run.
async fn definition_refused(builder: fn() -> sagaflow::WorkflowBuilder, names: &str) {
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            let e = builder().build().expect_err("invalid definition");
            assert!(
                matches!(&e, Error::InvalidDefinition { reason, .. } if reason.contains(names)),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_cyclic_graph() {
    definition_refused(
        || {
            Workflow::builder("w", 1)
                .step("a", noop())
                .after(["b"])
                .step("b", noop())
                .after(["a"])
        },
        "cycle",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_duplicate_step() {
    definition_refused(
        || {
            Workflow::builder("w", 1)
                .step("a", noop())
                .step("a", noop())
        },
        "duplicate step name `a`",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_dependency() {
    definition_refused(
        || Workflow::builder("w", 1).step("a", noop()).after(["ghost"]),
        "unknown step `ghost`",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_workflow_at_submit() {
    for db in backends().await {
        neighbours_finish(&db, async |n| {
            let e = n
                .rig
                .engine
                .start("no-such-workflow", &serde_json::json!({}))
                .await
                .expect_err("unknown workflow");
            assert!(
                matches!(&e, Error::WorkflowNotFound(w) if w == "no-such-workflow"),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_input_of_the_wrong_shape() {
    for db in backends().await {
        neighbours_finish(&db, async |n| {
            let e = n
                .rig
                .engine
                .start(ORDER_WORKFLOW, &serde_json::json!({"order_id": 7}))
                .await
                .expect_err("wrong shape");
            assert!(
                matches!(&e, Error::InvalidInput { workflow, .. } if workflow == ORDER_WORKFLOW),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_oversized_input() {
    for db in backends().await {
        neighbours_finish(&db, async |n| {
            // A client of the same database that takes inputs of at most 1 KiB.
            let wf = sagaflow_workflows::order::order_saga(
                sagaflow_workflows::order::OrderApis::from(&n.rig.services),
                crate::fixtures::order_settings(2_000, 3),
            )
            .expect("saga");
            let small = fast_builder(&db)
                .with_workflow(wf)
                .with_max_input_bytes(1024)
                .with_workers(false)
                .start()
                .await
                .expect("start");
            let mut order = sagaflow_workflows::order::Order::sample(900);
            order.address = "x".repeat(4096);
            let e = small
                .start(ORDER_WORKFLOW, &order)
                .await
                .expect_err("oversized");
            assert!(
                matches!(&e, Error::PayloadTooLarge { limit: 1024, size, .. } if *size > 4096),
                "[{}] {e}",
                db.backend
            );
            small.shutdown().await;
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_malformed_url() {
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            for url in [
                "mysql://root@localhost/db",
                "postgres://user:secret@[::1/db",
                "postgres://user:secret@host:notaport/db",
            ] {
                let e = start_fails(url, "malformed URL").await;
                let text = e.to_string();
                assert!(matches!(e, Error::Config(_)), "{url}: {text}");
                assert!(!text.contains("secret"), "the password leaked: {text}");
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unreachable_postgres() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            let url = format!("postgres://sagaflow:hunter2@127.0.0.1:{port}/nowhere");
            let began = Instant::now();
            let e = start_fails(url, "unreachable").await;
            let took = began.elapsed();
            let text = e.to_string();
            assert!(matches!(e, Error::Connect { .. }), "{text}");
            assert!(e.is_connection_lost(), "{text}");
            assert!(
                text.contains(&format!("127.0.0.1:{port}")),
                "names host and port: {text}"
            );
            assert!(
                text.to_lowercase().contains("refused"),
                "keeps the cause: {text}"
            );
            assert!(!text.contains("hunter2"), "the password leaked: {text}");
            assert!(took < Duration::from_secs(3), "took {took:?}");
        })
        .await;
    }
}

/// A URL naming a primary and its standbys: a server that does not answer is passed over for
/// the next; when none is the primary, the error says what each one answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_no_listed_server_is_the_primary() {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port()
    };
    let (a, b) = (free(), free());
    let url = format!("postgres://sagaflow:hunter2@127.0.0.1:{a},127.0.0.1:{b}/nowhere");
    let e = start_fails(url, "no primary").await;
    let text = e.to_string();
    assert!(matches!(e, Error::Connect { .. }), "{text}");
    assert!(e.is_connection_lost(), "{text}");
    for port in [a, b] {
        assert!(
            text.contains(&format!("127.0.0.1:{port}: ")),
            "says what 127.0.0.1:{port} answered: {text}"
        );
    }
    assert!(text.to_lowercase().contains("refused"), "{text}");
    assert!(!text.contains("hunter2"), "the password leaked: {text}");
    // The live primary listed after a dead server is found.
    if let Some(db) = sagaflow_testkit::postgres_db().await {
        let (head, tail) = db.url.split_once('@').expect("user part");
        let url = format!("{head}@127.0.0.1:{a},{tail}");
        let engine = start_trivial(url)
            .await
            .expect("the second server is the primary");
        let run = engine.start("w", &()).await.expect("start");
        assert_eq!(
            engine
                .wait(run, Duration::from_secs(20))
                .await
                .expect("wait")
                .state,
            RunState::Completed
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_read_only_sqlite() {
    let db = sqlite_db();
    // The neighbours write the file; a second engine opens it read-only.
    neighbours_finish(&db, async |_| {
        let url = db.url.replace("mode=rwc", "mode=ro");
        let e = start_fails(url, "read-only").await;
        assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
        assert_eq!(e.sqlite_code().map(|c| c & 0xff), Some(8), "{e}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_sqlite_file_deleted_mid_run() {
    // The neighbours run on their own database; the victim's file is deleted under it.
    let neighbours_db = sqlite_db();
    let n = neighbours(&neighbours_db, 0).await;
    let victim_db = sqlite_db();
    let victim = order_rig(&victim_db, 2_000, 3).await;
    for i in 100..110 {
        submit_order(&victim.engine, i).await;
    }
    let path = victim_db
        .url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .expect("path")
        .to_owned();
    std::fs::remove_file(&path).expect("delete the file");
    let fatal = tokio::time::timeout(Duration::from_secs(5), victim.engine.fatal_error())
        .await
        .expect("the engine notices within 5 s");
    assert!(
        matches!(&fatal, Error::DatabaseLost(why) if why.contains("deleted")),
        "{fatal}"
    );
    assert!(matches!(victim.engine.health(), Health::Failed(_)));
    let e = victim
        .engine
        .start(
            ORDER_WORKFLOW,
            &sagaflow_workflows::order::Order::sample(200),
        )
        .await
        .expect_err("no more starts");
    assert!(matches!(e, Error::DatabaseLost(_)), "{e}");
    victim.engine.shutdown().await;
    n.finished_normally().await;
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_sqlite_file_replaced_mid_run() {
    let neighbours_db = sqlite_db();
    let n = neighbours(&neighbours_db, 0).await;
    let victim_db = sqlite_db();
    let victim = order_rig(&victim_db, 2_000, 3).await;
    let path = victim_db
        .url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .expect("path")
        .to_owned();
    let copy = format!("{path}.copy");
    std::fs::copy(&path, &copy).expect("copy");
    std::fs::rename(&copy, &path).expect("replace");
    let fatal = tokio::time::timeout(Duration::from_secs(5), victim.engine.fatal_error())
        .await
        .expect("the engine notices within 5 s");
    assert!(
        matches!(&fatal, Error::DatabaseLost(why) if why.contains("replaced")),
        "{fatal}"
    );
    victim.engine.shutdown().await;
    n.finished_normally().await;
    n.stop().await;
}

/// Runs `sql` with `$1` bound to `run` on the database, as an operator's (or an accident's)
/// hand would, and checks that it changed one row.
async fn edit(db: &TestDb, sql: &str, run: Uuid) {
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    let done = conn
        .execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            sql,
            [run.into()],
        ))
        .await
        .unwrap_or_else(|e| panic!("[{}] {sql}: {e}", db.backend));
    assert_eq!(done.rows_affected(), 1, "[{}] {sql}", db.backend);
    let _ = conn.close().await;
}

async fn wait_alert(engine: &Engine, kind: &str, run: Uuid) -> sagaflow::Alert {
    eventually_some(Duration::from_secs(15), "the alert", || async {
        engine
            .run_alerts(run)
            .await
            .ok()
            .and_then(|a| a.into_iter().find(|a| a.kind.as_ref() == kind))
    })
    .await
}

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Job {
    n: u32,
}

/// `gated`: step `a` (compensated: its undo is logged) waits at a gate, then `b` reads the
/// typed input, then `c`. Every run of a test shares the gate, so their `a` results arrive
/// together and are written in the same batches.
fn gated(gate: Arc<Semaphore>, log: Log) -> Workflow {
    let undo = log.clone();
    Workflow::builder("gated", 1)
        .input::<Job>()
        .step("a", move |_ctx: StepContext| {
            let gate = gate.clone();
            async move {
                gate.acquire()
                    .await
                    .map_err(|e| StepError::retryable("gate", e.to_string()))?
                    .forget();
                Ok(())
            }
        })
        .compensate(move |ctx: StepContext| {
            let undo = undo.clone();
            async move {
                undo.push(format!("undo {}", ctx.run_id()));
                Ok(())
            }
        })
        .step("b", |ctx: StepContext| async move {
            let job: Job = ctx.input()?;
            Ok(job.n)
        })
        .after(["a"])
        .step("c", noop())
        .after(["b"])
        .build()
        .expect("gated")
}

struct Gated {
    engine: Engine,
    gate: Arc<Semaphore>,
    log: Log,
    victim: Uuid,
    others: Vec<Uuid>,
}

async fn gated_runs(db: &TestDb) -> Gated {
    let gate = Arc::new(Semaphore::new(0));
    let log = Log::default();
    let engine = sagaflow_testkit::engine(db, vec![gated(gate.clone(), log.clone())]).await;
    let mut ids = Vec::new();
    for n in 0..=NEIGHBOURS as u32 {
        ids.push(engine.start("gated", &Job { n }).await.expect("start"));
    }
    // Every `a` is in flight (waiting at the gate).
    eventually(Duration::from_secs(15), "all runs at the gate", || async {
        let mut running = 0;
        for id in &ids {
            let steps = engine.steps(*id).await.unwrap_or_default();
            running += usize::from(
                steps
                    .iter()
                    .any(|s| s.name == "a" && s.state == sagaflow::StepState::Running),
            );
        }
        running == ids.len()
    })
    .await;
    let victim = ids.remove(NEIGHBOURS / 2);
    Gated {
        engine,
        gate,
        log,
        victim,
        others: ids,
    }
}

impl Gated {
    fn open(&self) {
        self.gate.add_permits(1_000);
    }

    /// The victim is set aside with one `corrupt_row` alert naming what `expect` lists, was
    /// not compensated, and every other run completed.
    async fn set_aside_alone(&self, backend: &str, expect: &[&str]) {
        let alert = wait_alert(&self.engine, "corrupt_row", self.victim).await;
        for part in expect {
            assert!(
                alert.reason.contains(part),
                "[{backend}] alert names {part}: {}",
                alert.reason
            );
        }
        let run = expect_state(&self.engine, self.victim, RunState::Error, backend).await;
        let envelope = run.error.expect("error envelope");
        assert_eq!(envelope["code"], "corrupt_row", "[{backend}] {envelope}");
        for id in &self.others {
            expect_state(&self.engine, *id, RunState::Completed, backend).await;
        }
        assert_eq!(
            self.engine
                .run_alerts(self.victim)
                .await
                .expect("alerts")
                .len(),
            1,
            "[{backend}] one alert"
        );
        assert_eq!(
            self.log.count("undo"),
            0,
            "[{backend}] nothing compensated: {:?}",
            self.log.entries()
        );
    }

    /// After the repair, releasing the victim lets it complete.
    async fn released_completes(&self, backend: &str) {
        self.engine
            .operator()
            .release(self.victim)
            .await
            .expect("release");
        expect_state(&self.engine, self.victim, RunState::Completed, backend).await;
        assert_eq!(self.log.count("undo"), 0, "[{backend}] nothing compensated");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_version() {
    for db in backends().await {
        // A client that knows versions 1 and 2 starts a run of version 2; the workers know
        // only version 1.
        let v = |version| {
            Workflow::builder("versioned", version)
                .step("a", noop())
                .build()
                .expect("wf")
        };
        let client = fast_builder(&db)
            .with_workflow(v(1))
            .with_workflow(v(2))
            .with_workers(false)
            .start()
            .await
            .expect("client");
        let pinned = client
            .start("versioned", &serde_json::json!({}))
            .await
            .expect("start v2");
        let n = neighbours(&db, 0).await;
        let worker = fast_builder(&db)
            .with_workflow(v(1))
            .start()
            .await
            .expect("worker");
        let alert = eventually_some(Duration::from_secs(15), "unknown_version alert", || async {
            worker
                .open_alerts()
                .await
                .ok()
                .and_then(|a| a.into_iter().find(|a| a.kind == AlertKind::UnknownVersion))
        })
        .await;
        assert!(
            alert.reason.contains("versioned@2"),
            "[{}] {}",
            db.backend,
            alert.reason
        );
        let run = worker.run(pinned).await.expect("read").expect("run");
        assert_eq!(
            run.state,
            RunState::Running,
            "[{}] left untouched",
            db.backend
        );
        n.finished_normally().await;
        worker.shutdown().await;
        client.shutdown().await;
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_read_only_postgres() {
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    neighbours_finish(&db, async |_| {
        // Every transaction of this session is read-only, as on a hot standby.
        let url = format!("{}?options=-c%20default_transaction_read_only%3Don", db.url);
        let e = start_fails(url, "read-only").await;
        assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
        assert_eq!(e.sqlstate().as_deref(), Some("25006"), "{e}");
    })
    .await;
}

/// The database's own error reaches the caller, matchable by SQLSTATE or result code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_database_errors_are_typed() {
    for db in backends().await {
        neighbours_finish(&db, async |n| {
            let conn = n.rig.engine.connection();
            let insert = "INSERT INTO sagaflow_leases (name, holder, term, expires_at) VALUES ('x', 'h', 1, 0)";
            let backend = conn.get_database_backend();
            conn.execute_raw(Statement::from_string(backend, insert))
                .await
                .expect("first insert");
            let e: Error = conn
                .execute_raw(Statement::from_string(backend, insert))
                .await
                .expect_err("duplicate")
                .into();
            assert!(e.is_unique_violation(), "[{}] {e}", db.backend);
            assert!(!e.is_connection_lost(), "[{}] {e}", db.backend);
            match db.backend {
                "postgres" => assert_eq!(e.sqlstate().as_deref(), Some("23505"), "{e}"),
                _ => assert!(
                    matches!(e.sqlite_code(), Some(1555 | 2067)),
                    "primary key or unique: {e}"
                ),
            }
            let text = e.to_string();
            assert!(!text.contains("Custom Error"), "not flattened: {text}");
        })
        .await;
    }
}

/// The damage scenario: while every run's first step waits at the gate, `damage` edits the
/// victim's row; the gate opens; the victim alone is set aside with an alert naming `names`,
/// the others complete. Releasing before the repair of an undecodable step row is refused,
/// naming the damage; after `repair` (if any), `release` lets the victim complete, never
/// compensated.
async fn damaged_then_released(damage: &str, names: &[&str], repair: Option<&str>) {
    for db in backends().await {
        let g = gated_runs(&db).await;
        edit(&db, damage, g.victim).await;
        g.open();
        g.set_aside_alone(db.backend, names).await;
        if let Some(repair) = repair {
            // A step row that does not decode is named to an operator who releases too early.
            if damage.starts_with("UPDATE sagaflow_steps SET state") {
                let e = g
                    .engine
                    .operator()
                    .release(g.victim)
                    .await
                    .expect_err("still damaged");
                assert!(
                    matches!(&e, Error::CorruptRow { .. }),
                    "[{}] {e}",
                    db.backend
                );
            }
            edit(&db, repair, g.victim).await;
        }
        g.released_completes(db.backend).await;
        g.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_step_state_edited_to_an_unknown_value() {
    damaged_then_released(
        "UPDATE sagaflow_steps SET state = 'bogus' WHERE run_id = $1 AND name = 'c'",
        &["sagaflow_steps", "column `state`", "`bogus`"],
        Some("UPDATE sagaflow_steps SET state = 'not_started' WHERE run_id = $1 AND name = 'c'"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_run_input_edited_to_the_wrong_shape() {
    damaged_then_released(
        r#"UPDATE sagaflow_runs SET input = '{"n":"not a number"}' WHERE id = $1"#,
        &["sagaflow_runs", "column `input`", "not a number"],
        Some(r#"UPDATE sagaflow_runs SET input = '{"n":7}' WHERE id = $1"#),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_run_state_edited_to_an_unknown_value() {
    // Setting the run aside overwrites the bad state: nothing is left to repair.
    damaged_then_released(
        "UPDATE sagaflow_runs SET state = 'bogus' WHERE id = $1",
        &["sagaflow_runs", "column `state`", "`bogus`"],
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_step_row_names_an_unknown_step() {
    damaged_then_released(
        "UPDATE sagaflow_steps SET name = 'ghost' WHERE run_id = $1 AND name = 'c'",
        &["sagaflow_steps", "`ghost`", "not in workflow"],
        Some("UPDATE sagaflow_steps SET name = 'c' WHERE run_id = $1 AND name = 'ghost'"),
    )
    .await;
}

/// A queued step row that no claim can decode costs its own run, not the claims of its
/// workflow (SQLite, whose columns take any value): the claim parks it and has its run set
/// aside with one `corrupt_row` alert, and every other run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_undecodable_queued_row_costs_its_run_alone_sqlite() {
    let db = sqlite_db();
    let gate = Arc::new(Semaphore::new(1_000));
    let log = Log::default();
    // Runs queued by an instance that runs nothing, so every first step is still `ready`.
    let intake = fast_builder(&db)
        .with_workers(false)
        .with_supervisor(false)
        .with_workflow(gated(gate.clone(), log.clone()))
        .start()
        .await
        .expect("intake");
    let mut ids = Vec::new();
    for n in 0..=NEIGHBOURS as u32 {
        ids.push(intake.start("gated", &Job { n }).await.expect("start"));
    }
    let victim = ids.remove(NEIGHBOURS / 2);
    edit(
        &db,
        "UPDATE sagaflow_steps SET max_failures = 'many' WHERE run_id = $1 AND name = 'a'",
        victim,
    )
    .await;
    intake.shutdown().await;
    let engine = sagaflow_testkit::engine(&db, vec![gated(gate, log.clone())]).await;
    let alert = wait_alert(&engine, "corrupt_row", victim).await;
    assert!(alert.reason.contains("max_failures"), "{}", alert.reason);
    expect_state(&engine, victim, RunState::Error, "sqlite").await;
    for id in &ids {
        expect_state(&engine, *id, RunState::Completed, "sqlite").await;
    }
    assert_eq!(log.count("undo"), 0, "nothing compensated");
    engine.shutdown().await;
}

/// An in-flight step row that the supervisor's rescue cannot decode costs its own run, not
/// the sweep (SQLite): it is parked, its run set aside with one `corrupt_row` alert, and the
/// other runs complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_undecodable_in_flight_row_costs_its_run_alone_sqlite() {
    let db = sqlite_db();
    let g = gated_runs(&db).await;
    // The victim's attempt is past its deadline, and its row does not decode.
    edit(
        &db,
        "UPDATE sagaflow_steps SET complete_by = 1, max_interruptions = 'x' \
         WHERE run_id = $1 AND name = 'a'",
        g.victim,
    )
    .await;
    let alert = wait_alert(&g.engine, "corrupt_row", g.victim).await;
    assert!(
        alert.reason.contains("max_interruptions"),
        "{}",
        alert.reason
    );
    g.open();
    expect_state(&g.engine, g.victim, RunState::Error, "sqlite").await;
    for id in &g.others {
        expect_state(&g.engine, *id, RunState::Completed, "sqlite").await;
    }
    g.engine.shutdown().await;
}
