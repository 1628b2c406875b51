//! Submission: inserting runs and their steps, many per statement, with duplicate business
//! keys resolved to the run that holds them.

use sagaflow_migrations::partitions::RUN_KEYS;
use sea_orm::Value;

use super::row::Exec;
use uuid::Uuid;

use super::rows::{RUN_COLS, RUN_VIEW_COLS};
use super::tx::HistoryEntry;
use super::{RunView, Store};
use crate::trace::TraceContext;
pub use crate::transition::writes::{NewRun, NewStep, RunStart};
use crate::{Error, Result, RunState, StepState};

/// Rows per multi-row insert of runs or steps.
const CHUNK_RUNS: usize = 400;

/// Columns of a run to insert, as sent in a JSON row batch (name, PostgreSQL type).
const RUN_COLS_IN: [(&str, &str); 14] = [
    ("id", "uuid"),
    ("state", "text"),
    ("workflow", "text"),
    ("version", "integer"),
    ("workflow_key", "text"),
    ("business_key", "text"),
    ("input", "text"),
    ("priority", "integer"),
    ("start_ms", "bigint"),
    ("delay_ms", "bigint"),
    ("notify", "boolean"),
    ("trace_parent", "text"),
    ("trace_state", "text"),
    ("flow_key", "text"),
];

/// Columns of a step to insert, as sent in a JSON row batch (name, PostgreSQL type).
const STEP_COLS_IN: [(&str, &str); 16] = [
    ("run_id", "uuid"),
    ("workflow_key", "text"),
    ("name", "text"),
    ("state", "text"),
    ("max_failures", "integer"),
    ("max_interruptions", "integer"),
    ("deadline_ms", "bigint"),
    ("deadline_cap_ms", "bigint"),
    ("idempotency_key", "text"),
    ("ready", "boolean"),
    ("priority", "integer"),
    ("retry_priority", "integer"),
    ("start_ms", "bigint"),
    ("delay_ms", "bigint"),
    ("resource", "text"),
    ("flow_key", "text"),
];

/// The start a run asked for, on the database clock, from the row source `v`: `{now}` plus
/// the delay, or the instant given; `NULL` for a run started at once.
const START: &str = "COALESCE({now} + v.delay_ms, v.start_ms)";

/// `INSERT … SELECT` of runs from the row source `v` (columns of [`RUN_COLS_IN`]), in the
/// state each was decided to start in ([`NewRun::initial_state`]). A run whose business key
/// is already active is skipped by the unique index; the ids inserted are returned. (`WHERE TRUE`: SQLite needs it to read `ON CONFLICT` as the
/// upsert clause after a `SELECT`.)
fn insert_runs_sql(source: &str) -> String {
    insert_runs_where(source, "TRUE ON CONFLICT (workflow, active_key) DO NOTHING")
}

/// PostgreSQL: `INSERT … SELECT` of the runs from the row source `v` that have no business
/// key or whose key the statement's insert into the key table, `k`, took. The key table
/// arbitrates (a finished run keeps its key there after its row left the runs table), so
/// there is no conflict clause: a conflict on the runs table's own unique index would be a
/// key held there and not in the key table, an error rather than a run silently dropped.
fn insert_runs_keyed_sql(source: &str) -> String {
    insert_runs_where(
        source,
        "v.business_key IS NULL OR v.id IN (SELECT run_id FROM k)",
    )
}

/// The insert of runs from the row source `v`, with `tail` after `WHERE`.
fn insert_runs_where(source: &str, tail: &str) -> String {
    format!(
        "INSERT INTO sagaflow_runs (id, workflow, version, workflow_key, business_key, active_key, state, \
           input, dirty, created_at, updated_at, priority, start_at, notify, trace_parent, trace_state, flow_key) \
         SELECT v.id, v.workflow, v.version, v.workflow_key, v.business_key, v.business_key, v.state, \
           v.input, FALSE, {{now}}, {{now}}, v.priority, {START}, v.notify, v.trace_parent, v.trace_state, v.flow_key \
         FROM {source} WHERE {tail} RETURNING id, start_at, state"
    )
}

