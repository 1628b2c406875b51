//! The checks after a chaos run: the invariants, judged on the [`Findings`] into a typed
//! [`InvariantReport`].
//!
//! Invariants (each printed as `[ok]` or `[FAIL]`; any failure makes the exit code 1):
//! 1. every run is terminal (`completed`, `compensated` or `error`);
//! 2. no run is lost: every order was accepted, every accepted id has a row, and there is
//!    exactly one run per order;
//! 3. exactly once: no idempotency key applied twice, no operation applied twice for one
//!    order, and every effect carries a key of its order's own run;
//! 4. fenced results: no step attempt has two results in the history (completed, retry,
//!    failed or timeout): a late or stale answer never got through (SAS-3);
//! 5. net consistency of every run not in `error` (reserved ⇒ shipped or released; charged ⇒
//!    shipped or refunded), and the ledger agrees with the run's state (`completed` ⇒
//!    shipped, `compensated` ⇒ nothing left applied); runs in `error` may legitimately be
//!    half-way and are reported separately;
//! 6. every run in `error` has an alert;
//! 7. no engine process exited on its own, and the PostgreSQL restart (when asked for)
//!    worked;
//! 8. the history checker (`sagaflow::check`) finds no run breaking the engine's invariants.

use sagaflow::internals::store::Store;
use sagaflow_testkit::services::Services;
use sagaflow_tools::invariants::{ChaosTally, Finding, Invariant, InvariantReport, PgRestart};

use super::coordinator::Ending;
use super::gather::{Findings, gather};
use super::stats::{ChaosStats, Restart};
use super::submit::Submitted;
use super::summary;

/// Runs every check, prints the summary and the invariants, and returns the verdict.
pub(crate) async fn verify(
    store: &Store,
    services: &Services,
    submitted: &Submitted,
    stats: &ChaosStats,
) -> InvariantReport {
    let findings = gather(store, services, submitted).await;
    summary::print(&findings, services, stats);
    let history = history(store).await;
    let report = judge(&findings, submitted, stats, &history);
    println!("{report}");
    report
}

/// The seven invariants, judged on `f`.
fn judge(
    f: &Findings,
    submitted: &Submitted,
    stats: &ChaosStats,
    history: &Invariant,
) -> InvariantReport {
    let terminal = Invariant::judge(
        Finding::EveryRunTerminal {
            orders: f.orders,
            completed: f.completed.len(),
            compensated: f.compensated.len(),
            error: f.error.len(),
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
    if f.rows_total != i64::try_from(f.state_of.len()).unwrap_or(-1) {
        lost.push(format!(
            "{} run rows for {} accepted orders",
            f.rows_total,
            f.state_of.len()
        ));
    }
    let no_lost = Invariant::judge(
        Finding::NoLostRuns {
            accepted: f.run_of.len(),
            rows_found: f.state_of.len(),
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
        ],
        chaos: ChaosTally {
            kills: stats.kills,
            pauses: stats.pauses,
            cancels: stats.cancels,
            rescues_measured: stats.rescues.len(),
            idle_kills: stats.idle_kills,
            forced_stops: stats.forced_stops,
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

/// Every engine process stayed up unless killed, and the PostgreSQL restart worked.
fn chaos_as_planned(stats: &ChaosStats) -> Invariant {
    let mut issues: Vec<String> = stats
        .unexpected_exits
        .iter()
        .map(|e| format!("exited on its own: {e}"))
        .collect();
    if let Some(Restart { result: Err(e), .. }) = &stats.pg_restart {
        issues.push(format!("postgres restart failed: {e}"));
    }
    if stats.pg_restart_expected && stats.pg_restart.is_none() {
        issues.push("postgres restart did not happen".into());
    }
    let pg_restart = match (&stats.pg_restart, stats.pg_restart_expected) {
        (Some(Restart { result: Ok(_), .. }), _) => PgRestart::Done,
        (Some(_), _) => PgRestart::Failed,
        (None, true) => PgRestart::Missing,
        (None, false) => PgRestart::Skipped,
    };
    Invariant::judge(
        Finding::ChaosAsPlanned {
            kills: stats.kills,
            unexpected_exits: stats.unexpected_exits.len(),
            pg_restart,
        },
        true,
        issues,
    )
}
