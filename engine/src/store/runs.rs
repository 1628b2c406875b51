//! Runs: reads, monitoring counts, retention.

use sea_orm::Value;

use super::row::Exec;
use uuid::Uuid;

use super::rows::{FINAL_RUN_STATES, RUN_COLS, RUN_VIEW_COLS, STEP_COLS};
use super::{RunRow, RunView, StepRow, Store, StoreTx, placeholders};
use crate::interleave::{Point, Unit};
use crate::model::{HistoryEvent, HistoryKind, RunCounts};
use crate::{Backend, Error, Result, RunState};
use sagaflow_migrations::partitions::{
    HISTORY_DEFAULT_PARTITION, HISTORY_PARTITION_SPAN_MS, RUN_KEYS, RUNS_DONE,
    RUNS_DONE_DEFAULT_PARTITION,
};

impl Store {
    /// A run by id.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_get(&self, id: Uuid) -> Result<Option<RunRow>> {
        let sql = format!("SELECT {RUN_COLS} FROM sagaflow_runs_all WHERE id = $1");
        let row = self
            .exec
            .query_one(self.stmt(&sql, vec![id.into()]))
            .await?;
        row.as_ref().map(RunRow::decode).transpose()
    }

    /// A run by id, as shown to applications (with its priority and scheduled start).
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_view(&self, id: Uuid) -> Result<Option<RunView>> {
        run_view_on(self, &self.exec, id).await
    }

    /// A run as its page shows it: the run, its steps, its history and its alerts, all read
    /// in one snapshot ([`Db::begin_read`](super::conn::Db::begin_read)), so that the page
    /// never shows a run as it was with steps or history as they became (a running run with
    /// its completion in its history and its steps gone). `None` when there is no such run.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_page(&self, id: Uuid) -> Result<Option<RunDetail>> {
        let txn = self.exec.begin_read().await?;
        let read = async {
            let Some(run) = run_view_on(self, &txn, id).await? else {
                return Ok(None);
            };
            self.pause_point(Unit::Page, Point::AfterReads).await;
            Ok(Some(RunDetail {
                run,
                steps: run_steps_on(self, &txn, id).await?,
                history: self.history_on(&txn, id, 0, i64::MAX).await?,
                alerts: super::alerts::alert_list_on(self, &txn, Some(id), false).await?,
            }))
        }
        .await;
        // Only read: rolled back, whatever the reads found.
        txn.end(read, |_| false).await
    }

    /// The steps of an unfinished run (a finished run's steps have left the hot table; see
    /// [`Store::run_history`]).
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_steps(&self, id: Uuid) -> Result<Vec<StepRow>> {
        run_steps_on(self, &self.exec, id).await
    }

    /// The append-only history of a run, oldest first.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_history(&self, id: Uuid) -> Result<Vec<HistoryEvent>> {
        self.run_history_after(id, 0, i64::MAX).await
    }

    /// The events of a run's history rows with an id above `after`, oldest first, from at
    /// most `rows` rows (the events of one row share its id).
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_history_after(
        &self,
        id: Uuid,
        after: i64,
        rows: i64,
    ) -> Result<Vec<HistoryEvent>> {
        self.history_on(&self.exec, id, after, rows).await
    }

    /// [`Store::run_history_after`] on `conn`.
    pub(super) async fn history_on<C: super::row::Exec>(
        &self,
        conn: &C,
        id: Uuid,
        after: i64,
        rows: i64,
    ) -> Result<Vec<HistoryEvent>> {
        // The run first, in a statement of its own: one statement that named both would lock
        // the history before the runs (a view's tables are locked after the statement's
        // own), against the order of the writers and of the retention's drop, which lock the
        // finished runs first.
        let kept = conn
            .query_one(self.stmt(
                "SELECT 1 AS one FROM sagaflow_runs_all WHERE id = $1",
                vec![id.into()],
            ))
            .await?
            .is_some();
        if !kept {
            return Ok(Vec::new());
        }
        let rows = conn
            .query_all(self.stmt(
                "SELECT id, step, event, from_state, to_state, attempt, actor, detail, at, then_states \
                 FROM sagaflow_history WHERE run_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                vec![id.into(), after.into(), rows.into()],
            ))
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.extend(super::rows::history_columns(r)?.into_events()?);
        }
        Ok(out)
    }

    /// Runs marked for evaluation, oldest change first, among the given workflow keys.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_list_dirty(&self, workflow_keys: &[String], limit: u32) -> Result<Vec<Uuid>> {
        if workflow_keys.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT id FROM sagaflow_runs WHERE dirty AND workflow_key IN ({}) ORDER BY updated_at LIMIT $1",
            placeholders(2, workflow_keys.len())
        );
        let mut values: Vec<Value> = vec![i64::from(limit).into()];
        values.extend(workflow_keys.iter().map(|k| Value::from(k.clone())));
        let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
        rows.iter()
            .map(|r| r.try_get::<Uuid>("", "id").map_err(Error::from))
            .collect()
    }

    /// Those of `ids` that are compensating, with their error envelopes (which say whether
    /// an operator cancelled them).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn runs_compensating_among(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, Option<String>)>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(super::tx::CHUNK) {
            let (cond, values) = self.in_list("id", 1, chunk)?;
            let sql = format!(
                "SELECT id, error FROM sagaflow_runs WHERE {cond} AND state = 'compensating'"
            );
            let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
            for r in &rows {
                out.push((r.try_get("", "id")?, r.try_get("", "error")?));
            }
        }
        Ok(out)
    }

    /// Milliseconds left before the stored deadline of each of these attempts (step row id,
    /// fencing token) that is still in flight, by the database's clock.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn step_deadlines(&self, attempts: &[(i64, i32)]) -> Result<Vec<(i64, i32, i64)>> {
        let mut out = Vec::new();
        let wanted: std::collections::HashSet<(i64, i32)> = attempts.iter().copied().collect();
        for chunk in attempts.chunks(super::tx::CHUNK) {
            let ids: Vec<i64> = chunk.iter().map(|a| a.0).collect();
            let (cond, values) = self.in_list("id", 1, &ids)?;
            let sql = format!(
                "SELECT id, attempt, complete_by - {{now}} AS left_ms FROM sagaflow_steps \
                 WHERE {cond} AND state IN ('running', 'compensating')"
            );
            for r in &self.exec.query_all(self.stmt(&sql, values)).await? {
                let id: i64 = r.try_get("", "id")?;
                let attempt: i32 = r.try_get("", "attempt")?;
                let left: Option<i64> = r.try_get("", "left_ms")?;
                if let Some(left) = left.filter(|_| wanted.contains(&(id, attempt))) {
                    out.push((id, attempt, left));
                }
            }
        }
        Ok(out)
    }

    /// Workflow keys of unfinished runs, with counts (to spot runs pinned to a version this
    /// engine does not have).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_unfinished_keys(&self) -> Result<Vec<(String, i64)>> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT workflow_key, COUNT(*) AS n FROM sagaflow_runs WHERE finished_at IS NULL GROUP BY workflow_key",
                vec![],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String>("", "workflow_key")?,
                    r.try_get::<i64>("", "n")?,
                ))
            })
            .collect()
    }

    /// Counts runs per state (for summaries and monitoring).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_count_by_state(&self) -> Result<RunCounts> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT state, COUNT(*) AS n FROM sagaflow_runs_all GROUP BY state",
                vec![],
            ))
            .await?;
        let mut counts = Vec::with_capacity(rows.len());
        for r in &rows {
            let state: String = r.try_get("", "state")?;
            let n: i64 = r.try_get("", "n")?;
            // A damaged state is the concern of its run (set aside when it is read), not of
            // the counts of every other run.
            match state.parse::<RunState>() {
                Ok(s) => counts.push((s, u64::try_from(n).unwrap_or(0))),
                Err(_) => tracing::warn!(
                    state = %super::rows::quote(&state),
                    runs = n,
                    "runs with a state that is not one were left out of the counts"
                ),
            }
        }
        Ok(counts.into_iter().collect())
    }

    /// Fills the database with `n` finished runs of the workflows `archive@1` and (one in ten)
    /// `archive_b@1`, each with three history entries, in bulk SQL: for capacity
    /// measurements ("throughput with a million finished runs in history", AT-5, and the
    /// console's list over them). Every run has a business key (`order-<i>`), kept on
    /// PostgreSQL in the key table as the default key policy keeps it; one in a
    /// hundred is compensated rather than completed, and one in fifty had failed attempts
    /// (1 to 7). The runs started and finished between `ages.start` and `ages.end`
    /// milliseconds ago (DB clock), evenly apart, newest first; on PostgreSQL their ids carry
    /// that time as UUIDv7s do, so they land in the history partitions of that time. Not for
    /// production use.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_fill_finished(&self, n: u64, ages: std::ops::Range<i64>) -> Result<()> {
        let step = ((ages.end - ages.start) / i64::try_from(n.max(1)).unwrap_or(i64::MAX)).max(1);
        let rows = (self.dialect().numbered_rows)(n, ages.start, step);
        let now = self.now_ms().await?;
        self.history_partitions_back_to(now - ages.end, now - ages.start)
            .await;
        // Where the engine would have put them: on PostgreSQL the finished runs' table, with
        // their business keys kept in the key table (as the default key policy keeps them),
        // on SQLite the runs table (holding no key there).
        let table = self.run_tables().last().copied().unwrap_or("sagaflow_runs");
        let txn = self.exec.begin().await?;
        txn.execute(self.stmt(
            &format!(
                "INSERT INTO {table} (id, workflow, version, workflow_key, business_key, state, input, \
                 output, dirty, created_at, updated_at, finished_at, failed_attempts) \
                 SELECT id, w, 1, w || '@1', 'order-' || i, \
                   CASE WHEN i % 100 = 0 THEN 'compensated' ELSE 'completed' END, 'null', '{{}}', FALSE, \
                   t, t, t, CASE WHEN i % 50 = 0 THEN 1 + i % 7 ELSE 0 END \
                 FROM (SELECT id, t, i, CASE WHEN i % 10 = 3 THEN 'archive_b' ELSE 'archive' END AS w \
                       FROM ({rows}) AS r) AS x"
            ),
            vec![],
        ))
        .await?;
        if self.backend == Backend::Postgres {
            txn.execute(self.stmt(
                &format!(
                    "INSERT INTO {RUN_KEYS} (workflow, business_key, run_id) \
                     SELECT workflow, business_key, id FROM {RUNS_DONE} \
                     WHERE workflow IN ('archive', 'archive_b') \
                     ON CONFLICT (workflow, business_key) DO NOTHING"
                ),
                vec![],
            ))
            .await?;
        }
        // Their totals, as if counted when they finished (slot 0, as a purge takes them off).
        txn.execute(self.stmt(
            &format!(
                "INSERT INTO sagaflow_run_totals (workflow, state, slot, runs) \
                 SELECT workflow, state, 0, COUNT(*) FROM {table} \
                 WHERE workflow IN ('archive', 'archive_b') GROUP BY workflow, state \
                 ON CONFLICT (workflow, state, slot) \
                 DO UPDATE SET runs = sagaflow_run_totals.runs + excluded.runs"
            ),
            vec![],
        ))
        .await?;
        // Their throughput, as if counted when they finished.
        txn.execute(self.stmt(
            &format!(
                "INSERT INTO sagaflow_throughput (bucket, slot, finished) \
                 SELECT finished_at / 10000, 0, COUNT(*) FROM {table} \
                 WHERE workflow IN ('archive', 'archive_b') GROUP BY finished_at / 10000"
            ),
            vec![],
        ))
        .await?;
        for event in ["submitted", "completed", "state"] {
            txn.execute(self.stmt(
                &format!(
                    "INSERT INTO sagaflow_history (run_id, step, event, actor, at) \
                     SELECT id, 'only', '{event}', 'fill', created_at FROM {table} AS r \
                     WHERE workflow IN ('archive', 'archive_b') AND NOT EXISTS (SELECT 1 \
                     FROM sagaflow_history AS h WHERE h.run_id = r.id AND h.event = '{event}')"
                ),
                vec![],
            ))
            .await?;
        }
        txn.commit().await?;
        Ok(())
    }

    /// Counts history entries per event (`retry`, `timeout`, `completed`, `failed`, …) across
    /// all runs still retained: the figures behind summaries and dashboards.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn history_event_counts(&self) -> Result<Vec<(String, i64)>> {
        // The `state` changes folded into other rows count as the events they read back as.
        let sql = format!(
            "SELECT event, COUNT(*) AS n FROM sagaflow_history WHERE {kept} GROUP BY event \
             UNION ALL SELECT '{state}', SUM({folded}) FROM sagaflow_history \
             WHERE then_states IS NOT NULL AND {kept}",
            kept = "EXISTS (SELECT 1 FROM sagaflow_runs_all AS r WHERE r.id = sagaflow_history.run_id)",
            state = HistoryKind::State.as_ref(),
            folded = self.dialect().folded_count,
        );
        let rows = self.exec.query_all(self.stmt(&sql, vec![])).await?;
        let mut counts = std::collections::BTreeMap::<String, i64>::new();
        for r in &rows {
            // `SUM` over no row is NULL.
            if let Some(n) = r.try_get::<Option<i64>>("", "n")? {
                *counts.entry(r.try_get("", "event")?).or_default() += n;
            }
        }
        Ok(counts.into_iter().collect())
    }
}

