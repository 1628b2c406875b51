//! `sagaflow queue` and `sagaflow definitions`: what waits, what runs (in all and per
//! workflow), what is deployed.

use std::collections::BTreeMap;

use sagaflow::{Engine, PublishedDefinition, RunState, Stats, WorkflowQueue};
use serde::Serialize;

use crate::exit::Outcome;
use crate::output::{self, time};

/// The unfinished states, in the queue table's column order.
const ACTIVE: [RunState; 5] = [
    RunState::Pending,
    RunState::Running,
    RunState::Compensating,
    RunState::Paused,
    RunState::Error,
];

/// `queue --json`: the answer of `GET /api/v1/stats`, with the queue of each workflow.
#[derive(Debug, Serialize)]
struct QueueAnswer {
    #[serde(flatten)]
    stats: Stats,
    /// The steps due, scheduled and running per workflow (the workflows with any).
    queues: Vec<WorkflowQueue>,
}

pub(crate) async fn queue(engine: &Engine, json: bool) -> Outcome {
    let stats = engine.stats().await?;
    let queues = engine.queue_by_workflow().await?;
    if json {
        return output::json(&QueueAnswer { stats, queues });
    }
    let mut t = output::table(&[]);
    t.add_row([
        "steps ready".to_owned(),
        stats.ready.to_string(),
        format!(
            "oldest waiting {}",
            output::span(stats.oldest_ready_ms / 1000)
        ),
    ]);
    t.add_row([
        "steps scheduled".to_owned(),
        stats.scheduled.to_string(),
        String::new(),
    ]);
    t.add_row([
        "steps running".to_owned(),
        stats.running.to_string(),
        String::new(),
    ]);
    t.add_row([
        "runs finished".to_owned(),
        format!(
            "{} / {} / {}",
            stats.finished_last.m1, stats.finished_last.m5, stats.finished_last.m15
        ),
        "last 1m / 5m / 15m".to_owned(),
    ]);
    output::print_table(&t);
    output::line("");
    // Steps per workflow: what waits and what runs.
    if queues.is_empty() {
        output::line("no steps ready, scheduled or running");
    } else {
        let mut t = output::table(&[
            "WORKFLOW",
            "STEPS READY",
            "SCHEDULED",
            "RUNNING",
            "OLDEST WAITING",
        ]);
        for q in &queues {
            t.add_row([
                q.workflow.clone(),
                q.ready.to_string(),
                q.scheduled.to_string(),
                q.running.to_string(),
                if q.ready > 0 {
                    output::span(q.oldest_ready_ms / 1000)
                } else {
                    "-".to_owned()
                },
            ]);
        }
        output::print_table(&t);
    }
    output::line("");
    // Runs per workflow: the unfinished ones by state, the retained finished ones.
    let mut rows: BTreeMap<&str, ([i64; 5], i64)> = BTreeMap::new();
    for a in &stats.active {
        if let Some(i) = ACTIVE.iter().position(|s| *s == a.state) {
            rows.entry(a.workflow.as_str()).or_default().0[i] += a.runs;
        }
    }
    for f in &stats.finished {
        rows.entry(f.workflow.as_str()).or_default().1 += f.runs;
    }
    if rows.is_empty() {
        output::line("no runs");
        return Ok(());
    }
    let mut t = output::table(&[
        "WORKFLOW",
        "PENDING",
        "RUNNING",
        "COMPENSATING",
        "PAUSED",
        "ERROR",
        "FINISHED",
    ]);
    for (workflow, (active, finished)) in rows {
        let mut row = vec![workflow.to_owned()];
        row.extend(active.iter().map(ToString::to_string));
        row.push(finished.to_string());
        t.add_row(row);
    }
    output::print_table(&t);
    Ok(())
}

/// `definitions --json`: the answer of `GET /api/v1/definitions`.
#[derive(Debug, Serialize)]
struct DefinitionsAnswer {
    definitions: Vec<PublishedDefinition>,
}

pub(crate) async fn definitions(engine: &Engine, json: bool) -> Outcome {
    let defs = engine.definitions().await?;
    if json {
        return output::json(&DefinitionsAnswer { definitions: defs });
    }
    if defs.is_empty() {
        output::line("no published definitions (engines publish theirs when they start)");
        return Ok(());
    }
    let mut t = output::table(&["WORKFLOW", "VERSION", "STEPS", "PUBLISHED", "BY"]);
    for d in &defs {
        t.add_row([
            d.name.clone(),
            d.version.to_string(),
            d.description
                .as_ref()
                .map_or_else(|_| "?".to_owned(), |desc| desc.steps.len().to_string()),
            time(d.published_at),
            d.published_by.clone(),
        ]);
    }
    output::print_table(&t);
    Ok(())
}
