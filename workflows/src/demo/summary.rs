//! The final report: figures gathered from the engine, the summary table, the ledger check,
//! and the runs that never reached a terminal state.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sagaflow::{DeliveryCounts, Engine, HistoryKind, RunState};
use sagaflow_testkit::services::Services;
use uuid::Uuid;

use super::DemoResult;
use super::history::{is_compensation_done, undo_of};
use super::ledger_check::print_ledger_check;
use super::table::Table;
use super::text::{plural, rule, runs, secs};
use super::tracker::{Tally, Tracker};
use super::webhook;

/// What the engine recorded about the demo's runs.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    /// Runs per final state.
    states: BTreeMap<&'static str, usize>,
    retries: u64,
    timeouts: u64,
    /// Finished compensations per business operation (`refund`, `release`).
    compensations: BTreeMap<String, u64>,
    operator_actions: usize,
    alerts: usize,
    not_terminal: Vec<(String, Uuid, RunState)>,
    /// The state of every run when gathered.
    finals: HashMap<Uuid, RunState>,
    /// How the earlier runs (already on the database) ended, and their alerts.
    earlier: Tally,
    earlier_alerts: usize,
    /// Where the alert notices stand with the webhook, with `--webhook`.
    pub(crate) webhook: Option<DeliveryCounts>,
}

impl Figures {
    fn count(&self, s: RunState) -> usize {
        self.states.get(s.as_str()).copied().unwrap_or(0)
    }
}

/// Reads the final state, alerts and history of every accepted run, and the final state
/// and alerts of every earlier one.
pub(crate) async fn gather(engine: &Engine, tracker: &Tracker) -> DemoResult<Figures> {
    let mut f = Figures::default();
    for (_, id) in &tracker.earlier {
        if let Some(run) = engine.run(*id).await? {
            f.earlier.add(run.state);
        }
        f.earlier_alerts += engine.run_alerts(*id).await?.len();
    }
    for (order, id) in &tracker.runs {
        let state = engine
            .run(*id)
            .await?
            .map_or(RunState::Pending, |r| r.state);
        f.finals.insert(*id, state);
        f.alerts += engine.run_alerts(*id).await?.len();
        *f.states.entry(state.as_str()).or_default() += 1;
        if !state.is_terminal() {
            f.not_terminal.push((order.order_id.clone(), *id, state));
        }
        for h in engine.history(*id).await? {
            match &h.kind {
                HistoryKind::Retry => f.retries += 1,
                HistoryKind::Timeout => f.timeouts += 1,
                _ if is_compensation_done(&h) => {
                    let op = h.step.as_deref().map_or("?", undo_of).to_owned();
                    *f.compensations.entry(op).or_default() += 1;
                }
                k if k.as_ref().starts_with("operator_") => f.operator_actions += 1,
                _ => {}
            }
        }
    }
    Ok(f)
}

/// Prints the summary, the ledger check and any unfinished run; returns whether
/// everything checked out.
pub(crate) fn print_report(
    f: &Figures,
    tracker: &Tracker,
    engine: &Engine,
    services: &Services,
    elapsed: Duration,
) -> bool {
    print_summary(f, tracker, engine, services, elapsed);
    let ledger_ok = print_ledger_check(&f.finals, tracker, services);
    if !tracker.earlier.is_empty() {
        println!(
            "      ({} already on the database not checked: their first effects are in an earlier process's ledger)",
            runs(tracker.earlier.len())
        );
    }
    let all_terminal = f.not_terminal.is_empty();
    if !all_terminal {
        println!();
        println!(
            "  ✘ {} did not reach a terminal state:",
            runs(f.not_terminal.len())
        );
        for (order, id, state) in f.not_terminal.iter().take(20) {
            println!("      - {order} (run {id}) is {state}");
        }
    }
    ledger_ok && all_terminal
}

/// The summary table: how the runs ended and what it took.
fn print_summary(
    f: &Figures,
    tracker: &Tracker,
    engine: &Engine,
    services: &Services,
    elapsed: Duration,
) {
    let accepted = tracker.runs.len();
    println!();
    println!("{}", rule("Summary"));
    let mut t = Table::default();
    let rate = accepted as f64 / elapsed.as_secs_f64().max(1e-3);
    t.row(
        "Runs",
        accepted,
        if accepted == 0 && !tracker.earlier.is_empty() {
            "every order already had a run on the database".to_owned()
        } else {
            format!("in {} · {rate:.1} runs/s", secs(elapsed))
        },
    );
    let completed = f.count(RunState::Completed);
    let compensated = f.count(RunState::Compensated);
    let errors = f.count(RunState::Error);
    t.row("  ✔ completed", completed, "reserved, charged and shipped");
    t.row(
        "  ↺ compensated",
        compensated,
        "failed before shipping, undone",
    );
    t.row(
        "  ✘ error",
        errors,
        if errors > 0 {
            "waiting for an operator"
        } else {
            ""
        },
    );
    let others = accepted - completed - compensated - errors;
    if others > 0 {
        t.row("  … not finished", others, "");
    }
    if !tracker.rejected.is_empty() {
        t.row(
            "Not started",
            tracker.rejected.len(),
            "the engine refused to start them",
        );
    }
    if !tracker.earlier.is_empty() {
        let e = &f.earlier;
        let mut note = format!(
            "already on the database, not started again: {} completed · {} compensated · {} error",
            e.completed, e.compensated, e.error
        );
        if f.earlier_alerts > 0 {
            note.push_str(&format!(
                " · {}",
                plural(f.earlier_alerts, "alert", "alerts")
            ));
        }
        t.row("Earlier runs", tracker.earlier.len(), note);
    }
    t.row("Retries", f.retries, "failed attempts retried with backoff");
    match engine.supervisor().map(|s| s.stats()) {
        Some(s) => t.row(
            "Supervisor rescues",
            s.requeued + s.failed,
            format!(
                "{} re-queued with a longer deadline · {} failed at the threshold",
                s.requeued, s.failed
            ),
        ),
        None => t.row("Supervisor rescues", "-", "no supervisor in this instance"),
    }
    let comp_total: u64 = f.compensations.values().sum();
    let comp_note = f
        .compensations
        .iter()
        .map(|(op, n)| format!("{n} {op}"))
        .collect::<Vec<_>>()
        .join(" · ");
    t.row("Compensations run", comp_total, comp_note);
    t.row(
        "Alerts raised",
        f.alerts,
        if f.operator_actions > 0 {
            format!(
                "resolved by {}",
                plural(f.operator_actions, "operator action", "operator actions")
            )
        } else {
            String::new()
        },
    );
    if let Some(c) = &f.webhook {
        t.row("Webhook", c.delivered, webhook::note(c));
    }
    let faults = services.fault_counts();
    t.row(
        "Injected faults",
        faults.total(),
        format!(
            "{} transient · {} hung · {} lost replies · {} permanent",
            faults.transient, faults.hang, faults.lost_reply, faults.permanent
        ),
    );
    t.print();
}
