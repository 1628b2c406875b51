//! The coordinator: sets the stage, submits the runs (orders, pairs, flows), sends the
//! flows' events, records every finished run before retention can purge it, kills, freezes
//! and restarts engine processes (the leader among them), cancels runs one by one and in
//! bulk, restarts PostgreSQL, until every run is terminal (or time is up), then hands over
//! to the checks.
//!
//! Submission: the coordinator submits every run from its own client-only engine instance
//! (`with_workers(false)`: no scheduler, agents or supervisor), so that a SIGKILL never hits
//! a half-done submission loop (which would need a way to tell which runs were already
//! accepted), and every step is run by the engine processes of the fleet, which get killed.
//! The client ([`super::client`]) registers the same workflows (the flow in version 1 only),
//! to resolve and check the input of the workflow it starts; it also sends the events and
//! takes the operators' cancels.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sagaflow::RunState;
use sagaflow::internals::store::Store;
use sagaflow_testkit::services::{FaultPlan, ServicePlans, Services, serve};
use sagaflow_tools::Error;
use tokio::task::JoinHandle;

use super::cancels::{cancel_batch, cancel_one, leader};
use super::check;
use super::cli::Args;
use super::client;
use super::events::{EventTally, send_events};
use super::fleet::{self, Fleet, WorkerSpec};
use super::observer::Observed;
use super::postgres::ChaosDb;
use super::rescue::rescue_time;
use super::stage::{self, RestartTarget, durability, init_logging, pct};
use super::stats::{ChaosStats, Restart};
use super::submit::{Intake, Submitted, plan, submit_all};
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

