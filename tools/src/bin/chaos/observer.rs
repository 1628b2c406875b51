//! The coordinator's record of every finished run as it sees it, polled from the database
//! while the chaos goes on: with a short retention window, the engine processes purge
//! finished runs during the run, and the checks then judge a purged run on the final state
//! recorded here (its effects stay in the ledger and are checked all the same).
//!
//! A child run can leave its final state again (a completed child is compensated when its
//! parent unwinds): the record keeps the latest state seen. Retention never takes a child
//! while its parent may still compensate it, so the latest state seen is its final one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sagaflow::RunState;
use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use uuid::Uuid;

use super::mix::CHILD_WORKFLOW;

/// How often the observer reads the finished runs (well within the retention window).
pub(crate) const OBSERVE_EVERY: Duration = Duration::from_millis(250);

/// A finished run as last seen.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// Its workflow.
    pub(crate) workflow: String,
    /// Its version (a migrated flow shows 2).
    pub(crate) version: i32,
    /// Its state.
    pub(crate) state: RunState,
    /// Its business key (a child's is `<parent run>:<step>`).
    pub(crate) business_key: Option<String>,
}

impl Seen {
    /// Whether it is a child run.
    pub(crate) fn is_child(&self) -> bool {
        self.workflow == CHILD_WORKFLOW
    }
}

/// Every finished run seen so far.
#[derive(Debug, Default)]
pub(crate) struct Observed {
    runs: Mutex<HashMap<Uuid, Seen>>,
    /// Finished runs seen that are not children: the progress the chaos follows.
    pub(crate) roots_ended: AtomicU64,
    /// Polls that failed (PostgreSQL restarting).
    pub(crate) errors: AtomicU64,
}

impl Observed {
    /// A copy of what was seen.
    pub(crate) fn snapshot(&self) -> HashMap<Uuid, Seen> {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads every finished run once and records it.
    pub(crate) async fn poll(&self, store: &Store) -> Result<(), sagaflow::sea_orm::DbErr> {
        let conn = store.connection();
        let rows = conn
            .query_all_raw(Statement::from_string(
                conn.get_database_backend(),
                "SELECT id, workflow, version, state, business_key FROM sagaflow_runs_all \
                 WHERE state IN ('completed', 'compensated', 'error')",
            ))
            .await?;
        let mut seen = Vec::with_capacity(rows.len());
        for r in rows {
            let state: String = r.try_get("", "state")?;
            let Ok(state) = state.parse::<RunState>() else {
                continue;
            };
            seen.push((
                r.try_get::<Uuid>("", "id")?,
                Seen {
                    workflow: r.try_get("", "workflow")?,
                    version: r.try_get("", "version")?,
                    state,
                    business_key: r.try_get("", "business_key")?,
                },
            ));
        }
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.extend(seen);
        let roots = runs.values().filter(|s| !s.is_child()).count();
        self.roots_ended
            .store(u64::try_from(roots).unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok(())
    }

    /// Polls every [`OBSERVE_EVERY`] until aborted.
    pub(crate) async fn watch(&self, store: Store) {
        let mut tick = tokio::time::interval(OBSERVE_EVERY);
        loop {
            tick.tick().await;
            if self.poll(&store).await.is_err() {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
