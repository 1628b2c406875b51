//! `sagaflow-bench`: throughput and latency of the order-shaped saga with no-op agents.
//!
//! Three sequential steps, each returning a small JSON value, each durable before the next
//! starts. Prints workflows/s and steps/s for N runs, start latency (submit → first step
//! begins) and end-to-end latency at moderate load (runs one at a time), peak RSS, and the
//! machine and durability settings it ran on. A measurement, not a test: nothing is asserted.

use sagaflow_tools::measure::{Latencies, ms};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Parser;
use sagaflow::sea_orm::ConnectionTrait;
use sagaflow::{
    Backend, DeadlinePolicy, Engine, RetryPolicy, RunState, StepContext, StepError, Workflow,
};
use uuid::Uuid;

#[derive(Parser, Debug)]
#[command(about = "Measure sagaflow: workflows/s, start and end-to-end latency, peak RSS")]
struct Args {
    /// Database URL; default: a fresh SQLite file under ./.sagaflow/.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Runs in the throughput phase.
    #[arg(long, default_value_t = 10_000)]
    runs: usize,
    /// Runs in the latency phase (one at a time).
    #[arg(long, default_value_t = 100)]
    latency_runs: usize,
    /// Concurrent submitters in the throughput phase (64: the setting of the figures in
    /// docs/benchmarks.md).
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    submitters: usize,
    /// Steps in flight at most.
    #[arg(long, default_value_t = 512)]
    max_in_flight: usize,
    /// Steps per claim statement.
    #[arg(long, default_value_t = 128)]
    claim_batch: u32,
    /// Result batches each engine writes concurrently; default: the engine's.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    completion_writers: Option<usize>,
    /// Engine processes running the steps. With more than one, this process only submits
    /// (a client-only engine) and the workers are copies of this command; latencies then come
    /// from the runs' database timestamps, and the start latency is not measured.
    #[arg(long, default_value_t = 1)]
    processes: usize,
    /// Finished runs (with history) to insert before measuring: throughput must not depend
    /// on how much history the database holds (AT-5).
    #[arg(long, default_value_t = 0)]
    prefill_finished: u64,
    /// Internal: run as a worker process until killed.
    #[arg(long, hide = true)]
    worker: Option<String>,
}

type Starts = Arc<Mutex<HashMap<Uuid, Instant>>>;

fn workflow(starts: Starts) -> sagaflow::Result<Workflow> {
    let noop = |name: &'static str| {
        move |_ctx: StepContext| async move {
            Ok::<_, StepError>(serde_json::json!({ "step": name, "ok": true }))
        }
    };
    Workflow::builder("bench", 1)
        .default_retry(
            RetryPolicy::default()
                .with_backoff(Duration::from_millis(10), Duration::from_millis(100)),
        )
        .default_deadline(DeadlinePolicy::new(
            Duration::from_secs(30),
            Duration::from_secs(120),
        ))
        .step("reserve", move |ctx: StepContext| {
            let starts = starts.clone();
            async move {
                starts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(ctx.run_id())
                    .or_insert_with(Instant::now);
                Ok::<_, StepError>(serde_json::json!({ "step": "reserve", "ok": true }))
            }
        })
        .step("charge", noop("charge"))
        .after(["reserve"])
        .step("ship", noop("ship"))
        .after(["charge"])
        .build()
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