/// The runs of `table` retention may delete (`$1`: the retention window in ms): final,
/// finished before the window, and not a child run whose parent may still compensate it. A
/// child's parent step row lives until the parent itself finishes (a completed child run
/// keeps its steps for its own parent), so a child goes only once no step of a parent can
/// reach it. A child reopened for compensation is no longer final and has no `finished_at`.
fn purgeable(table: &str) -> String {
    format!(
        "state IN {FINAL_RUN_STATES} AND finished_at IS NOT NULL \
         AND finished_at < {{now}} - $1 AND (parent_step IS NULL OR NOT EXISTS \
         (SELECT 1 FROM sagaflow_steps AS p WHERE p.id = {table}.parent_step))"
    )
}

/// The tables retention deletes runs from row by row, for a retention of `retention_ms`:
/// the runs table (child runs, which keep their parent's claim after they finish, and runs
/// that finished before the finished runs' table existed) and, on
/// PostgreSQL, the finished runs' default partition (runs kept past their day, moved there
/// when the day was dropped). The finished runs' days go whole
/// ([`Store::history_partitions_maintain`]) once all their runs are due, at most a day after
/// the retention. A retention shorter than a day would keep runs several times as long as
/// asked that way: then the finished runs are deleted row by row too, as on SQLite, and
/// their days drop empty.
fn purge_tables(store: &Store, retention_ms: i64) -> &'static [&'static str] {
    match store.backend {
        Backend::Postgres if retention_ms < HISTORY_PARTITION_SPAN_MS => {
            &["sagaflow_runs", RUNS_DONE]
        }
        Backend::Postgres => &["sagaflow_runs", RUNS_DONE_DEFAULT_PARTITION],
        Backend::Sqlite => &["sagaflow_runs"],
    }
}

