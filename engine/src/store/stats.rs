//! Figures for a console's overview, each meant to be read through an index rather than over
//! every retained run: the queue (steps ready now, scheduled
//! for later, running), the age of the oldest ready step, the runs per workflow and state,
//! and the runs finished in the last 1, 5 and 15 minutes.
//!
//! Unfinished runs are counted over the runs (through the index of unfinished runs). Finished
//! ones are not, since that would read every retained run: every transaction that finishes
//! runs adds them to `sagaflow_run_totals` per workflow and final state, the retention sweep
//! takes the runs it deletes off again, and the figures sum those rows.
//!
//! Recent throughput is not counted over the runs: every transaction that finishes runs adds
//! their number to a row of `sagaflow_throughput` for the current ten seconds (one of
//! sixteen rows, taken in turn, so that concurrent writers seldom share a row), and
//! the figures sum those rows. "The last minute" is thus the last 50 to 60 seconds.

use std::collections::BTreeMap;
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
    /// Retained finished runs (`completed`, `compensated`) per workflow and state.
    pub finished: Vec<ActiveCount>,
    /// Runs finished (completed or compensated) in the last 1, 5 and 15 minutes.
    pub finished_last: FinishedCounts,
}

/// Runs of one workflow in one state.
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

/// The queue of one workflow (all its versions), as the metrics' gauges show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowQueue {
    /// Workflow name.
    pub workflow: String,
    /// Steps due now (`ready`, `compensation_ready`).
    pub ready: i64,
    /// Steps queued for later.
    pub scheduled: i64,
    /// Steps with an attempt in flight (`running`, `compensating`).
    pub running: i64,
    /// Milliseconds since the oldest due step became due; 0 when none is.
    pub oldest_ready_ms: i64,
}

/// Rows per ten seconds that finishing transactions spread their counts over.
pub(super) const THROUGHPUT_SLOTS: u32 = 16;

/// How long throughput rows are kept (milliseconds): the longest window shown, with room.
pub(super) const THROUGHPUT_KEEP_MS: i64 = 60 * 60 * 1000;

/// Adds runs that finished, per workflow and final state, to the totals and to the current
/// ten seconds' throughput, in the caller's transaction: the totals first, then throughput,
/// each in key order, so that transactions sharing a slot take the rows in one order.
pub(super) async fn count_finished(
    store: &Store,
    txn: &Txn,
    finished: &BTreeMap<(String, RunState), i64>,
) -> Result<()> {
    static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);
    if finished.is_empty() {
        return Ok(());
    }
    let slot = i64::from(NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % THROUGHPUT_SLOTS);
    add_totals(
        store,
        txn,
        slot,
        finished.iter().map(|((w, st), n)| (w.as_str(), *st, *n)),
    )
    .await?;
    let n: i64 = finished.values().sum();
    txn.execute(store.stmt(
        "INSERT INTO sagaflow_throughput (bucket, slot, finished) VALUES ({now} / 10000, $1, $2) \
         ON CONFLICT (bucket, slot) DO UPDATE SET finished = sagaflow_throughput.finished + excluded.finished",
        vec![slot.into(), n.into()],
    ))
    .await?;
    Ok(())
}

