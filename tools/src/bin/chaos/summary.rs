//! The `results` block a chaos run prints before its invariants: runs, chaos, faults,
//! supervisor work, rescue times, history, effects and the runs left in error.

use sagaflow_testkit::services::{Operation, OrderStatus, Services};
use sagaflow_tools::measure::{Latencies, ms};

use super::gather::Findings;
use super::stats::ChaosStats;

/// Prints the summary of `f`, the services' fault counts and `stats`.
pub(crate) fn print(f: &Findings, services: &Services, stats: &ChaosStats) {
    let faults = services.fault_counts();
    let by_service: Vec<String> = services
        .fault_counts_by_service()
        .iter()
        // The order saga's services only (the travel saga's are idle here).
        .filter(|(s, _)| Operation::ORDER.iter().any(|op| op.service() == **s))
        .map(|(s, c)| format!("{s} {}/{}/{}", c.transient, c.hang, c.permanent))
        .collect();
    let a = &f.all_report.applied;
    let hist = |e: &str| {
        f.history
            .iter()
            .find(|(n, _)| n == e)
            .map_or(0, |(_, c)| *c)
    };
    let secs = stats.elapsed.as_secs_f64();
    println!("\nresults ({secs:.1} s)");
    println!(
        "  runs        completed {} · compensated {} · error {} · not terminal {} · {:.0} runs/s (all kinds)",
        f.completed.len(),
        f.compensated.len(),
        f.error.len(),
        f.stuck,
        (f.completed.len() + f.compensated.len() + f.error.len()) as f64 / secs.max(0.001)
    );
    let restarts: Vec<String> = stats
        .pg_restarts
        .iter()
        .map(|r| match &r.result {
            Ok(took) => format!(
                "at {:.0} s (back in {:.1} s)",
                r.at.as_secs_f64(),
                took.as_secs_f64()
            ),
            Err(_) => format!("at {:.0} s FAILED", r.at.as_secs_f64()),
        })
        .collect();
    let pg = match (restarts.is_empty(), stats.pg_restarts_planned) {
        (true, 0) => "no postgres restart".to_owned(),
        (true, _) => "postgres restart did not happen".to_owned(),
        (false, _) => format!(
            "postgres restarted {}/{}: {}",
            restarts.len(),
            stats.pg_restarts_planned,
            restarts.join(", ")
        ),
    };
    for (kind, c) in &f.by_kind {
        println!(
            "  {:<11} {} submitted · completed {} · compensated {} · error {}",
            format!("{kind:?}").to_lowercase() + "s",
            c.submitted,
            c.completed,
            c.compensated,
            c.error
        );
    }
    println!(
        "  mix         {} child runs · {} flows migrated v1→v2 · events {} sent, {} refused (run finished), {} failed · {} flows timed out waiting · {} runs purged by retention",
        f.parent_of.len(),
        f.migrated,
        stats.events_sent,
        stats.events_refused,
        stats.events_failed,
        f.wait_timeouts,
        f.purged.len()
    );
    println!(
        "  chaos       kills {} · restarts {} · {pg} · failed progress polls {}",
        stats.kills, stats.restarts, stats.monitor_errors
    );
    println!(
        "  faults      transient {} · hang {} · lost replies {} · terminal {} (per service t/h/p: {})",
        faults.transient,
        faults.hang,
        faults.lost_reply,
        faults.permanent,
        by_service.join(", ")
    );
    println!(
        "  supervisor  timeouts handled {} (re-queued or failed at the threshold) · interruptions {} (attempts lost with a killed process)",
        hist("timeout"),
        hist("interrupted")
    );
    let rescues = Latencies::of(stats.rescues.iter().copied());
    println!(
        "  rescue      after SIGKILL: {} kills with steps in flight, released in p50 {} · p99 {} · max {} ({} kills hit an idle process)",
        rescues.len(),
        ms(rescues.percentile(50.0)),
        ms(rescues.percentile(99.0)),
        ms(rescues.max()),
        stats.idle_kills
    );
    println!(
        "  chaos       {} SIGKILLs · {} SIGSTOPs of 1-3 s (late heartbeats) · {} SIGSTOPs of the leader · {} runs cancelled by an operator · {} bulk cancels ({} runs cancelled, {} refused)",
        stats.kills,
        stats.pauses,
        stats.leader_pauses,
        stats.cancels,
        stats.bulk_cancels,
        stats.bulk_cancelled,
        stats.bulk_refused
    );
    let hist_line: Vec<String> = f.history.iter().map(|(e, n)| format!("{e} {n}")).collect();
    println!("  history     {}", hist_line.join(" · "));
    println!(
        "  effects     reserve {} · release {} · charge {} · refund {} · ship {} · replays {}",
        a.reserve, a.release, a.charge, a.refund, a.ship, f.all_report.replays
    );
    if f.error.is_empty() {
        return;
    }
    for (k, n) in &f.error_kinds {
        println!("  error runs  {n}× {k}");
    }
    let e = &f.error_report;
    println!(
        "              their ledger: {} settled, {} half-way (allowed: they wait for an operator)",
        e.count(OrderStatus::Shipped)
            + e.count(OrderStatus::Compensated)
            + e.count(OrderStatus::Untouched),
        e.count(OrderStatus::Inconsistent)
    );
    for e in &f.error_examples {
        println!("              e.g. {e}");
    }
}
