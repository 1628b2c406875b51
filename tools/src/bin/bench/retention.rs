//! `--retention N`: what the retention pass costs over N finished runs (issue 32).
//!
//! Two phases, each over N finished runs (three history rows each) that finished between
//! 7 days and 14 days ago, with the retention at its default of 7 days, so that every one of
//! them is due:
//!
//! 1. **Alone:** the pass runs on an idle engine until nothing is due. Printed: how long it
//!    took, the WAL it wrote, then what a `VACUUM` of the runs and history tables afterwards
//!    took and wrote (a row delete leaves dead rows for it; a dropped partition leaves none).
//! 2. **Under load:** the bench saga runs flat out (`--max-in-flight` runs in flight) for
//!    `--load-secs` while nothing is due, then while the same pass runs. Printed: completed
//!    sagas per second in each window and the longest gap between two completions (a lock
//!    that stalls the hot path shows as a gap), read from the runs' own `finished_at` on the
//!    database clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sagaflow::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use sagaflow::{Backend, Engine, RunState};
use sagaflow_tools::Error;
use tokio::sync::Semaphore;

use super::figures::{durability, settle};
use super::workload::workflow;

/// The retention window of the measurement: the engine's default.
const AGE_MS: i64 = 7 * 24 * 3_600_000;

/// Runs both phases over `runs` finished runs.
///
/// # Errors
/// When the engine cannot start or a statement fails.
pub(crate) async fn run(
    url: &str,
    runs: u64,
    load_secs: u64,
    in_flight: usize,
) -> Result<(), Error> {
    let engine = Engine::builder()
        .with_database_url(url.to_owned())
        .with_workflow(workflow(Arc::default(), false)?)
        .with_retention(None)
        .with_pool_size(16)
        .start()
        .await?;
    println!(
        "sagaflow-bench --retention {runs} · machine: {}",
        sagaflow_tools::machine::describe()
    );
    println!("  database: {}", durability(&engine).await);
    let db = engine.store().connection().clone();

    fill(&engine, runs).await?;
    let wal = Wal::of(&engine);
    let w0 = wal.now(&db).await?;
    let t0 = Instant::now();
    let purged = purge(&engine).await?;
    let took = t0.elapsed();
    let w1 = wal.now(&db).await?;
    let t1 = Instant::now();
    for sql in vacuums(engine.backend()) {
        db.execute_unprepared(sql)
            .await
            .map_err(sagaflow::Error::from)?;
    }
    let vacuum = t1.elapsed();
    let w2 = wal.now(&db).await?;
    println!("\nretention alone · {purged} runs due");
    println!(
        "  pass     {:>8.2} s   {:>9.0} runs/s   WAL {}",
        took.as_secs_f64(),
        purged as f64 / took.as_secs_f64(),
        wal.show(w1 - w0)
    );
    println!(
        "  vacuum   {:>8.2} s                    WAL {}",
        vacuum.as_secs_f64(),
        wal.show(w2 - w1)
    );

    fill(&engine, runs).await?;
    let load = Load::start(&engine, in_flight);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let store = engine.store();
    let a = store.now_ms().await?;
    tokio::time::sleep(Duration::from_secs(load_secs)).await;
    let b = store.now_ms().await?;
    let c = store.now_ms().await?;
    let t0 = Instant::now();
    let purged = purge(&engine).await?;
    let took = t0.elapsed();
    // At least `load_secs` of load measured with the pass, however fast it was.
    if took < Duration::from_secs(load_secs) {
        tokio::time::sleep(Duration::from_secs(load_secs) - took).await;
    }
    let d = store.now_ms().await?;
    load.stop().await;
    let quiet = Window::read(&db, a, b).await?;
    let busy = Window::read(&db, c, d).await?;
    println!(
        "\nretention under load · {purged} runs due · {in_flight} sagas in flight · pass took {:.2} s",
        took.as_secs_f64()
    );
    quiet.print("nothing due", &Window::default());
    busy.print("pass running", &quiet);
    engine.shutdown().await;
    Ok(())
}

/// `runs` finished runs, all due under [`AGE_MS`], then a vacuum and a checkpoint.
async fn fill(engine: &Engine, runs: u64) -> Result<(), Error> {
    let t = Instant::now();
    engine
        .store()
        .run_fill_finished(runs, (AGE_MS + 3_600_000)..(2 * AGE_MS))
        .await?;
    println!(
        "  filled {runs} finished runs in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    settle(engine).await;
    Ok(())
}

/// What the retention service does in one pass ([`Engine::purge_finished`]): every due run
/// deleted, then the history partitions no kept run needs dropped. Returns how many runs
/// went.
async fn purge(engine: &Engine) -> Result<u64, Error> {
    let age = Duration::from_millis(u64::try_from(AGE_MS).unwrap_or(0));
    Ok(engine.purge_finished(age).await?)
}

/// The statements that clean up after the pass.
fn vacuums(backend: Backend) -> &'static [&'static str] {
    match backend {
        Backend::Postgres => &[
            "VACUUM sagaflow_runs",
            "VACUUM sagaflow_run_keys",
            "VACUUM sagaflow_history",
        ],
        Backend::Sqlite => &["PRAGMA wal_checkpoint(TRUNCATE)"],
    }
}