/// Adds `n` (negative: takes off) runs per workflow and final state to slot `slot` of the
/// totals, in one statement. The rows go in the order of their key as stored (workflow,
/// then the state's name), which is the order their locks are taken in: every writer of a
/// slot takes them alike (a unit of work's end kept them in the order of the state's
/// variant, the retention in that of its name, and each could hold a row the other waited
/// for).
pub(super) async fn add_totals<'a>(
    store: &Store,
    txn: &Txn,
    slot: i64,
    counts: impl Iterator<Item = (&'a str, RunState, i64)>,
) -> Result<()> {
    let mut counts: Vec<(&str, RunState, i64)> = counts.collect();
    counts.sort_unstable_by(|a, b| (a.0, a.1.as_str()).cmp(&(b.0, b.1.as_str())));
    let mut values: Vec<sea_orm::Value> = vec![slot.into()];
    let mut rows = Vec::new();
    for (workflow, state, n) in counts {
        let i = values.len();
        rows.push(format!("(${}, ${}, $1, ${})", i + 1, i + 2, i + 3));
        values.extend([workflow.into(), state.as_str().into(), n.into()]);
    }
    if rows.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "INSERT INTO sagaflow_run_totals (workflow, state, slot, runs) VALUES {} \
         ON CONFLICT (workflow, state, slot) DO UPDATE SET runs = sagaflow_run_totals.runs + excluded.runs",
        rows.join(", ")
    );
    txn.execute(store.stmt(&sql, values)).await?;
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
        // Steps with and without a resource are queued in two partial indexes: each count
        // goes through one.
        const DUE: &str = "state IN ('ready', 'compensation_ready')";
        const FREE: &str = "resource IS NULL";
        const HELD: &str = "resource IS NOT NULL";
        let sql = format!(
            "SELECT \
               (SELECT COUNT(*) FROM sagaflow_steps WHERE {DUE} AND {FREE} AND available_at <= {{now}}) \
                 + (SELECT COUNT(*) FROM sagaflow_steps WHERE {DUE} AND {HELD} AND available_at <= {{now}}) AS ready, \
               (SELECT COUNT(*) FROM sagaflow_steps WHERE {DUE} AND {FREE} AND available_at > {{now}}) \
                 + (SELECT COUNT(*) FROM sagaflow_steps WHERE {DUE} AND {HELD} AND available_at > {{now}}) AS scheduled, \
               (SELECT COUNT(*) FROM sagaflow_steps WHERE state IN ('running', 'compensating')) AS running, \
               (SELECT {{now}} - MIN(available_at) FROM sagaflow_steps \
                 WHERE {DUE} AND {FREE} AND available_at <= {{now}}) AS oldest, \
               (SELECT {{now}} - MIN(available_at) FROM sagaflow_steps \
                 WHERE {DUE} AND {HELD} AND available_at <= {{now}}) AS oldest_held, \
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
            get("oldest")?.max(get("oldest_held")?),
        );
        let finished_last = FinishedCounts {
            m1: get("m1")?,
            m5: get("m5")?,
            m15: get("m15")?,
        };
        let active = self
            .state_counts(
                "SELECT workflow, state, COUNT(*) AS n FROM sagaflow_runs \
                 WHERE finished_at IS NULL GROUP BY workflow, state ORDER BY workflow, state",
            )
            .await?;
        let finished = self
            .state_counts(
                "SELECT workflow, state, CAST(SUM(runs) AS BIGINT) AS n FROM sagaflow_run_totals \
                 GROUP BY workflow, state HAVING SUM(runs) > 0 ORDER BY workflow, state",
            )
            .await?;
        Ok(Stats {
            ready,
            scheduled,
            running,
            oldest_ready_ms: oldest_ready_ms.max(0),
            active,
            finished,
            finished_last,
        })
    }

    /// The queue per workflow: the figures of [`Stats`] (`ready`, `scheduled`, `running`,
    /// `oldest_ready_ms`) for each workflow with unfinished steps, in one statement over the
    /// steps table (which holds the steps of unfinished runs only).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn queue_by_workflow(&self) -> Result<Vec<WorkflowQueue>> {
        const DUE: &str = "state IN ('ready', 'compensation_ready')";
        let sql = format!(
            "SELECT workflow_key, \
               SUM(CASE WHEN {DUE} AND available_at <= {{now}} THEN 1 ELSE 0 END) AS ready, \
               SUM(CASE WHEN {DUE} AND available_at > {{now}} THEN 1 ELSE 0 END) AS scheduled, \
               SUM(CASE WHEN state IN ('running', 'compensating') THEN 1 ELSE 0 END) AS running, \
               {{now}} - MIN(CASE WHEN {DUE} AND available_at <= {{now}} THEN available_at END) AS oldest \
             FROM sagaflow_steps WHERE state IN ('ready', 'compensation_ready', 'running', 'compensating') \
             GROUP BY workflow_key"
        );
        let rows = self.exec.query_all(self.stmt(&sql, vec![])).await?;
        let mut by_name: BTreeMap<String, WorkflowQueue> = BTreeMap::new();
        for r in &rows {
            let key: String = r.try_get("", "workflow_key")?;
            let name = key.rsplit_once('@').map_or(key.as_str(), |(n, _)| n);
            let get =
                |col: &str| -> Result<i64> { Ok(r.try_get::<Option<i64>>("", col)?.unwrap_or(0)) };
            let q = by_name
                .entry(name.to_owned())
                .or_insert_with(|| WorkflowQueue {
                    workflow: name.to_owned(),
                    ready: 0,
                    scheduled: 0,
                    running: 0,
                    oldest_ready_ms: 0,
                });
            q.ready += get("ready")?;
            q.scheduled += get("scheduled")?;
            q.running += get("running")?;
            q.oldest_ready_ms = q.oldest_ready_ms.max(get("oldest")?);
        }
        Ok(by_name.into_values().collect())
    }

    /// Counts per workflow and state, read by `sql` (columns `workflow`, `state`, `n`).
    async fn state_counts(&self, sql: &str) -> Result<Vec<ActiveCount>> {
        let rows = self.exec.query_all(self.stmt(sql, vec![])).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let state: String = r.try_get("", "state")?;
            // A damaged state is the concern of its run, not of the overview.
            if let Ok(state) = state.parse::<RunState>() {
                out.push(ActiveCount {
                    workflow: r.try_get("", "workflow")?,
                    state,
                    runs: r.try_get("", "n")?,
                });
            }
        }
        Ok(out)
    }
}
