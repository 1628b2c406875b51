//! The coordinator: sets the stage, submits the orders, kills and restarts engine processes
//! and PostgreSQL until every run is terminal (or time is up), then hands over to the checks.
//!
//! Submission: the coordinator submits every order from its own client-only engine instance
//! (`with_workers(false)`: no scheduler, agents or supervisor), so that a SIGKILL never hits
//! a half-done submission loop (which would need a way to tell which orders were already
//! accepted), and every step is run by the engine processes of the fleet, which get killed.
//! The client registers the same order saga, to resolve and check the input of the
//! workflow it starts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow::{Engine, OnDuplicate, RunState, StartOptions, Store};
use sagaflow_testkit::services::{FaultPlan, HttpServices, ServicePlans, Services, serve};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use tokio::task::JoinHandle;
use tracing_subscriber::EnvFilter;
use uuid::Uuid;

use super::check::{self, ChaosStats, Restart};
use super::cli::Args;
use super::fleet::{self, Fleet, WorkerSpec};
use sagaflow_testkit::{self as postgres, PgCluster};

use super::postgres::ChaosDb;
use super::worker;

/// Concurrent submitters.
const SUBMITTERS: usize = 16;
/// Attempts per submission before it counts as failed.
const SUBMIT_ATTEMPTS: u32 = 20;
/// How often the coordinator looks at the run counts (and decides whether a kill is due).
const POLL: Duration = Duration::from_millis(100);
/// How often a rescue watcher looks at the steps a killed process held.
const RESCUE_POLL: Duration = Duration::from_millis(50);
/// How long a rescue watcher waits before it reports the steps as never rescued.
const RESCUE_GIVE_UP: Duration = Duration::from_secs(120);
/// How often it prints a progress line.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Where and how to restart PostgreSQL mid-run.
#[derive(Debug, Clone)]
struct RestartTarget {
    bin: Option<std::path::PathBuf>,
    data_dir: std::path::PathBuf,
    log: Option<std::path::PathBuf>,
}

/// The submission's progress, shared with the submitting tasks (readable even when they
/// are stopped half-way by the timeout).
#[derive(Debug)]
struct Intake {
    ids: Mutex<Vec<Option<Uuid>>>,
    errors: Mutex<Vec<String>>,
    accepted: AtomicUsize,
}

impl Intake {
    fn new(orders: usize) -> Self {
        Self {
            ids: Mutex::new(vec![None; orders]),
            errors: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
        }
    }

    fn snapshot(&self, took: Duration) -> Submitted {
        Submitted {
            ids: self
                .ids
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            errors: self
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            took,
        }
    }
}

/// What the submission produced.
#[derive(Debug, Default)]
pub(crate) struct Submitted {
    /// The run id of each order (by order number), `None` when it could not be submitted.
    pub(crate) ids: Vec<Option<Uuid>>,
    /// Why submissions failed (first few).
    pub(crate) errors: Vec<String>,
    /// How long it took.
    pub(crate) took: Duration,
}

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

fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("error,sagaflow_engine::hub=off")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// `fsync` and `synchronous_commit` as the engine's sessions see them.
async fn durability(store: &Store) -> String {
    let show = |what: &'static str| async move {
        store
            .connection()
            .query_one_raw(Statement::from_string(
                store.connection().get_database_backend(),
                format!("SHOW {what}"),
            ))
            .await
            .ok()
            .flatten()
            .and_then(|r| r.try_get_by_index::<String>(0).ok())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "fsync={} · synchronous_commit={} · full_page_writes={}",
        show("fsync").await,
        show("synchronous_commit").await,
        show("full_page_writes").await
    )
}

