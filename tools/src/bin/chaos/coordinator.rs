//! The coordinator: sets the stage, submits the orders, kills and restarts engine processes
//! and PostgreSQL until every run is terminal (or time is up), then hands over to the checks.
//!
//! Submission: the coordinator submits every order from its own client-only engine instance
//! (`with_workers(false)`: no scheduler, agents or supervisor), so that a SIGKILL never hits
//! a half-done submission loop (which would need a way to tell which orders were already
//! accepted), and every step is run by the engine processes of the fleet, which get killed.
//! The client registers the same order saga, to resolve and check the input of the
//! workflow it starts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sagaflow::internals::store::Store;
use sagaflow::{Engine, RunState};
use sagaflow_testkit::services::{FaultPlan, HttpServices, ServicePlans, Services, serve};
use sagaflow_tools::Error;
use sagaflow_workflows::order::{OrderApis, order_saga};
use tokio::task::JoinHandle;

use super::check;
use super::cli::Args;
use super::fleet::{self, Fleet, WorkerSpec};
use super::postgres::ChaosDb;
use super::rescue::rescue_time;
use super::stage::{self, RestartTarget, durability, init_logging, pct};
use super::stats::{ChaosStats, Restart};
use super::submit::{Intake, Submitted, submit_all};
use super::worker;

/// How often the coordinator looks at the run counts (and decides whether a kill is due).
const POLL: Duration = Duration::from_millis(100);
/// How often it prints a progress line.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Why the main loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Every run reached a terminal state.
    AllTerminal,
    /// `--timeout-secs` passed first.
    TimedOut,
    /// Ctrl-C.
    Interrupted,
}

/// Freezes the engine process `pid` (SIGSTOP) for `d`, then lets it go on (SIGCONT): a
/// process whose heartbeat is late while it lives, as a long pause of its host would leave it.
async fn freeze(pid: u32, d: Duration) {
    signal(pid, "STOP");
    tokio::time::sleep(d).await;
    signal(pid, "CONT");
}

/// Sends `sig` to `pid` with kill(1) (a process that exited meanwhile is ignored).
fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// An operator cancels one run that has not reserved stock yet (a cancel past the pivot
/// `ship` would leave its effect standing: see the closing notes of docs/reliability.md);
/// `true` when a run was cancelled.
async fn cancel_one(store: Store) -> bool {
    use sagaflow::sea_orm::{ConnectionTrait, Statement};
    let conn = store.connection();
    let pick = Statement::from_string(
        conn.get_database_backend(),
        "SELECT run_id FROM sagaflow_steps WHERE name = 'reserve_stock' \
         AND state IN ('not_started', 'ready', 'running') LIMIT 1",
    );
    let Ok(Some(row)) = conn.query_one_raw(pick).await else {
        return false;
    };
    let Ok(id) = row.try_get::<uuid::Uuid>("", "run_id") else {
        return false;
    };
    let audit = sagaflow::internals::operator::Audit::new("chaos", "the customer cancelled");
    sagaflow::internals::operator::cancel(&store, id, &audit)
        .await
        .is_ok()
}

/// The coordinator's main: returns the exit code (0 pass, 1 an invariant failed, 2 the run
/// could not be set up, 130 interrupted).
pub(crate) async fn run(args: Args) -> u8 {
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        return 2;
    }
    init_logging();
    println!(
        "sagaflow-chaos · {} engine processes · {} orders · faults {} transient, {} hang, {} lost replies, {} terminal · seed {}",
        args.processes,
        args.orders,
        pct(args.transient),
        pct(args.hang),
        pct(args.lose_reply),
        pct(args.permanent),
        args.seed
    );
    println!("  machine: {}", sagaflow_tools::machine::describe());

    // PostgreSQL: the given server, or a private cluster.
    let (admin_url, own) = match stage::postgres(&args).await {
        Ok(found) => found,
        Err(e) => {
            eprintln!("error: cannot prepare PostgreSQL: {e}");
            return 2;
        }
    };
    let restart = stage::restart_target(&args, own.as_ref());

    let db = match ChaosDb::create(&admin_url, !args.server_commit_mode).await {
        Ok(db) => db,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    println!("  database: {}", db.url);

    let code = match chaos(&args, &db, restart).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    };
    if args.keep_db {
        println!("  kept database {}", db.url);
    } else if let Err(e) = db.drop_db().await {
        eprintln!("warning: {e}");
    }
    drop(own);
    code
}

