//! The operator act: list the open alerts of this demo's runs, fix their cause (clear the
//! planted refusals), resume each run, and tell the story of the showcased one.

use std::time::{Duration, Instant};

use sagaflow::{Alert, Engine, HistoryEvent, RunState};
use sagaflow_testkit::services::{Operation, Service, Services};
use uuid::Uuid;

use super::DemoResult;
use super::alerts::{numbered_line, print_card};
use super::history::{is_compensation_done, story, undo_of};
use super::text::{plural, rule, since};
use super::tracker::Tracker;

/// Alerts shown as full cards; the rest get one line each.
const DETAILED: usize = 5;

/// Runs the operator act; `deadline_cap` is the longest step deadline.
pub(crate) async fn operator_act(
    engine: &Engine,
    services: &Services,
    tracker: &mut Tracker,
    deadline_cap: Duration,
) -> DemoResult<()> {
    println!();
    println!("{}", rule("Operator"));
    let (mine, others): (Vec<Alert>, Vec<Alert>) = engine
        .open_alerts()
        .await?
        .into_iter()
        .filter(|a| a.run_id.is_some())
        .partition(|a| a.run_id.is_some_and(|id| tracker.owns(id)));
    // Runs this demo did not start (an earlier demo's) are not fixed here: their first
    // effects are in another process's services.
    if !others.is_empty() {
        println!(
            "  {} of runs this demo did not start left as they are.",
            plural(others.len(), "open alert", "open alerts")
        );
    }
    let refund_script_left = services
        .faults(Service::Payments)
        .scripted_left(Operation::Refund);
    if mine.is_empty() {
        if refund_script_left > 0 {
            println!(
                "  No open alerts: no shipment failed, so no refund was needed and the refund"
            );
            println!(
                "  refusal planted for this act never fired. Try more orders or --permanent 0.05."
            );
        } else {
            println!("  No open alerts: every saga finished on its own.");
        }
        return Ok(());
    }
    println!("  {}:", plural(mine.len(), "open alert", "open alerts"));
    for a in mine.iter().take(DETAILED) {
        print_card(tracker, a);
    }
    if mine.len() > DETAILED {
        println!();
        for a in mine.iter().skip(DETAILED) {
            println!("{}", numbered_line(tracker, a));
        }
    }
    println!();
    if refund_script_left == 0 {
        println!(
            "  → Fixing the cause: the payments team turns refunds back on (refusal cleared)."
        );
    } else {
        println!("  → Fixing the cause: clearing every scripted refusal.");
    }
    for s in Service::ALL {
        services.faults(s).clear_scripts();
    }

    let mut runs: Vec<Uuid> = mine.iter().filter_map(|a| a.run_id).collect();
    runs.dedup();
    // The run whose story is told: the one hit by the planted refusal, else the first.
    let showcase = mine
        .iter()
        .find(|a| a.reason.contains("(scripted)"))
        .or_else(|| mine.first())
        .and_then(|a| a.run_id);
    let wait_for = Duration::from_secs(30) + deadline_cap * 4;
    let mut told = None;
    for id in runs {
        if let Some(history) = resume(engine, tracker, id, wait_for).await?
            && Some(id) == showcase
        {
            told = Some((tracker.name(id), history));
        }
    }
    if let Some((name, history)) = told {
        println!();
        println!("  The story of {name}:");
        for line in story(&history) {
            println!("    {line}");
        }
    }
    Ok(())
}

/// Resumes one run and waits for it to settle, printing what happened. Returns its full
/// history once it settled, `None` when the resume was refused or the run did not settle.
async fn resume(
    engine: &Engine,
    tracker: &mut Tracker,
    id: Uuid,
    wait_for: Duration,
) -> DemoResult<Option<Vec<HistoryEvent>>> {
    let name = tracker.name(id);
    let started = Instant::now();
    let history_len = engine.history(id).await?.len();
    match engine.operator().resume(id).await {
        Ok(state) => println!("  → operator resume {name}: the run is {state} again"),
        Err(e) => {
            println!("  ✘ operator resume {name} refused: {e}");
            return Ok(None);
        }
    }
    let run = match engine.wait(id, wait_for).await {
        Ok(run) => run,
        Err(e) => {
            println!("  ✘ {name} did not settle after the resume: {e}");
            return Ok(None);
        }
    };
    tracker.see(id, run.state);
    let history = engine.history(id).await?;
    let undone: Vec<String> = history
        .iter()
        .skip(history_len)
        .filter(|h| is_compensation_done(h))
        .filter_map(|h| h.step.as_deref().map(|s| format!("{} ({s})", undo_of(s))))
        .collect();
    let mark = if run.state == RunState::Error {
        "✘"
    } else {
        "✔"
    };
    let did = if undone.is_empty() {
        String::new()
    } else {
        format!(" after {}", undone.join(", then "))
    };
    println!(
        "  {mark} {name} is {}{did}, {} after the fix",
        run.state,
        since(started)
    );
    Ok(Some(history))
}
