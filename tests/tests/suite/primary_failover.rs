//! Failover of the PostgreSQL primary (LE-1..3, AT-8, SAS-5): two private clusters on
//! loopback, the second a streaming standby of the first (`pg_basebackup`); child engine
//! processes and a client engine on the URL that names both
//! (`postgres://…@primary,standby/db`). Under a steady load of starts and cancels, the
//! primary and every process it started are SIGKILLed and the standby is promoted. The
//! engines find the new primary on their own and carry on.
//!
//! - With synchronous replication, nothing acknowledged is lost: every start that returned,
//!   every cancel that returned, every step result (the services' ledgers, which record each
//!   effect by idempotency key, show each applied once and nothing left half-done), and the
//!   history checker finds nothing wrong.
//! - With asynchronous replication, the test measures what was lost and checks that the loss
//!   is what docs/operations.md says it can be: only what was acknowledged in the moments
//!   before the crash (the WAL not yet sent), and effects at services only of those runs.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use sagaflow::{Engine, HistoryKind, RunState, StartOptions};
use sagaflow_testkit::PgCluster;
use sagaflow_testkit::services::{FaultPlan, Operation, ServicePlans, Services};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use tokio::time::Instant;
use uuid::Uuid;

use crate::failover::{ChildEngine, assert_no_panics, leader, serve_services};
use crate::fixtures::{order_settings, postgres_wanted};

async fn sql(url: &str, statements: &[&str]) {
    let db = Database::connect(url).await.expect("connect");
    for s in statements {
        db.execute_unprepared(s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    let _ = db.close().await;
}

/// A primary and its streaming standby; `url` names both, primary first.
pub(crate) struct Pair {
    pub(crate) primary: PgCluster,
    pub(crate) standby: PgCluster,
    pub(crate) url: String,
}

impl Pair {
    /// The URL of the test's database on one server of the pair.
    pub(crate) fn db_url(cluster: &PgCluster) -> String {
        let (base, _) = cluster.url.rsplit_once('/').expect("url");
        format!("{base}/sagaflow_failover")
    }
}

pub(crate) async fn pair(synchronous: bool) -> Pair {
    let primary = tokio::task::spawn_blocking(PgCluster::start_private)
        .await
        .expect("task")
        .expect("primary cluster");
    // Commits wait for the local WAL flush (the throwaway default does not), and the
    // database exists before the copy is taken.
    sql(
        &primary.url,
        &[
            "ALTER SYSTEM SET synchronous_commit = on",
            "SELECT pg_reload_conf()",
            "CREATE DATABASE sagaflow_failover",
        ],
    )
    .await;
    let standby = tokio::task::block_in_place(|| primary.start_standby()).expect("standby cluster");
    if synchronous {
        // Set on the primary only, after the copy: the promoted standby must not wait for a
        // standby of its own.
        sql(
            &primary.url,
            &[
                "ALTER SYSTEM SET synchronous_standby_names = '*'",
                "SELECT pg_reload_conf()",
            ],
        )
        .await;
    }
    let want = if synchronous { "sync" } else { "async" };
    let admin = Database::connect(primary.url.as_str())
        .await
        .expect("admin");
    let start = Instant::now();
    loop {
        let row = admin
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT state, sync_state FROM pg_stat_replication",
            ))
            .await
            .expect("pg_stat_replication");
        let got = row.map(|r| {
            (
                r.try_get::<String>("", "state").unwrap_or_default(),
                r.try_get::<String>("", "sync_state").unwrap_or_default(),
            )
        });
        if got
            .as_ref()
            .is_some_and(|(s, m)| s == "streaming" && m == want)
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the standby is not streaming ({want}): {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = admin.close().await;
    let url = format!(
        "postgres://postgres@{},{}/sagaflow_failover",
        primary.host_port(),
        standby.host_port()
    );
    Pair {
        primary,
        standby,
        url,
    }
}

/// The pid of the primary's WAL sender (to its one standby).
pub(crate) async fn wal_sender(primary_url: &str) -> Pid {
    let db = Database::connect(primary_url).await.expect("primary");
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pid FROM pg_stat_replication",
        ))
        .await
        .expect("pg_stat_replication")
        .expect("a WAL sender");
    let _ = db.close().await;
    Pid::from_raw(row.try_get::<i32>("", "pid").expect("pid"))
}