/// Everything between creating the database and dropping it.
async fn chaos(args: &Args, db: &ChaosDb, restart: Option<RestartTarget>) -> Result<u8, Error> {
    let started = Instant::now();
    // Connecting migrates the schema once, before the fleet starts.
    let store = Store::connect(&db.url, Some(4)).await?;
    println!("  durability: {}", durability(&store).await);

    let services = Services::new(ServicePlans::uniform(FaultPlan {
        transient: args.transient,
        hang: args.hang,
        lose_reply: args.lose_reply,
        permanent: args.permanent,
        ..FaultPlan::seeded(args.seed)
    }));
    let server = serve(services.clone(), ([127, 0, 0, 1], 0).into())
        .await
        .map_err(Error::io("cannot serve the simulated services"))?;
    let services_url = server.base_url();

    let log_dir = fleet::log_dir(args.log_dir.as_deref())
        .map_err(Error::io("cannot create the log directory"))?;
    println!(
        "  services: {services_url} · engine logs: {}",
        log_dir.display()
    );
    println!(
        "  engine: deadline {:?} (cap {:?}) · {} failures max · lease {:?}/{:?} · sweep {:?} · heartbeat defaults · {} SIGKILLs, one per {} ended runs · {} SIGSTOPs of 1-3 s · {} cancels",
        worker::DEADLINE,
        worker::DEADLINE_CAP,
        worker::MAX_FAILURES,
        worker::LEASE_TTL,
        worker::LEASE_RENEW,
        worker::SWEEP,
        args.kills,
        args.orders as u64 / (args.kills + 1),
        args.pauses,
        args.cancels
    );
    let logs_are_ours = args.log_dir.is_none();
    let logs_at = log_dir.clone();
    let exe = std::env::current_exe().map_err(Error::io("cannot find this binary"))?;
    let mut fleet = Fleet::start(
        WorkerSpec {
            exe,
            database_url: db.url.clone(),
            services_url: services_url.clone(),
            log_dir,
        },
        args.processes,
    )
    .map_err(Error::io("cannot start the engine processes"))?;

    let submitter = Engine::builder()
        .with_database_url(db.url.clone())
        .with_instance_id("chaos-submitter")
        .with_workflow_result(order_saga(
            OrderApis::from(&HttpServices::new(services_url)),
            worker::order_settings(),
        ))
        .with_workers(false)
        .with_pool_size(8)
        .with_retention(None)
        .start()
        .await?;
    let intake = Arc::new(Intake::new(args.orders));
    // Submissions pause while PostgreSQL restarts (see `submit_all`).
    let gate = Arc::new(tokio::sync::RwLock::new(()));
    let mut submission = Some(tokio::spawn(submit_all(
        submitter.clone(),
        args.orders,
        intake.clone(),
        gate.clone(),
    )));
    let mut submitted: Option<Submitted> = None;

    let mut stats = ChaosStats::default();
    let mut rng = StdRng::seed_from_u64(args.seed ^ 0x5eed_c4a0_5000_0001);
    let mut rescues = tokio::task::JoinSet::new();
    let mut freezes = tokio::task::JoinSet::new();
    let mut cancels = tokio::task::JoinSet::new();
    let mut poll_tick = tokio::time::interval(POLL);
    let mut last_progress = Instant::now();
    let mut restarting: Option<(Duration, JoinHandle<Result<Duration, Error>>)> = None;
    let mut monitor_errors = 0u64;
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);

    let ending = loop {
        tokio::select! {
            _ = poll_tick.tick() => {
                if Instant::now() >= deadline {
                    break Ending::TimedOut;
                }
                fleet.reap().map_err(Error::io("cannot restart an engine process"))?;
                if submitted.is_none() && submission.as_ref().is_some_and(JoinHandle::is_finished) {
                    if let Some(task) = submission.take() {
                        let took = task.await.map_err(Error::task("submission"))?;
                        let s = intake.snapshot(took);
                        println!(
                            "  submitted {}/{} orders in {:.1} s",
                            s.ids.iter().flatten().count(),
                            args.orders,
                            s.took.as_secs_f64()
                        );
                        submitted = Some(s);
                    }
                    submitter.shutdown().await;
                }
                if let Some((at, task)) = restarting.take_if(|(_, t)| t.is_finished()) {
                    let result = task.await.map_err(Error::task("postgres restart"))?;
                    match &result {
                        Ok(took) => println!(
                            "  [{:>4.0}s] postgres restarted (pg_ctl restart -m immediate), back after {:.1} s",
                            at.as_secs_f64(),
                            took.as_secs_f64()
                        ),
                        Err(e) => println!("  [{:>4.0}s] postgres restart FAILED: {e}", at.as_secs_f64()),
                    }
                    stats.pg_restart = Some(Restart { at, result });
                }
                let counts = match store.run_count_by_state().await {
                    Ok(c) => c,
                    Err(_) => {
                        // PostgreSQL restarting; the pool reconnects on its own.
                        monitor_errors += 1;
                        continue;
                    }
                };
                let count = |s: RunState| i64::try_from(counts.get(s)).unwrap_or(i64::MAX);
                let terminal = count(RunState::Completed) + count(RunState::Compensated) + count(RunState::Error);
                let total = i64::try_from(counts.total()).unwrap_or(i64::MAX);
                let expected = submitted.as_ref().map(|s| s.ids.iter().flatten().count());
                // Kills follow progress: the k-th when k / (kills + 1) of the orders ended.
                let due = u64::try_from(terminal).unwrap_or(0) * (args.kills + 1)
                    / args.orders as u64;
                if fleet.kills < due.min(args.kills) {
                    let slot = rng.random_range(0..fleet.len());
                    let victim = fleet
                        .kill_and_restart(slot)
                        .map_err(Error::io(format!("cannot restart engine process {slot}")))?;
                    rescues.spawn(rescue_time(store.clone(), victim, Instant::now()));
                }
                // SIGSTOPs and cancels follow progress the same way.
                let due = |n: u64| u64::try_from(terminal).unwrap_or(0) * (n + 1) / args.orders as u64;
                if stats.pauses < due(args.pauses).min(args.pauses) {
                    let slot = rng.random_range(0..fleet.len());
                    if let Some(pid) = fleet.pid(slot) {
                        let frozen = Duration::from_millis(rng.random_range(1_000..=3_000));
                        freezes.spawn(freeze(pid, frozen));
                        stats.pauses += 1;
                    }
                }
                if stats.cancels < due(args.cancels).min(args.cancels) {
                    stats.cancels += 1;
                    cancels.spawn(cancel_one(store.clone()));
                }
                // Restart PostgreSQL once, when a third of the orders are done: the fleet is
                // busy with the rest.
                if let Some(target) = &restart
                    && stats.pg_restart.is_none()
                    && restarting.is_none()
                    && usize::try_from(terminal).unwrap_or(0) * 3 >= args.orders
                {
                    let (target, gate) = (target.clone(), gate.clone());
                    let at = started.elapsed();
                    println!(
                        "  [{:>4.0}s] restarting postgres (immediate) with {} runs in flight…",
                        at.as_secs_f64(),
                        total - terminal
                    );
                    restarting = Some((at, tokio::spawn(async move {
                        let _paused = gate.write().await;
                        tokio::task::spawn_blocking(move || target.restart())
                            .await
                            .unwrap_or_else(|e| Err(Error::task("postgres restart")(e)))
                    })));
                }
                // The chaos must happen, however quick the run: one kill and the restart.
                let restart_done = restart.is_none() || stats.pg_restart.is_some();
                let killed = fleet.kills >= args.kills
                    && stats.pauses >= args.pauses
                    && stats.cancels >= args.cancels;
                if let Some(expected) = expected
                    && restart_done
                    && killed
                    && terminal >= i64::try_from(expected).unwrap_or(i64::MAX)
                {
                    break Ending::AllTerminal;
                }
                if last_progress.elapsed() >= PROGRESS_EVERY {
                    last_progress = Instant::now();
                    println!(
                        "  [{:>4.0}s] accepted {} · terminal {terminal}/{total} (completed {}, compensated {}, error {}) · kills {}",
                        started.elapsed().as_secs_f64(),
                        intake.accepted.load(Ordering::Relaxed),
                        count(RunState::Completed),
                        count(RunState::Compensated),
                        count(RunState::Error),
                        fleet.kills
                    );
                }
            }
            _ = &mut ctrl_c => break Ending::Interrupted,
        }
    };
    let elapsed = started.elapsed();
    match ending {
        Ending::AllTerminal => println!(
            "  [{:>4.0}s] every run is terminal; stopping the fleet",
            elapsed.as_secs_f64()
        ),
        Ending::TimedOut => println!(
            "  [{:>4.0}s] timed out (--timeout-secs {}); stopping the fleet",
            elapsed.as_secs_f64(),
            args.timeout_secs
        ),
        Ending::Interrupted => println!("  interrupted; stopping the fleet"),
    }

    // Stop the chaos: no more kills; frozen processes are thawed; the engine processes shut
    // down.
    while freezes.join_next().await.is_some() {}
    let mut cancelled = 0;
    while let Some(r) = cancels.join_next().await {
        cancelled += u64::from(r.unwrap_or(false));
    }
    stats.cancels = cancelled;
    let forced = fleet.stop(Duration::from_secs(10)).await;
    if let Some(task) = submission.take() {
        if task.is_finished() {
            // Finished since the last poll.
            if let Ok(took) = task.await {
                submitted = Some(intake.snapshot(took));
            }
        } else {
            task.abort();
        }
    }
    submitter.shutdown().await;
    if let Some((_, task)) = restarting.take() {
        // Let a restart in progress finish, so the checks can read the database.
        if let Ok(result) = task.await {
            stats.pg_restart = Some(Restart {
                at: elapsed,
                result,
            });
        }
    }
    while let Some(r) = rescues.join_next().await {
        match r {
            Ok(Some(took)) => stats.rescues.push(took),
            Ok(None) => stats.idle_kills += 1,
            Err(e) => return Err(Error::task("rescue watcher")(e)),
        }
    }
    stats.kills = fleet.kills;
    stats.restarts = fleet.restarts;
    stats.unexpected_exits = std::mem::take(&mut fleet.unexpected_exits);
    stats.forced_stops = forced;
    stats.monitor_errors = monitor_errors;
    stats.pg_restart_expected = restart.is_some();
    stats.elapsed = elapsed;
    stats.ending = Some(ending);

    let submitted = submitted.unwrap_or_else(|| {
        let mut s = intake.snapshot(elapsed);
        s.errors.push("the submission did not finish".into());
        s
    });
    let report = check::verify(&store, &services, &submitted, &stats).await;
    let _ = server.shutdown().await;
    if let Some(path) = &args.report_json {
        report.write_json(path)?;
    }
    let passed = report.passed();
    if passed && logs_are_ours {
        // Nothing to look at: do not leave temp files behind.
        let _ = std::fs::remove_dir_all(&logs_at);
    } else {
        println!("engine logs kept in {}", logs_at.display());
    }
    Ok(match ending {
        Ending::Interrupted => 130,
        _ if passed => 0,
        _ => 1,
    })
}