impl Store {
    /// How many runs finished more than `older_than_ms` ago (DB clock): what
    /// [`Store::run_purge_finished`] would delete.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_count_finished(&self, older_than_ms: i64) -> Result<u64> {
        let mut total = 0;
        // A finished run of a day's partition goes when its day does.
        for table in self.run_tables() {
            let row = self
                .exec
                .query_one(self.stmt(
                    &format!(
                        "SELECT COUNT(*) AS n FROM {table} WHERE {}",
                        purgeable(table)
                    ),
                    vec![older_than_ms.into()],
                ))
                .await?;
            let n: i64 = match row {
                Some(r) => r.try_get("", "n")?,
                None => 0,
            };
            total += u64::try_from(n).unwrap_or(0);
        }
        Ok(total)
    }

    /// Deletes finished runs (and their history and alerts) that finished more than
    /// `older_than_ms` ago (DB clock): the retention policy. Returns how many runs.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_purge_finished(&self, older_than_ms: i64, limit: u32) -> Result<u64> {
        // Throughput rows past the longest window shown go with the same sweep.
        self.exec
            .execute(self.stmt(
                "DELETE FROM sagaflow_throughput WHERE bucket < ({now} - $1) / 10000",
                vec![super::stats::THROUGHPUT_KEEP_MS.into()],
            ))
            .await?;
        let txn = self.exec.begin().await?;
        // The first table that has runs due (see `purge_tables`).
        let mut due = None;
        for table in purge_tables(self, older_than_ms) {
            let rows = txn
                .query_all(self.stmt(
                    &format!(
                        "SELECT id, workflow, state FROM {table} WHERE {} \
                         ORDER BY finished_at LIMIT $2 {lock}",
                        purgeable(table),
                        lock = self.claim_lock(),
                    ),
                    vec![older_than_ms.into(), i64::from(limit).into()],
                ))
                .await?;
            if !rows.is_empty() {
                due = Some((*table, rows));
                break;
            }
        }
        let Some((runs_table, rows)) = due else {
            return Ok(0);
        };
        self.pause_point(Unit::Purge, Point::AfterReads).await;
        let mut ids: Vec<Uuid> = Vec::with_capacity(rows.len());
        // What the deleted runs took off the totals, per workflow and (stored) state.
        let mut gone: std::collections::BTreeMap<(String, String), i64> =
            std::collections::BTreeMap::new();
        for r in &rows {
            ids.push(r.try_get("", "id")?);
            let key = (r.try_get("", "workflow")?, r.try_get("", "state")?);
            *gone.entry(key).or_default() -= 1;
        }
        // Steps too: a completed child run keeps its steps for its parent's compensation.
        // On PostgreSQL a run's history goes with its day's partition
        // (`Store::history_partitions_maintain`), unless it was moved to the default one.
        let history = if self.backend == Backend::Postgres {
            HISTORY_DEFAULT_PARTITION
        } else {
            "sagaflow_history"
        };
        let mut tables = vec![
            history,
            "sagaflow_alerts",
            "sagaflow_steps",
            "sagaflow_events",
        ];
        // A purged run's business key is free again.
        if self.backend == Backend::Postgres {
            tables.push(RUN_KEYS);
        }
        for table in tables {
            let (cond, values) = self.in_list("run_id", 1, &ids)?;
            let sql = format!("DELETE FROM {table} WHERE {cond}");
            txn.execute(self.stmt(&sql, values)).await?;
        }
        let (cond, values) = self.in_list("id", 1, &ids)?;
        let sql = format!("DELETE FROM {runs_table} WHERE {cond}");
        let n = txn.execute(self.stmt(&sql, values)).await?;
        // The totals are per run state: a stored state that is not one is left out.
        let counted = gone.iter().filter_map(|((w, st), n)| {
            st.parse::<crate::RunState>()
                .ok()
                .map(|st| (w.as_str(), st, *n))
        });
        super::stats::add_totals(self, &txn, 0, counted).await?;
        self.pause_point(Unit::Purge, Point::BeforeCommit).await;
        txn.commit().await?;
        Ok(n)
    }
}

