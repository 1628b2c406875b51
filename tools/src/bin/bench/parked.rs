//! `sagaflow-bench --parked N`: what parked runs cost an engine. N runs are parked (half on
//! a 30-day timer, half waiting for an event that is never sent); the engine's resident
//! memory and CPU time are read while they wait, against the same engine idle before they
//! were started. CPU time is the process's user + system time from `/proc/self/stat`, so
//! it counts every poll, pass and wake-up the engine made, whatever the machine's load.

use std::time::{Duration, Instant};

use sagaflow::{Engine, EventWait, Workflow};
use sagaflow_tools::Error;

use super::figures::peak_rss_mib;

/// The two parked workflows.
pub(crate) fn workflows() -> Result<Vec<Workflow>, Error> {
    let timer = Workflow::builder("parked_timer", 1)
        .timer("hold", Duration::from_secs(30 * 24 * 3600))
        .build()?;
    let event = Workflow::builder("parked_event", 1)
        .wait_for_event(
            "approval",
            EventWait::named("approval").within(Duration::from_secs(30 * 24 * 3600)),
        )
        .build()?;
    Ok(vec![timer, event])
}

/// Resident memory now, in MiB (`VmRSS`).
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU used over `window` of idling, as a share of one core.
async fn idle_cpu(window: Duration) -> f64 {
    let (c0, t0) = (
        sagaflow_tools::cpu::this_process().unwrap_or_default(),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let used = sagaflow_tools::cpu::this_process()
        .unwrap_or_default()
        .saturating_sub(c0);
    used.as_secs_f64() / t0.elapsed().as_secs_f64()
}

/// Parks `n` runs and prints what they cost.
pub(crate) async fn measure(engine: &Engine, n: usize, idle: Duration) -> Result<(), Error> {
    println!("parked runs: {n} (half on a 30-day timer, half waiting for an event)");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let base_rss = rss_mib().unwrap_or_default();
    let base_cpu = idle_cpu(idle).await;
    println!(
        "  idle, nothing parked: RSS {base_rss:.1} MiB · CPU {:.2}% of a core over {} s",
        base_cpu * 100.0,
        idle.as_secs()
    );
    let t = Instant::now();
    let submitters = 8;
    let mut tasks = Vec::new();
    for s in 0..submitters {
        let engine = engine.clone();
        let count = n / submitters + usize::from(s < n % submitters);
        tasks.push(tokio::spawn(async move {
            for i in 0..count {
                let wf = if i % 2 == 0 {
                    "parked_timer"
                } else {
                    "parked_event"
                };
                engine.start(wf, &()).await?;
            }
            Ok::<_, sagaflow::Error>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|source| Error::Task {
            what: "parking runs",
            source,
        })??;
    }
    let store = engine.store();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let waiting = store.steps_waiting_count().await?;
        if waiting as usize >= n {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::TimedOut {
                done: usize::try_from(waiting).unwrap_or(0),
                expected: n,
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  parked {n} runs in {:.1} s ({:.0} runs/s)",
        t.elapsed().as_secs_f64(),
        n as f64 / t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_mib().unwrap_or_default();
    let cpu = idle_cpu(idle).await;
    println!(
        "  idle, {n} parked: RSS {rss:.1} MiB (+{:.1} MiB) · CPU {:.2}% of a core over {} s · peak RSS {:.1} MiB",
        rss - base_rss,
        cpu * 100.0,
        idle.as_secs(),
        peak_rss_mib().unwrap_or_default()
    );
    Ok(())
}
