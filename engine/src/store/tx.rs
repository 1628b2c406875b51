//! The unit of work: one transaction through which every decided transition is persisted.
//!
//! [`Store::begin`] opens a [`StoreTx`]. Its typed methods lock runs (always in id order, the
//! lock order of every transaction), read steps, and write what the transition module
//! decided: fenced attempt results and rescues, evaluator and operator plans, run states,
//! alerts. History rows are collected and written in one statement at [`StoreTx::commit`],
//! together with the wake-up notification. The store decides nothing: it never calls back
//! into the planner.
//!
//! Writing decided plans is in `plans.rs`. A completion batch is one unit of work: lock its runs, write its results, read the runs'
//! steps, apply their plans, commit. Each step is a typed call on the handle, so a backend
//! could later execute the whole unit in one call on its own thread.

use std::collections::HashMap;

use super::row::Exec;

use super::conn::Txn;
use uuid::Uuid;

use super::alerts::{NewAlert, insert_alert};
use super::rows::{FINAL_RUN_STATES, RUN_COLS, STEP_COLS};
use super::{Backend, Damage, RunRow, StepRow, Store};
use crate::model::{Alert, AlertKind, FoldedStates, HistoryKind};
use crate::{Result, RunState};

/// Rows per batch statement (bounds the size of one array or JSON parameter).
pub(super) const CHUNK: usize = 400;

/// The rows that store `entries`: each entry that only records a state change (event
/// `state`, no attempt, no detail) is folded into the row of the entry before it of the same
/// run and actor, as a [`FoldedStates`] triple; every other entry is a row of its own. All of
/// them are written by one unit of work at one `{now}`, and a run's entries keep their order:
/// a folded change reads back right after the event of its row, before any later row of its
/// run. Entries of other runs between them do not matter: a history is read run by run.
fn fold_history(entries: &[HistoryEntry]) -> Vec<(&HistoryEntry, FoldedStates)> {
    let mut rows: Vec<(&HistoryEntry, FoldedStates)> = Vec::with_capacity(entries.len());
    // The row each run's latest entry went into.
    let mut last: HashMap<Uuid, usize> = HashMap::new();
    for e in entries {
        let bare =
            e.event == HistoryKind::State.as_ref() && e.attempt.is_none() && e.detail.is_none();
        if bare
            && let Some(&row) = last.get(&e.run_id)
            && rows[row].0.actor == e.actor
        {
            rows[row]
                .1
                .0
                .push((e.step.clone(), e.from.clone(), e.to.clone()));
            continue;
        }
        last.insert(e.run_id, rows.len());
        rows.push((e, FoldedStates::default()));
    }
    rows
}

/// One history row to insert.
#[derive(Debug, Clone)]
pub(super) struct HistoryEntry {
    pub(super) run_id: Uuid,
    pub(super) step: Option<String>,
    pub(super) event: String,
    pub(super) from: Option<String>,
    pub(super) to: Option<String>,
    pub(super) attempt: Option<i32>,
    pub(super) actor: String,
    pub(super) detail: Option<String>,
}

/// The steps of many runs, as read by [`StoreTx::steps_lock`]: decoded, or the damage found.
#[derive(Debug, Default)]
pub struct RunSteps {
    steps: HashMap<Uuid, Vec<StepRow>>,
    damaged: HashMap<Uuid, Damage>,
}

impl RunSteps {
    /// The steps of `run` (none when it has no rows), or the damage of one of them.
    ///
    /// # Errors
    /// The [`Damage`] of the first step row of `run` that did not decode.
    pub fn take(&mut self, run: Uuid) -> std::result::Result<Vec<StepRow>, Damage> {
        match self.damaged.remove(&run) {
            Some(d) => Err(d),
            None => Ok(self.steps.remove(&run).unwrap_or_default()),
        }
    }
}

/// An open unit of work (see the module documentation). Dropping it without
/// [`StoreTx::commit`] rolls everything back.
#[derive(Debug)]
pub struct StoreTx<'s> {
    pub(super) store: &'s Store,
    pub(super) txn: Txn,
    pub(super) history: Vec<HistoryEntry>,
    pub(super) notify: bool,
    /// What this unit of work did, returned by its commit for the metrics.
    pub happened: super::Happened,
}

