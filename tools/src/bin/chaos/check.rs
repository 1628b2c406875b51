//! The checks after a chaos run: the invariants, judged on the [`Findings`] into a typed
//! [`InvariantReport`].
//!
//! Invariants (each printed as `[ok]` or `[FAIL]`; any failure makes the exit code 1):
//! 1. every run is terminal (`completed`, `compensated` or `error`), child runs included;
//! 2. no run is lost: every run was accepted, every accepted id has a row or was seen
//!    finished before retention purged it, and there is exactly one run per business key;
//! 3. exactly once: no idempotency key applied twice, no operation applied twice for one
//!    business key, and every effect carries a key of its own run (or of a child of it);
//! 4. fenced results: no step attempt has two results in the history (completed, retry,
//!    failed or timeout): a late or stale answer never got through (SAS-3);
//! 5. net consistency of every run not in `error` (reserved ⇒ shipped or released; charged ⇒
//!    shipped or refunded), and the ledger agrees with the run's state (`completed` ⇒
//!    shipped, `compensated` ⇒ nothing left applied); runs in `error` may legitimately be
//!    half-way and are reported separately;
//! 6. every run in `error` has an alert;
//! 7. no engine process exited on its own, and the PostgreSQL restart (when asked for)
//!    worked;
//! 8. the history checker (`sagaflow::check`) finds no run breaking the engine's invariants;
//! 9. every run met its planned fate: no pair with a root refused for good, and no flow whose
//!    event was never sent, completed; every child run ended as its parent.
//!
//! The ledger checks (3 and 5) cover every run, purged or not: orders, pairs and flows
//! record their effects under their business key, a flow's child under its parent's.

use sagaflow::internals::store::Store;
use sagaflow_testkit::services::Services;
use sagaflow_tools::invariants::{ChaosTally, Finding, Invariant, InvariantReport, PgRestart};

use std::collections::HashMap;

use uuid::Uuid;

use super::coordinator::Ending;
use super::gather::{Findings, gather};
use super::mix::Kind;
use super::observer::Seen;
use super::stats::{ChaosStats, Restart};
use super::submit::{Planned, Submitted};
use super::summary;

/// Runs every check, prints the summary and the invariants, and returns the verdict.
pub(crate) async fn verify(
    store: &Store,
    services: &Services,
    plan: &[Planned],
    submitted: &Submitted,
    observed: &HashMap<Uuid, Seen>,
    stats: &ChaosStats,
) -> InvariantReport {
    let findings = gather(store, services, plan, submitted, observed, stats).await;
    summary::print(&findings, services, stats);
    let history = history(store).await;
    let report = judge(&findings, plan, submitted, stats, &history);
    println!("{report}");
    report
}

