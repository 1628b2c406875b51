//! `sagaflow-bench`: throughput and latency of the order-shaped saga with no-op agents.
//!
//! Three sequential steps, each returning a small JSON value, each durable before the next
//! starts. Prints workflows/s and steps/s for N runs, start latency (submit → first step
//! begins) and end-to-end latency at moderate load (runs one at a time), peak RSS, and the
//! machine and durability settings it ran on, and what the runs wrote per saga (rows and WAL
//! bytes on PostgreSQL, bytes written on SQLite), the CPU each saga cost the engine and
//! PostgreSQL and the projection to larger servers it gives (issue 32). With a prefilled
//! history it also times the console's reads over it. With `--netns-hosts N` the worker
//! processes run in network namespaces and it prints how evenly those hosts shared the
//! steps. With `--retention N` it measures the retention pass over N finished runs instead.
//! A measurement, not a test: nothing is asserted.

mod bench;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Parser;
use sagaflow::{Engine, RunState};
use sagaflow_tools::Error;
use sagaflow_tools::measure::{Latencies, ms};
use uuid::Uuid;

use bench::ceiling;
use bench::cli::Args;
use bench::figures::{count_completed, durability, peak_rss_mib, print_throughput, settle};
use bench::fleet::{multi_process, worker};
use bench::workload::{Starts, workflow};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    if let Some(id) = &args.worker {
        return worker(&args, id).await;
    }
    let url = match args.database_url.clone() {
        Some(u) => u,
        None => {
            std::fs::create_dir_all(".sagaflow").map_err(Error::io("cannot create .sagaflow/"))?;
            for ext in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!(".sagaflow/bench.db{ext}"));
            }
            "sqlite://.sagaflow/bench.db?mode=rwc".to_owned()
        }
    };
    if let Some(replica) = &args.read_replica {
        let prefill = if args.prefill_finished == 0 {
            100_000
        } else {
            args.prefill_finished
        };
        return bench::replica::run(&url, replica, prefill, args.console_secs).await;
    }
    if let Some(runs) = args.retention {
        return bench::retention::run(&url, runs, args.load_secs, args.submitters).await;
    }
    let worker_urls = bench::fleet::worker_urls(&args, &url)?;
    let fleet = args.processes > 1 || args.netns_hosts.is_some();
    if let Some(clients) = args.hostile {
        return bench::hostile::run(&url, args.latency_runs, clients).await;
    }
    let starts: Starts = Arc::default();
    let mut builder = Engine::builder()
        .with_database_url(url.clone())
        .with_workflow(workflow(starts.clone(), args.resource_limit.is_some())?)
        .with_max_in_flight(args.max_in_flight)
        .with_claim_batch(args.claim_batch)
        .with_completion_writers(
            args.completion_writers
                .unwrap_or_else(sagaflow::internals::scheduler::completion_writers_default),
        )
        .with_pool_size(16)
        .with_sqlite_sync(if args.sqlite_sync == "normal" {
            sagaflow::SqliteSync::Normal
        } else {
            sagaflow::SqliteSync::Full
        })
        .with_retention(None)
        .with_workers(!fleet);
    if let Some(r) = bench::workload::resource(args.resource_limit) {
        builder = builder.with_resource(r);
    }
    if args.parked.is_some() {
        for wf in bench::parked::workflows()? {
            builder = builder.with_workflow(wf);
        }
    }
    let engine = builder.start().await?;
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
    if let Some(n) = args.resource_limit {
        println!(
            "  flow control: every step calls resource `{}`, at most {n} in flight",
            bench::workload::RESOURCE
        );
    }
    if let Some(n) = args.parked {
        bench::parked::measure(&engine, n, Duration::from_secs(args.idle_secs)).await?;
        engine.shutdown().await;
        return Ok(());
    }
    if args.prefill_finished > 0 {
        let t = Instant::now();
        engine
            .store()
            .run_fill_finished(
                args.prefill_finished,
                0..i64::try_from(args.prefill_finished).unwrap_or(i64::MAX),
            )
            .await?;
        println!(
            "  prefilled {} finished runs with history in {:.1} s",
            args.prefill_finished,
            t.elapsed().as_secs_f64()
        );
        settle(&engine).await;
    }
    if args.console_samples > 0 && (args.prefill_finished > 0 || args.console_only) {
        bench::console::measure(&engine, args.console_samples).await?;
    }
    if args.console_only {
        engine.shutdown().await;
        return Ok(());
    }
    let ceiling_for = Duration::from_secs(args.ceiling_secs);
    let ceilings = if ceiling_for.is_zero() {
        Vec::new()
    } else {
        let c = ceiling::measure(&engine, &url, ceiling_for).await?;
        ceiling::print(&c, ceiling_for);
        c
    };
    if fleet {
        return multi_process(&args, &worker_urls, &engine, &ceilings).await;
    }

    // Throughput: N runs submitted by concurrent submitters; time to the last completion.
    let writes_before = bench::writes::now(&engine).await;
    let server = bench::cpu::Server::of(&engine).await;
    let mut events = engine.subscribe();
    let submitted: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let cpu_before = bench::cpu::mark(&server, &[]);
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
                    return Err(Error::TimedOut {
                        done,
                        expected: args.runs,
                    });
                }
            }
        }
    }
    for t in tasks {
        t.await.map_err(Error::task("submitter"))??;
    }
    let total = t0.elapsed();
    let cpu_after = bench::cpu::mark(&server, &[]);
    println!("\nthroughput · {} runs × 3 steps", args.runs);
    print_throughput(
        args.runs,
        submit_done.unwrap_or(total),
        total,
        &Latencies::of(e2e),
        "under full load",
        &ceilings,
    );
    let rss_after_load = peak_rss_mib();
    if let (Some(before), Some(after)) = (writes_before, bench::writes::now(&engine).await) {
        bench::writes::print(&before, &after, args.runs);
    }
    bench::cpu::print(&cpu_before, &cpu_after, args.runs, total, &server);

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
            return Err(Error::UnexpectedEnd {
                run: id,
                state: run.state,
            });
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