impl Store {
    /// [`Store::run_purge_finished`], `batch` runs a transaction, until none is due: the
    /// retention pass over the runs deleted row by row (the finished runs' days go whole, in
    /// [`Store::history_partitions_maintain`]). Returns how many runs went; the batches
    /// deleted before an error stay deleted.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_purge_due(&self, older_than_ms: i64, batch: u32) -> Result<u64> {
        let batch = batch.max(1);
        let mut total = 0;
        loop {
            // A short batch may be the end of one table of `purge_tables`: go on until none.
            let n = self.run_purge_finished(older_than_ms, batch).await?;
            total += n;
            if n == 0 {
                return Ok(total);
            }
        }
    }
}

/// A run's page, read in one snapshot ([`Store::run_page`]).
#[derive(Debug, Clone)]
pub struct RunDetail {
    /// The run.
    pub run: RunView,
    /// Its steps (none once it finished).
    pub steps: Vec<StepRow>,
    /// Its history, oldest first.
    pub history: Vec<HistoryEvent>,
    /// Its alerts, open and resolved, oldest first.
    pub alerts: Vec<crate::model::Alert>,
}

/// [`Store::run_view`] on `conn`.
async fn run_view_on<C: Exec>(store: &Store, conn: &C, id: Uuid) -> Result<Option<RunView>> {
    let sql = format!("SELECT {RUN_COLS}, {RUN_VIEW_COLS} FROM sagaflow_runs_all WHERE id = $1");
    let row = conn.query_one(store.stmt(&sql, vec![id.into()])).await?;
    row.as_ref().map(RunView::decode).transpose()
}

