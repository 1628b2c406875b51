//! Checking the demo against the ledger of the simulated services, the ground truth of what
//! happened remotely: no effect applied twice, every settled saga net-consistent, and the
//! ledger agreeing with every run's final state.

use std::collections::HashMap;
use std::fmt::Write as _;

use sagaflow::RunState;
use sagaflow_testkit::services::{LedgerReport, OrderStatus, Services};
use uuid::Uuid;

use super::table::Table;
use super::text::{rule, runs};
use super::tracker::Tracker;

/// Problems listed under a check; the rest are counted.
const SHOWN: usize = 10;

/// Prints the ledger section and its checks; returns whether all passed.
pub(crate) fn print_ledger_check(
    finals: &HashMap<Uuid, RunState>,
    tracker: &Tracker,
    services: &Services,
) -> bool {
    let ids: Vec<String> = tracker
        .runs
        .iter()
        .map(|(o, _)| o.order_id.clone())
        .collect();
    let all = services.ledger().check_orders(&ids);
    // Runs left in error wait for an operator: their effects are not expected to net out.
    let settled: Vec<String> = tracker
        .runs
        .iter()
        .filter(|(_, id)| finals.get(id).is_some_and(|s| s.is_final()))
        .map(|(o, _)| o.order_id.clone())
        .collect();
    let waiting = ids.len() - settled.len();
    let net = services.ledger().check_orders(&settled);
    let twice: Vec<&String> = all
        .violations
        .iter()
        .filter(|v| is_applied_twice(v))
        .collect();
    let net_violations: Vec<&String> = net
        .violations
        .iter()
        .filter(|v| !is_applied_twice(v))
        .collect();
    let disagree = disagreements(finals, tracker, &net);

    println!();
    println!("{}", rule("Ledger of the remote services"));
    print_effects(&all);
    println!();
    check(&twice, "no effect applied twice");
    let mut net_text =
        "every saga net-consistent (reserved ⇒ shipped or released; charged ⇒ shipped or refunded)"
            .to_owned();
    if waiting > 0 {
        let _ = write!(
            net_text,
            "\n      ({} waiting for an operator not checked)",
            runs(waiting)
        );
    }
    check(&net_violations, &net_text);
    let disagree: Vec<&String> = disagree.iter().collect();
    check(&disagree, "ledger agrees with every run's final state");
    twice.is_empty() && net_violations.is_empty() && disagree.is_empty()
}

/// Whether a ledger violation says an effect was applied more than once.
fn is_applied_twice(violation: &str) -> bool {
    violation.starts_with("key ") || violation.contains("times under different keys")
}

/// Runs whose final state the ledger contradicts: completed ⇒ shipped; compensated ⇒
/// nothing left.
fn disagreements(
    finals: &HashMap<Uuid, RunState>,
    tracker: &Tracker,
    net: &LedgerReport,
) -> Vec<String> {
    let mut disagree = Vec::new();
    for (order, id) in &tracker.runs {
        let status = net.orders.get(&order.order_id).copied();
        let expected = match finals.get(id) {
            // Already reported among the net-consistency violations.
            _ if status == Some(OrderStatus::Inconsistent) => true,
            Some(RunState::Completed) => matches!(status, Some(OrderStatus::Shipped)),
            Some(RunState::Compensated) => {
                matches!(
                    status,
                    Some(OrderStatus::Compensated | OrderStatus::Untouched)
                )
            }
            _ => true,
        };
        if !expected {
            let state = finals.get(id).map_or("?", |s| s.as_str());
            let says = match status {
                Some(OrderStatus::Shipped) => "it shipped",
                Some(OrderStatus::Compensated) => "it was undone",
                Some(OrderStatus::Untouched) => "nothing was applied",
                Some(OrderStatus::Inconsistent) => "it is inconsistent",
                None => "nothing about it",
            };
            disagree.push(format!(
                "{} is {state} but the ledger says {says}",
                order.order_id
            ));
        }
    }
    disagree
}

/// The effects applied and the replays absorbed, as a table.
fn print_effects(all: &LedgerReport) {
    let a = &all.applied;
    let mut t = Table::default();
    t.row(
        "Effects applied",
        a.reserve + a.charge + a.ship + a.release + a.refund,
        format!(
            "reserve {} · charge {} · ship {} · refund {} · release {}",
            a.reserve, a.charge, a.ship, a.refund, a.release
        ),
    );
    t.row(
        "Replays absorbed",
        all.replays,
        "repeated calls answered from the idempotency key, not applied",
    );
    t.print();
}

/// Prints one check: ✔ or ✘ with its text, then the first problems.
fn check(problems: &[&String], text: &str) {
    println!("  {} {text}", if problems.is_empty() { "✔" } else { "✘" });
    for v in problems.iter().take(SHOWN) {
        println!("      - {v}");
    }
    if problems.len() > SHOWN {
        println!("      … and {} more", problems.len() - SHOWN);
    }
}
