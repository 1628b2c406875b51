//! What the benchmark reads and prints besides the runs: the database's settings, peak
//! memory, completed-run counts, the settling after a prefill, and the throughput figures.

use std::time::Duration;

use sagaflow::sea_orm::ConnectionTrait;
use sagaflow::{Backend, Engine};
use sagaflow_tools::measure::{Latencies, ms};

use super::ceiling::{Ceiling, ratios};

/// The process's peak resident memory, from `/proc/self/status`.
pub(crate) fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The database's version and durability settings, as the engine's sessions see them.
pub(crate) async fn durability(engine: &Engine) -> String {
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

/// Runs completed so far, from the database.
pub(crate) async fn count_completed(engine: &Engine) -> usize {
    engine.run_counts().await.map_or(0, |c| {
        usize::try_from(c.get(sagaflow::RunState::Completed)).unwrap_or(0)
    })
}

/// After a bulk prefill, brings the database to the state a long-lived database with that much
/// history would be in (vacuumed, analyzed, checkpointed), so that the measurement shows the
/// cost of the history's size and not the one-off aftermath of loading it in seconds
/// (autovacuum passes over a million fresh rows and a checkpoint flushing them, both of which
/// otherwise land inside the measurement on a 2-core machine).
pub(crate) async fn settle(engine: &Engine) {
    let db = engine.store().connection();
    let stmts: &[&str] = match db.get_database_backend() {
        sagaflow::sea_orm::DbBackend::Postgres => &[
            "VACUUM ANALYZE sagaflow_runs",
            "VACUUM ANALYZE sagaflow_runs_done",
            "VACUUM ANALYZE sagaflow_run_keys",
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
/// Whether the submitters, not the engine, set the pace: the last run completed within a
/// tenth of the run's time after the last start was accepted.
fn bound_by_submission(submitted: Duration, total: Duration) -> bool {
    total.saturating_sub(submitted) < total / 10
}

pub(crate) fn print_throughput(
    runs: usize,
    submitted: Duration,
    total: Duration,
    e2e: &Latencies,
    how: &str,
    ceilings: &[Ceiling],
) {
    let wps = runs as f64 / total.as_secs_f64();
    println!(
        "  submitted in   {:.2} s ({:.0} runs/s accepted)",
        submitted.as_secs_f64(),
        runs as f64 / submitted.as_secs_f64()
    );
    println!("  completed in   {:.2} s", total.as_secs_f64());
    println!("  workflows/s    {wps:.0}");
    if bound_by_submission(submitted, total) {
        println!(
            "  bound by       submission: the engine finished {:.0} ms after the last start, so \
             it kept up with the submitters; more --submitters measure the engine",
            total.saturating_sub(submitted).as_secs_f64() * 1e3
        );
    }
    if !ceilings.is_empty() {
        println!("  of ceiling     {}", ratios(wps, ceilings));
    }
    println!("  steps/s        {:.0}", wps * 3.0);
    println!(
        "  end-to-end     p50 {} · p99 {} ({how})",
        ms(e2e.percentile(50.0)),
        ms(e2e.percentile(99.0))
    );
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::bound_by_submission;

    #[test]
    fn a_run_that_ends_right_after_its_last_start_was_bound_by_submission() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert!(bound_by_submission(ms(3_520), ms(3_740)));
        assert!(!bound_by_submission(ms(2_850), ms(3_930)));
        assert!(!bound_by_submission(s(0), s(0)));
    }
}