pub(super) async fn run_steps_on<C: Exec>(
    store: &Store,
    conn: &C,
    id: Uuid,
) -> Result<Vec<StepRow>> {
    // Sorted here rather than by `ORDER BY id`, which could walk the primary key (see
    // `steps_of`).
    let sql = format!("SELECT {STEP_COLS} FROM sagaflow_steps WHERE run_id = $1");
    let rows = conn.query_all(store.stmt(&sql, vec![id.into()])).await?;
    let mut steps = rows
        .iter()
        .map(StepRow::decode)
        .collect::<Result<Vec<_>>>()?;
    steps.sort_unstable_by_key(|s| s.id);
    Ok(steps)
}

impl Store {
    /// Records the progress an attempt reports on its step (JSON), only while that attempt
    /// holds the step (`attempt` is its fencing token); `false` when it no longer does.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn step_set_progress(
        &self,
        step_id: i64,
        attempt: i32,
        progress: &str,
    ) -> Result<bool> {
        let changed = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_steps SET progress = $1 \
                 WHERE id = $2 AND attempt = $3 AND state IN ('running', 'compensating')",
                vec![progress.to_owned().into(), step_id.into(), attempt.into()],
            ))
            .await?;
        Ok(changed == 1)
    }
}

impl StoreTx<'_> {
    /// A run's history, read in this unit of work.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_history(&self, id: Uuid) -> Result<Vec<HistoryEvent>> {
        self.store.history_on(&self.txn, id, 0, i64::MAX).await
    }
}
