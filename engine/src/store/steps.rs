//! Steps: the batch claim, the inputs of claimed steps, and the listing and rescue of
//! expired or orphaned steps. The fenced attempt-end writes a rescue uses are in
//! `attempts.rs`.

use std::collections::HashMap;

use sea_orm::Value;

use super::row::Exec;
use uuid::Uuid;

use super::leases::LeaderFence;
use super::rows::{ClaimedStep, ExpiredStep};
use super::tx::{CHUNK, StoreTx, mark_dirty};
use super::{Backend, Row, Store, placeholders, postgres};
use crate::trace::TraceContext;
use crate::transition::{Trigger, step_rule};
use crate::{Result, StepState};

/// The state an attempt that met damaged data gives its step back in, from the table.
fn set_aside(from: StepState) -> StepState {
    step_rule(from, Trigger::SetAside).map_or(from, |r| r.to)
}

/// The state a claim moves a queued step to, from the transition table.
fn claimed(from: StepState) -> StepState {
    step_rule(from, Trigger::Claimed).map_or(from, |r| r.to)
}

/// Inputs a batch of claimed steps needs: run inputs, their trace contexts and the outputs
/// of completed steps.
#[derive(Debug, Clone, Default)]
pub struct StepInputs {
    /// Input JSON per run.
    pub inputs: HashMap<Uuid, String>,
    /// Output JSON per (run, completed step).
    pub outputs: HashMap<(Uuid, String), String>,
    /// The stored trace context per run (`traceparent`, `tracestate`), read with the input.
    pub traces: HashMap<Uuid, (String, Option<String>)>,
}

impl StepInputs {
    /// Adds what `more` holds.
    pub fn extend(&mut self, more: Self) {
        self.inputs.extend(more.inputs);
        self.outputs.extend(more.outputs);
        self.traces.extend(more.traces);
    }

    /// The trace context of `run`: the stored one, or (none stored, or one that no longer
    /// parses) the run id read as the trace id.
    pub fn trace_of(&self, run: Uuid) -> TraceContext {
        self.traces
            .get(&run)
            .and_then(|(tp, ts)| TraceContext::parse(tp, ts.as_deref()).ok())
            .unwrap_or_else(|| TraceContext::of_run(run))
    }

    fn keep_trace(&mut self, r: &Row, run: Uuid, prefix: &str) {
        if let Ok(Some(tp)) = r.try_get::<Option<String>>("", &format!("{prefix}trace_parent")) {
            let ts = r
                .try_get::<Option<String>>("", &format!("{prefix}trace_state"))
                .ok()
                .flatten();
            self.traces.insert(run, (tp, ts));
        }
    }
}

/// The claim's parameters: `$1` the owner, `$2` the limit, `$3…` the workflow keys.
fn claim_values(owner: &str, workflow_keys: &[String], limit: u32) -> Vec<Value> {
    let mut values: Vec<Value> = vec![owner.to_owned().into(), i64::from(limit).into()];
    values.extend(workflow_keys.iter().map(|k| Value::from(k.clone())));
    values
}

/// The claim's writes (`$1` the owner): the next state, owner, fencing token, phase attempt
/// and deadline.
fn claim_set() -> String {
    format!(
        "SET \
           state = CASE WHEN state = '{ready}' THEN '{running}' ELSE '{compensating}' END, \
           locked_by = $1, attempt = attempt + 1, \
           forward_attempts = forward_attempts + CASE WHEN state = '{ready}' THEN 1 ELSE 0 END, \
           compensation_attempts = compensation_attempts + CASE WHEN state = '{ready}' THEN 0 ELSE 1 END, \
           complete_by = {{now}} + deadline_ms, available_at = NULL, updated_at = {{now}}",
        ready = StepState::Ready,
        running = claimed(StepState::Ready),
        compensating = claimed(StepState::CompensationReady),
    )
}

/// The columns a SQLite claim returns.
const CLAIM_RETURNING: &str = "id, run_id, workflow_key, name, state, attempt, forward_attempts, \
    compensation_attempts, failure_count, max_failures, interruptions, max_interruptions, \
    deadline_ms, deadline_cap_ms, complete_by, idempotency_key, output, wait, {now} AS db_now";

