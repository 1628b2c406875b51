//! Failover with real processes and a real database server (LE-1..3, SAS-3..6, AT-8).
//!
//! The suite binary re-runs itself as child engines (the ignored test `child_engine`, driven
//! over stdin/stdout); the order saga's services live in the parent behind loopback HTTP and
//! record every effect by idempotency key. Scenarios:
//!
//! 1. the supervisor leader is SIGKILLed: another process takes the lease with a higher term
//!    within the lease TTL and finishes the step that hung in the dead process;
//! 2. the leader is frozen (SIGSTOP) past its lease: after SIGCONT it steps down, its term's
//!    writes are fenced, and it wrote nothing as supervisor after being frozen;
//! 3. every database connection of an engine is terminated mid-run, three times;
//! 4. a private PostgreSQL cluster is restarted with `pg_ctl restart -m immediate` mid-run;
//! 5. a leader frozen inside a fenced transaction does not block the next election (LE-3).

use sagaflow::HistoryKind;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use sagaflow::internals::SupervisorConfig;
use sagaflow::internals::rescue::rescue_steps;
use sagaflow::internals::store::LeaderFence;
use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use sagaflow::{Engine, Error, RunState, StartOptions};
use sagaflow_testkit::services::{
    FaultPlan, HttpServices, Operation, Scripted, ServicePlans, Services, serve,
};
use sagaflow_testkit::{ChildTest, PgCluster, backends, eventually, fast_builder, postgres_db};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use tokio::time::Instant;
use uuid::Uuid;

use crate::fixtures::order_settings;

/// Lease of the child engines (LE-1: renewed well within its lifetime).
const LEASE_TTL: Duration = Duration::from_millis(1500);
const LEASE_RENEW: Duration = Duration::from_millis(300);
/// How long a takeover may take after the leader dies: the TTL plus a margin.
const TAKEOVER_MAX: Duration = Duration::from_secs(5);

pub(crate) fn lease_name() -> String {
    SupervisorConfig::new("-").lease_name
}

/// A child engine process and everything it printed.
pub(crate) struct ChildEngine {
    id: String,
    proc: ChildTest,
}

impl ChildEngine {
    /// Starts a child engine and waits until it has started.
    pub(crate) async fn spawn(
        db_url: &str,
        services_url: &str,
        id: &str,
        deadline_ms: u64,
    ) -> Self {
        let proc = ChildTest::spawn(
            "failover::child_engine",
            &[
                ("SAGAFLOW_FAILOVER_CHILD", "1".into()),
                ("SAGAFLOW_FAILOVER_DB", db_url.into()),
                ("SAGAFLOW_FAILOVER_SERVICES", services_url.into()),
                ("SAGAFLOW_FAILOVER_ID", id.into()),
                ("SAGAFLOW_FAILOVER_DEADLINE_MS", deadline_ms.to_string()),
            ],
        );
        let me = Self {
            id: id.to_owned(),
            proc,
        };
        let what = format!("child {id} to start its engine");
        eventually(Duration::from_secs(30), &what, || async {
            me.proc.printed("READY")
        })
        .await;
        me
    }

    /// The last `n` lines it printed but its status lines, and its last status, for a
    /// failure's message.
    pub(crate) fn tail(&self, n: usize) -> String {
        let lines = self.proc.lines();
        let said: Vec<&String> = lines.iter().filter(|l| !l.starts_with("STATUS ")).collect();
        let from = said.len().saturating_sub(n);
        let status = lines.iter().rev().find(|l| l.starts_with("STATUS "));
        let said: Vec<&str> = said[from..].iter().map(|l| l.as_str()).collect();
        format!("{}\nlast: {status:?}", said.join("\n"))
    }

    fn log_line(&self, needle: &str) -> Option<String> {
        let lines = self.proc.lines();
        lines.iter().find(|l| l.contains(needle)).cloned()
    }

    /// What the child last said about its own leadership: `Some(term)` while it leads.
    pub(crate) fn last_status(&self) -> Option<Option<i64>> {
        let lines = self.proc.lines();
        let line = lines.iter().rev().find(|l| l.starts_with("STATUS "))?;
        let term = line.rsplit_once("term=")?.1;
        Some(term.parse().ok())
    }

    fn status_count(&self) -> usize {
        let lines = self.proc.lines();
        lines.iter().filter(|l| l.starts_with("STATUS ")).count()
    }