impl Store {
    /// Opens a unit of work.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn begin(&self) -> Result<StoreTx<'_>> {
        Ok(StoreTx {
            store: self,
            txn: self.exec.begin().await?,
            history: Vec::new(),
            notify: false,
            happened: super::Happened::default(),
        })
    }

    pub(super) async fn history_insert_many<C: Exec>(
        &self,
        conn: &C,
        entries: &[HistoryEntry],
    ) -> Result<()> {
        self.history_insert_notifying(conn, entries, None).await
    }

    /// Inserts history rows, one statement per [`CHUNK`], and with `notify` (PostgreSQL), sends
    /// the wake-up notification with that payload in the statement of the last chunk: one
    /// round trip for both.
    async fn history_insert_notifying<C: Exec>(
        &self,
        conn: &C,
        entries: &[HistoryEntry],
        notify: Option<&str>,
    ) -> Result<()> {
        const COLS: [(&str, &str); 9] = [
            ("run_id", "uuid"),
            ("step", "text"),
            ("event", "text"),
            ("from_state", "text"),
            ("to_state", "text"),
            ("attempt", "integer"),
            ("actor", "text"),
            ("detail", "text"),
            ("then_states", "text"),
        ];
        let notify = notify.filter(|_| self.backend == Backend::Postgres);
        let folded = fold_history(entries);
        let chunks = folded.len().div_ceil(CHUNK);
        for (i, chunk) in folded.chunks(CHUNK).enumerate() {
            let rows = chunk
                .iter()
                .map(|(e, then)| {
                    vec![
                        e.run_id.into(),
                        e.step.clone().into(),
                        e.event.clone().into(),
                        e.from.clone().into(),
                        e.to.clone().into(),
                        e.attempt.into(),
                        e.actor.clone().into(),
                        e.detail.clone().into(),
                        then.to_column().into(),
                    ]
                })
                .collect();
            let (source, mut values) = self.rows_source(1, &COLS, rows)?;
            let insert = format!(
                "INSERT INTO sagaflow_history (run_id, step, event, from_state, to_state, attempt, actor, detail, then_states, at) \
                 SELECT v.run_id, v.step, v.event, v.from_state, v.to_state, v.attempt, v.actor, v.detail, v.then_states, {{now}} \
                 FROM {source}"
            );
            match notify {
                Some(payload) if i + 1 == chunks => {
                    values.push(payload.to_owned().into());
                    let sql = format!(
                        "WITH h AS ({insert}) SELECT pg_notify('{}', $2)",
                        super::postgres::READY_CHANNEL
                    );
                    conn.execute(self.stmt(&sql, values)).await?;
                }
                _ => {
                    conn.execute(self.stmt(&insert, values)).await?;
                }
            }
        }
        if let Some(payload) = notify
            && entries.is_empty()
        {
            conn.execute(self.stmt(
                &format!("SELECT pg_notify('{}', $1)", super::postgres::READY_CHANNEL),
                vec![payload.to_owned().into()],
            ))
            .await?;
        }
        Ok(())
    }
}

