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

    /// Counts one run in state `s` (not at all when `s` is not terminal).
    pub(crate) fn add(&mut self, s: RunState) {
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
    /// Runs of this demo's orders that were already on the database (an earlier demo on it,
    /// killed or still running, started them; the order's key returned them): followed to
    /// their end, not started again, and left out of the ledger check (their first effects
    /// are not in this process's ledger).
    pub(crate) earlier: Vec<(Order, Uuid)>,
    earlier_by_id: HashMap<Uuid, usize>,
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

    /// Records `id`, already on the database in `state`, as the run of `order` (a state its
    /// events told since is kept).
    pub(crate) fn adopt(&mut self, order: Order, id: Uuid, state: RunState) {
        self.earlier_by_id.insert(id, self.earlier.len());
        self.earlier.push((order, id));
        self.latest.entry(id).or_insert(state);
    }

    /// Every followed run: the accepted ones, then the earlier ones.
    fn followed(&self) -> impl Iterator<Item = Uuid> + '_ {
        self.runs.iter().chain(&self.earlier).map(|(_, id)| *id)
    }

    /// Whether `id` is one of this demo's runs.
    pub(crate) fn owns(&self, id: Uuid) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Tallies the followed runs (accepted and earlier) by their latest state.
    pub(crate) fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for id in self.followed() {
            if let Some(s) = self.latest.get(&id) {
                t.add(*s);
            }
        }
        t
    }

    /// Followed runs (accepted and earlier) not yet seen in a terminal state.
    pub(crate) fn unfinished(&self) -> Vec<Uuid> {
        self.followed()
            .filter(|id| !self.latest.get(id).is_some_and(|s| s.is_terminal()))
            .collect()
    }

    /// The order id of a run (`order-00007 (earlier run)` for an earlier one), or `run <id>`
    /// for a run this demo does not follow (an earlier demo's run of another order, resumed
    /// by this engine).
    pub(crate) fn name(&self, id: Uuid) -> String {
        if let Some((order, _)) = self.by_id.get(&id).and_then(|&i| self.runs.get(i)) {
            return order.order_id.clone();
        }
        if let Some((order, _)) = self
            .earlier_by_id
            .get(&id)
            .and_then(|&i| self.earlier.get(i))
        {
            return format!("{} (earlier run)", order.order_id);
        }
        format!("run {id}")
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