/// PostgreSQL: the insert of the keys of the runs from the row source `v` that have one,
/// each unless it is held; it returns the runs whose key it took.
fn insert_keys_sql(source: &str) -> String {
    format!(
        "INSERT INTO {RUN_KEYS} (workflow, business_key, run_id) \
         SELECT v.workflow, v.business_key, v.id FROM {source} WHERE v.business_key IS NOT NULL \
         ON CONFLICT (workflow, business_key) DO NOTHING RETURNING run_id"
    )
}

/// When a root step from the row source `v` is due: at the run's start, or at once when it
/// has none or it has passed; `NULL` (not queued) for the other steps.
const DUE: &str =
    "CASE WHEN v.ready THEN CASE WHEN {START} > {now} THEN {START} ELSE {now} END END";

/// `INSERT … SELECT` of steps from the row source `v` (columns of [`STEP_COLS_IN`]), the rows
/// chosen by `filter`. Root steps are due at the run's start, or at once when it has none or
/// it has passed, and wait toward aging from then; every step takes the run's priority, and
/// the priority its retries are queued at.
fn insert_steps_sql(source: &str, filter: &str) -> String {
    let due = DUE.replace("{START}", START);
    format!(
        "INSERT INTO sagaflow_steps (run_id, workflow_key, name, state, max_failures, max_interruptions, \
           deadline_ms, initial_deadline_ms, deadline_cap_ms, idempotency_key, available_at, aging_from, \
           updated_at, priority, retry_priority, resource, flow_key) \
         SELECT v.run_id, v.workflow_key, v.name, v.state, v.max_failures, v.max_interruptions, \
           v.deadline_ms, v.deadline_ms, v.deadline_cap_ms, v.idempotency_key, {due}, {due}, {{now}}, \
           v.priority, v.retry_priority, v.resource, v.flow_key \
         FROM {source} WHERE {filter}"
    )
}

/// The row of a run to insert (columns of [`RUN_COLS_IN`]).
fn run_row(r: &NewRun) -> Vec<Value> {
    vec![
        r.id.into(),
        r.initial_state().as_str().into(),
        r.workflow.clone().into(),
        r.version.into(),
        crate::workflow_key(&r.workflow, r.version).into(),
        r.business_key.clone().into(),
        r.input.clone().into(),
        r.priority.into(),
        r.start.at_ms().into(),
        r.start.delay_ms().into(),
        r.notify.into(),
        r.trace.as_ref().map(TraceContext::traceparent).into(),
        r.trace
            .as_ref()
            .and_then(|t| t.trace_state().map(str::to_owned))
            .into(),
        r.flow_key.clone().into(),
    ]
}

/// The row of a step to insert (columns of [`STEP_COLS_IN`]), due from `start` if it is a
/// root step.
fn step_row(run: &NewRun, s: &NewStep, start: RunStart) -> Vec<Value> {
    let state = if s.ready {
        StepState::Ready
    } else {
        StepState::NotStarted
    };
    vec![
        run.id.into(),
        crate::workflow_key(&run.workflow, run.version).into(),
        s.name.clone().into(),
        state.as_str().into(),
        s.max_failures.into(),
        s.max_interruptions.into(),
        s.deadline_ms.into(),
        s.deadline_cap_ms.into(),
        s.idempotency_key.clone().into(),
        s.ready.into(),
        run.priority.into(),
        run.retry_priority.into(),
        start.at_ms().into(),
        start.delay_ms().into(),
        s.resource.clone().into(),
        run.flow_key.clone().into(),
    ]
}

impl RunStart {
    fn at_ms(self) -> Option<i64> {
        match self {
            Self::At(ms) => Some(ms),
            Self::Now | Self::After(_) => None,
        }
    }

