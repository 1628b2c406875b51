//! Steps: the batch claim, fenced completion writes, and the supervisor's rescue of expired
//! steps.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, TransactionTrait, Value};
use uuid::Uuid;

use super::apply::{HistoryEntry, Planner};
use super::leases::LeaderFence;
use super::rows::{ClaimedStep, ExpiredStep};
use super::runs::EvalApplied;
use super::{Store, placeholders};
use crate::{Result, StepError, StepState};

/// Inputs a batch of claimed steps needs: run inputs and the outputs of completed steps.
#[derive(Debug, Clone, Default)]
pub struct StepInputs {
    /// Input JSON per run.
    pub inputs: HashMap<Uuid, String>,
    /// Output JSON per (run, completed step).
    pub outputs: HashMap<(Uuid, String), String>,
}

/// How an attempt ended, as decided by the scheduler from the agent's response.
#[derive(Debug, Clone)]
pub enum StepFinishKind {
    /// Success: `Running → Completed` or `Compensating → Compensated`.
    Succeeded {
        /// Output JSON (forward steps).
        output: Option<String>,
    },
    /// Retryable failure under the threshold: back to the queue after `delay_ms`.
    Retry {
        /// Backoff before the next attempt.
        delay_ms: i64,
        /// The failure.
        error: StepError,
    },
    /// Terminal failure or threshold reached: `Failed` / `CompensationFailed`.
    Failed {
        /// The failure.
        error: StepError,
    },
}

/// A fenced write of one attempt's result.
#[derive(Debug, Clone)]
pub struct StepFinish {
    /// Row id.
    pub id: i64,
    /// Run id.
    pub run_id: Uuid,
    /// Step name.
    pub name: String,
    /// The state the lease was taken in (`Running` or `Compensating`).
    pub state: StepState,
    /// The attempt of the lease.
    pub attempt: i32,
    /// The lease owner.
    pub owner: String,
    /// What happened.
    pub kind: StepFinishKind,
}

/// The state a result moves its step to.
fn finish_target(it: &StepFinish) -> StepState {
    let compensation = it.state == StepState::Compensating;
    match (&it.kind, compensation) {
        (StepFinishKind::Succeeded { .. }, false) => StepState::Completed,
        (StepFinishKind::Succeeded { .. }, true) => StepState::Compensated,
        (StepFinishKind::Retry { .. }, false) => StepState::Ready,
        (StepFinishKind::Retry { .. }, true) => StepState::CompensationReady,
        (StepFinishKind::Failed { .. }, false) => StepState::Failed,
        (StepFinishKind::Failed { .. }, true) => StepState::CompensationFailed,
    }
}

/// Rows per bulk result write.
const FINISH_CHUNK: usize = 200;