/// The invariants, judged on `f`.
fn judge(
    f: &Findings,
    plan: &[Planned],
    submitted: &Submitted,
    stats: &ChaosStats,
    history: &Invariant,
) -> InvariantReport {
    let terminal = Invariant::judge(
        Finding::EveryRunTerminal {
            runs: f.runs,
            completed: f.completed.len(),
            compensated: f.compensated.len(),
            error: f.error.len(),
            children_unfinished: f.children_unfinished.len(),
        },
        f.stuck == 0 && f.missing_rows.is_empty() && f.not_accepted.is_empty(),
        f.stuck_details.clone(),
    );
    let mut lost = f.missing_rows.clone();
    lost.extend(
        f.not_accepted
            .iter()
            .map(|o| format!("{o}: never accepted")),
    );
    lost.extend(submitted.errors.iter().cloned());
    let rows_found = f.state_of.len() - f.purged.len();
    if f.rows_total != i64::try_from(rows_found).unwrap_or(-1) {
        lost.push(format!(
            "{} run rows (children apart) for {rows_found} accepted runs still in the database",
            f.rows_total,
        ));
    }
    let no_lost = Invariant::judge(
        Finding::NoLostRuns {
            accepted: f.run_of.len(),
            rows_found,
            purged: f.purged.len(),
            rows_total: f.rows_total,
        },
        true,
        lost,
    );
    let once = Invariant::judge(
        Finding::ExactlyOnce {
            effects: f.records.len(),
            keys_applied_twice: f.twice_keys.len(),
            operations_applied_twice: f.twice_ops.len(),
            foreign_keys: f.foreign.len(),
        },
        true,
        [&f.twice_keys, &f.twice_ops, &f.foreign]
            .into_iter()
            .flatten()
            .cloned()
            .collect(),
    );
    let fenced = Invariant::judge(
        Finding::FencedResults {
            step_results: f.outcomes,
            doubled_attempts: f.doubled.len(),
        },
        true,
        f.doubled.clone(),
    );
    let consistency = Invariant::judge(
        Finding::NetConsistency {
            settled: f.completed.len() + f.compensated.len(),
            error_runs: f.error.len(),
        },
        true,
        [&f.settled_report.violations, &f.disagreements]
            .into_iter()
            .flatten()
            .cloned()
            .collect(),
    );
    let alerts = Invariant::judge(
        Finding::Alerts {
            error_runs: f.error.len(),
            alerted: f.error.len() - f.unalerted.len(),
        },
        true,
        f.unalerted.clone(),
    );
    let doomed = |k: Kind| plan.iter().filter(|p| p.kind == k && p.doomed).count();
    let kinds = |k: Kind| plan.iter().filter(|p| p.kind == k).count();
    let fates = Invariant::judge(
        Finding::Fates {
            refused_pairs: doomed(Kind::Pair),
            withheld_events: doomed(Kind::Flow),
            violations: f.fate_violations.len(),
        },
        true,
        f.fate_violations.clone(),
    );
    InvariantReport {
        invariants: vec![
            terminal,
            no_lost,
            once,
            fenced,
            consistency,
            alerts,
            chaos_as_planned(stats),
            history.clone(),
            fates,
        ],
        chaos: ChaosTally {
            kills: stats.kills,
            pauses: stats.pauses,
            cancels: stats.cancels,
            rescues_measured: stats.rescues.len(),
            idle_kills: stats.idle_kills,
            forced_stops: stats.forced_stops,
            orders: kinds(Kind::Order),
            pairs: kinds(Kind::Pair),
            flows: kinds(Kind::Flow),
            refused_pairs: doomed(Kind::Pair),
            children: f.parent_of.len(),
            migrated: f.migrated,
            events_sent: stats.events_sent,
            events_withheld: doomed(Kind::Flow),
            wait_timeouts: f.wait_timeouts,
            bulk_cancels: stats.bulk_cancels,
            bulk_cancelled: stats.bulk_cancelled,
            leader_pauses: stats.leader_pauses,
            purged: f.purged.len(),
        },
        interrupted: stats.ending == Some(Ending::Interrupted),
    }
}

/// The history checker's verdict on the whole database.
async fn history(store: &Store) -> Invariant {
    match sagaflow::check::check(store.connection()).await {
        Ok(report) => Invariant::judge(
            Finding::History {
                runs_checked: usize::try_from(report.runs_checked).unwrap_or(usize::MAX),
                violations: report.violations.len(),
            },
            true,
            report.violations.iter().map(ToString::to_string).collect(),
        ),
        Err(e) => Invariant::judge(
            Finding::History {
                runs_checked: 0,
                violations: 0,
            },
            false,
            vec![format!(
                "the history checker could not read the database: {e}"
            )],
        ),
    }
}

/// Every engine process stayed up unless killed, and every PostgreSQL restart worked.
fn chaos_as_planned(stats: &ChaosStats) -> Invariant {
    let mut issues: Vec<String> = stats
        .unexpected_exits
        .iter()
        .map(|e| format!("exited on its own: {e}"))
        .collect();
    let failed = stats
        .pg_restarts
        .iter()
        .filter(|r| r.result.is_err())
        .count();
    for r in &stats.pg_restarts {
        if let Restart { result: Err(e), at } = r {
            issues.push(format!(
                "postgres restart at {:.0} s failed: {e}",
                at.as_secs_f64()
            ));
        }
    }
    let done = stats.pg_restarts.len() as u64;
    if done < stats.pg_restarts_planned {
        issues.push(format!(
            "{} of {} postgres restarts did not happen",
            stats.pg_restarts_planned - done,
            stats.pg_restarts_planned
        ));
    }
    let pg_restart = if stats.pg_restarts_planned == 0 {
        PgRestart::Skipped
    } else if failed > 0 {
        PgRestart::Failed
    } else if done < stats.pg_restarts_planned {
        PgRestart::Missing
    } else {
        PgRestart::Done
    };
    Invariant::judge(
        Finding::ChaosAsPlanned {
            kills: stats.kills,
            unexpected_exits: stats.unexpected_exits.len(),
            pg_restarts: done,
            pg_restart,
        },
        true,
        issues,
    )
}