impl Store {
    /// Claims up to `limit` due steps for `owner` atomically (AT-3, SAS-7): one statement on
    /// PostgreSQL, one write-locked transaction on SQLite. It
    /// sets `LockedBy`, `CompleteBy = now + deadline`, state `Running` (or `Compensating`),
    /// `attempt + 1` (the fencing token, whatever the phase) and `forward_attempts + 1` (or
    /// `compensation_attempts + 1`). Only steps of the given workflow keys are taken.
    ///
    /// # Errors
    /// [`crate::Error::Db`], [`crate::Error::CorruptRow`].
    pub async fn step_claim(
        &self,
        owner: &str,
        workflow_keys: &[String],
        limit: u32,
    ) -> Result<Vec<ClaimedStep>> {
        if workflow_keys.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        if self.backend == Backend::Postgres {
            let sql = postgres::claim(&claim_set(), workflow_keys.len());
            let values = claim_values(owner, workflow_keys, limit);
            let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
            let (claimed, bad) = decode_each(&rows, ClaimedStep::decode);
            self.park_undecodable(&self.exec, &bad).await?;
            return Ok(claimed);
        }
        // SQLite's RETURNING sees only the updated row, whose `available_at` the claim
        // clears. So the due steps are read first, with when they fell due, and claimed by
        // id, in one transaction: it holds the file's write lock from its first statement,
        // and the claim's own condition still requires each step to be due, so a step is
        // never claimed twice.
        let txn = self.exec.begin().await?;
        let claimed = self.claim_read_due(&txn, owner, workflow_keys, limit).await;
        txn.end(claimed, |_| true).await
    }

    /// The SQLite claim in `txn`: the due steps (with when they fell due), then the claim
    /// of those by id.
    async fn claim_read_due(
        &self,
        txn: &super::conn::Txn,
        owner: &str,
        workflow_keys: &[String],
        limit: u32,
    ) -> Result<Vec<ClaimedStep>> {
        let due = self.claim_due_times(txn, workflow_keys, limit).await?;
        self.claim_by_ids(txn, owner, &due).await
    }

