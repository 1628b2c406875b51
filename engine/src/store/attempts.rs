//! Fenced writes of decided attempt ends (results, timeouts, interruptions): the
//! [`StepFinish`] a decision produces, the [`DeadlineGuard`] that fences it, and
//! [`StoreTx::attempts_write`], which writes a batch of them in bulk.

use sea_orm::Value;

use super::row::Exec;
use uuid::Uuid;

use super::leases::LeaderFence;
use super::tx::{HistoryEntry, StoreTx};
pub use crate::transition::writes::{DeadlineGuard, StepFinish, WaitWrite};
use crate::{Result, StepError};

impl DeadlineGuard {
    /// The condition on the step row.
    const fn sql(self) -> &'static str {
        match self {
            Self::Live => " AND s.complete_by > {now}",
            Self::Expired => " AND s.complete_by < {now}",
            Self::Any => "",
        }
    }
}

impl WaitWrite {
    fn op(&self) -> &'static str {
        match self {
            Self::Keep => "keep",
            Self::Clear => "clear",
            Self::Set(_) => "set",
        }
    }

    fn json(&self) -> Option<String> {
        match self {
            Self::Set(p) => Some(
                crate::wait::WaitState {
                    on: p.request.on.clone(),
                    timeout_ms: p.request.timeout_ms,
                    woken: None,
                }
                .to_json(),
            ),
            _ => None,
        }
    }
}

/// What a rescue pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RescueCounts {
    /// Timed-out steps put back in the queue with an extended deadline.
    pub requeued: u64,
    /// Steps failed at their threshold or past their interruption cap.
    pub failed: u64,
    /// Steps of dead or stopped instances put back in the queue (interruptions).
    pub interrupted: u64,
    /// Steps that moved on before the write (finished meanwhile): left alone.
    pub skipped: u64,
}

/// Rows per bulk attempt-end write.
const FINISH_CHUNK: usize = 200;