impl Store {
    /// The fenced result writes of a batch, as one `UPDATE … FROM (VALUES …)` per chunk
    /// (one round trip instead of one per step). Returns the ids whose fence held.
    async fn finish_writes(
        &self,
        txn: &sea_orm::DatabaseTransaction,
        items: &[StepFinish],
    ) -> Result<std::collections::HashSet<i64>> {
        const COLS: [(&str, &str); 10] = [
            ("vid", "bigint"),
            ("from_state", "text"),
            ("attempt", "integer"),
            ("owner", "text"),
            ("to_state", "text"),
            ("kind", "text"),
            ("output", "text"),
            ("error", "text"),
            ("delay_ms", "bigint"),
            ("maybe", "boolean"),
        ];
        let mut done = std::collections::HashSet::with_capacity(items.len());
        for chunk in items.chunks(FINISH_CHUNK) {
            let mut rows = Vec::with_capacity(chunk.len());
            for it in chunk {
                let (kind, output, error, delay, maybe) = match &it.kind {
                    StepFinishKind::Succeeded { output } => ("ok", output.clone(), None, 0, false),
                    StepFinishKind::Retry { delay_ms, error } => (
                        "retry",
                        None,
                        Some(error.to_json()),
                        *delay_ms,
                        it.state == StepState::Running && error.may_have_applied(),
                    ),
                    StepFinishKind::Failed { error } => (
                        "failed",
                        None,
                        Some(error.to_json()),
                        0,
                        it.state == StepState::Running && error.may_have_applied(),
                    ),
                };
                rows.push(vec![
                    it.id.into(),
                    it.state.as_str().into(),
                    it.attempt.into(),
                    it.owner.clone().into(),
                    finish_target(it).as_str().into(),
                    kind.into(),
                    output.into(),
                    error.into(),
                    delay.into(),
                    maybe.into(),
                ]);
            }
            let (source, values) = self.rows_source(1, &COLS, rows)?;
            let sql = format!(
                "UPDATE sagaflow_steps AS s SET state = v.to_state, locked_by = NULL, complete_by = NULL, \
                   updated_at = {{now}}, \
                   output = CASE WHEN v.kind = 'ok' THEN COALESCE(v.output, s.output) ELSE s.output END, \
                   error = CASE WHEN v.kind = 'ok' THEN NULL ELSE v.error END, \
                   failure_count = s.failure_count + CASE WHEN v.kind = 'ok' THEN 0 ELSE 1 END, \
                   available_at = CASE WHEN v.kind = 'retry' THEN {{now}} + v.delay_ms ELSE NULL END, \
                   maybe_applied = (s.maybe_applied OR v.maybe) \
                 FROM {source} \
                 WHERE s.id = v.vid AND s.state = v.from_state AND s.attempt = v.attempt \
                   AND s.locked_by = v.owner AND s.complete_by > {{now}} \
                 RETURNING id"
            );
            for r in txn.query_all_raw(self.stmt(&sql, values)).await? {
                done.insert(r.try_get::<i64>("", "id")?);
            }
        }
        Ok(done)
    }
}

/// What a finish batch did.
#[derive(Debug)]
pub struct FinishOutcome {
    /// Per item, whether its fenced write applied.
    pub applied: Vec<bool>,
    /// The evaluations of the runs concerned.
    pub evaluated: Vec<EvalApplied>,
    /// Runs whose evaluation failed (left marked for the evaluation loop).
    pub failed: Vec<(Uuid, crate::Error)>,
}

/// One expired step the supervisor decided about.
#[derive(Debug, Clone)]
pub struct Rescue {
    /// The step as listed.
    pub step: ExpiredStep,
    /// New deadline length (extended) when re-queued.
    pub new_deadline_ms: i64,
    /// Whether the failure threshold is reached (the step fails instead of re-queueing).
    pub give_up: bool,
}

/// What a rescue pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RescueCounts {
    /// Steps put back in the queue with an extended deadline.
    pub requeued: u64,
    /// Steps failed at their threshold (the run compensates or errors).
    pub failed: u64,
    /// Steps that moved on before the write (finished meanwhile): left alone.
    pub skipped: u64,
}