/// What the client acknowledged: starts (order number, run id, when) and cancels.
#[derive(Default)]
struct Acks {
    starts: Vec<(usize, Uuid, Instant)>,
    cancels: Vec<(Uuid, Instant)>,
    failed_calls: usize,
}

/// Starts orders one after another from `from`, cancelling every fifth right after its
/// start, until `stop` is set. A call that fails (the primary is gone) is retried with the
/// same business key; only what returned is acknowledged.
async fn load(engine: Engine, from: usize, acks: Arc<Mutex<Acks>>, stop: Arc<tokio::sync::Notify>) {
    let mut k = from;
    loop {
        let o = Order::sample(k);
        let started = tokio::select! {
            () = stop.notified() => return,
            r = engine.start_with(ORDER_WORKFLOW, &o, StartOptions::keyed(o.order_id.clone())) => r,
        };
        match started {
            Ok(s) => {
                acks.lock()
                    .expect("acks")
                    .starts
                    .push((k, s.id, Instant::now()));
                if k.is_multiple_of(5) {
                    match engine.operator().cancel(s.id).await {
                        Ok(_) => acks
                            .lock()
                            .expect("acks")
                            .cancels
                            .push((s.id, Instant::now())),
                        Err(_) => acks.lock().expect("acks").failed_calls += 1,
                    }
                }
                k += 1;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            Err(_) => {
                acks.lock().expect("acks").failed_calls += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Waits until every run in `ids` that exists is final; tolerates errors while polling. On
/// timeout, panics with the children's last words and the server that answered.
async fn await_final(store: &Store, ids: &[Uuid], timeout: Duration, children: [&ChildEngine; 2]) {
    let start = Instant::now();
    let mut pending: Vec<Uuid> = ids.to_vec();
    while !pending.is_empty() {
        let mut still = Vec::new();
        for &id in &pending {
            match store.run_get(id).await {
                Ok(Some(run)) if run.state.is_final() => {}
                Ok(None) => {}
                _ => still.push(id),
            }
        }
        pending = still;
        if !pending.is_empty() && start.elapsed() >= timeout {
            let server = store
                .connection()
                .query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT inet_server_port()::text || ' in recovery ' || \
                     pg_is_in_recovery()::text AS s",
                ))
                .await
                .map(|r| r.and_then(|r| r.try_get::<String>("", "s").ok()));
            panic!(
                "{} runs not final after {timeout:?}, e.g. {:?}; answered by {server:?}\n\
                 child a:\n{}\nchild b:\n{}",
                pending.len(),
                store.run_get(pending[0]).await.ok().flatten(),
                children[0].tail(60),
                children[1].tail(60),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one failover scenario observed.
struct Outcome {
    /// How long the standby had received nothing when the primary died (asynchronous).
    behind_for: Option<Duration>,
    acked_starts: usize,
    lost_starts: Vec<(usize, Duration)>,
    acked_cancels: usize,
    lost_cancels: usize,
    resumed_after: Duration,
    /// Orders with effects at the services and no run, with how long before the crash their
    /// start was acknowledged (`None`: never acknowledged).
    orphaned: Vec<(usize, Option<Duration>)>,
}

async fn failover(synchronous: bool) -> Outcome {
    let mode = if synchronous { "sync" } else { "async" };
    let began = Instant::now();
    let pair = pair(synchronous).await;
    eprintln!(
        "[failover {mode}] clusters ready in {:?}: primary {} standby {} url {}",
        began.elapsed(),
        pair.primary.host_port(),
        pair.standby.host_port(),
        pair.url
    );
    let services = Services::new(ServicePlans::uniform(FaultPlan {
        latency: Duration::from_millis(100),
        ..FaultPlan::seeded(11)
    }));
    let (server, services_url) = serve_services(&services).await;
    sagaflow_testkit::init_logging();
    // The client: starts and cancels runs, executes nothing.
    let client = Engine::builder()
        .with_database_url(pair.url.clone())
        .with_workflow(
            order_saga(OrderApis::from(&services), order_settings(3000, 5)).expect("saga"),
        )
        .with_workers(false)
        .with_error_pause(Duration::from_millis(100))
        .start()
        .await
        .expect("client engine");
    let store = client.store().clone();
    let a = ChildEngine::spawn(&pair.url, &services_url, "a", 3000).await;
    let b = ChildEngine::spawn(&pair.url, &services_url, "b", 3000).await;

    let acks = Arc::new(Mutex::new(Acks::default()));
    let stop = Arc::new(tokio::sync::Notify::new());
    let loader = tokio::spawn(load(client.clone(), 0, acks.clone(), stop.clone()));
    // Mid-load: charges applied, their answers on the way back.
    sagaflow_testkit::eventually(Duration::from_secs(60), "20 charges applied", || async {
        services.ledger().applied_count(Operation::Charge) >= 20
    })
    .await;
    let before = leader(&store).await.expect("a leader before the crash");
    eprintln!(
        "[failover {mode}] load under way after {:?}",
        began.elapsed()
    );
    // Asynchronously, the standby falls behind: the primary's WAL sender is frozen for a few
    // starts, so what commits meanwhile is acknowledged and never sent.
    let sender = if synchronous {
        None
    } else {
        let pid = wal_sender(&pair.primary.url).await;
        nix::sys::signal::kill(pid, Signal::SIGSTOP).expect("SIGSTOP the WAL sender");
        let frozen_at = Instant::now();
        let acked = acks.lock().expect("acks").starts.len();
        sagaflow_testkit::eventually(Duration::from_secs(10), "starts while behind", || async {
            acks.lock().expect("acks").starts.len() >= acked + 5
        })
        .await;
        Some((pid, frozen_at))
    };
    let killed_at = Instant::now();
    let (primary, standby) = (pair.primary, pair.standby);
    let (primary, standby) = tokio::task::spawn_blocking(move || {
        // The frozen WAL sender dies with the rest.
        primary.kill().expect("SIGKILL the primary");
        standby.promote().expect("promote the standby");
        (primary, standby)
    })
    .await
    .expect("failover task");
    let promoted_at = Instant::now();
    eprintln!(
        "[failover {mode}] primary killed, standby promoted in {:?}; term before {} held by {}",
        promoted_at - killed_at,
        before.term,
        before.holder
    );
    // The client carries on: a start acknowledged after the promotion.
    let acked_before = acks.lock().expect("acks").starts.len();
    sagaflow_testkit::eventually(
        Duration::from_secs(30),
        "a start after the promotion",
        || async { acks.lock().expect("acks").starts.len() > acked_before },
    )
    .await;
    let resumed_after = promoted_at.elapsed();
    sagaflow_testkit::eventually(Duration::from_secs(30), "15 more starts", || async {
        acks.lock().expect("acks").starts.len() >= acked_before + 15
    })
    .await;
    stop.notify_one();
    loader.await.expect("load task");
    let acks = std::mem::take(&mut *acks.lock().expect("acks"));
    let ids: Vec<Uuid> = acks.starts.iter().map(|(_, id, _)| *id).collect();
    await_final(&store, &ids, Duration::from_secs(90), [&a, &b]).await;

    eprintln!("[failover {mode}] all final after {:?}", began.elapsed());
    // What the new primary knows of what was acknowledged.
    let mut lost_starts = Vec::new();
    let mut present = HashSet::new();
    for &(k, id, at) in &acks.starts {
        if store.run_get(id).await.expect("run").is_some() {
            present.insert(id);
        } else {
            lost_starts.push((k, killed_at.saturating_duration_since(at)));
        }
    }
    let mut cancels_kept = HashSet::new();
    for &(id, _) in &acks.cancels {
        let history = store.run_history(id).await.expect("history");
        if history
            .iter()
            .any(|h| h.kind == HistoryKind::OperatorCancel)
        {
            cancels_kept.insert(id);
        }
    }
    let lost_cancels = acks.cancels.len() - cancels_kept.len();
    // Every surviving run ended as its acknowledgements say: undone when a cancel of it is
    // on record, completed otherwise.
    for &(k, id, _) in &acks.starts {
        let Some(run) = store.run_get(id).await.expect("run") else {
            continue;
        };
        if cancels_kept.contains(&id) {
            assert_ne!(
                run.state,
                RunState::Completed,
                "[{mode}] cancelled order {k} completed"
            );
        } else {
            if run.state != RunState::Completed {
                let server = store
                    .connection()
                    .query_one_raw(Statement::from_string(
                        DbBackend::Postgres,
                        "SELECT inet_server_port()::text || ' pid ' || pg_backend_pid()::text \
                         || ' started ' || pg_postmaster_start_time()::text || ' recovery ' \
                         || pg_is_in_recovery()::text AS s",
                    ))
                    .await
                    .map(|r| r.and_then(|r| r.try_get::<String>("", "s").ok()));
                let acked = acks.starts.iter().find(|s| s.0 == k).map(|s| s.2);
                eprintln!(
                    "[{mode}] order {k} not completed: run {run:?}; server {server:?}; acked {:?} before \
                     the kill; frozen {:?} before the kill; steps {:?}",
                    acked.map(|a| killed_at.saturating_duration_since(a)),
                    sender.map(|(_, at)| killed_at.saturating_duration_since(at)),
                    store.run_steps(id).await.ok().map(|s| s
                        .iter()
                        .map(|s| (s.name.clone(), s.state, s.attempt))
                        .collect::<Vec<_>>()),
                );
            }
            assert_eq!(
                run.state,
                RunState::Completed,
                "[{mode}] order {k}: {:?}",
                run.error
            );
        }
    }
    // The services: each effect once per key; an order that applied effects and has no run
    // is orphaned (its run was lost with the primary).
    let last = acks.starts.last().map_or(0, |s| s.0);
    let mut orphaned = Vec::new();
    let mut orphaned_orders = Vec::new();
    for k in 0..=last + 1 {
        let order = Order::sample(k).order_id;
        let has_run = store
            .run_by_key(ORDER_WORKFLOW, &order)
            .await
            .expect("run by key")
            .is_some();
        let touched = services
            .ledger()
            .check_orders(std::slice::from_ref(&order))
            .applied
            .reserve
            > 0;
        if touched && !has_run {
            let acked = acks.starts.iter().find(|s| s.0 == k);
            orphaned.push((k, acked.map(|s| killed_at.saturating_duration_since(s.2))));
            orphaned_orders.push(order);
        }
    }
    let submitted: Vec<String> = (0..=last + 1).map(|k| Order::sample(k).order_id).collect();
    let consistent: Vec<String> = submitted
        .iter()
        .filter(|o| !orphaned_orders.contains(o))
        .cloned()
        .collect();
    let report = services.ledger().check_orders(&consistent);
    assert!(report.violations.is_empty(), "[{mode}] {report}");
    let history = sagaflow::check::check(store.connection())
        .await
        .expect("check");
    assert!(history.is_clean(), "[{mode}] {}", history.summary());
    assert_no_panics(&store, &present.iter().copied().collect::<Vec<_>>()).await;
    // The lease survived with its fencing: the term never goes back.
    let after = leader(&store).await.expect("a leader after the failover");
    assert!(
        after.term >= before.term,
        "[{mode}] term went back from {} to {}",
        before.term,
        after.term
    );
    assert!(
        ["a", "b"].contains(&after.holder.as_str()),
        "[{mode}] leader {}",
        after.holder
    );
    eprintln!(
        "[failover {mode}] {} starts and {} cancels acknowledged ({} calls failed during the \
         failover); resumed {resumed_after:?} after the promotion; lost: {} starts {:?}, {} \
         cancels; orphaned orders at the services: {:?}; term {} → {} ({}); {report}",
        acks.starts.len(),
        acks.cancels.len(),
        acks.failed_calls,
        lost_starts.len(),
        lost_starts,
        lost_cancels,
        orphaned,
        before.term,
        after.term,
        after.holder
    );
    tokio::time::timeout(Duration::from_secs(15), client.shutdown())
        .await
        .expect("client shuts down");
    drop((a, b));
    server.shutdown().await.expect("server shutdown");
    drop((primary, standby));
    Outcome {
        behind_for: sender.map(|(_, at)| killed_at - at),
        acked_starts: acks.starts.len(),
        lost_starts,
        acked_cancels: acks.cancels.len(),
        lost_cancels,
        resumed_after,
        orphaned,
    }
}

/// Synchronous replication: nothing acknowledged is lost, and the engines carry on within
/// the bound the docs give (a check interval plus connect timeouts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_synchronous_standby_loses_nothing_acknowledged() {
    if !postgres_wanted("the synchronous failover scenario") {
        return;
    }
    let o = failover(true).await;
    assert!(o.acked_starts > 20 && o.acked_cancels > 3);
    assert_eq!(o.lost_starts, [], "acknowledged starts lost");
    assert_eq!(o.lost_cancels, 0, "acknowledged cancels lost");
    assert_eq!(o.orphaned, [], "effects without a run");
    assert!(
        o.resumed_after < Duration::from_secs(15),
        "resumed only after {:?}",
        o.resumed_after
    );
}

/// Asynchronous replication: what is lost is measured, and it is only the tail the docs
/// describe (acknowledged within the moments before the crash), with effects at services
/// only for runs that were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_asynchronous_standby_loses_at_most_the_last_moments() {
    if !postgres_wanted("the asynchronous failover scenario") {
        return;
    }
    let o = failover(false).await;
    let behind = o.behind_for.expect("the standby was behind");
    assert!(o.acked_starts > 20);
    // Starts were acknowledged while the standby received nothing: they are lost, and
    // nothing acknowledged before the standby fell behind is.
    assert!(
        !o.lost_starts.is_empty(),
        "nothing lost while {behind:?} behind"
    );
    for (k, before_kill) in &o.lost_starts {
        assert!(
            *before_kill <= behind,
            "order {k} lost though acknowledged {before_kill:?} before the crash, and the \
             standby was only {behind:?} behind"
        );
    }
    // An order with effects and no run: its start was lost with the primary, acknowledged
    // in the same last moments or never.
    for (k, acked) in &o.orphaned {
        assert!(
            acked.is_none_or(|before_kill| before_kill <= behind),
            "order {k} orphaned though acknowledged {acked:?} before the crash"
        );
    }
    assert!(
        o.resumed_after < Duration::from_secs(15),
        "resumed only after {:?}",
        o.resumed_after
    );
}

/// Starts a run of [`one_step`] and waits until it completed; returns its id.
async fn completed_run(engine: &Engine) -> Uuid {
    let run = engine.start("w", &()).await.expect("start");
    let done = engine
        .wait(run, Duration::from_secs(20))
        .await
        .expect("wait");
    assert_eq!(done.state, RunState::Completed);
    run
}

/// A workflow of one step that succeeds.
fn one_step() -> sagaflow::Workflow {
    sagaflow::Workflow::builder("w", 1)
        .step("a", |_| {
            std::future::ready(Ok::<(), sagaflow::StepError>(()))
        })
        .build()
        .expect("wf")
}

/// How many sessions a database of `cluster` has seen (`pg_stat_database.sessions`).
async fn sessions(cluster: &PgCluster, db: &str) -> i64 {
    let admin = Database::connect(cluster.url.as_str())
        .await
        .expect("admin");
    let row = admin
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT sessions FROM pg_stat_database WHERE datname = '{db}'"),
        ))
        .await
        .expect("pg_stat_database")
        .expect("the database");
    let _ = admin.close().await;
    row.try_get::<i64>("", "sessions").expect("sessions")
}

/// A listed address answered by a server of another cluster once the engine's primary is
/// gone (on one machine, the next cluster started takes the freed port; in production, a
/// replaced host): writable, not in recovery, and never taken for the primary, since runs
/// written there would never meet the others. Both up at open fails the open, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_another_cluster_at_a_listed_address_is_never_the_primary() {
    if !postgres_wanted("the foreign-cluster scenario") {
        return;
    }
    let start = || async {
        let c = tokio::task::spawn_blocking(PgCluster::start_private)
            .await
            .expect("task")
            .expect("cluster");
        sql(&c.url, &["CREATE DATABASE sagaflow_failover"]).await;
        c
    };
    let (ours, foreign) = (start().await, start().await);
    let url = format!(
        "postgres://postgres@{},{}/sagaflow_failover",
        ours.host_port(),
        foreign.host_port()
    );
    // Both up at open: which one holds the runs is not for the engine to guess.
    let e = Engine::builder()
        .with_database_url(url.clone())
        .with_workflow(one_step())
        .start()
        .await
        .expect_err("a URL of two clusters");
    let text = e.to_string();
    assert!(matches!(e, sagaflow::Error::Connect { .. }), "{text}");
    assert!(
        text.contains("primaries of different clusters")
            && text.contains(&ours.host_port())
            && text.contains(&foreign.host_port()),
        "names both: {text}"
    );
    // Without the database, the foreign server is no server of the URL's while the engine
    // opens (a visit that fails; stopping it would free its port for another test's
    // cluster). It gets the database, with the schema, once the engine's primary is gone.
    sql(
        &foreign.url,
        &["DROP DATABASE sagaflow_failover WITH (FORCE)"],
    )
    .await;
    let engine = Engine::builder()
        .with_database_url(url)
        .with_instance_id("pinned")
        .with_workflow(one_step())
        .start()
        .await
        .expect("engine on the first server");
    completed_run(&engine).await;
    tokio::task::block_in_place(|| ours.kill()).expect("SIGKILL the primary");
    sql(&foreign.url, &["CREATE DATABASE sagaflow_failover"]).await;
    // The foreign database has the schema, so an engine that moved there would work.
    let setup = Engine::builder()
        .with_database_url(Pair::db_url(&foreign))
        .with_workflow(one_step())
        .with_workers(false)
        .start()
        .await
        .expect("schema on the foreign cluster");
    setup.shutdown().await;
    // The watcher looks at the foreign server again and again (a session each time) and
    // refuses it; meanwhile starts fail rather than land there.
    let seen = sessions(&foreign, "sagaflow_failover").await;
    let mut refused = 0;
    let began = Instant::now();
    while sessions(&foreign, "sagaflow_failover").await < seen + 3 {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the watcher did not look at the foreign server"
        );
        if tokio::time::timeout(Duration::from_secs(2), engine.start("w", &()))
            .await
            .is_ok_and(|r| r.is_err())
        {
            refused += 1;
        }
    }
    let foreign_db = Database::connect(Pair::db_url(&foreign))
        .await
        .expect("foreign");
    let count = |sql: &'static str| {
        let foreign_db = &foreign_db;
        async move {
            foreign_db
                .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
                .await
                .expect(sql)
                .expect("a row")
                .try_get::<i64>("", "n")
                .expect("n")
        }
    };
    assert_eq!(
        count("SELECT count(*) AS n FROM sagaflow_runs_all").await,
        0,
        "runs written to the foreign cluster ({refused} starts refused)"
    );
    assert_eq!(
        count("SELECT count(*) AS n FROM sagaflow_instances WHERE id = 'pinned'").await,
        0,
        "the engine registered on the foreign cluster"
    );
    let _ = foreign_db.close().await;
    tokio::time::timeout(Duration::from_secs(20), engine.shutdown())
        .await
        .expect("shuts down");
    drop((ours, foreign));
}

