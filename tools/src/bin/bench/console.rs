//! The console's reads over a large history: each page of the runs list a console asks for
//! (filters, both orders, a page far down) and the overview figures, timed one after another
//! so that each latency is one statement's, not a queue's.

use std::future::Future;
use std::time::Instant;

use sagaflow::{Engine, RunOrder, RunQuery, RunState};
use sagaflow_tools::Error;
use sagaflow_tools::measure::{Latencies, ms};

/// Times `samples` calls of `read`, after two unmeasured ones (statement caches, pages in
/// memory), and prints its percentiles.
async fn time<F, Fut>(what: &str, samples: usize, mut read: F) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = sagaflow::Result<usize>>,
{
    for _ in 0..2 {
        read().await?;
    }
    let mut lat = Latencies::new();
    let mut rows = 0;
    for _ in 0..samples {
        let at = Instant::now();
        rows = read().await?;
        lat.record(at.elapsed());
    }
    println!(
        "  {what:<46} p50 {:>9} · p95 {:>9} · p99 {:>9} · {rows} rows",
        ms(lat.percentile(50.0)),
        ms(lat.percentile(95.0)),
        ms(lat.percentile(99.0)),
    );
    Ok(())
}

/// Every console read, `samples` times each.
pub(crate) async fn measure(engine: &Engine, samples: usize) -> Result<(), Error> {
    let retained = engine.run_counts().await?.total();
    println!("\nconsole reads · {retained} retained runs · {samples} samples each, one at a time");
    let list = |q: RunQuery| {
        let engine = engine.clone();
        move || {
            let (engine, q) = (engine.clone(), q.clone());
            async move { Ok(engine.list_runs(&q).await?.runs.len()) }
        }
    };
    time("runs, newest first", samples, list(RunQuery::new())).await?;
    time(
        "runs, most failed attempts first",
        samples,
        list(RunQuery::new().order(RunOrder::Attempts)),
    )
    .await?;
    time(
        "runs of one workflow (1 in 10 runs)",
        samples,
        list(RunQuery::new().workflow("archive_b")),
    )
    .await?;
    time(
        "runs in one state (1 in 100 runs)",
        samples,
        list(RunQuery::new().state(RunState::Compensated)),
    )
    .await?;
    time(
        "runs in one state, most failed attempts first",
        samples,
        list(
            RunQuery::new()
                .state(RunState::Compensated)
                .order(RunOrder::Attempts),
        ),
    )
    .await?;
    time(
        "runs of one business key",
        samples,
        list(RunQuery::new().business_key("order-123457")),
    )
    .await?;
    // A page far down: the cursor after 100 pages of 50, reached once, then read again.
    let mut deep = RunQuery::new();
    for _ in 0..100 {
        match engine.list_runs(&deep).await?.next {
            Some(next) => deep = deep.after(next),
            None => break,
        }
    }
    time("runs, page 101 by its cursor", samples, list(deep)).await?;
    time("overview figures (stats)", samples, || {
        let engine = engine.clone();
        async move { Ok(engine.stats().await?.active.len()) }
    })
    .await?;
    Ok(())
}