impl StoreTx<'_> {
    /// Locks runs (sorted by id: the lock order every transaction follows) and returns them.
    /// With `only_dirty`, only runs marked for evaluation are taken, and unmarked: this
    /// transaction evaluates them.
    ///
    /// PostgreSQL takes the row locks with `SELECT … ORDER BY id FOR UPDATE`, which locks in
    /// id order and writes no new row version; only runs that were marked get an `UPDATE`.
    /// SQLite's first write takes the database's write lock, so there the lock is the
    /// unmarking `UPDATE` itself.
    ///
    /// # Errors
    /// [`crate::Error::Db`], [`crate::Error::CorruptRow`].
    pub async fn runs_lock(
        &mut self,
        ids: &[Uuid],
        only_dirty: bool,
    ) -> Result<Vec<std::result::Result<RunRow, Damage>>> {
        let s = self.store;
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let only = if only_dirty { " AND dirty" } else { "" };
        let mut out = Vec::with_capacity(ids.len());
        let mut marked = Vec::new();
        for chunk in ids.chunks(CHUNK) {
            let (cond, values) = s.in_list("id", 1, chunk)?;
            let sql = (s.dialect().lock_runs)(&cond, only);
            for r in &self.txn.query_all(s.stmt(&sql, values)).await? {
                // A run row that does not decode costs that run, not the batch.
                let id: Uuid = r.try_get("", "id")?;
                if r.try_get::<bool>("", "dirty")? {
                    marked.push(id);
                }
                out.push(RunRow::decode(r).map_err(|e| Damage::of(id, e)));
            }
        }
        for chunk in marked.chunks(CHUNK) {
            let (cond, values) = s.in_list("id", 1, chunk)?;
            let sql = format!("UPDATE sagaflow_runs SET dirty = FALSE WHERE {cond}");
            self.txn.execute(s.stmt(&sql, values)).await?;
        }
        Ok(out)
    }

    /// Locks one run for an operator action and marks it for evaluation (the action's
    /// writes are followed by an evaluation in the evaluation loop of some engine). Returns
    /// the run, and the run it was restarted as, if an operator restarted it.
    ///
    /// # Errors
    /// [`crate::Error::Db`], [`crate::Error::CorruptRow`].
    pub async fn run_lock_for_action(
        &mut self,
        id: Uuid,
    ) -> Result<Option<(RunRow, Option<Uuid>)>> {
        // The first statement is a write: it takes the run's row lock on PostgreSQL and the
        // write lock on SQLite, so evaluations of one run are serialised.
        let sql = format!(
            "UPDATE sagaflow_runs SET dirty = TRUE, updated_at = {{now}} WHERE id = $1 \
             RETURNING {RUN_COLS}, restarted_as"
        );
        let row = self
            .txn
            .query_one(self.store.stmt(&sql, vec![id.into()]))
            .await?;
        // The action marks the run for evaluation: wake every engine, not just this one.
        self.notify = true;
        let row = match row {
            Some(row) => row,
            None => match self.run_finished_locked(id, ", restarted_as").await? {
                Some(row) => row,
                None => return Ok(None),
            },
        };
        let restarted_as: Option<Uuid> = row.try_get("", "restarted_as")?;
        Ok(Some((RunRow::decode(&row)?, restarted_as)))
    }

    /// Run `id` in the table of finished runs (PostgreSQL), locked: where a unit of work
    /// looks for a run it did not find in the runs table, because the run had finished, or
    /// because its end moved it there while the unit waited for its lock (the new statement
    /// sees that commit). `None` on SQLite, which keeps every run in one table. The row
    /// lock serialises a restart's link with another restart or action on the same run.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub(super) async fn run_finished_locked(
        &self,
        id: Uuid,
        extra: &str,
    ) -> Result<Option<super::row::Row>> {
        let s = self.store;
        if s.backend() != crate::Backend::Postgres {
            return Ok(None);
        }
        let sql = format!(
            "SELECT {RUN_COLS}{extra} FROM {RUNS_DONE} WHERE id = $1 FOR UPDATE",
            RUNS_DONE = sagaflow_migrations::partitions::RUNS_DONE
        );
        Ok(self.txn.query_one(s.stmt(&sql, vec![id.into()])).await?)
    }

    /// Stops at `point` of `unit` when a test's hook holds it (see [`crate::interleave`]).
    pub async fn pause_point(
        &self,
        unit: crate::interleave::Unit,
        point: crate::interleave::Point,
    ) {
        self.store.pause_point(unit, point).await;
    }

    /// The steps of many runs, grouped by run, each run's sorted by id. A step row that does
    /// not decode marks its run damaged instead of failing the read.
    ///
    /// The rows are locked until the unit of work ends (`FOR UPDATE` on PostgreSQL; SQLite's
    /// unit of work holds the file's write lock): what is decided from them cannot be undone
    /// by a writer that takes no run lock. A claim skips them (`SKIP LOCKED`), a timer wake
    /// waits and then finds the state it expects gone or kept. On PostgreSQL the step of a
    /// parent that each unfinished child run among `ids` would wake at its end is locked in
    /// the same statement (not returned), every lock in id order: a unit takes no step lock
    /// after this one but on rows it deletes.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn steps_lock(&self, ids: &[Uuid]) -> Result<RunSteps> {
        read_steps(self.store, &self.txn, ids, self.store.dialect().row_lock).await
    }

    /// Locks what [`StoreTx::steps_lock`] locks, reading nothing: for a unit of work that
    /// writes some of its runs' steps before it reads them all (a completion batch writes
    /// its attempts' ends first), so that its every step lock is still taken in one
    /// statement, in id order. Nothing on SQLite, whose unit of work holds the write lock.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn steps_lock_ahead(&self, ids: &[Uuid]) -> Result<()> {
        let s = self.store;
        let lock = s.dialect().row_lock;
        if lock.is_empty() {
            return Ok(());
        }
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        for chunk in ids.chunks(CHUNK) {
            let (cond, values) = s.in_list("run_id", 1, chunk)?;
            let sql = locked_steps_sql(s, "id", &cond, chunk, lock)?;
            self.txn.query_all(s.stmt(&sql, values)).await?;
        }
        Ok(())
    }

    /// Sets runs aside for damaged rows, as the run table's
    /// [`RunTrigger::DamagedRow`](crate::transition::RunTrigger::DamagedRow) rule says: the run
    /// goes to `Error` with an error envelope naming the damage (code `corrupt_row`, the
    /// phase it was in), stops being evaluated, and raises one `corrupt_row` alert. Nothing
    /// is compensated. Returns the alerts raised (an open one for the run is not repeated).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn run_set_aside(
        &mut self,
        runs: &[(Option<RunState>, Damage)],
        actor: &str,
    ) -> Result<Vec<Alert>> {
        let s = self.store;
        let rule = crate::transition::set_aside_rule();
        let mut alerts = Vec::new();
        for (phase, d) in runs {
            let envelope = serde_json::json!({
                "code": crate::transition::operator::CORRUPT_ROW,
                "message": d.to_string(),
                "table": d.table,
                "row": d.row,
                "phase": phase.map(RunState::as_str),
            })
            .to_string();
            let sql = "UPDATE sagaflow_runs SET state = $2, error = $3, dirty = FALSE, \
                       updated_at = {now} WHERE id = $1";
            self.txn
                .execute(s.stmt(
                    sql,
                    vec![d.run_id.into(), rule.to.as_str().into(), envelope.into()],
                ))
                .await?;
            self.history.push(HistoryEntry {
                run_id: d.run_id,
                step: None,
                event: "set_aside".into(),
                from: phase.map(|p| p.as_str().to_owned()),
                to: Some(rule.to.as_str().to_owned()),
                attempt: None,
                actor: actor.to_owned(),
                detail: Some(d.to_string()),
            });
            tracing::warn!(run_id = %d.run_id, table = d.table, row = %d.row, reason = %d.reason, "run set aside for a damaged row");
            let alert = NewAlert {
                run_id: Some(d.run_id),
                step: None,
                kind: rule.alert.map_or(AlertKind::CorruptRow, AlertKind::named),
                reason: format!(
                    "run set aside: {d}; it is not compensated, and waits for an operator"
                ),
                attempts: 0,
                actions: vec![
                    "repair the row, then release the run (Operator::release)".into(),
                    "resolve_alert".into(),
                ],
                open_key: Some(format!("corrupt_row:{}", d.run_id)),
            };
            alerts.extend(insert_alert(s, &self.txn, &alert).await?);
        }
        Ok(alerts)
    }

    /// Marks runs for another evaluation, locking those not locked yet in id order.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn runs_mark_dirty(&mut self, ids: &[Uuid]) -> Result<()> {
        mark_dirty(self.store, &self.txn, ids).await
    }

    /// Asks for the wake-up notification at commit (PostgreSQL `NOTIFY`).
    pub fn notify(&mut self) {
        self.notify = true;
    }

    /// Writes the history collected so far, notifies (if asked) and commits; returns what
    /// the unit of work did, for the metrics. The notification carries no payload: every
    /// listening engine wakes both its loops.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn commit(self) -> Result<super::Happened> {
        self.commit_notifying(None).await
    }

    /// [`StoreTx::commit`] for an engine's own unit of work: the notification, if one is
    /// asked for, names `wake`'s loops and `sender` (the engine's instance id), so that the
    /// sender, which wakes its own loops in process, ignores it, and other engines wake only
    /// the loops concerned ([`super::Wake`]).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn commit_from(self, wake: super::Wake, sender: &str) -> Result<super::Happened> {
        let payload = wake.payload(sender);
        self.commit_notifying(Some(&payload)).await
    }

    async fn commit_notifying(self, payload: Option<&str>) -> Result<super::Happened> {
        let notify = self.notify.then_some(payload.unwrap_or(""));
        self.store
            .history_insert_notifying(&self.txn, &self.history, notify)
            .await?;
        self.txn.commit().await?;
        Ok(self.happened)
    }
}