/// Whether run `id` is in the database at `url`.
async fn has_run(db: &sagaflow::sea_orm::DatabaseConnection, id: Uuid) -> bool {
    db.query_one_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT 1 AS one FROM sagaflow_runs_all WHERE id = $1",
        [id.into()],
    ))
    .await
    .expect("look up a run")
    .is_some()
}

/// A standby promoted while its primary still runs (a network partition; a promotion by
/// hand): two primaries of one cluster, the promoted one on a newer timeline. The engine
/// leaves the old one for it within ten checks, and writes nothing more there; an engine
/// opened afterwards with the old primary listed first starts on the promoted one. The
/// operator's `split_brain` alert stays open while the old primary accepts writes (the
/// engines refuse it; others may not), and while it is frozen (whether it accepts writes is
/// not known); it resolves once the old primary is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_brain_is_left_for_the_newer_timeline() {
    if !postgres_wanted("the split-brain scenario") {
        return;
    }
    let pair = pair(false).await;
    let engine_on = |id: &'static str| {
        Engine::builder()
            .with_database_url(pair.url.clone())
            .with_instance_id(id)
            .with_store_options(sagaflow::StoreOptions {
                primary_check_interval: Duration::from_millis(100),
                // A look at a frozen server below waits this long for it.
                connect_timeout: Duration::from_secs(2),
                ..sagaflow::StoreOptions::default()
            })
            .with_backlog_interval(Duration::from_millis(200))
            .with_workflow(one_step())
            .start()
    };
    let split_alerts = |e: &Engine| {
        let e = e.clone();
        async move {
            e.open_alerts()
                .await
                .expect("alerts")
                .into_iter()
                .filter(|a| a.kind == sagaflow::AlertKind::SplitBrain)
                .collect::<Vec<_>>()
        }
    };
    let engine = engine_on("first").await.expect("engine");
    let old = Database::connect(Pair::db_url(&pair.primary))
        .await
        .expect("old primary");
    let run = completed_run(&engine).await;
    assert!(has_run(&old, run).await);
    tokio::task::block_in_place(|| pair.standby.promote()).expect("promote the standby");
    let new = Database::connect(Pair::db_url(&pair.standby))
        .await
        .expect("promoted standby");
    // Both accept writes now. The engine's starts move to the newer timeline.
    let began = Instant::now();
    loop {
        let run = engine.start("w", &()).await.expect("start");
        if has_run(&new, run).await {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "still writing to the old primary after {:?}",
            began.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "[split brain] left the old primary {:?} after the promotion",
        began.elapsed()
    );
    for _ in 0..20 {
        let run = completed_run(&engine).await;
        assert!(
            has_run(&new, run).await,
            "run {run} not on the promoted standby"
        );
        assert!(
            !has_run(&old, run).await,
            "run {run} written to the old primary"
        );
    }
    // The wake-up listener, which keeps a connection of its own, moved too.
    let listening = |db: &'static str| {
        let conn = if db == "new" { &new } else { &old };
        async move {
            conn.query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'sagaflow' \
                 AND datname = current_database() AND query LIKE 'LISTEN%'",
            ))
            .await
            .expect("pg_stat_activity")
            .expect("a row")
            .try_get::<i64>("", "n")
            .expect("n")
        }
    };
    sagaflow_testkit::eventually(
        Duration::from_secs(20),
        "the listener on the promoted standby only",
        || async { listening("new").await == 1 && listening("old").await == 0 },
    )
    .await;
    // A fresh engine, the old primary still listed first, starts on the promoted one.
    let second = engine_on("second").await.expect("second engine");
    let run = second.start("w", &()).await.expect("start");
    assert!(
        has_run(&new, run).await,
        "the second engine's run is not on the new primary"
    );
    assert!(
        !has_run(&old, run).await,
        "the second engine wrote to the old primary"
    );
    // The operator is called, on the primary the engines follow: one open alert naming both
    // servers, until the old primary is gone.
    sagaflow_testkit::eventually(Duration::from_secs(20), "a split_brain alert", || async {
        split_alerts(&engine).await.len() == 1
    })
    .await;
    let alert = split_alerts(&engine).await.remove(0);
    assert!(
        alert
            .reason
            .contains(&format!("{} (timeline 1)", pair.primary.host_port()))
            && alert
                .reason
                .contains(&format!("{} (timeline 2)", pair.standby.host_port())),
        "{}",
        alert.reason
    );
    // Looks at every server after the one that raised it, by both engines (the leader's
    // store is the one its supervisor reads): with looks a second apart, the supervisor's
    // pass (every 200 ms) would have resolved the alert after the first of them.
    let looks_past = |n: u64| {
        let stores = [engine.store().clone(), second.store().clone()];
        let from = stores
            .clone()
            .map(|s| s.primary_looks().expect("a URL of two servers"));
        async move {
            sagaflow_testkit::eventually(
                Duration::from_secs(30),
                "more looks at every server",
                || async {
                    stores
                        .iter()
                        .zip(from)
                        .all(|(s, looks)| s.primary_looks() >= Some(looks + n))
                },
            )
            .await;
        }
    };
    // The old primary, which the engines refuse since the promotion, still accepts writes:
    // the split brain goes on, and the alert stays open.
    looks_past(3).await;
    assert_eq!(
        split_alerts(&engine).await.len(),
        1,
        "the split_brain alert stays open while both accept writes"
    );
    // Frozen, the old primary answers nothing: whether it accepts writes is not known, so the
    // alert stays open.
    let postmaster = {
        let pid = std::fs::read_to_string(pair.primary.dir.join("data/postmaster.pid"))
            .expect("postmaster.pid");
        Pid::from_raw(
            pid.lines()
                .next()
                .and_then(|l| l.trim().parse().ok())
                .expect("a pid"),
        )
    };
    nix::sys::signal::kill(postmaster, Signal::SIGSTOP).expect("freeze the old primary");
    looks_past(2).await;
    assert_eq!(
        split_alerts(&engine).await.len(),
        1,
        "the split_brain alert stays open while the old primary does not answer"
    );
    // Fenced (killed, frozen or not), it refuses connections: the split brain is over.
    tokio::task::block_in_place(|| pair.primary.kill()).expect("fence the old primary");
    sagaflow_testkit::eventually(
        Duration::from_secs(20),
        "the split_brain alert resolved",
        || async { split_alerts(&engine).await.is_empty() },
    )
    .await;
    for e in [engine, second] {
        tokio::time::timeout(Duration::from_secs(20), e.shutdown())
            .await
            .expect("shuts down");
    }
    let _ = (old.close().await, new.close().await);
    drop(pair);
}