    /// Has the child submit orders `from..from+n`; returns their run ids.
    async fn submit(&mut self, from: usize, n: usize) -> Vec<Uuid> {
        self.proc.send(&format!("submit {from} {n}")).await;
        let done = format!("SUBMITTED {from} {n}");
        let what = format!("child {} to submit orders {from}..{}", self.id, from + n);
        eventually(Duration::from_secs(30), &what, || async {
            self.proc.printed(&done)
        })
        .await;
        let lines = self.proc.lines();
        (from..from + n)
            .map(|k| {
                let prefix = format!("RUN {k} ");
                let line = lines
                    .iter()
                    .find(|l| l.starts_with(&prefix))
                    .expect("run id");
                line[prefix.len()..].parse().expect("uuid")
            })
            .collect()
    }

    /// Sends `sig` to the child (SIGSTOP freezes it, SIGCONT resumes it).
    fn signal(&self, sig: Signal) {
        let pid = self.proc.child.id().expect("child still running");
        let pid = Pid::from_raw(i32::try_from(pid).expect("pid fits"));
        nix::sys::signal::kill(pid, sig).unwrap_or_else(|e| panic!("{sig} {}: {e}", self.id));
    }
}

pub(crate) async fn leader(store: &Store) -> Option<LeaderFence> {
    store.leader_current(&lease_name()).await.ok().flatten()
}