async fn durability(engine: &Engine) -> String {
    let conn = engine.connection();
    let q = |sql: &'static str| async move {
        conn.query_one_raw(sagaflow::sea_orm::Statement::from_string(
            conn.get_database_backend(),
            sql,
        ))
        .await
        .ok()
        .flatten()
        .and_then(|r| {
            r.try_get_by_index::<String>(0)
                .ok()
                .or_else(|| r.try_get_by_index::<i64>(0).ok().map(|v| v.to_string()))
        })
        .unwrap_or_else(|| "?".into())
    };
    match engine.backend() {
        Backend::Postgres => format!(
            "PostgreSQL {} · fsync={} · synchronous_commit={}",
            q("SHOW server_version").await,
            q("SHOW fsync").await,
            q("SHOW synchronous_commit").await
        ),
        Backend::Sqlite => format!(
            "SQLite {} · journal_mode={} · synchronous={} (0 off, 1 normal, 2 full)",
            q("SELECT sqlite_version()").await,
            q("PRAGMA journal_mode").await,
            q("PRAGMA synchronous").await
        ),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(id) = &args.worker {
        return worker(&args, id).await;
    }
    let url = match args.database_url.clone() {
        Some(u) => u,
        None => {
            std::fs::create_dir_all(".sagaflow")?;
            for ext in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!(".sagaflow/bench.db{ext}"));
            }
            "sqlite://.sagaflow/bench.db?mode=rwc".to_owned()
        }
    };
    let starts: Starts = Arc::default();
    let engine = Engine::builder()
        .with_database_url(url.clone())
        .with_workflow(workflow(starts.clone())?)
        .with_max_in_flight(args.max_in_flight)
        .with_claim_batch(args.claim_batch)
        .with_completion_writers(
            args.completion_writers
                .unwrap_or(sagaflow::internals::scheduler::COMPLETION_WRITERS_DEFAULT),
        )
        .with_pool_size(16)
        .with_retention(None)
        .with_workers(args.processes <= 1)
        .start()
        .await?;
    println!(
        "sagaflow-bench · machine: {}",
        sagaflow_tools::machine::describe()
    );
    println!("  database: {}", durability(&engine).await);
    println!(
        "  engine: {} process(es) · max in flight {} each · claim batch {}",
        args.processes.max(1),
        args.max_in_flight,
        args.claim_batch
    );
    if args.prefill_finished > 0 {
        let t = Instant::now();
        engine
            .store()
            .run_fill_finished(args.prefill_finished)
            .await?;
        println!(
            "  prefilled {} finished runs with history in {:.1} s",
            args.prefill_finished,
            t.elapsed().as_secs_f64()
        );
        settle(&engine).await;
    }
    if args.processes > 1 {
        return multi_process(&args, &url, &engine).await;
    }

    // Throughput: N runs submitted by concurrent submitters; time to the last completion.
    let mut events = engine.subscribe();
    let submitted: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..args.submitters {
        let (engine, submitted) = (engine.clone(), submitted.clone());
        let n = args.runs / args.submitters + usize::from(s < args.runs % args.submitters);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let at = Instant::now();
                let id = engine
                    .start("bench", &serde_json::json!({ "qty": 1 }))
                    .await?;
                submitted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id, at);
            }
            Ok::<_, sagaflow::Error>(())
        }));
    }
    let mut e2e = Vec::with_capacity(args.runs);
    let mut done = 0usize;
    let mut submit_done = None;
    let deadline = t0 + Duration::from_secs(600);
    while done < args.runs {
        if submit_done.is_none() && tasks.iter().all(tokio::task::JoinHandle::is_finished) {
            submit_done = Some(t0.elapsed());
        }
        match tokio::time::timeout(Duration::from_secs(2), events.recv()).await {
            Ok(Ok(e)) if e.state == RunState::Completed => {
                done += 1;
                let at = submitted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&e.run_id)
                    .copied();
                if let Some(at) = at {
                    e2e.push(at.elapsed());
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(n))) => {
                eprintln!("  (event stream lagged by {n}; counting from the database)");
                done = count_completed(&engine).await;
            }
            Ok(Err(_)) => break,
            Err(_) => {
                done = count_completed(&engine).await;
                if Instant::now() > deadline {
                    return Err(format!("only {done}/{} runs completed in time", args.runs).into());
                }
            }
        }
    }
    for t in tasks {
        t.await??;
    }
    let total = t0.elapsed();
    println!("\nthroughput · {} runs × 3 steps", args.runs);
    print_throughput(
        args.runs,
        submit_done.unwrap_or(total),
        total,
        &Latencies::of(e2e),
        "under full load",
    );
    let rss_after_load = peak_rss_mib();

    // Latency at moderate load: one run at a time.
    let mut start_lat = Vec::with_capacity(args.latency_runs);
    let mut e2e_lat = Vec::with_capacity(args.latency_runs);
    for _ in 0..args.latency_runs {
        let at = Instant::now();
        let id = engine
            .start("bench", &serde_json::json!({ "qty": 1 }))
            .await?;
        let run = engine.wait(id, Duration::from_secs(30)).await?;
        let end = at.elapsed();
        if run.state != RunState::Completed {
            return Err(format!("run {id} ended {}", run.state).into());
        }
        if let Some(s) = starts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
        {
            start_lat.push(s.duration_since(at));
        }
        e2e_lat.push(end);
    }
    let (start_lat, e2e_lat) = (Latencies::of(start_lat), Latencies::of(e2e_lat));
    println!("\nlatency · {} runs one at a time", args.latency_runs);
    println!(
        "  start (submit → first step begins)  p50 {} · p99 {}",
        ms(start_lat.percentile(50.0)),
        ms(start_lat.percentile(99.0))
    );
    println!(
        "  end-to-end (submit → completed)     p50 {} · p99 {}",
        ms(e2e_lat.percentile(50.0)),
        ms(e2e_lat.percentile(99.0))
    );
    match rss_after_load {
        Some(m) => println!(
            "\npeak RSS         {m:.1} MiB (engine + benchmark client, after the throughput phase)"
        ),
        None => println!("\npeak RSS         unavailable"),
    }
    engine.shutdown().await;
    Ok(())
}