/// Marks runs for another evaluation.
pub(super) async fn mark_dirty<C: Exec>(store: &Store, conn: &C, ids: &[Uuid]) -> Result<()> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    for chunk in ids.chunks(CHUNK) {
        let (cond, values) = store.in_list("id", 1, chunk)?;
        // Locked in id order, as every unit of work locks runs: an update alone takes its
        // rows in the order its scan finds them (a bitmap scan's is the table's), and a
        // rescue marking runs that a completion batch holds could wait for one while
        // holding another the batch waits for.
        let sql = format!(
            "UPDATE sagaflow_runs SET dirty = TRUE, updated_at = {{now}} WHERE id IN \
             (SELECT id FROM sagaflow_runs WHERE {cond} ORDER BY id{})",
            store.dialect().row_lock
        );
        conn.execute(store.stmt(&sql, values)).await?;
    }
    Ok(())
}

/// The statement that locks the steps of the runs `chunk` (`cond` selects them) with
/// `lock`, and the parent's step of each unfinished child run among them, whose end wakes
/// that step ([`StoreTx::wake_parents`]), returning `cols`: every step lock of the unit in
/// one statement, in id order (`id + 0`: sorted after the lookup by run, not read in
/// primary-key order), so that two units that each hold a parent and the other's child take
/// them in the same order, and neither waits for a step while holding one the other needs
/// after it. `= ANY(ARRAY(…))`: the parents' steps are looked up first, and both lookups are
/// index scans (`OR id IN (…)` read the whole table). The runs' list takes the same
/// placeholders as `cond`.
fn locked_steps_sql(
    s: &Store,
    cols: &str,
    cond: &str,
    chunk: &[Uuid],
    lock: &str,
) -> Result<String> {
    let (runs, _) = s.in_list("r.id", 1, chunk)?;
    Ok(format!(
        "SELECT {cols} FROM sagaflow_steps WHERE {cond} OR id = ANY(ARRAY( \
         SELECT r.parent_step FROM sagaflow_runs AS r WHERE {runs} \
         AND r.parent_step IS NOT NULL AND r.state NOT IN {FINAL_RUN_STATES})) \
         ORDER BY id + 0{lock}"
    ))
}