impl StoreTx<'_> {
    /// Writes decided attempt ends as one `UPDATE … FROM` per chunk (one round trip instead
    /// of one per step), each fenced by `(id, state, attempt, locked_by)` and its deadline
    /// guard, and, with `fence`, by the leader lease. A step queued again (a retry, a
    /// deferral, a timeout, an interruption) takes its stored retry priority (its run's
    /// priority moved by the workflow's retry lane), never its current priority plus
    /// anything, and waits toward aging from when it is due. Returns, per item, whether its fence
    /// held; a history row is recorded for each that did, by the lease owner (an attempt's
    /// answer, an instance releasing its own steps) or the supervisor's term.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn attempts_write(
        &mut self,
        items: &[StepFinish],
        fence: Option<&LeaderFence>,
    ) -> Result<Vec<bool>> {
        let mut done = std::collections::HashSet::with_capacity(items.len());
        // One statement per deadline guard (a completion batch has one, a rescue at most
        // two) and per chunk.
        for guard in [
            DeadlineGuard::Live,
            DeadlineGuard::Expired,
            DeadlineGuard::Any,
        ] {
            let of_guard: Vec<&StepFinish> = items.iter().filter(|it| it.guard == guard).collect();
            for chunk in of_guard.chunks(FINISH_CHUNK) {
                done.extend(self.write_chunk(chunk, guard, fence).await?);
            }
        }
        // One history row per applied write, even if a batch carried the same attempt twice.
        // A write is its step's and its attempt's: a batch may also carry a stale answer of an
        // earlier attempt of the same step (its instance fenced, then claiming the step
        // again), whose write missed and which must count as missed.
        let mut recorded = std::collections::HashSet::with_capacity(items.len());
        let mut failed_runs = Vec::new();
        for it in items {
            if !done.contains(&(it.id, it.attempt)) || !recorded.insert((it.id, it.attempt)) {
                continue;
            }
            if it.change.on.ends_attempt_unsuccessfully() {
                failed_runs.push(it.run_id);
            }
            self.history.push(HistoryEntry {
                run_id: it.run_id,
                step: Some(it.name.clone()),
                event: it.event().into(),
                from: Some(it.change.from.as_str().into()),
                to: Some(it.change.to.as_str().into()),
                attempt: Some(it.attempt),
                actor: fence.map_or_else(|| it.owner.clone(), LeaderFence::actor),
                detail: it
                    .error
                    .as_ref()
                    .map(StepError::to_json)
                    .or_else(|| it.wait.json()),
            });
            self.happened.attempt(it);
        }
        self.count_failed_attempts(&failed_runs).await?;
        Ok(items
            .iter()
            .map(|it| done.contains(&(it.id, it.attempt)))
            .collect())
    }

    /// Adds one to a run's failed-attempt count per appearance in `runs` (the applied attempt
    /// ends that did not succeed): one statement per chunk, none for a batch of successes.
    async fn count_failed_attempts(&self, runs: &[Uuid]) -> Result<()> {
        const COLS: [(&str, &str); 2] = [("vid", "uuid"), ("n", "integer")];
        let mut per_run: std::collections::BTreeMap<Uuid, i32> = std::collections::BTreeMap::new();
        for &run in runs {
            *per_run.entry(run).or_default() += 1;
        }
        let per_run: Vec<(Uuid, i32)> = per_run.into_iter().collect();
        let s = self.store;
        for chunk in per_run.chunks(FINISH_CHUNK) {
            let rows = chunk
                .iter()
                .map(|(id, n)| vec![(*id).into(), (*n).into()])
                .collect();
            let (source, values) = s.rows_source(1, &COLS, rows)?;
            let sql = format!(
                "UPDATE sagaflow_runs AS r SET failed_attempts = r.failed_attempts + v.n \
                 FROM {source} WHERE r.id = v.vid"
            );
            self.txn.execute(s.stmt(&sql, values)).await?;
        }
        Ok(())
    }

    /// One fenced write of attempt ends sharing a deadline guard; returns the (id, attempt)
    /// of the writes whose fence held.
    async fn write_chunk(
        &self,
        chunk: &[&StepFinish],
        guard: DeadlineGuard,
        fence: Option<&LeaderFence>,
    ) -> Result<Vec<(i64, i32)>> {
        const COLS: [(&str, &str); 14] = [
            ("vid", "bigint"),
            ("from_state", "text"),
            ("attempt", "integer"),
            ("owner", "text"),
            ("to_state", "text"),
            ("output", "text"),
            ("error", "text"),
            ("failures", "integer"),
            ("interruptions", "integer"),
            ("deadline_ms", "bigint"),
            ("due_ms", "bigint"),
            ("maybe", "boolean"),
            ("wait_op", "text"),
            ("wait", "text"),
        ];
        let s = self.store;
        let rows = chunk
            .iter()
            .map(|it| {
                let c = &it.change;
                vec![
                    it.id.into(),
                    c.from.as_str().into(),
                    it.attempt.into(),
                    it.owner.clone().into(),
                    c.to.as_str().into(),
                    it.output.clone().filter(|_| c.store_output).into(),
                    it.error.as_ref().map(StepError::to_json).into(),
                    c.failure_count.into(),
                    c.interruptions.into(),
                    c.deadline_ms.into(),
                    c.due_in_ms.into(),
                    c.maybe_applied.into(),
                    it.wait.op().into(),
                    it.wait.json().into(),
                ]
            })
            .collect();
        let (source, mut values) = s.rows_source(1, &COLS, rows)?;
        let lease = match fence {
            Some(f) => {
                values.extend([
                    Value::from(f.name.clone()),
                    f.holder.clone().into(),
                    f.term.into(),
                ]);
                " AND EXISTS (SELECT 1 FROM sagaflow_leases WHERE name = $2 AND holder = $3 \
                   AND term = $4 AND expires_at > {wall_now})"
            }
            None => "",
        };
        let sql = format!(
            "UPDATE sagaflow_steps AS s SET state = v.to_state, locked_by = NULL, \
               complete_by = CASE WHEN v.interruptions > s.interruptions AND s.complete_by > {{now}} \
                 THEN s.complete_by ELSE NULL END, \
               updated_at = {{now}}, output = COALESCE(v.output, s.output), error = v.error, \
               failure_count = v.failures, interruptions = v.interruptions, deadline_ms = v.deadline_ms, \
               available_at = CASE WHEN v.due_ms IS NULL THEN NULL ELSE {{now}} + v.due_ms END, \
               aging_from = CASE WHEN v.due_ms IS NULL THEN NULL ELSE {{now}} + v.due_ms END, \
               priority = CASE WHEN v.due_ms IS NULL THEN s.priority ELSE s.retry_priority END, \
               maybe_applied = (s.maybe_applied OR v.maybe), \
               wait = CASE v.wait_op WHEN 'set' THEN v.wait WHEN 'clear' THEN NULL ELSE s.wait END, \
               wait_key = CASE v.wait_op WHEN 'clear' THEN NULL ELSE s.wait_key END \
             FROM {source} \
             WHERE s.id = v.vid AND s.state = v.from_state AND s.attempt = v.attempt \
               AND s.locked_by = v.owner{deadline}{lease} \
             RETURNING {returning}",
            deadline = guard.sql(),
            // PostgreSQL reads `attempt` of the source too; SQLite's `RETURNING` sees the
            // updated table only, and under its own name.
            returning = if s.backend == super::Backend::Postgres {
                "s.id, s.attempt"
            } else {
                "id, attempt"
            },
        );
        let rows = self.txn.query_all(s.stmt(&sql, values)).await?;
        // The write leaves `attempt` as it was, so the row's is the answer's.
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<i64>("", "id")?,
                    r.try_get::<i32>("", "attempt")?,
                ))
            })
            .collect()
    }
}