fn pct(x: f64) -> String {
    format!("{}%", (x * 1000.0).round() / 10.0)
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
    let mut own: Option<PgCluster> = None;
    let admin_url = match &args.database_url {
        Some(url) => url.clone(),
        None => {
            let script = postgres::script_path(args.pg_script.as_deref());
            match tokio::task::spawn_blocking(move || PgCluster::start(&script)).await {
                Ok(Ok(mut c)) => {
                    c.keep = args.keep_db;
                    let url = c.url.clone();
                    if !args.fast_unsafe
                        && let Err(e) = postgres::make_durable(&url).await
                    {
                        eprintln!("error: cannot switch the cluster to full durability: {e}");
                        return 2;
                    }
                    println!(
                        "  postgres: private throwaway cluster in {}",
                        c.dir.display()
                    );
                    own = Some(c);
                    url
                }
                Ok(Err(e)) => {
                    eprintln!("error: cannot start a PostgreSQL cluster: {e}");
                    return 2;
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return 2;
                }
            }
        }
    };
    let restart = if args.no_pg_restart {
        println!("  postgres restart: off (--no-pg-restart)");
        None
    } else if let Some(c) = &own {
        Some(RestartTarget {
            bin: Some(c.bin.clone()),
            data_dir: c.data_dir(),
            log: Some(c.dir.join("server.log")),
        })
    } else if let Some(d) = &args.pg_ctl_data_dir {
        Some(RestartTarget {
            bin: postgres::pg_bin(args.pg_bin.as_deref()),
            data_dir: d.clone(),
            log: None,
        })
    } else {
        println!(
            "  postgres restart: skipped (the server is not ours; pass --pg-ctl-data-dir to restart it)"
        );
        None
    };

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
async fn chaos(args: &Args, db: &ChaosDb, restart: Option<RestartTarget>) -> Result<u8, String> {
    let started = Instant::now();
    // Connecting migrates the schema once, before the fleet starts.
    let store = Store::connect(&db.url, Some(4))
        .await
        .map_err(|e| format!("cannot open {}: {e}", db.url))?;
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
        .map_err(|e| format!("cannot serve the simulated services: {e}"))?;
    let services_url = server.base_url();

    let log_dir = fleet::log_dir(args.log_dir.as_deref())
        .map_err(|e| format!("cannot create the log directory: {e}"))?;
    println!(
        "  services: {services_url} · engine logs: {}",
        log_dir.display()
    );
    println!(
        "  engine: deadline {:?} (cap {:?}) · {} failures max · lease {:?}/{:?} · sweep {:?} · heartbeat defaults · {} SIGKILLs, one per {} ended runs",
        worker::DEADLINE,
        worker::DEADLINE_CAP,
        worker::MAX_FAILURES,
        worker::LEASE_TTL,
        worker::LEASE_RENEW,
        worker::SWEEP,
        args.kills,
        args.orders as u64 / (args.kills + 1)
    );
    let logs_are_ours = args.log_dir.is_none();
    let logs_at = log_dir.clone();
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let mut fleet = Fleet::start(
        WorkerSpec {
            exe,
            database_url: db.url.clone(),
            services_url: services_url.clone(),
            log_dir,
        },
        args.processes,
    )
    .map_err(|e| format!("cannot start the engine processes: {e}"))?;

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
        .await
        .map_err(|e| format!("cannot start the submitting engine: {e}"))?;
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
    let mut poll_tick = tokio::time::interval(POLL);
    let mut last_progress = Instant::now();
    let mut restarting: Option<(Duration, JoinHandle<Result<Duration, String>>)> = None;
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
                fleet.reap().map_err(|e| format!("cannot restart an engine process: {e}"))?;
                if submitted.is_none() && submission.as_ref().is_some_and(JoinHandle::is_finished) {
                    if let Some(task) = submission.take() {
                        let took = task.await.map_err(|e| format!("submission task: {e}"))?;
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
                    let result = task.await.map_err(|e| format!("restart task: {e}"))?;
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
                let count = |s: RunState| {
                    counts.iter().filter(|(n, _)| n == s.as_str()).map(|(_, c)| *c).sum::<i64>()
                };
                let terminal = count(RunState::Completed) + count(RunState::Compensated) + count(RunState::Error);
                let total: i64 = counts.iter().map(|(_, c)| *c).sum();
                let expected = submitted.as_ref().map(|s| s.ids.iter().flatten().count());
                // Kills follow progress: the k-th when k / (kills + 1) of the orders ended.
                let due = u64::try_from(terminal).unwrap_or(0) * (args.kills + 1)
                    / args.orders as u64;
                if fleet.kills < due.min(args.kills) {
                    let slot = rng.random_range(0..fleet.len());
                    let victim = fleet
                        .kill_and_restart(slot)
                        .map_err(|e| format!("cannot restart engine process {slot}: {e}"))?;
                    rescues.spawn(rescue_time(store.clone(), victim, Instant::now()));
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
                        tokio::task::spawn_blocking(move || {
                            postgres::restart_immediate(target.bin.as_deref(), &target.data_dir, target.log.as_deref())
                                .map_err(|e| e.to_string())
                        })
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()))
                    })));
                }
                // The chaos must happen, however quick the run: one kill and the restart.
                let restart_done = restart.is_none() || stats.pg_restart.is_some();
                let killed = fleet.kills >= args.kills;
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

    // Stop the chaos: no more kills; the engine processes shut down.
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
            Err(e) => return Err(format!("rescue watcher: {e}")),
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
    let passed = check::verify(&store, &services, &submitted, &stats).await;
    let _ = server.shutdown().await;
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