    /// Claims the steps of `due` (step id → when it fell due) that are still due, in `txn`.
    pub(super) async fn claim_by_ids(
        &self,
        txn: &super::conn::Txn,
        owner: &str,
        due: &HashMap<i64, i64>,
    ) -> Result<Vec<ClaimedStep>> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = due.keys().copied().collect();
        let (sql, values) = self.claim_by_ids_sql(owner, &ids)?;
        let rows = txn.query_all(self.stmt(&sql, values)).await?;
        let (mut claimed, bad) = decode_each(&rows, ClaimedStep::decode);
        self.park_undecodable(txn, &bad).await?;
        for c in &mut claimed {
            c.due_at = due.get(&c.id).copied();
        }
        Ok(claimed)
    }

    /// The claim of due steps by id: `$1` the owner, `$2` the ids.
    fn claim_by_ids_sql(&self, owner: &str, ids: &[i64]) -> Result<(String, Vec<Value>)> {
        let (cond, ids) = self.in_list("id", 2, ids)?;
        let sql = format!(
            "UPDATE sagaflow_steps {set} WHERE {cond} \
             AND state IN ('ready', 'compensation_ready') AND available_at <= {{now}} \
             RETURNING {CLAIM_RETURNING}",
            set = claim_set(),
        );
        let mut values: Vec<Value> = vec![owner.to_owned().into()];
        values.extend(ids);
        Ok((sql, values))
    }

    /// When the steps the claim is about to take fell due, by step id (SQLite).
    async fn claim_due_times(
        &self,
        txn: &super::conn::Txn,
        workflow_keys: &[String],
        limit: u32,
    ) -> Result<HashMap<i64, i64>> {
        let sql = format!(
            "SELECT id, available_at FROM sagaflow_steps \
             WHERE state IN ('ready', 'compensation_ready') AND resource IS NULL AND available_at <= {{now}} \
               AND workflow_key IN ({keys}) \
             ORDER BY priority DESC, available_at LIMIT $1",
            keys = placeholders(2, workflow_keys.len()),
        );
        let mut values: Vec<Value> = vec![i64::from(limit).into()];
        values.extend(workflow_keys.iter().map(|k| Value::from(k.clone())));
        let mut due = HashMap::new();
        for r in txn.query_all(self.stmt(&sql, values)).await? {
            due.insert(r.try_get("", "id")?, r.try_get("", "available_at")?);
        }
        Ok(due)
    }

    /// Claims like [`Store::step_claim`] and loads what the claimed steps need, like
    /// [`Store::step_inputs`]; `needs_outputs` tells which claimed steps need the outputs of
    /// their run's completed steps (a run's first step does not).
    ///
    /// On PostgreSQL this is one statement, one round trip before the steps start: the claim
    /// in a `WITH`, and for each claimed step its run's input and its run's completed outputs
    /// (read through the `(run_id, name)` index; a first step finds none). On SQLite, where a
    /// statement costs no round trip, it is the claim and the reads of `step_inputs`.
    ///
    /// If the reads fail after the claim, the claims stand: their deadlines expire and the
    /// supervisor re-queues them.
    ///
    /// # Errors
    /// [`crate::Error::Db`], [`crate::Error::CorruptRow`].
    pub async fn step_claim_with_inputs(
        &self,
        owner: &str,
        workflow_keys: &[String],
        limit: u32,
        needs_outputs: impl Fn(&ClaimedStep) -> bool,
    ) -> Result<(Vec<ClaimedStep>, StepInputs)> {
        if self.backend != Backend::Postgres {
            let claimed = self.step_claim(owner, workflow_keys, limit).await?;
            let runs: Vec<Uuid> = claimed.iter().map(|c| c.run_id).collect();
            let with_outputs: Vec<Uuid> = claimed
                .iter()
                .filter(|c| needs_outputs(c))
                .map(|c| c.run_id)
                .collect();
            let inputs = self.step_inputs(&runs, &with_outputs).await?;
            return Ok((claimed, inputs));
        }
        if workflow_keys.is_empty() || limit == 0 {
            return Ok((Vec::new(), StepInputs::default()));
        }
        let sql = postgres::with_inputs(&postgres::claim(&claim_set(), workflow_keys.len()));
        let rows = self
            .exec
            .query_all(self.stmt(&sql, claim_values(owner, workflow_keys, limit)))
            .await?;
        let (claimed, inputs, bad) = decode_with_inputs(&rows, needs_outputs);
        self.park_undecodable(&self.exec, &bad).await?;
        Ok((claimed, inputs))
    }

    /// PostgreSQL: claims the due steps `due` (id → when it fell due) for `owner` by id, and
    /// reads what they need (their runs' inputs and completed outputs) in the same statement.
    pub(super) async fn claim_by_ids_with_inputs(
        &self,
        txn: &super::conn::Txn,
        owner: &str,
        due: &HashMap<i64, i64>,
        needs_outputs: &(dyn Fn(&ClaimedStep) -> bool + Sync),
    ) -> Result<(Vec<ClaimedStep>, StepInputs)> {
        if due.is_empty() {
            return Ok((Vec::new(), StepInputs::default()));
        }
        let ids: Vec<i64> = due.keys().copied().collect();
        let (sql, values) = self.claim_by_ids_sql(owner, &ids)?;
        let rows = txn
            .query_all(self.stmt(&postgres::with_inputs(&sql), values))
            .await?;
        let (mut claimed, inputs, bad) = decode_with_inputs(&rows, needs_outputs);
        self.park_undecodable(txn, &bad).await?;
        for c in &mut claimed {
            c.due_at = due.get(&c.id).copied();
        }
        Ok((claimed, inputs))
    }
}

/// The claimed steps of a [`postgres::with_inputs`] statement, and what they need.
fn decode_with_inputs(
    rows: &[super::Row],
    needs_outputs: impl Fn(&ClaimedStep) -> bool,
) -> (Vec<ClaimedStep>, StepInputs, Vec<Undecodable>) {
    let mut claimed = Vec::with_capacity(rows.len());
    let mut inputs = StepInputs::default();
    let mut bad = Vec::new();
    for r in rows {
        let c = match ClaimedStep::decode(r) {
            Ok(c) => c,
            Err(e) => {
                bad.extend(Undecodable::of(r, e));
                continue;
            }
        };
        // An unreadable input or output list is left out: the step's request reports
        // what is missing as damage of that run alone.
        if let Ok(input) = r.try_get::<String>("", "run_input") {
            inputs.inputs.insert(c.run_id, input);
        }
        inputs.keep_trace(r, c.run_id, "run_");
        if needs_outputs(&c)
            && let Ok(Some(outputs)) = r.try_get::<Option<String>>("", "run_outputs")
            && let Ok(pairs) = serde_json::from_str::<Vec<(String, String)>>(&outputs)
        {
            for (name, output) in pairs {
                inputs.outputs.insert((c.run_id, name), output);
            }
        }
        claimed.push(c);
    }
    (claimed, inputs, bad)
}

/// An in-flight step row that a claim or a rescue listing could not decode.
#[derive(Debug)]
struct Undecodable {
    id: i64,
    run_id: Uuid,
    error: crate::Error,
}

