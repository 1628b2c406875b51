//! Figures for a console's overview, each meant to be read through an index rather than over
//! every retained run: the queue (steps ready now, scheduled
//! for later, running), the age of the oldest ready step, the unfinished runs per workflow and
//! state, and the runs finished in the last 1, 5 and 15 minutes.
//!
//! Lifetime totals of finished runs per workflow are left out on purpose: counting them reads
//! every retained run (`Engine::run_counts` does, for monitoring that can afford it).
//!
//! Recent throughput is not counted over the runs: every transaction that finishes runs adds
//! their number to a row of `sagaflow_throughput` for the current ten seconds (one of
//! sixteen rows, taken in turn, so that concurrent writers seldom share a row), and
//! the figures sum those rows. "The last minute" is thus the last 50 to 60 seconds.

use std::sync::atomic::{AtomicU32, Ordering};

use serde::Serialize;

use super::Store;
use super::conn::Txn;
use super::row::Exec;
use crate::{Result, RunState};

/// A snapshot of the queue and of recent throughput (database clock).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Stats {
    /// Steps due now (`ready`, `compensation_ready`).
    pub ready: i64,
    /// Steps queued for later (a retry's backoff, a scheduled start).
    pub scheduled: i64,
    /// Steps with an attempt in flight (`running`, `compensating`).
    pub running: i64,
    /// Milliseconds since the oldest due step became due; 0 when none is.
    pub oldest_ready_ms: i64,
    /// Unfinished runs per workflow and state.
    pub active: Vec<ActiveCount>,
    /// Runs finished (completed or compensated) in the last 1, 5 and 15 minutes.
    pub finished_last: FinishedCounts,
}

/// Unfinished runs of one workflow in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActiveCount {
    /// Workflow name.
    pub workflow: String,
    /// Run state.
    pub state: RunState,
    /// How many.
    pub runs: i64,
}

/// Runs finished in the last 1, 5 and 15 minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FinishedCounts {
    /// In the last minute.
    pub m1: i64,
    /// In the last 5 minutes.
    pub m5: i64,
    /// In the last 15 minutes.
    pub m15: i64,
}

/// Rows per ten seconds that finishing transactions spread their counts over.
pub(super) const THROUGHPUT_SLOTS: u32 = 16;

/// How long throughput rows are kept (milliseconds): the longest window shown, with room.
pub(super) const THROUGHPUT_KEEP_MS: i64 = 60 * 60 * 1000;

/// Adds `n` finished runs to the current ten seconds' throughput, in the caller's transaction.
pub(super) async fn count_finished(store: &Store, txn: &Txn, n: usize) -> Result<()> {
    static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);
    if n == 0 {
        return Ok(());
    }
    let slot = NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % THROUGHPUT_SLOTS;
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    txn.execute(store.stmt(
        "INSERT INTO sagaflow_throughput (bucket, slot, finished) VALUES ({now} / 10000, $1, $2) \
         ON CONFLICT (bucket, slot) DO UPDATE SET finished = sagaflow_throughput.finished + excluded.finished",
        vec![i64::from(slot).into(), n.into()],
    ))
    .await?;
    Ok(())
}

impl Store {
    /// The overview figures (see the module documentation).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn stats(&self) -> Result<Stats> {
        // One statement, so that the figures are of one moment: a step claimed between two
        // reads would count as both due and running.
        const DUE: &str = "state IN ('ready', 'compensation_ready')";
        let sql = format!(
            "SELECT \
               (SELECT COUNT(*) FROM sagaflow_steps WHERE {DUE} AND available_at <= {{now}}) AS ready, \
               (SELECT COUNT(*) FROM sagaflow_steps WHERE {DUE} AND available_at > {{now}}) AS scheduled, \
               (SELECT COUNT(*) FROM sagaflow_steps WHERE state IN ('running', 'compensating')) AS running, \
               (SELECT {{now}} - MIN(available_at) FROM sagaflow_steps \
                 WHERE {DUE} AND available_at <= {{now}}) AS oldest, \
               (SELECT CAST(SUM(finished) AS BIGINT) FROM sagaflow_throughput WHERE bucket > {{now}} / 10000 - 6) AS m1, \
               (SELECT CAST(SUM(finished) AS BIGINT) FROM sagaflow_throughput WHERE bucket > {{now}} / 10000 - 30) AS m5, \
               (SELECT CAST(SUM(finished) AS BIGINT) FROM sagaflow_throughput WHERE bucket > {{now}} / 10000 - 90) AS m15"
        );
        let row = self.exec.query_one(self.stmt(&sql, vec![])).await?;
        let get = |col: &str| -> Result<i64> {
            Ok(match &row {
                Some(r) => r.try_get::<Option<i64>>("", col)?.unwrap_or(0),
                None => 0,
            })
        };
        let (ready, scheduled, running, oldest_ready_ms) = (
            get("ready")?,
            get("scheduled")?,
            get("running")?,
            get("oldest")?,
        );
        let finished_last = FinishedCounts {
            m1: get("m1")?,
            m5: get("m5")?,
            m15: get("m15")?,
        };
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT workflow, state, COUNT(*) AS n FROM sagaflow_runs \
                 WHERE finished_at IS NULL GROUP BY workflow, state ORDER BY workflow, state",
                vec![],
            ))
            .await?;
        let mut active = Vec::with_capacity(rows.len());
        for r in &rows {
            let state: String = r.try_get("", "state")?;
            // A damaged state is the concern of its run, not of the overview.
            if let Ok(state) = state.parse::<RunState>() {
                active.push(ActiveCount {
                    workflow: r.try_get("", "workflow")?,
                    state,
                    runs: r.try_get("", "n")?,
                });
            }
        }
        Ok(Stats {
            ready,
            scheduled,
            running,
            oldest_ready_ms: oldest_ready_ms.max(0),
            active,
            finished_last,
        })
    }
}