/// The steps of many runs read on `conn`, grouped by run, each run's sorted by id; `lock` is
/// appended to each statement (` FOR UPDATE`, or nothing). A step row that does not decode
/// marks its run damaged instead of failing the read.
pub(super) async fn read_steps<C: Exec>(
    s: &Store,
    conn: &C,
    ids: &[Uuid],
    lock: &str,
) -> Result<RunSteps> {
    let mut out: HashMap<Uuid, Vec<StepRow>> = HashMap::with_capacity(ids.len());
    let mut damaged: HashMap<Uuid, Damage> = HashMap::new();
    for chunk in ids.chunks(CHUNK) {
        let (cond, values) = s.in_list("run_id", 1, chunk)?;
        let sql = if lock.is_empty() {
            // No `ORDER BY id` here: it would invite a walk of the whole primary key in id
            // order instead of a lookup by run. Each run's steps are sorted below.
            format!("SELECT {STEP_COLS} FROM sagaflow_steps WHERE {cond}")
        } else {
            locked_steps_sql(s, STEP_COLS, &cond, chunk, lock)?
        };
        let rows = conn.query_all(s.stmt(&sql, values)).await?;
        let members: Option<std::collections::HashSet<&Uuid>> =
            (!lock.is_empty()).then(|| chunk.iter().collect());
        for r in &rows {
            let run: Uuid = r.try_get("", "run_id")?;
            if members.as_ref().is_some_and(|m| !m.contains(&run)) {
                continue; // a parent's step, locked and not read
            }
            match StepRow::decode(r) {
                Ok(step) => out.entry(step.run_id).or_default().push(step),
                Err(e) => {
                    damaged.entry(run).or_insert_with(|| Damage::of(run, e));
                }
            }
        }
    }
    for steps in out.values_mut() {
        steps.sort_unstable_by_key(|s| s.id);
    }
    Ok(RunSteps {
        steps: out,
        damaged,
    })
}