/// Waits until `holder` holds the lease, polling; returns the fence and how long it took.
async fn await_leader(store: &Store, holder: &str, timeout: Duration) -> (LeaderFence, Duration) {
    let start = Instant::now();
    loop {
        if let Some(f) = leader(store).await
            && f.holder == holder
        {
            return (f, start.elapsed());
        }
        assert!(
            start.elapsed() < timeout,
            "{holder} did not hold the lease within {timeout:?} (holder now: {:?})",
            leader(store).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every run is `Completed`, tolerating database errors while polling (the
/// database may be going away under the test). Fails at once on another terminal state.
pub(crate) async fn await_completed(store: &Store, ids: &[Uuid], timeout: Duration, what: &str) {
    let start = Instant::now();
    let mut pending: Vec<Uuid> = ids.to_vec();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for &id in &pending {
            match store.run_get(id).await {
                Ok(Some(run)) if run.state == RunState::Completed => {}
                Ok(Some(run)) if run.state.is_terminal() => {
                    panic!("{what}: run {id} ended {}: {:?}", run.state, run.error)
                }
                _ => still.push(id),
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
        if start.elapsed() >= timeout {
            let mut report = Vec::new();
            for id in pending.iter().take(3) {
                let run = store.run_get(*id).await.ok().flatten();
                let steps = store.run_steps(*id).await.unwrap_or_default();
                report.push(format!(
                    "{id}: {:?} steps {:?}",
                    run.map(|r| r.state),
                    steps
                        .iter()
                        .map(|s| (s.name.clone(), s.state, s.attempt, s.failure_count))
                        .collect::<Vec<_>>()
                ));
            }
            panic!(
                "{what}: {} of {} runs not completed after {timeout:?}:\n{}",
                pending.len(),
                ids.len(),
                report.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every effect of the orders applied exactly once, nothing compensated.
fn assert_ledger(services: &Services, orders: std::ops::Range<usize>, backend: &str) {
    let ids: Vec<String> = orders.clone().map(|n| Order::sample(n).order_id).collect();
    let report = services.ledger().check_orders(&ids);
    assert!(
        report.violations.is_empty(),
        "[{backend}] {:?}",
        report.violations
    );
    let n = orders.len() as u64;
    let a = report.applied;
    assert_eq!(
        (a.reserve, a.charge, a.ship, a.release, a.refund),
        (n, n, n, 0, 0),
        "[{backend}] each effect applied once per order"
    );
}

/// Per run and step, the forward step completed exactly once (a late or stale result would
/// add a second `completed` entry).
async fn assert_completed_once(store: &Store, ids: &[Uuid]) {
    for &id in ids {
        let history = store.run_history(id).await.expect("history");
        for step in ["reserve_stock", "charge_card", "ship"] {
            let n = history
                .iter()
                .filter(|h| h.kind == HistoryKind::Completed && h.step.as_deref() == Some(step))
                .count();
            assert_eq!(n, 1, "run {id}: step {step} completed {n} times");
        }
    }
}

pub(crate) async fn serve_services(
    services: &Services,
) -> (sagaflow_testkit::services::ServerHandle, String) {
    let server = serve(services.clone(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    let url = server.base_url();
    (server, url)
}

/// Scenario 1 (LE-1..3, SAS-5): SIGKILL the leader; the other process takes the lease with a
/// higher term within TTL + margin, rescues the step that hung in the dead process (same
/// idempotency key, so no second charge), and runs started afterwards complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_leader_is_replaced_within_the_lease_ttl() {
    const HUNG: usize = 2;
    const FRESH: usize = 3;
    const DEADLINE_MS: u64 = 4000;
    for db in backends().await {
        let b_ = db.backend;
        let services = Services::default();
        services.script("charge", vec![Scripted::Hang; HUNG]);
        let (server, url) = serve_services(&services).await;
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");

        // A starts alone, so it leads, and its charges hang after applying.
        let mut a = ChildEngine::spawn(&db.url, &url, "fo1-a", DEADLINE_MS).await;
        let (fa, _) = await_leader(&store, "fo1-a", Duration::from_secs(10)).await;
        let hung = a.submit(0, HUNG).await;
        eventually(
            Duration::from_secs(30),
            "charges applied and hung in A",
            || async { services.ledger().applied_count(Operation::Charge) == HUNG },
        )
        .await;

        let mut b = ChildEngine::spawn(&db.url, &url, "fo1-b", DEADLINE_MS).await;
        let holder = leader(&store).await.expect("a leader");
        assert_eq!(holder, fa, "[{b_}] B must not take a live lease");
        for &id in &hung {
            let steps = store.run_steps(id).await.expect("steps");
            let charge = steps
                .iter()
                .find(|s| s.name == "charge_card")
                .expect("charge");
            assert_eq!(
                (charge.state, charge.locked_by.as_deref()),
                (sagaflow::StepState::Running, Some("fo1-a")),
                "[{b_}] the charge still hangs in A when A is killed"
            );
        }

        // SIGKILL: no renewal, no release, no result.
        let killed = Instant::now();
        a.proc.child.kill().await.expect("SIGKILL A");
        let (fb, took) = await_leader(&store, "fo1-b", TAKEOVER_MAX).await;
        assert!(fb.term > fa.term, "[{b_}] terms increase: {fa:?} -> {fb:?}");
        eprintln!(
            "[{b_}] takeover {took:?} after SIGKILL (term {} -> {}); {:?} since the kill",
            fa.term,
            fb.term,
            killed.elapsed()
        );

        let fresh = b.submit(HUNG, FRESH).await;
        await_completed(&store, &hung, Duration::from_secs(30), "hung runs").await;
        await_completed(&store, &fresh, Duration::from_secs(30), "fresh runs").await;

        assert_ledger(&services, 0..HUNG + FRESH, b_);
        for n in 0..HUNG {
            let charge = services
                .ledger()
                .records_for_order(&Order::sample(n).order_id)
                .into_iter()
                .find(|r| r.operation == Operation::Charge)
                .expect("charged");
            assert!(
                charge.replays >= 1,
                "[{b_}] the rescued charge reused its key"
            );
        }
        // B's supervisor, in its own term, rescued the charges that hung in A.
        let rescuer = fb.actor();
        for &id in &hung {
            let history = store.run_history(id).await.expect("history");
            assert!(
                history.iter().any(|h| (h.kind == HistoryKind::Timeout
                    || h.kind == HistoryKind::Interrupted)
                    && h.step.as_deref() == Some("charge_card")
                    && h.actor == rescuer),
                "[{b_}] run {id}: no rescue by {rescuer}"
            );
        }
        assert_completed_once(&store, &hung).await;
        assert!(
            rescue_steps(&store, Some(&fa), &[]).await.is_err(),
            "[{b_}] the dead leader's fence is stale"
        );
        drop(b);
        server.shutdown().await.expect("server shutdown");
    }
}

/// Scenario 2 (LE-2, LE-3, SAS-3, SAS-6): a leader frozen (SIGSTOP) past its lease loses it
/// to the other process; once resumed (SIGCONT) it steps down, its term is fenced, and it
/// wrote nothing as supervisor after it was frozen. Every run completes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_fenced_and_steps_down_when_resumed() {
    const FIRST: usize = 6;
    const HUNG: usize = 2;
    const LATER: usize = 3;
    const DEADLINE_MS: u64 = 3000;
    let Some(db) = postgres_db().await else {
        return;
    };
    let services = Services::default();
    services.script("charge", vec![Scripted::Hang; HUNG]);
    let (server, url) = serve_services(&services).await;
    let store = Store::connect(&db.url, Some(2)).await.expect("connect");

    let mut a = ChildEngine::spawn(&db.url, &url, "fo2-a", DEADLINE_MS).await;
    let (fa, _) = await_leader(&store, "fo2-a", Duration::from_secs(10)).await;
    let mut runs = a.submit(0, FIRST).await;
    eventually(
        Duration::from_secs(30),
        "A to run every order up to the hung charges",
        || async {
            let l = services.ledger();
            l.applied_count(Operation::Charge) == FIRST
                && l.applied_count(Operation::Ship) == FIRST - HUNG
        },
    )
    .await;
    let b = ChildEngine::spawn(&db.url, &url, "fo2-b", DEADLINE_MS).await;
    assert_eq!(leader(&store).await, Some(fa.clone()), "A still leads");

    // Freeze A while it leads and two of its steps are in flight.
    let frozen_at = store.now_ms().await.expect("db clock");
    a.signal(Signal::SIGSTOP);
    let (fb, took) = await_leader(&store, "fo2-b", TAKEOVER_MAX).await;
    assert!(fb.term > fa.term, "terms increase: {fa:?} -> {fb:?}");
    eprintln!(
        "[postgres] takeover {took:?} after SIGSTOP (term {} -> {})",
        fa.term, fb.term
    );
    // B rescues the charges stuck in the frozen A and finishes every run.
    await_completed(
        &store,
        &runs,
        Duration::from_secs(30),
        "runs while A is frozen",
    )
    .await;

    let statuses = a.status_count();
    a.signal(Signal::SIGCONT);
    // A wakes with its old term in memory: it must notice the loss and stand down.
    eventually(
        Duration::from_secs(5),
        "A to report it no longer leads",
        || async { a.status_count() > statuses && a.last_status() == Some(None) },
    )
    .await;
    let why = a
        .log_line("stepping down")
        .expect("A logged why it stepped down");
    eprintln!("[postgres] resumed A: {why}");
    // And it does not take the lease back: B keeps renewing its term (sampled over several
    // renewal periods).
    let until = Instant::now() + LEASE_RENEW * 4;
    while Instant::now() < until {
        assert_eq!(leader(&store).await, Some(fb.clone()), "B keeps the lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The stale term's writes are refused by the database.
    let err = rescue_steps(&store, Some(&fa), &[])
        .await
        .expect_err("stale fence");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");

    // The resumed process still works as a scheduler: orders it submits complete.
    runs.extend(a.submit(FIRST, LATER).await);
    await_completed(&store, &runs, Duration::from_secs(30), "all runs").await;

    // A's term did nothing after the freeze; B's term did the rescues.
    let stale = fa.actor();
    let mut rescued_by_b = 0;
    for &id in &runs {
        for h in store.run_history(id).await.expect("history") {
            assert!(
                !(h.actor == stale && h.at.timestamp_millis() >= frozen_at),
                "run {id}: the stale term {stale} wrote after the freeze: {h}"
            );
            let rescue = h.kind == HistoryKind::Timeout || h.kind == HistoryKind::Interrupted;
            rescued_by_b += usize::from(rescue && h.actor == fb.actor());
        }
    }
    assert!(
        rescued_by_b >= HUNG,
        "B rescued the frozen steps ({rescued_by_b})"
    );
    assert_completed_once(&store, &runs).await;
    assert_ledger(&services, 0..FIRST + LATER, "postgres");
    drop((a, b));
    server.shutdown().await.expect("server shutdown");
}

/// An in-process engine running the order saga over slow services (so runs are in flight
/// when the database misbehaves).
async fn slow_order_engine(url: &str) -> (Services, Engine) {
    let services = Services::new(ServicePlans::uniform(FaultPlan {
        latency: Duration::from_millis(150),
        ..FaultPlan::seeded(7)
    }));
    let wf = order_saga(OrderApis::from(&services), order_settings(1000, 12)).expect("saga");
    sagaflow_testkit::init_logging();
    // The harness's fast settings, on any URL (a TestDb's other fields are private).
    let mut db = sagaflow_testkit::sqlite_db();
    (db.backend, db.url) = ("postgres", url.to_owned());
    let engine = fast_builder(&db)
        .with_workflow(wf)
        .start()
        .await
        .expect("engine");
    (services, engine)
}

async fn submit_orders(engine: &Engine, orders: std::ops::Range<usize>) -> Vec<Uuid> {
    let mut ids = Vec::with_capacity(orders.len());
    for n in orders {
        let o = Order::sample(n);
        let started = engine
            .start_with(ORDER_WORKFLOW, &o, StartOptions::keyed(o.order_id.clone()))
            .await
            .expect("submit");
        ids.push(started.id);
    }
    ids
}

/// Runs not yet completed, or `None` when the database cannot answer right now.
async fn unfinished_runs(store: &Store) -> Option<u64> {
    let counts = store.run_count_by_state().await.ok()?;
    Some(counts.total() - counts.get(RunState::Completed))
}

/// No step attempt panicked (a panic becomes a retryable `panic` failure in the history).
pub(crate) async fn assert_no_panics(store: &Store, ids: &[Uuid]) {
    for &id in ids {
        for h in store.run_history(id).await.expect("history") {
            assert!(
                !h.detail
                    .as_ref()
                    .is_some_and(|d| d.to_string().contains("panic")),
                "run {id}: {h}"
            );
        }
    }
}

/// Scenario 3 (AT-8): every connection of the engine is terminated three times while ~50
/// order sagas run; each still completes once, and the engine keeps working afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_database_connections_mid_run_are_survived() {
    const ORDERS: usize = 50;
    let Some(db) = postgres_db().await else {
        return;
    };
    let admin_url = std::env::var("SAGAFLOW_PG_URL").expect("admin url");
    let admin = Database::connect(admin_url.as_str()).await.expect("admin");
    let dbname = db.url.rsplit_once('/').expect("db name").1.to_owned();
    let (services, engine) = slow_order_engine(&db.url).await;
    let started = Instant::now();
    let mut ids = submit_orders(&engine, 0..ORDERS).await;

    let store = engine.store().clone();
    // Three rounds, each once the services have applied enough effects: those effects' results
    // are still on their way back (the services sleep before answering), so every round
    // catches runs in flight.
    let mut rounds = Vec::new();
    for (op, n) in [
        (Operation::Reserve, 5),
        (Operation::Charge, 20),
        (Operation::Ship, 20),
    ] {
        let what = format!("{n} {op} effects applied");
        eventually(Duration::from_secs(30), &what, || async {
            services.ledger().applied_count(op) >= n
        })
        .await;
        let unfinished = unfinished_runs(&store).await;
        let rows = admin
            .query_all_raw(Statement::from_string(
                DbBackend::Postgres,
                format!(
                    "SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity \
                     WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
                ),
            ))
            .await
            .expect("terminate");
        let killed = rows
            .iter()
            .filter(|r| r.try_get::<bool>("", "t").unwrap_or(false))
            .count();
        rounds.push((op.as_str(), unfinished, killed));
    }
    eprintln!("[postgres] kill rounds (after, unfinished runs, connections killed): {rounds:?}");
    assert!(rounds.iter().all(|&(_, _, k)| k > 0), "{rounds:?}");

    await_completed(
        &store,
        &ids,
        Duration::from_secs(45),
        "runs after the kills",
    )
    .await;
    // Processing recovered: new work goes through too.
    let more = submit_orders(&engine, ORDERS..ORDERS + 5).await;
    await_completed(
        &store,
        &more,
        Duration::from_secs(20),
        "runs after recovery",
    )
    .await;
    ids.extend(more);
    eprintln!(
        "[postgres] connection kills: all runs done in {:?}",
        started.elapsed()
    );

    assert_completed_once(&store, &ids).await;
    assert_no_panics(&store, &ids).await;
    assert_ledger(&services, 0..ORDERS + 5, "postgres");
    tokio::time::timeout(Duration::from_secs(15), engine.shutdown())
        .await
        .expect("engine shuts down");
    let _ = admin.close().await;
}

/// Scenario 4 (AT-8, SAS-5): the database server restarts (immediate mode: no clean
/// shutdown, crash recovery) while ~50 order sagas run; every run still completes once.
/// Uses a private cluster so that no other test sees the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_postgres_restarted_mid_run() {
    const ORDERS: usize = 50;
    if !crate::fixtures::postgres_wanted("the PostgreSQL restart scenario") {
        return;
    }
    let pg = tokio::task::spawn_blocking(PgCluster::start_private)
        .await
        .expect("start task")
        .expect("private PostgreSQL cluster");
    eprintln!(
        "[postgres] private cluster {} at {}",
        pg.dir.display(),
        pg.url
    );
    // The throwaway cluster runs with synchronous_commit = off, which may lose commits
    // acknowledged in the last few hundred milliseconds on an immediate shutdown; this test is
    // about the engine, not about that setting, so make commits durable first.
    {
        let admin = Database::connect(pg.url.as_str()).await.expect("admin");
        admin
            .execute_unprepared("ALTER SYSTEM SET synchronous_commit = on")
            .await
            .expect("alter system");
        admin
            .execute_unprepared("SELECT pg_reload_conf()")
            .await
            .expect("reload");
        admin
            .execute_unprepared("CREATE DATABASE sagaflow_restart")
            .await
            .expect("create database");
        let _ = admin.close().await;
    }
    let (base, _) = pg.url.rsplit_once('/').expect("url");
    let (services, engine) = slow_order_engine(&format!("{base}/sagaflow_restart")).await;
    let started = Instant::now();
    let ids = submit_orders(&engine, 0..ORDERS).await;
    let store = engine.store().clone();
    // Restart once a third of the charges are applied: their answers are still on the way.
    eventually(Duration::from_secs(30), "charges under way", || async {
        services.ledger().applied_count(Operation::Charge) >= ORDERS / 3
    })
    .await;
    let unfinished = unfinished_runs(&store).await;
    let restart = Instant::now();
    let pg = tokio::task::spawn_blocking(move || {
        pg.restart().expect("pg_ctl restart");
        pg
    })
    .await
    .expect("restart task");
    eprintln!(
        "[postgres] restarted (immediate) in {:?} with {unfinished:?} runs unfinished",
        restart.elapsed()
    );
    assert!(unfinished.unwrap_or(0) > 0, "runs in flight at the restart");

    await_completed(
        &store,
        &ids,
        Duration::from_secs(45),
        "runs after the restart",
    )
    .await;
    let more = submit_orders(&engine, ORDERS..ORDERS + 5).await;
    await_completed(
        &store,
        &more,
        Duration::from_secs(20),
        "runs after recovery",
    )
    .await;
    eprintln!(
        "[postgres] restart: all runs done in {:?}",
        started.elapsed()
    );
    let mut all = ids;
    all.extend(more);
    assert_completed_once(&store, &all).await;
    assert_no_panics(&store, &all).await;
    assert_ledger(&services, 0..ORDERS + 5, "postgres");
    tokio::time::timeout(Duration::from_secs(15), engine.shutdown())
        .await
        .expect("engine shuts down");
    drop(pg);
}

/// The child engine. Ignored in normal runs; the failover tests start it in a subprocess and
/// drive it over stdin (`submit <from> <n>`); it prints `READY`, `RUN <n> <id>`,
/// `SUBMITTED <from> <n>`, `STATUS …` every 100 ms, and its supervisor's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as the failover tests' child process"]
async fn child_engine() {
    if std::env::var("SAGAFLOW_FAILOVER_CHILD").as_deref() != Ok("1") {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,sagaflow_supervisor=info",
        ))
        .with_ansi(false)
        .with_writer(std::io::stdout)
        .try_init();
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let id = var("SAGAFLOW_FAILOVER_ID");
    let deadline_ms: u64 = var("SAGAFLOW_FAILOVER_DEADLINE_MS").parse().expect("ms");
    let http = HttpServices::new(var("SAGAFLOW_FAILOVER_SERVICES"));
    let wf = order_saga(OrderApis::from(&http), order_settings(deadline_ms, 5)).expect("saga");
    let engine = Engine::builder()
        .with_database_url(var("SAGAFLOW_FAILOVER_DB"))
        .with_instance_id(id.clone())
        .with_workflow(wf)
        .with_poll_interval(Duration::from_millis(50))
        .with_error_pause(Duration::from_millis(100))
        .with_sweep_interval(Duration::from_millis(100))
        .with_lease(LEASE_TTL, LEASE_RENEW)
        .start()
        .await
        .expect("child engine");
    // On a line of its own: libtest has printed `test … ` without a newline.
    println!("\nREADY {id}");
    let status = {
        let engine = engine.clone();
        tokio::spawn(async move {
            loop {
                let term = engine
                    .supervisor_internals()
                    .and_then(sagaflow::internals::Supervisor::fence)
                    .map_or_else(|| "-".to_owned(), |f| f.term.to_string());
                println!("STATUS {id} term={term}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    // stdin is read on a plain thread (the suite's tokio has no `io-std`).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let commands = async {
        while let Some(line) = rx.recv().await {
            let words: Vec<&str> = line.split_whitespace().collect();
            if let ["submit", from, n] = words[..] {
                let (from, n): (usize, usize) =
                    (from.parse().expect("from"), n.parse().expect("n"));
                for k in from..from + n {
                    let o = Order::sample(k);
                    let started = engine
                        .start_with(ORDER_WORKFLOW, &o, StartOptions::keyed(o.order_id.clone()))
                        .await
                        .expect("submit");
                    println!("RUN {k} {}", started.id);
                }
                println!("SUBMITTED {from} {n}");
            }
        }
    };
    // Runs until the parent kills it or closes stdin; bounded so an orphan cannot live on.
    tokio::select! {
        () = commands => {}
        () = tokio::time::sleep(Duration::from_secs(180)) => {}
    }
    status.abort();
}

/// LE-3: a leader frozen in the middle of a fenced supervisor transaction (`rescue_steps`
/// checks the lease at its start, without locking the row) must not keep every
/// other instance from being elected once its lease has expired. The frozen leader is
/// emulated by a connection that won the lease, ran the fence check's statement in a
/// transaction, and then stopped (as a SIGSTOPped process would, with its connection open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_inside_a_fenced_transaction_does_not_block_the_election() {
    use sagaflow::sea_orm::TransactionTrait;
    let Some(db) = postgres_db().await else {
        return;
    };
    let store = Store::connect(&db.url, Some(2)).await.expect("connect");
    let fence = store
        .leader_try_elect(&lease_name(), "frozen", LEASE_TTL)
        .await
        .expect("elect")
        .expect("won");
    let txn = store.connection().begin().await.expect("begin");
    txn.query_one_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT term FROM sagaflow_leases WHERE name = $1 AND holder = $2 AND term = $3",
        [
            fence.name.clone().into(),
            fence.holder.clone().into(),
            fence.term.into(),
        ],
    ))
    .await
    .expect("fence check")
    .expect("fence holds");

    let services = Services::default();
    let wf = order_saga(OrderApis::from(&services), order_settings(1000, 5)).expect("saga");
    let mut other = sagaflow_testkit::sqlite_db();
    (other.backend, other.url) = ("postgres", db.url.clone());
    let engine = fast_builder(&other)
        .with_instance_id("fo5-b")
        .with_lease(LEASE_TTL, LEASE_RENEW)
        .with_workflow(wf)
        .start()
        .await
        .expect("engine");
    let start = Instant::now();
    let mut took = None;
    while start.elapsed() < TAKEOVER_MAX {
        if engine.supervisor().is_some_and(|s| s.is_leader()) {
            took = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What the other instance's election is doing meanwhile.
    let waiting: Vec<String> = store
        .connection()
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT wait_event_type || ': ' || left(query, 90) AS q FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        ))
        .await
        .map(|rows| {
            rows.iter()
                .filter_map(|r| r.try_get("", "q").ok())
                .collect()
        })
        .unwrap_or_default();
    // Let the frozen leader go before asserting, so the engine can shut down either way.
    txn.rollback().await.expect("rollback");
    let after = tokio::time::timeout(Duration::from_secs(5), async {
        while !engine.supervisor().is_some_and(|s| s.is_leader()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    tokio::time::timeout(Duration::from_secs(15), engine.shutdown())
        .await
        .expect("engine shuts down");
    assert!(
        after.is_ok(),
        "fo5-b leads once the frozen transaction ends"
    );
    assert!(
        took.is_some(),
        "fo5-b was not elected within {TAKEOVER_MAX:?} although the frozen leader's lease \
         (TTL {LEASE_TTL:?}) had expired: its election UPDATE waits on the frozen \
         open transaction; waiting: {waiting:?}"
    );
}