/// A role that may not read the cluster's identity (a managed service may revoke
/// `pg_control_system()`): no cluster or timeline check, and still the primary found behind
/// a standby listed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_the_cluster_identity_still_finds_the_primary() {
    if !postgres_wanted("the unprivileged-role scenario") {
        return;
    }
    let pair = pair(false).await;
    // A function's privileges are the database's own.
    sql(
        &Pair::db_url(&pair.primary),
        &[
            "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC",
            "CREATE ROLE app LOGIN",
            "ALTER DATABASE sagaflow_failover OWNER TO app",
        ],
    )
    .await;
    let url = format!(
        "postgres://app@{},{}/sagaflow_failover",
        pair.standby.host_port(),
        pair.primary.host_port()
    );
    // The revocation holds for the role (and has reached the standby).
    let direct = Database::connect(format!(
        "postgres://app@{}/sagaflow_failover",
        pair.primary.host_port()
    ))
    .await
    .expect("app on the primary");
    let denied = direct
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT system_identifier FROM pg_control_system()",
        ))
        .await
        .expect_err("pg_control_system() revoked");
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    let _ = direct.close().await;
    let engine = Engine::builder()
        .with_database_url(url)
        .with_workflow(one_step())
        .start()
        .await
        .expect("the primary, listed second, is found");
    completed_run(&engine).await;
    tokio::time::timeout(Duration::from_secs(20), engine.shutdown())
        .await
        .expect("shuts down");
    drop(pair);
}