impl Store {
    /// Claims up to `limit` due steps for `owner` in one atomic statement (AT-3, SAS-7):
    /// sets `LockedBy`, `CompleteBy = now + deadline`, state `Running` (or `Compensating`)
    /// and `attempt + 1`. Only steps of the given workflow keys are taken.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn step_claim(
        &self,
        owner: &str,
        workflow_keys: &[String],
        limit: u32,
    ) -> Result<Vec<ClaimedStep>> {
        if workflow_keys.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let sql = format!(
            "UPDATE sagaflow_steps SET \
               state = CASE WHEN state = 'ready' THEN 'running' ELSE 'compensating' END, \
               locked_by = $1, attempt = attempt + 1, complete_by = {{now}} + deadline_ms, \
               available_at = NULL, updated_at = {{now}} \
             WHERE id IN ( \
               SELECT id FROM sagaflow_steps \
               WHERE state IN ('ready', 'compensation_ready') AND available_at <= {{now}} AND workflow_key IN ({keys}) \
               ORDER BY available_at LIMIT $2 {lock}) \
             RETURNING id, run_id, workflow_key, name, state, attempt, failure_count, max_failures, complete_by, \
               idempotency_key, output, {{now}} AS db_now",
            keys = placeholders(3, workflow_keys.len()),
            lock = self.claim_lock(),
        );
        let mut values: Vec<Value> = vec![owner.to_owned().into(), i64::from(limit).into()];
        values.extend(workflow_keys.iter().map(|k| Value::from(k.clone())));
        let rows = self.db.query_all_raw(self.stmt(&sql, values)).await?;
        rows.iter().map(ClaimedStep::decode).collect()
    }

    /// Loads what a batch of claimed steps needs: their runs' inputs, and the outputs of the
    /// completed steps of `with_outputs` (the runs whose claimed steps have dependencies).
    /// At most two queries for the whole batch.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn step_inputs(&self, runs: &[Uuid], with_outputs: &[Uuid]) -> Result<StepInputs> {
        let mut out = StepInputs::default();
        if runs.is_empty() {
            return Ok(out);
        }
        let (cond, values) = self.in_list("id", 1, runs)?;
        let sql = format!("SELECT id, input FROM sagaflow_runs WHERE {cond}");
        for r in self.db.query_all_raw(self.stmt(&sql, values)).await? {
            out.inputs
                .insert(r.try_get("", "id")?, r.try_get("", "input")?);
        }
        if with_outputs.is_empty() {
            return Ok(out);
        }
        let (cond, values) = self.in_list("run_id", 1, with_outputs)?;
        let sql = format!(
            "SELECT run_id, name, output FROM sagaflow_steps WHERE {cond} AND output IS NOT NULL"
        );
        for r in self.db.query_all_raw(self.stmt(&sql, values)).await? {
            out.outputs.insert(
                (r.try_get("", "run_id")?, r.try_get("", "name")?),
                r.try_get("", "output")?,
            );
        }
        Ok(out)
    }

    /// Writes a batch of attempt results and advances their runs, in one transaction.
    ///
    /// Each write is fenced by `(id, state, attempt, locked_by)` and by `complete_by` not
    /// having passed (SAS-3: an answer after the deadline counts as a failure); a write that
    /// matches no row lost its lease (the deadline passed, the supervisor re-queued the step,
    /// another attempt owns it) and is dropped. The runs concerned are locked first, in id
    /// order (the lock order of every transaction), and evaluated with `plan` before the
    /// commit: one commit per batch moves many runs forward.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn step_finish_batch(
        &self,
        items: &[StepFinish],
        actor: &str,
        plan: Planner<'_>,
    ) -> Result<FinishOutcome> {
        let txn = self.db.begin().await?;
        let run_ids: Vec<Uuid> = items.iter().map(|i| i.run_id).collect();
        let runs = self.lock_runs(&txn, &run_ids, false).await?;
        let done = self.finish_writes(&txn, items).await?;
        let applied: Vec<bool> = items.iter().map(|it| done.contains(&it.id)).collect();
        // One history row per applied write, even if a batch carried the same attempt twice.
        let mut recorded = std::collections::HashSet::with_capacity(items.len());
        let history: Vec<HistoryEntry> = items
            .iter()
            .filter(|it| done.contains(&it.id) && recorded.insert(it.id))
            .map(|it| {
                let (event, detail) = match &it.kind {
                    StepFinishKind::Succeeded { .. } => ("completed", None),
                    StepFinishKind::Retry { error, .. } => ("retry", Some(error.to_json())),
                    StepFinishKind::Failed { error } => ("failed", Some(error.to_json())),
                };
                HistoryEntry {
                    run_id: it.run_id,
                    step: Some(it.name.clone()),
                    event: event.into(),
                    from: Some(it.state.as_str().into()),
                    to: Some(finish_target(it).as_str().into()),
                    attempt: Some(it.attempt),
                    actor: it.owner.clone(),
                    detail,
                }
            })
            .collect();
        let (evaluated, failed) = self
            .evaluate_locked(&txn, runs, actor, plan, history)
            .await?;
        txn.commit().await?;
        Ok(FinishOutcome {
            applied,
            evaluated,
            failed,
        })
    }

    /// Running steps whose deadline has passed, oldest deadline first.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn step_list_expired(&self, limit: u32) -> Result<Vec<ExpiredStep>> {
        let rows = self
            .db
            .query_all_raw(self.stmt(
                "SELECT id, run_id, name, state, attempt, failure_count, max_failures, deadline_ms, deadline_cap_ms \
                 FROM sagaflow_steps WHERE state IN ('running', 'compensating') AND complete_by < {now} \
                 ORDER BY complete_by LIMIT $1",
                vec![i64::from(limit).into()],
            ))
            .await?;
        rows.iter().map(ExpiredStep::decode).collect()
    }

    /// Applies the supervisor's decisions for expired steps in one transaction, fenced by the
    /// leader lease: if `fence` no longer holds the lease, nothing is written and
    /// [`crate::Error::LeaseLost`] is returned. Each write also re-checks that the step is
    /// still the same expired attempt.
    ///
    /// # Errors
    /// [`crate::Error::Db`]; [`crate::Error::LeaseLost`] when the lease was lost.
    pub async fn step_rescue(&self, fence: &LeaderFence, items: &[Rescue]) -> Result<RescueCounts> {
        let txn = self.db.begin().await?;
        self.fence_check(&txn, fence).await?;
        // Runs first, in id order: the lock order of every transaction that writes steps.
        let mut runs: Vec<Uuid> = items.iter().map(|r| r.step.run_id).collect();
        runs.sort_unstable();
        runs.dedup();
        self.mark_dirty(&txn, &runs).await?;
        let actor = fence.actor();
        let mut counts = RescueCounts::default();
        let mut history = Vec::with_capacity(items.len());
        for r in items {
            let s = &r.step;
            let compensation = s.state == StepState::Compensating;
            let to = match (compensation, r.give_up) {
                (false, false) => StepState::Ready,
                (false, true) => StepState::Failed,
                (true, false) => StepState::CompensationReady,
                (true, true) => StepState::CompensationFailed,
            };
            let error = StepError::timeout(s.deadline_ms);
            let res = txn
                .execute_raw(self.stmt(
                    "UPDATE sagaflow_steps SET state = $1, locked_by = NULL, complete_by = NULL, \
                     failure_count = failure_count + 1, deadline_ms = $2, error = $3, updated_at = {now}, \
                     available_at = CASE WHEN $4 THEN {now} ELSE NULL END, \
                     maybe_applied = (maybe_applied OR $8) \
                     WHERE id = $5 AND state = $6 AND attempt = $7 AND complete_by < {now} \
                       AND EXISTS (SELECT 1 FROM sagaflow_leases WHERE name = $9 AND holder = $10 \
                                   AND term = $11 AND expires_at > {now})",
                    vec![
                        to.as_str().into(),
                        r.new_deadline_ms.into(),
                        error.to_json().into(),
                        (!r.give_up).into(),
                        s.id.into(),
                        s.state.as_str().into(),
                        s.attempt.into(),
                        // A forward attempt that timed out may have taken effect remotely.
                        (!compensation).into(),
                        fence.name.clone().into(),
                        fence.holder.clone().into(),
                        fence.term.into(),
                    ],
                ))
                .await?;
            if res.rows_affected() == 0 {
                counts.skipped += 1;
                continue;
            }
            if r.give_up {
                counts.failed += 1;
            } else {
                counts.requeued += 1;
            }
            let detail = format!(
                "{{\"failure_count\":{},\"max_failures\":{},\"deadline_ms\":{}}}",
                s.failure_count + 1,
                s.max_failures,
                r.new_deadline_ms
            );
            history.push(HistoryEntry {
                run_id: s.run_id,
                step: Some(s.name.clone()),
                event: "timeout".into(),
                from: Some(s.state.as_str().into()),
                to: Some(to.as_str().into()),
                attempt: Some(s.attempt),
                actor: actor.clone(),
                detail: Some(detail),
            });
        }
        self.history_insert_many(&txn, &history).await?;
        if counts.requeued + counts.failed > 0 {
            // Re-queued steps, and runs to evaluate for the ones that failed.
            self.notify_ready(&txn).await?;
        }
        txn.commit().await?;
        Ok(counts)
    }

    /// Number of steps waiting in the queue (ready or compensation-ready), for monitoring.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn step_queue_depth(&self) -> Result<i64> {
        let row = self
            .db
            .query_one_raw(self.stmt(
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