/// Submits orders `0..orders` from `SUBMITTERS` concurrent tasks; each submission is retried
/// (returning the existing run if an earlier attempt got through).
///
/// Each attempt holds a read guard of `gate`; the PostgreSQL restart holds the write guard,
/// so intake pauses during the restart. Otherwise a commit whose answer was lost in the
/// crash would be retried, and if the run had already finished (which frees its business
/// key) the retry would start a second run for the order: correct engine behaviour, but it
/// would blur the "one run per order" check.
async fn submit_all(
    engine: Engine,
    orders: usize,
    intake: Arc<Intake>,
    gate: Arc<tokio::sync::RwLock<()>>,
) -> Duration {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..SUBMITTERS.min(orders) {
        let (engine, next, intake, gate) =
            (engine.clone(), next.clone(), intake.clone(), gate.clone());
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= orders {
                    return;
                }
                let order = Order::sample(n);
                let opts = StartOptions::keyed(order.order_id.clone())
                    .on_duplicate(OnDuplicate::ReturnExisting);
                let mut last = None;
                for _ in 0..SUBMIT_ATTEMPTS {
                    let open = gate.read().await;
                    let result = engine
                        .start_with(ORDER_WORKFLOW, &order, opts.clone())
                        .await;
                    drop(open);
                    match result {
                        Ok(s) => {
                            intake.ids.lock().unwrap_or_else(PoisonError::into_inner)[n] =
                                Some(s.id);
                            intake.accepted.fetch_add(1, Ordering::Relaxed);
                            last = None;
                            break;
                        }
                        Err(e) => {
                            last = Some(e.to_string());
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                }
                if let Some(e) = last {
                    let mut errors = intake.errors.lock().unwrap_or_else(PoisonError::into_inner);
                    if errors.len() < 5 {
                        errors.push(format!("{}: {e}", order.order_id));
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    started.elapsed()
}

/// How long after the SIGKILL of `victim` (at `killed`) every step it held was released to
/// the queue, or `None` when it held nothing. The released steps are claimed by a live
/// process at once (they are queued and, on PostgreSQL, announced by NOTIFY).
async fn rescue_time(store: Store, victim: String, killed: Instant) -> Option<Duration> {
    let held = loop {
        match store.step_list_owned(&victim, 10_000).await {
            Ok(steps) => break steps,
            // PostgreSQL may be restarting.
            Err(_) if killed.elapsed() < RESCUE_GIVE_UP => {
                tokio::time::sleep(RESCUE_POLL).await;
            }
            Err(_) => return None,
        }
    };
    if held.is_empty() {
        return None;
    }
    while killed.elapsed() < RESCUE_GIVE_UP {
        if store
            .step_list_owned(&victim, 1)
            .await
            .is_ok_and(|s| s.is_empty())
        {
            return Some(killed.elapsed());
        }
        tokio::time::sleep(RESCUE_POLL).await;
    }
    Some(RESCUE_GIVE_UP)
}