    fn delay_ms(self) -> Option<i64> {
        match self {
            Self::After(ms) => Some(ms),
            Self::Now | Self::At(_) => None,
        }
    }
}

/// What inserting a run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunInsertOutcome {
    /// The run was inserted.
    Inserted(Uuid),
    /// A retained run holds the business key; nothing was written.
    Duplicate {
        /// The run holding the key.
        existing: Uuid,
        /// Its state when looked up.
        state: RunState,
    },
}

/// Inserts retried when the run holding a conflicting key vanished (finished and freed its
/// key, or was purged) between the conflict and the look-up.
const KEY_RACE_RETRIES: usize = 3;

impl Store {
    /// Inserts a run and its steps on `conn`: the engine's pool, or the caller's transaction
    /// so that a business row and its saga commit together (SAS-7). The run starts in
    /// [`NewRun::initial_state`]; its root steps start `Ready` (queued at once), the others
    /// `NotStarted`.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_insert<C: Exec>(&self, conn: &C, run: &NewRun) -> Result<RunInsertOutcome> {
        let mut out = self
            .run_insert_many(conn, std::slice::from_ref(run))
            .await?;
        out.pop()
            .ok_or_else(|| Error::corrupt("sagaflow_runs", run.id, "insert returned nothing"))
    }

    /// Inserts many runs in one transaction of the engine's own (group commit: one commit
    /// for the whole batch). Returns one outcome per run, in order.
    ///
    /// # Errors
    /// [`Error::Db`]; nothing of the batch is written then.
    pub async fn run_insert_batch(&self, runs: &[NewRun]) -> Result<Vec<RunInsertOutcome>> {
        if self.backend == super::Backend::Postgres && runs.iter().all(|r| r.business_key.is_none())
        {
            // One statement writes the whole batch there: atomic without a transaction
            // block, and two round trips (BEGIN, COMMIT) shorter. Only runs without a
            // business key go this way: a duplicate key is resolved by a second statement,
            // which must share the insert's fate (a batch is reported failed only if nothing
            // of it was written).
            return self.run_insert_many(&self.exec, runs).await;
        }
        let txn = self.exec.begin().await?;
        let out = self.run_insert_many(&txn, runs).await?;
        txn.commit().await?;
        Ok(out)
    }

    /// Inserts many runs on `conn` (one transaction when `conn` is one: group commit).
    /// Returns one outcome per run, in order; duplicates of active business keys are not
    /// inserted.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn run_insert_many<C: Exec>(
        &self,
        conn: &C,
        runs: &[NewRun],
    ) -> Result<Vec<RunInsertOutcome>> {
        // Concurrent batches with business keys insert them in one global order (by key), as
        // transactions lock rows in id order: two batches holding `a, b` and `b, a` could
        // otherwise wait for each other at the unique index, a deadlock on PostgreSQL.
        if runs.len() > 1 && runs.iter().any(|r| r.business_key.is_some()) {
            let mut order: Vec<usize> = (0..runs.len()).collect();
            order.sort_by(|&a, &b| {
                (&runs[a].workflow, &runs[a].business_key)
                    .cmp(&(&runs[b].workflow, &runs[b].business_key))
            });
            if order.windows(2).any(|w| w[0] > w[1]) {
                let sorted: Vec<NewRun> = order.iter().map(|&i| runs[i].clone()).collect();
                let outcomes = self.run_insert_sorted(conn, &sorted).await?;
                let mut out = vec![None; runs.len()];
                for (i, o) in order.into_iter().zip(outcomes) {
                    out[i] = Some(o);
                }
                return Ok(out.into_iter().flatten().collect());
            }
        }
        self.run_insert_sorted(conn, runs).await
    }

    /// [`Store::run_insert_many`] for runs already in key order.
    async fn run_insert_sorted<C: Exec>(
        &self,
        conn: &C,
        runs: &[NewRun],
    ) -> Result<Vec<RunInsertOutcome>> {
        let mut out = self.run_insert_once(conn, runs).await?;
        for _ in 0..KEY_RACE_RETRIES {
            let lost: Vec<usize> = (0..runs.len()).filter(|&i| out[i].is_none()).collect();
            if lost.is_empty() {
                break;
            }
            let again: Vec<NewRun> = lost.iter().map(|&i| runs[i].clone()).collect();
            for (i, o) in lost
                .into_iter()
                .zip(self.run_insert_once(conn, &again).await?)
            {
                out[i] = o;
            }
        }
        out.into_iter()
            .zip(runs)
            .map(|(o, r)| {
                o.ok_or_else(|| {
                    Error::corrupt(
                        "sagaflow_runs",
                        r.id,
                        "the business key conflicted but no run holds it (after retries)",
                    )
                })
            })
            .collect()
    }

    /// One insert pass; `None` for a run whose key conflicted with a run that was gone by
    /// the time it was looked up (the caller retries it).
    async fn run_insert_once<C: Exec>(
        &self,
        conn: &C,
        runs: &[NewRun],
    ) -> Result<Vec<Option<RunInsertOutcome>>> {
        if self.backend == super::Backend::Postgres {
            return self.run_insert_many_pg(conn, runs).await;
        }
        // Runs first, many per statement; a run whose business key is already active is
        // skipped by the unique index and reported as a duplicate of that run.
        // Each inserted run's start as the database resolved it: its steps are due from that
        // instant (`{now}` moves between statements here, unlike within PostgreSQL's one).
        let mut fresh = std::collections::HashMap::with_capacity(runs.len());
        for chunk in runs.chunks(CHUNK_RUNS) {
            let rows = chunk.iter().map(run_row).collect();
            let (source, values) = self.rows_source(1, &RUN_COLS_IN, rows)?;
            let sql = insert_runs_sql(&source);
            for r in conn.query_all(self.stmt(&sql, values)).await? {
                let start = r
                    .try_get::<Option<i64>>("", "start_at")?
                    .map_or(RunStart::Now, RunStart::At);
                fresh.insert(r.try_get::<Uuid>("", "id")?, start);
            }
        }
        let (outcomes, inserted) = self.resolve_duplicates(conn, runs, &fresh).await?;
        let steps: Vec<(&NewRun, &NewStep)> = inserted
            .iter()
            .flat_map(|r| r.steps.iter().map(move |s| (*r, s)))
            .collect();
        for chunk in steps.chunks(CHUNK_RUNS) {
            let rows = chunk
                .iter()
                .map(|(run, s)| step_row(run, s, fresh.get(&run.id).copied().unwrap_or_default()))
                .collect();
            let (source, values) = self.rows_source(1, &STEP_COLS_IN, rows)?;
            let sql = insert_steps_sql(&source, "TRUE");
            conn.execute(self.stmt(&sql, values)).await?;
        }
        let history: Vec<HistoryEntry> = inserted
            .iter()
            .map(|r| HistoryEntry {
                run_id: r.id,
                step: None,
                event: "submitted".into(),
                from: None,
                to: Some(r.initial_state().as_str().into()),
                attempt: None,
                actor: "api".into(),
                detail: None,
            })
            .collect();
        self.history_insert_many(conn, &history).await?;
        if !inserted.is_empty() {
            self.notify_ready(conn).await?;
        }
        Ok(outcomes)
    }

    /// Outcomes of a multi-row insert: runs in `fresh` were inserted; for each other run,
    /// the active run holding its business key.
    async fn resolve_duplicates<'r, C: Exec>(
        &self,
        conn: &C,
        runs: &'r [NewRun],
        fresh: &std::collections::HashMap<Uuid, RunStart>,
    ) -> Result<(Vec<Option<RunInsertOutcome>>, Vec<&'r NewRun>)> {
        let mut outcomes = Vec::with_capacity(runs.len());
        let mut inserted: Vec<&NewRun> = Vec::with_capacity(runs.len());
        for run in runs {
            if fresh.contains_key(&run.id) {
                outcomes.push(Some(RunInsertOutcome::Inserted(run.id)));
                inserted.push(run);
                continue;
            }
            // The holder of the key: the key table's on PostgreSQL (the run may have
            // finished and left the runs table), the runs table's unique index on SQLite.
            let sql = if self.backend == super::Backend::Postgres {
                "SELECT r.id, r.state FROM sagaflow_run_keys AS k \
                 JOIN sagaflow_runs_all AS r ON r.id = k.run_id \
                 WHERE k.workflow = $1 AND k.business_key = $2"
            } else {
                "SELECT id, state FROM sagaflow_runs WHERE workflow = $1 AND active_key = $2"
            };
            let holder = conn
                .query_one(self.stmt(
                    sql,
                    vec![run.workflow.clone().into(), run.business_key.clone().into()],
                ))
                .await?;
            let outcome = match holder {
                Some(r) => {
                    let existing: Uuid = r.try_get("", "id")?;
                    let state: String = r.try_get("", "state")?;
                    Some(RunInsertOutcome::Duplicate {
                        existing,
                        state: super::rows::state_of("sagaflow_runs", existing, &state)?,
                    })
                }
                None => None,
            };
            outcomes.push(outcome);
        }
        Ok((outcomes, inserted))
    }

    /// PostgreSQL: the whole batch in one statement — runs, their steps, their `submitted`
    /// history and the wake-up notification — so a submission costs one round trip and is
    /// atomic without a transaction of its own. Duplicates (rare) are resolved afterwards.
    async fn run_insert_many_pg<C: Exec>(
        &self,
        conn: &C,
        runs: &[NewRun],
    ) -> Result<Vec<Option<RunInsertOutcome>>> {
        let run_rows = runs.iter().map(run_row).collect();
        let step_rows = runs
            .iter()
            .flat_map(|r| r.steps.iter().map(move |s| (r, s)))
            .map(|(run, s)| step_row(run, s, run.start))
            .collect();
        let (run_src, mut values) = self.rows_source(1, &RUN_COLS_IN, run_rows)?;
        let (step_src, step_values) = self.rows_source(2, &STEP_COLS_IN, step_rows)?;
        values.extend(step_values);
        let keyed = runs.iter().any(|r| r.business_key.is_some());
        let sql = super::postgres::intake(
            keyed.then(|| insert_keys_sql(&run_src)).as_deref(),
            &if keyed {
                insert_runs_keyed_sql(&run_src)
            } else {
                insert_runs_sql(&run_src)
            },
            &insert_steps_sql(&step_src, "v.run_id IN (SELECT id FROM r)"),
            &super::Wake::CLAIM.payload(""),
        );
        // One statement, one `{now}`: the steps resolve the run's start exactly as the run did.
        let mut fresh = std::collections::HashMap::with_capacity(runs.len());
        for r in conn.query_all(self.stmt(&sql, values)).await? {
            fresh.insert(r.try_get::<Uuid>("", "id")?, RunStart::Now);
        }
        Ok(self.resolve_duplicates(conn, runs, &fresh).await?.0)
    }

    /// The newest retained run of `workflow` started with `business_key`, active or
    /// finished.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_by_key(&self, workflow: &str, business_key: &str) -> Result<Option<RunView>> {
        let sql = format!(
            "SELECT {RUN_COLS}, {RUN_VIEW_COLS} FROM sagaflow_runs_all WHERE workflow = $1 AND business_key = $2 \
             ORDER BY created_at DESC LIMIT 1"
        );
        let row = self
            .exec
            .query_one(self.stmt(
                &sql,
                vec![workflow.to_owned().into(), business_key.to_owned().into()],
            ))
            .await?;
        row.as_ref().map(RunView::decode).transpose()
    }
}