/// The write-ahead log's position: PostgreSQL's WAL in bytes; SQLite's pages written
/// (`PRAGMA wal_checkpoint` reports none usefully across connections, so none is read).
struct Wal {
    postgres: bool,
}

impl Wal {
    fn of(engine: &Engine) -> Self {
        Self {
            postgres: engine.backend() == Backend::Postgres,
        }
    }

    async fn now(&self, db: &DatabaseConnection) -> Result<i64, Error> {
        if !self.postgres {
            return Ok(0);
        }
        let row = db
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS b",
            ))
            .await
            .map_err(sagaflow::Error::from)?
            .ok_or_else(|| Error::Usage("no WAL position".into()))?;
        Ok(row.try_get::<i64>("", "b").map_err(sagaflow::Error::from)?)
    }

    fn show(&self, bytes: i64) -> String {
        if self.postgres {
            format!("{:.1} MiB", bytes as f64 / 1_048_576.0)
        } else {
            "(not measured on SQLite)".into()
        }
    }
}

/// The saga load: `in_flight` runs in flight, a new one started as each completes.
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(engine: &Engine, in_flight: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let permits = Arc::new(Semaphore::new(in_flight));
        let mut tasks = Vec::new();
        let mut events = engine.subscribe();
        let (p, s) = (permits.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                match events.recv().await {
                    Ok(e) if e.state == RunState::Completed => p.add_permits(1),
                    Ok(_) => {}
                    // Lost events are counted as completions: the load stays near its level.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        p.add_permits(usize::try_from(n).unwrap_or(usize::MAX));
                    }
                    Err(_) => return,
                }
            }
        }));
        for _ in 0..8 {
            let (engine, p, s) = (engine.clone(), permits.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !s.load(Ordering::Relaxed) {
                    let Ok(permit) =
                        tokio::time::timeout(Duration::from_millis(200), p.acquire()).await
                    else {
                        continue;
                    };
                    let Ok(permit) = permit else { return };
                    permit.forget();
                    if let Err(e) = engine
                        .start("bench", &serde_json::json!({ "qty": 1 }))
                        .await
                    {
                        eprintln!("  (a start failed: {e})");
                    }
                }
            }));
        }
        Self { stop, tasks }
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

/// Completions of the bench saga in one window of the database clock.
#[derive(Debug, Default)]
struct Window {
    secs: f64,
    completed: i64,
    longest_gap_ms: i64,
}

impl Window {
    async fn read(db: &DatabaseConnection, from: i64, to: i64) -> Result<Self, Error> {
        let backend = db.get_database_backend();
        let (p1, p2) = if backend == DbBackend::Postgres {
            ("$1", "$2")
        } else {
            ("?1", "?2")
        };
        let row = db
            .query_one_raw(Statement::from_sql_and_values(
                backend,
                format!(
                    "SELECT COUNT(*) AS n, COALESCE(MAX(finished_at - prev), 0) AS gap FROM \
                     (SELECT finished_at, LAG(finished_at) OVER (ORDER BY finished_at) AS prev \
                      FROM sagaflow_runs_all WHERE workflow = 'bench' AND state = 'completed' \
                      AND finished_at >= {p1} AND finished_at < {p2}) AS w"
                ),
                [from.into(), to.into()],
            ))
            .await
            .map_err(sagaflow::Error::from)?
            .ok_or_else(|| Error::Usage("no completions read".into()))?;
        let get = |c: &str| row.try_get::<i64>("", c).map_err(sagaflow::Error::from);
        Ok(Self {
            secs: (to - from) as f64 / 1000.0,
            completed: get("n")?,
            longest_gap_ms: get("gap")?,
        })
    }

    fn rate(&self) -> f64 {
        self.completed as f64 / self.secs.max(0.001)
    }

    fn print(&self, label: &str, against: &Self) {
        let ratio = if against.completed > 0 {
            format!("   {:.2}× the quiet rate", self.rate() / against.rate())
        } else {
            String::new()
        };
        println!(
            "  {label:<13} {:>6.1} s   {:>7.0} sagas/s   longest gap {:>5} ms{ratio}",
            self.secs,
            self.rate(),
            self.longest_gap_ms
        );
    }
}
