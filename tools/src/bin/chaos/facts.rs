//! What the database says about each run of a chaos run: its state, and every step attempt
//! with more than one recorded result.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sagaflow::internals::store::Store;
use sagaflow::{HistoryKind, RunState};
use uuid::Uuid;

/// What the database says about one run.
#[derive(Debug, Default)]
pub(crate) struct RunFacts {
    /// Its state, `None` when the row is missing (or unreadable).
    pub(crate) state: Option<RunState>,
    /// Its version (a migrated flow shows 2).
    pub(crate) version: i32,
    /// Step results recorded in its history.
    pub(crate) outcomes: usize,
    /// Attempts with more than one recorded result: a fenced write that let a stale or
    /// late answer through.
    pub(crate) doubled: Vec<String>,
}

/// Events that record the result of one step attempt.
const OUTCOMES: [HistoryKind; 5] = [
    HistoryKind::Completed,
    HistoryKind::Retry,
    HistoryKind::Failed,
    HistoryKind::Timeout,
    HistoryKind::Interrupted,
];

async fn run_facts(store: &Store, id: Uuid) -> RunFacts {
    // PostgreSQL may have been restarted a moment ago: retry a little.
    let mut facts = RunFacts::default();
    for _ in 0..20 {
        match store.run_get(id).await {
            Ok(row) => {
                if let Some(r) = row {
                    facts.state = Some(r.state);
                    facts.version = r.version;
                }
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let mut history = Vec::new();
    for _ in 0..20 {
        match store.run_history(id).await {
            Ok(h) => {
                history = h;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    // One result per attempt: forward attempts leave `running`, compensations `compensating`.
    let mut per_attempt: BTreeMap<(String, String, i32), Vec<String>> = BTreeMap::new();
    for h in history.iter().filter(|h| OUTCOMES.contains(&h.kind)) {
        facts.outcomes += 1;
        per_attempt
            .entry((
                h.step.clone().unwrap_or_default(),
                h.from.map(|s| s.to_string()).unwrap_or_default(),
                h.attempt.unwrap_or(-1),
            ))
            .or_default()
            .push(format!("{} by {}", h.kind, h.actor));
    }
    for ((step, from, attempt), events) in per_attempt {
        if events.len() > 1 {
            facts.doubled.push(format!(
                "run {id} step {step} attempt {attempt} (from {from}): {}",
                events.join(", ")
            ));
        }
    }
    facts
}

/// `run_facts` of every id, from a few concurrent readers.
pub(crate) async fn all_run_facts(store: &Store, ids: Vec<Uuid>) -> HashMap<Uuid, RunFacts> {
    const READERS: usize = 8;
    let chunk = ids.len().div_ceil(READERS).max(1);
    let mut tasks = tokio::task::JoinSet::new();
    for part in ids.chunks(chunk) {
        let (store, part) = (store.clone(), part.to_vec());
        tasks.spawn(async move {
            let mut out = Vec::with_capacity(part.len());
            for id in part {
                out.push((id, run_facts(&store, id).await));
            }
            out
        });
    }
    let mut facts = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(part) = done {
            facts.extend(part);
        }
    }
    facts
}