impl Undecodable {
    /// The row's id and run with the decoding error, or `None` when even those do not read
    /// (nothing can then be done with the row but say so).
    fn of(r: &Row, error: crate::Error) -> Option<Self> {
        match (r.try_get::<i64>("", "id"), r.try_get::<Uuid>("", "run_id")) {
            (Ok(id), Ok(run_id)) => Some(Self { id, run_id, error }),
            _ => {
                tracing::error!(%error, "an in-flight step row has no readable id or run id");
                None
            }
        }
    }
}

/// The rows that decode, and those that do not: one bad row costs its own run, not the
/// batch it was read with.
fn decode_each<T>(rows: &[Row], decode: impl Fn(&Row) -> Result<T>) -> (Vec<T>, Vec<Undecodable>) {
    let mut ok = Vec::with_capacity(rows.len());
    let mut bad = Vec::new();
    for r in rows {
        match decode(r) {
            Ok(v) => ok.push(v),
            Err(e) => bad.extend(Undecodable::of(r, e)),
        }
    }
    (ok, bad)
}

impl Store {
    /// Loads what a batch of claimed steps needs: their runs' inputs, and the outputs of the
    /// completed steps of `with_outputs` (the runs whose claimed steps have dependencies).
    /// At most two queries for the whole batch.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn step_inputs(&self, runs: &[Uuid], with_outputs: &[Uuid]) -> Result<StepInputs> {
        let mut out = StepInputs::default();
        if runs.is_empty() {
            return Ok(out);
        }
        let (cond, values) = self.in_list("id", 1, runs)?;
        let sql =
            format!("SELECT id, input, trace_parent, trace_state FROM sagaflow_runs WHERE {cond}");
        for r in self.exec.query_all(self.stmt(&sql, values)).await? {
            // An unreadable input is left out: the step's request reports it as damage of
            // that run alone.
            let id = r.try_get("", "id")?;
            if let Ok(input) = r.try_get("", "input") {
                out.inputs.insert(id, input);
            }
            out.keep_trace(&r, id, "");
        }
        if with_outputs.is_empty() {
            return Ok(out);
        }
        let (cond, values) = self.in_list("run_id", 1, with_outputs)?;
        let sql = format!(
            "SELECT run_id, name, output FROM sagaflow_steps WHERE {cond} AND output IS NOT NULL"
        );
        for r in self.exec.query_all(self.stmt(&sql, values)).await? {
            out.outputs.insert(
                (r.try_get("", "run_id")?, r.try_get("", "name")?),
                r.try_get("", "output")?,
            );
        }
        Ok(out)
    }

    /// Running steps to rescue, oldest deadline first: those past their deadline, and those
    /// whose owner instance has not heartbeaten for `stale_after_ms` (dead, frozen or
    /// stopped), whatever their deadline. `owner_dead` tells which.
    ///
    /// Three index-driven reads rather than one statement with an `OR`: the dead instances
    /// (a handful of rows), the expired steps (a range of the running-steps index), and, only
    /// when an instance is dead, the running steps it holds.
    ///
    /// # Errors
    /// [`crate::Error::Db`], [`crate::Error::CorruptRow`].
    pub async fn step_list_rescuable(
        &self,
        stale_after_ms: i64,
        limit: u32,
    ) -> Result<Vec<ExpiredStep>> {
        let dead: Vec<String> = self
            .exec
            .query_all(self.stmt(
                "SELECT id FROM sagaflow_instances WHERE heartbeat_at < {wall_now} - $1",
                vec![stale_after_ms.into()],
            ))
            .await?
            .iter()
            .map(|r| r.try_get::<String>("", "id"))
            .collect::<Result<_, _>>()?;
        let sql = format!(
            "SELECT {cols}, FALSE AS owner_dead FROM sagaflow_steps \
             WHERE state IN ('running', 'compensating') AND complete_by < {{now}} \
             ORDER BY complete_by LIMIT $1",
            cols = ExpiredStep::COLS,
        );
        let rows = self
            .exec
            .query_all(self.stmt(&sql, vec![i64::from(limit).into()]))
            .await?;
        let (mut out, bad) = decode_each(&rows, ExpiredStep::decode);
        self.park_undecodable(&self.exec, &bad).await?;
        if !dead.is_empty() {
            let orphans = self.steps_held_by(&dead, limit).await?;
            let mut by_id: std::collections::HashMap<i64, ExpiredStep> =
                out.into_iter().map(|s| (s.id, s)).collect();
            // An orphan is an interruption, even if its deadline passed too.
            by_id.extend(orphans.into_iter().map(|s| (s.id, s)));
            out = by_id.into_values().collect();
            out.sort_unstable_by_key(|s| s.id);
            out.truncate(limit as usize);
        }
        Ok(out)
    }

    /// Running steps held by `owner` (a predecessor of a restarted instance, or this
    /// instance at shutdown), with `owner_dead` set.
    ///
    /// # Errors
    /// [`crate::Error::Db`], [`crate::Error::CorruptRow`].
    pub async fn step_list_owned(&self, owner: &str, limit: u32) -> Result<Vec<ExpiredStep>> {
        self.steps_held_by(&[owner.to_owned()], limit).await
    }

    /// Running steps whose `locked_by` is one of `owners`, marked `owner_dead`.
    async fn steps_held_by(&self, owners: &[String], limit: u32) -> Result<Vec<ExpiredStep>> {
        let (cond, mut values) = self.in_list("locked_by", 2, owners)?;
        values.insert(0, i64::from(limit).into());
        let sql = format!(
            "SELECT {cols}, TRUE AS owner_dead FROM sagaflow_steps \
             WHERE state IN ('running', 'compensating') AND {cond} \
             ORDER BY complete_by LIMIT $1",
            cols = ExpiredStep::COLS,
        );
        let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
        let (out, bad) = decode_each(&rows, ExpiredStep::decode);
        self.park_undecodable(&self.exec, &bad).await?;
        Ok(out)
    }

    /// Gives in-flight step rows that do not decode back to their phase's queue, parked (no
    /// due time: never claimed, never listed for rescue again), as the transition table's
    /// `set_aside` does for an attempt that met damaged data, and marks their runs for
    /// evaluation, which sets each run aside in `error` with a `corrupt_row` alert. Each write
    /// is guarded by the row being in flight still.
    async fn park_undecodable<C: Exec>(&self, conn: &C, bad: &[Undecodable]) -> Result<()> {
        if bad.is_empty() {
            return Ok(());
        }
        let (running, compensating) = (StepState::Running, StepState::Compensating);
        let sql = format!(
            "UPDATE sagaflow_steps SET state = CASE WHEN state = '{running}' THEN '{r}' ELSE '{c}' END, \
               locked_by = NULL, available_at = NULL, updated_at = {{now}} \
             WHERE id = $1 AND state IN ('{running}', '{compensating}')",
            r = set_aside(running),
            c = set_aside(compensating),
        );
        let mut runs = Vec::with_capacity(bad.len());
        for b in bad {
            tracing::error!(
                step_id = b.id,
                run_id = %b.run_id,
                error = %b.error,
                "an in-flight step row does not decode: it is parked and its run set aside"
            );
            conn.execute(self.stmt(&sql, vec![b.id.into()])).await?;
            runs.push(b.run_id);
        }
        mark_dirty(self, conn, &runs).await
    }

    /// Number of steps waiting in the queue (ready or compensation-ready), for monitoring.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn step_queue_depth(&self) -> Result<i64> {
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT COUNT(*) AS n FROM sagaflow_steps WHERE state IN ('ready', 'compensation_ready')",
                vec![],
            ))
            .await?;
        Ok(row
            .map(|r| r.try_get::<i64>("", "n"))
            .transpose()?
            .unwrap_or(0))
    }
}