async fn count_completed(engine: &Engine) -> usize {
    engine.run_counts().await.map_or(0, |c| {
        usize::try_from(c.get(sagaflow::RunState::Completed)).unwrap_or(0)
    })
}

/// A worker process: an engine running the bench workflow until killed.
async fn worker(args: &Args, id: &str) -> Result<(), Box<dyn std::error::Error>> {
    let url = args
        .database_url
        .clone()
        .ok_or("--worker needs --database-url")?;
    let engine = Engine::builder()
        .with_database_url(url)
        .with_instance_id(id)
        .with_workflow(workflow(Arc::default())?)
        .with_max_in_flight(args.max_in_flight)
        .with_claim_batch(args.claim_batch)
        .with_completion_writers(
            args.completion_writers
                .unwrap_or(sagaflow::internals::scheduler::COMPLETION_WRITERS_DEFAULT),
        )
        .with_pool_size(8)
        .with_retention(None)
        .start()
        .await?;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    engine.shutdown().await;
    Ok(())
}

/// Throughput with several worker processes; this process submits and watches the database.
async fn multi_process(
    args: &Args,
    url: &str,
    engine: &Engine,
) -> Result<(), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let mut workers = Vec::new();
    for p in 0..args.processes {
        workers.push(
            tokio::process::Command::new(&exe)
                .args([
                    "--worker",
                    &format!("bench-worker-{p}"),
                    "--database-url",
                    url,
                ])
                .args(["--max-in-flight", &args.max_in_flight.to_string()])
                .args(["--claim-batch", &args.claim_batch.to_string()])
                .args(
                    args.completion_writers
                        .map(|n| format!("--completion-writers={n}")),
                )
                .kill_on_drop(true)
                .spawn()?,
        );
    }
    // Let every worker connect and start polling before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let ids: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    for s in 0..args.submitters {
        let (engine, ids) = (engine.clone(), ids.clone());
        let n = args.runs / args.submitters + usize::from(s < args.runs % args.submitters);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let id = engine
                    .start("bench", &serde_json::json!({ "qty": 1 }))
                    .await?;
                ids.lock().unwrap_or_else(PoisonError::into_inner).push(id);
            }
            Ok::<_, sagaflow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let submitted = t0.elapsed();
    let deadline = t0 + Duration::from_secs(600);
    while count_completed(engine).await < args.runs {
        if Instant::now() > deadline {
            return Err("runs did not complete in time".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = t0.elapsed();
    for mut w in workers {
        let _ = w.kill().await;
    }
    let ids = ids.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut e2e = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = engine.run(id).await?
            && let Some(f) = r.finished_at
        {
            e2e.push((f - r.created_at).to_std().unwrap_or_default());
        }
    }
    println!(
        "\nthroughput · {} runs × 3 steps · {} worker processes",
        args.runs, args.processes
    );
    print_throughput(
        args.runs,
        submitted,
        total,
        &Latencies::of(e2e),
        "database clock, under full load",
    );
    engine.shutdown().await;
    Ok(())
}

/// After a bulk prefill, brings the database to the state a long-lived database with that much
/// history would be in (vacuumed, analyzed, checkpointed), so that the measurement shows the
/// cost of the history's size and not the one-off aftermath of loading it in seconds
/// (autovacuum passes over a million fresh rows and a checkpoint flushing them, both of which
/// otherwise land inside the measurement on a 2-core machine).
async fn settle(engine: &Engine) {
    let db = engine.store().connection();
    let stmts: &[&str] = match db.get_database_backend() {
        sagaflow::sea_orm::DbBackend::Postgres => &[
            "VACUUM ANALYZE sagaflow_runs",
            "VACUUM ANALYZE sagaflow_history",
            "CHECKPOINT",
        ],
        _ => &["ANALYZE", "PRAGMA wal_checkpoint(TRUNCATE)"],
    };
    for sql in stmts {
        if let Err(e) = db.execute_unprepared(sql).await {
            println!("  (could not run `{sql}` after the prefill: {e})");
        }
    }
}

/// The throughput phase's figures: acceptance, completion, workflows and steps per second,
/// and end-to-end latency.
fn print_throughput(runs: usize, submitted: Duration, total: Duration, e2e: &Latencies, how: &str) {
    let wps = runs as f64 / total.as_secs_f64();
    println!(
        "  submitted in   {:.2} s ({:.0} runs/s accepted)",
        submitted.as_secs_f64(),
        runs as f64 / submitted.as_secs_f64()
    );
    println!("  completed in   {:.2} s", total.as_secs_f64());
    println!("  workflows/s    {wps:.0}");
    println!("  steps/s        {:.0}", wps * 3.0);
    println!(
        "  end-to-end     p50 {} · p99 {} ({how})",
        ms(e2e.percentile(50.0)),
        ms(e2e.percentile(99.0))
    );
}
