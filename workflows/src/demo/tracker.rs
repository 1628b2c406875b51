//! Tracking the demo's runs while they execute: which were accepted or rejected, the latest
//! state seen of each, and the tally of finished ones.

use std::collections::HashMap;

use sagaflow::{Engine, RunState};
use sagaflow_workflows::order::Order;
use uuid::Uuid;

use super::DemoResult;

/// How many runs ended in each final state.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    pub(crate) completed: usize,
    pub(crate) compensated: usize,
    pub(crate) error: usize,
}

impl Tally {
    /// Runs in a terminal state.
    pub(crate) fn done(&self) -> usize {
        self.completed + self.compensated + self.error
    }

    fn add(&mut self, s: RunState) {
        match s {
            RunState::Completed => self.completed += 1,
            RunState::Compensated => self.compensated += 1,
            RunState::Error => self.error += 1,
            _ => {}
        }
    }

    /// Fits next to the progress bar on an 80-column terminal.
    pub(crate) fn compact(&self) -> String {
        self.joined("  ")
    }

    /// The tally on a line of its own.
    pub(crate) fn line(&self) -> String {
        self.joined("   ")
    }

    fn joined(&self, gap: &str) -> String {
        format!(
            "✔ {} completed{gap}↺ {} compensated{gap}✘ {} error",
            self.completed, self.compensated, self.error
        )
    }
}

/// The demo's runs and what is known of them.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    /// Accepted runs in submission order, with their order.
    pub(crate) runs: Vec<(Order, Uuid)>,
    by_id: HashMap<Uuid, usize>,
    /// Latest state seen per run id (from events or polling); may precede `runs`.
    latest: HashMap<Uuid, RunState>,
    /// Orders the engine refused to start, with why.
    pub(crate) rejected: Vec<(Order, String)>,
    /// Whether every order was submitted (accepted or rejected).
    pub(crate) submitted_all: bool,
}

impl Tracker {
    /// Records an accepted run of `order`.
    pub(crate) fn accept(&mut self, order: Order, id: Uuid) {
        self.by_id.insert(id, self.runs.len());
        self.runs.push((order, id));
    }

    /// Whether `id` is one of this demo's runs.
    pub(crate) fn owns(&self, id: Uuid) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Tallies the runs by their latest state.
    pub(crate) fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for (_, id) in &self.runs {
            if let Some(s) = self.latest.get(id) {
                t.add(*s);
            }
        }
        t
    }

    /// Accepted runs not yet seen in a terminal state.
    pub(crate) fn unfinished(&self) -> Vec<Uuid> {
        self.runs
            .iter()
            .map(|(_, id)| *id)
            .filter(|id| !self.latest.get(id).is_some_and(|s| s.is_terminal()))
            .collect()
    }

    /// The order id of a run, or `run <id>` for a run not (yet) known.
    pub(crate) fn name(&self, id: Uuid) -> String {
        self.by_id
            .get(&id)
            .map_or_else(|| format!("run {id}"), |&i| self.runs[i].0.order_id.clone())
    }

    /// Records the latest state seen of a run.
    pub(crate) fn see(&mut self, id: Uuid, state: RunState) {
        self.latest.insert(id, state);
    }

    /// Re-reads the state of every unfinished run from the database.
    pub(crate) async fn reconcile(&mut self, engine: &Engine) -> DemoResult<()> {
        for id in self.unfinished() {
            if let Some(run) = engine.run(id).await? {
                self.see(id, run.state);
            }
        }
        Ok(())
    }
}