impl StoreTx<'_> {
    /// Fails with [`crate::Error::LeaseLost`] unless `fence`'s holder still holds the leader
    /// lease with its term.
    ///
    /// # Errors
    /// [`crate::Error::Db`]; [`crate::Error::LeaseLost`].
    pub async fn fence_check(&self, fence: &LeaderFence) -> Result<()> {
        self.store.fence_check(&self.txn, fence).await
    }

    /// Parks the due steps of those of `runs` that are paused: a paused run claims no new
    /// step, so what a rescue re-queued for one waits for its resume (its evaluation would
    /// park it too, but a claim could come first).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn steps_park_of_paused(&self, runs: &[Uuid]) -> Result<()> {
        for chunk in runs.chunks(CHUNK) {
            let (cond, values) = self.store.in_list("id", 1, chunk)?;
            let sql = format!(
                "UPDATE sagaflow_steps SET available_at = NULL, aging_from = NULL \
                 WHERE state IN ('ready', 'compensation_ready') AND available_at IS NOT NULL \
                   AND run_id IN (SELECT id FROM sagaflow_runs WHERE {cond} AND state = '{paused}')",
                paused = crate::RunState::Paused,
            );
            self.txn.execute(self.store.stmt(&sql, values)).await?;
        }
        Ok(())
    }
}