/// The coordinator's main: returns the exit code (0 pass, 1 an invariant failed, 2 the run
/// could not be set up, 130 interrupted).
pub(crate) async fn run(args: Args) -> u8 {
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        return 2;
    }
    init_logging();
    println!(
        "sagaflow-chaos · {} engine processes · {} orders, {} pairs, {} flows · faults {} transient, {} hang, {} lost replies, {} terminal · seed {}",
        args.processes,
        args.orders,
        args.pairs,
        args.flows,
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
        "  engine: deadline {:?} (cap {:?}) · {} failures max · lease {:?}/{:?} · sweep {:?} · timer pass {:?} · retention {} ms · heartbeat defaults · {} SIGKILLs, one per {} ended runs · {} SIGSTOPs of 1-3 s · {} of the leader · {} cancels · {} bulk cancels of {}",
        worker::DEADLINE,
        worker::DEADLINE_CAP,
        worker::MAX_FAILURES,
        worker::LEASE_TTL,
        worker::LEASE_RENEW,
        worker::SWEEP,
        worker::TIMER_PASS,
        args.retention_ms,
        args.kills,
        args.runs() as u64 / (args.kills + 1),
        args.pauses,
        args.leader_pauses,
        args.cancels,
        args.bulk_cancels,
        args.bulk_size
    );
    let logs_are_ours = args.log_dir.is_none();
    let logs_at = log_dir.clone();
    let exe = std::env::current_exe().map_err(Error::io("cannot find this binary"))?;
    let submitter = client::start(&db.url, &services_url).await?;
    let mut fleet = Fleet::start(
        WorkerSpec {
            exe,
            database_url: db.url.clone(),
            services_url: services_url.clone(),
            retention_ms: args.retention_ms,
            log_dir,
        },
        args.processes,
    )
    .map_err(Error::io("cannot start the engine processes"))?;

    let plan = Arc::new(plan(args.orders, args.pairs, args.flows));
    let runs = plan.len();
    let intake = Arc::new(Intake::new(runs));
    // Submissions pause while PostgreSQL restarts (see `submit_all`).
    let gate = Arc::new(tokio::sync::RwLock::new(()));
    let (event_keys, keys_rx) = tokio::sync::mpsc::unbounded_channel();
    let event_tally = Arc::new(EventTally::default());
    let mut event_sender = Some(tokio::spawn(send_events(
        submitter.clone(),
        keys_rx,
        event_tally.clone(),
    )));
    let mut submission = Some(tokio::spawn(submit_all(
        submitter.clone(),
        plan.clone(),
        intake.clone(),
        gate.clone(),
        event_keys,
    )));
    let observed = Arc::new(Observed::default());
    let observer = {
        let (observed, store) = (observed.clone(), store.clone());
        tokio::spawn(async move { observed.watch(store).await })
    };
    let mut submitted: Option<Submitted> = None;

    let mut stats = ChaosStats::default();
    let mut rng = StdRng::seed_from_u64(args.seed ^ 0x5eed_c4a0_5000_0001);
    let mut rescues = tokio::task::JoinSet::new();
    let mut freezes = tokio::task::JoinSet::new();
    let mut cancels = tokio::task::JoinSet::new();
    let mut bulk = tokio::task::JoinSet::new();
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
                if submitted.is_none()
                    && submission.as_ref().is_some_and(JoinHandle::is_finished)
                    && let Some(task) = submission.take()
                {
                    let took = task.await.map_err(Error::task("submission"))?;
                    let s = intake.snapshot(took);
                    println!(
                        "  submitted {}/{runs} runs in {:.1} s",
                        s.ids.iter().flatten().count(),
                        s.took.as_secs_f64()
                    );
                    submitted = Some(s);
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
                    stats.pg_restarts.push(Restart { at, result });
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
                // Progress: the submitted runs seen finished (purged ones included; children
                // apart).
                let ended = observed.roots_ended.load(Ordering::Relaxed);
                // Kills follow progress: the k-th when k / (kills + 1) of the runs ended.
                let due = ended * (args.kills + 1) / runs as u64;
                if fleet.kills < due.min(args.kills) {
                    let slot = rng.random_range(0..fleet.len());
                    let victim = fleet
                        .kill_and_restart(slot)
                        .map_err(Error::io(format!("cannot restart engine process {slot}")))?;
                    rescues.spawn(rescue_time(store.clone(), victim, Instant::now()));
                }
                // SIGSTOPs and cancels follow progress the same way.
                let due = |n: u64| ended * (n + 1) / runs as u64;
                if stats.pauses < due(args.pauses).min(args.pauses) {
                    let slot = rng.random_range(0..fleet.len());
                    if let Some(pid) = fleet.pid(slot) {
                        let frozen = Duration::from_millis(rng.random_range(1_000..=3_000));
                        freezes.spawn(freeze(pid, frozen));
                        stats.pauses += 1;
                    }
                }
                if stats.leader_pauses < due(args.leader_pauses).min(args.leader_pauses)
                    && let Some(slot) = leader(&store).await.and_then(|l| fleet.slot_of(&l))
                    && let Some(pid) = fleet.pid(slot)
                {
                    // Longer than the lease: another process must take the leadership over.
                    let frozen = Duration::from_millis(rng.random_range(2_500..=3_500));
                    freezes.spawn(freeze(pid, frozen));
                    stats.leader_pauses += 1;
                }
                if stats.cancels < due(args.cancels).min(args.cancels) {
                    stats.cancels += 1;
                    cancels.spawn(cancel_one(store.clone()));
                }
                if stats.bulk_cancels < due(args.bulk_cancels).min(args.bulk_cancels) {
                    stats.bulk_cancels += 1;
                    bulk.spawn(cancel_batch(store.clone(), args.bulk_size));
                }
                // Restart PostgreSQL `--pg-restarts` times, the k-th when k / (n + 2) of the
                // runs ended (once: at a third), so the fleet is busy with the rest.
                if let Some(target) = &restart
                    && restarting.is_none()
                    && (stats.pg_restarts.len() as u64)
                        < (ended * (args.pg_restarts + 2) / runs as u64).min(args.pg_restarts)
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
                let restart_done =
                    restart.is_none() || stats.pg_restarts.len() as u64 >= args.pg_restarts;
                let killed = fleet.kills >= args.kills
                    && stats.pauses >= args.pauses
                    && stats.leader_pauses >= args.leader_pauses
                    && stats.cancels >= args.cancels
                    && stats.bulk_cancels >= args.bulk_cancels;
                // Every submitted run seen finished, and no run left unfinished in the
                // database (children included).
                if let Some(expected) = expected
                    && restart_done
                    && killed
                    && ended >= expected as u64
                    && terminal >= total
                {
                    break Ending::AllTerminal;
                }
                if last_progress.elapsed() >= PROGRESS_EVERY {
                    last_progress = Instant::now();
                    println!(
                        "  [{:>4.0}s] accepted {} · ended {ended}/{runs} · in the database terminal {terminal}/{total} (completed {}, compensated {}, error {}) · kills {}",
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
        if let Ok(Some(id)) = r {
            cancelled += 1;
            stats.cancelled.insert(id);
        }
    }
    stats.cancels = cancelled;
    while let Some(r) = bulk.join_next().await {
        if let Ok((ids, refused)) = r {
            stats.bulk_cancelled += ids.len() as u64;
            stats.bulk_refused += refused;
            stats.cancelled.extend(ids);
        }
    }
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
    if let Some(mut task) = event_sender.take() {
        // Every flow is finished (or time is up): what is left to send is refused at once.
        if tokio::time::timeout(Duration::from_secs(10), &mut task)
            .await
            .is_err()
        {
            task.abort();
            println!("  the event sender did not finish within 10 s");
        }
    }
    stats.events_sent = event_tally.sent.load(Ordering::Relaxed);
    stats.events_refused = event_tally.refused.load(Ordering::Relaxed);
    stats.events_failed = event_tally.failed.load(Ordering::Relaxed);
    submitter.shutdown().await;
    if let Some((_, task)) = restarting.take() {
        // Let a restart in progress finish, so the checks can read the database.
        if let Ok(result) = task.await {
            stats.pg_restarts.push(Restart {
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
    stats.pg_restarts_planned = if restart.is_some() {
        args.pg_restarts
    } else {
        0
    };
    stats.elapsed = elapsed;
    stats.ending = Some(ending);

    let submitted = submitted.unwrap_or_else(|| {
        let mut s = intake.snapshot(elapsed);
        s.errors.push("the submission did not finish".into());
        s
    });
    // The last look before the checks (nothing is purged any more: the fleet is down).
    observer.abort();
    for _ in 0..20 {
        if observed.poll(&store).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stats.monitor_errors += observed.errors.load(Ordering::Relaxed);
    let report = check::verify(
        &store,
        &services,
        plan.as_slice(),
        &submitted,
        &observed.snapshot(),
        &stats,
    )
    .await;
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
