//! `sagaflow queue` and `sagaflow definitions`: what waits, what runs, what is deployed.

use std::collections::BTreeMap;

use sagaflow::{Engine, RunState, Timestamp, WorkflowDescription};
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

pub(crate) async fn queue(engine: &Engine, json: bool) -> Outcome {
    let stats = engine.stats().await?;
    if json {
        return output::json(&stats);
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
    definitions: Vec<DefinitionAnswer>,
}

/// One published definition.
#[derive(Debug, Serialize)]
struct DefinitionAnswer {
    key: String,
    name: String,
    version: i32,
    description: Option<WorkflowDescription>,
    description_error: Option<String>,
    published_by: String,
    published_at: Timestamp,
}

pub(crate) async fn definitions(engine: &Engine, json: bool) -> Outcome {
    let defs: Vec<DefinitionAnswer> = engine
        .definitions()
        .await?
        .into_iter()
        .map(|d| {
            let (description, description_error) = match d.description {
                Ok(desc) => (Some(desc), None),
                Err(e) => (None, Some(e)),
            };
            DefinitionAnswer {
                key: d.key,
                name: d.name,
                version: d.version,
                description,
                description_error,
                published_by: d.published_by,
                published_at: d.published_at,
            }
        })
        .collect();
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
                .map_or_else(|| "?".to_owned(), |desc| desc.steps.len().to_string()),
            time(d.published_at),
            d.published_by.clone(),
        ]);
    }
    output::print_table(&t);
    Ok(())
}
