//! Several engine processes: the worker processes (copies of this command) and the
//! coordinating process that submits and watches the database.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::Engine;
use sagaflow_tools::Error;
use sagaflow_tools::measure::Latencies;
use uuid::Uuid;

use super::ceiling::Ceiling;
use super::cli::Args;
use super::figures::{count_completed, print_throughput};
use super::workload::workflow;

/// A worker process: an engine running the bench workflow until killed.
pub(crate) async fn worker(args: &Args, id: &str) -> Result<(), Error> {
    let url = args
        .database_url
        .clone()
        .ok_or_else(|| Error::Usage("--worker needs --database-url".into()))?;
    let mut builder = Engine::builder()
        .with_database_url(url)
        .with_instance_id(id)
        .with_workflow(workflow(Arc::default(), args.resource_limit.is_some())?)
        .with_max_in_flight(args.max_in_flight)
        .with_claim_batch(args.claim_batch)
        .with_completion_writers(
            args.completion_writers
                .unwrap_or_else(sagaflow::internals::scheduler::completion_writers_default),
        )
        .with_pool_size(8)
        .with_retention(None);
    if let Some(r) = super::workload::resource(args.resource_limit) {
        builder = builder.with_resource(r);
    }
    let engine = builder.start().await?;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    engine.shutdown().await;
    Ok(())
}

/// Throughput with several worker processes; this process submits and watches the database.
pub(crate) async fn multi_process(
    args: &Args,
    url: &str,
    engine: &Engine,
    ceilings: &[Ceiling],
) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(Error::io("cannot find this binary"))?;
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
                .spawn()
                .map_err(Error::io(format!("cannot start worker process {p}")))?,
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
        t.await.map_err(Error::task("submitter"))??;
    }
    let submitted = t0.elapsed();
    let deadline = t0 + Duration::from_secs(600);
    while count_completed(engine).await < args.runs {
        if Instant::now() > deadline {
            return Err(Error::TimedOut {
                done: count_completed(engine).await,
                expected: args.runs,
            });
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
        ceilings,
    );
    engine.shutdown().await;
    Ok(())
}
