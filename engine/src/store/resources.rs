//! Resources: their limits as stored, and the claim of due steps that obey them (see
//! [`crate::resource`]).

use std::collections::HashMap;

use sea_orm::Value;

use super::row::Exec;
use super::rows::ClaimedStep;
use super::{Backend, Row, Store, placeholders};
use crate::interleave::{Point, Unit};
use crate::resource::{
    BreakerGate, BreakerState, BreakerStatus, Resource, ResourceLimits, ResourceView, WindowGate,
};
use crate::{Error, Result, StepState};

/// A claim for a resource's steps: see [`Store::resource_claim`].
#[derive(Debug, Clone, Copy)]
pub struct ResourceAsk<'a> {
    /// The claiming engine.
    pub owner: &'a str,
    /// The resource.
    pub resource: &'a str,
    /// The workflow keys (`name@version`) whose steps may be taken.
    pub workflow_keys: &'a [String],
    /// The most steps to take.
    pub limit: u32,
    /// Whether the last claim for the resource took steps (then no probe for due steps
    /// comes first).
    pub busy: bool,
}

/// What one claim for a resource took, and when it is worth trying again.
#[derive(Debug, Default)]
pub struct ResourceClaim {
    /// The steps claimed.
    pub claimed: Vec<ClaimedStep>,
    /// When a limit lets the next attempt start, in milliseconds from now, if one held steps
    /// back for a time (the rate, a closed window, a batch's pause, an open breaker); `None`
    /// when nothing waits on time (a concurrency limit frees up when an attempt ends, which
    /// wakes the claim loop).
    pub retry_in_ms: Option<u64>,
    /// What the claimed steps need, when the claim read it (PostgreSQL: in the claiming
    /// statement); `None` leaves it to [`Store::step_inputs`].
    pub inputs: Option<super::StepInputs>,
}

impl ResourceClaim {
    fn wait(ms: i64) -> Self {
        Self {
            retry_in_ms: Some(u64::try_from(ms).unwrap_or(1).max(1)),
            ..Self::default()
        }
    }
}

/// The stored limits and state of one resource, as its claim reads them.
struct Stored {
    limits: ResourceLimits,
    tat_us: i64,
    /// The compensations' own rate limiter, when a share splits the rate.
    comp_tat_us: i64,
    now_ms: i64,
    batch_count: i64,
    batch_resume_at: i64,
    breaker: BreakerStatus,
}

/// The attempts of one resource that ended in a completion batch, for its breaker: how many
/// succeeded, how many failed, and how many of the failures came after the batch's last
/// success (the failures in a row it leaves).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceOutcomes {
    /// The resource.
    pub resource: String,
    /// Attempts that succeeded (or were answered definitively).
    pub succeeded: i64,
    /// Attempts that failed in a way that speaks of the remote's health.
    pub failed: i64,
    /// Failures after the last success.
    pub trailing_failures: i64,
}

/// The columns of a resource's breaker, in [`breaker_of`]'s order.
const BREAKER_COLS: &str = "breaker_state, breaker_since, breaker_opened_at, breaker_consecutive, \
     breaker_calls, breaker_failed, breaker_window_at";

fn breaker_of(name: &str, r: &Row) -> Result<BreakerStatus> {
    let state: String = r.try_get("", "breaker_state")?;
    Ok(BreakerStatus {
        state: BreakerState::parse(&state).ok_or_else(|| Error::CorruptRow {
            table: "sagaflow_resources",
            id: name.to_owned(),
            reason: format!("breaker_state: unknown state `{state}`"),
        })?,
        since_ms: r.try_get("", "breaker_since")?,
        opened_at_ms: r.try_get("", "breaker_opened_at")?,
        consecutive_failures: r.try_get("", "breaker_consecutive")?,
        window_calls: r.try_get("", "breaker_calls")?,
        window_failed: r.try_get("", "breaker_failed")?,
        window_at_ms: r.try_get("", "breaker_window_at")?,
    })
}

fn limits_of(name: &str, column: &str, json: &str) -> Result<ResourceLimits> {
    serde_json::from_str::<ResourceLimits>(json)
        .map_err(|e| e.to_string())
        .and_then(|l| l.check().map(|()| l))
        .map_err(|e| Error::CorruptRow {
            table: "sagaflow_resources",
            id: name.to_owned(),
            reason: format!("{column}: {e}"),
        })
}

impl Store {
    /// Writes the limits the application's code declares for each resource (its defaults),
    /// leaving an operator's override and the rate limiter's state alone.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn resources_publish(&self, resources: &[Resource]) -> Result<()> {
        if resources.is_empty() {
            return Ok(());
        }
        // In name order: engines starting at once lock the rows in the same order.
        let mut ordered: Vec<&Resource> = resources.iter().collect();
        ordered.sort_by(|a, b| a.name().cmp(b.name()));
        let txn = self.exec.begin().await?;
        for r in ordered {
            let defaults =
                serde_json::to_string(r.limits()).map_err(|e| Error::Config(e.to_string()))?;
            // Completions count outcomes for the breaker of the limits in force: the code's,
            // unless an operator's override stands.
            txn.execute(self.stmt(
                "INSERT INTO sagaflow_resources (name, defaults, tat_us, updated_at, breaker_on) \
                 VALUES ($1, $2, 0, {now}, $3) \
                 ON CONFLICT (name) DO UPDATE SET defaults = excluded.defaults, updated_at = {now}, \
                   breaker_on = CASE WHEN sagaflow_resources.override IS NULL \
                     THEN excluded.breaker_on ELSE sagaflow_resources.breaker_on END",
                vec![
                    r.name().to_owned().into(),
                    defaults.into(),
                    r.limits().breaker.is_some().into(),
                ],
            ))
            .await?;
        }
        txn.commit().await?;
        Ok(())
    }

    /// Sets (`Some`) or clears (`None`) the operator's override of a resource's limits,
    /// recording who and why. `false` when no such resource is stored.
    ///
    /// # Errors
    /// [`Error::Config`] for limits that [`ResourceLimits::check`] refuses; [`Error::Db`].
    pub async fn resource_override(
        &self,
        name: &str,
        limits: Option<ResourceLimits>,
        actor: &str,
        reason: &str,
    ) -> Result<bool> {
        let cleared = limits.is_none();
        let json = match &limits {
            Some(l) => {
                l.check()
                    .map_err(|e| Error::Config(format!("resource `{name}`: {e}")))?;
                Some(serde_json::to_string(l).map_err(|e| Error::Config(e.to_string()))?)
            }
            None => None,
        };
        // Whether the limits in force afterwards have a breaker: the override's, or on
        // clearing, the code's, read in the statement from their JSON (which names the key
        // `"breaker"` only when there is one: the engine writes it, and no other field can
        // hold that text).
        let breaker_on = limits.as_ref().map(|l| l.breaker.is_some());
        let (by, why) = if json.is_some() {
            (Some(actor.to_owned()), Some(reason.to_owned()))
        } else {
            (None, None)
        };
        let done = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_resources SET override = $2, override_by = $3, \
                 override_reason = $4, updated_at = {now}, \
                 breaker_on = COALESCE($5, defaults LIKE '%\"breaker\"%') WHERE name = $1",
                vec![
                    name.to_owned().into(),
                    json.into(),
                    by.into(),
                    why.into(),
                    breaker_on.into(),
                ],
            ))
            .await?;
        if done > 0 {
            tracing::info!(
                resource = name,
                actor,
                reason,
                cleared,
                "resource limits changed"
            );
        }
        Ok(done > 0)
    }

    /// Every stored resource with its limits and its load now, by name.
    ///
    /// # Errors
    /// [`Error::Db`]; a row whose limits cannot be read is left out and logged.
    pub async fn resource_list(&self) -> Result<Vec<ResourceView>> {
        let sql = "SELECT r.name, r.defaults, r.override, r.override_by, r.override_reason, \
               r.breaker_state, r.breaker_since, r.breaker_opened_at, r.breaker_consecutive, \
               r.breaker_calls, r.breaker_failed, r.breaker_window_at, \
               CASE WHEN r.batch_resume_at > {now} THEN r.batch_resume_at END AS batch_resume_at, \
               (SELECT COUNT(*) FROM sagaflow_steps s WHERE s.resource = r.name \
                 AND s.state IN ('running', 'compensating') AND s.resource IS NOT NULL) AS in_flight, \
               (SELECT COUNT(*) FROM sagaflow_steps s WHERE s.resource = r.name \
                 AND s.state IN ('running', 'compensating') AND s.resource IS NOT NULL \
                 AND s.state = 'compensating') AS undo_in_flight, \
               (SELECT COUNT(*) FROM sagaflow_steps s WHERE s.resource = r.name \
                 AND s.state IN ('ready', 'compensation_ready') AND s.resource IS NOT NULL \
                 AND s.available_at <= {now}) AS waiting, \
               (SELECT COUNT(*) FROM sagaflow_steps s WHERE s.resource = r.name \
                 AND s.state = 'compensation_ready' AND s.resource IS NOT NULL \
                 AND s.available_at <= {now}) AS undo_waiting \
             FROM sagaflow_resources r ORDER BY r.name";
        let rows = self.exec.query_all(self.stmt(sql, vec![])).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            match view(r) {
                Ok(v) => out.push(v),
                Err(e) => tracing::error!(error = %e, "a resource row cannot be read; left out"),
            }
        }
        Ok(out)
    }

    /// Claims up to `ask.limit` due steps of resource `ask.resource` (of the given workflow
    /// keys) for `ask.owner`, within the resource's limits, in one transaction that holds the resource's
    /// row: instances claiming for the same resource take turns, so a limit holds across a
    /// fleet. Attempts in flight are counted from the running steps; per-key limits serve
    /// the keys with the fewest attempts in flight first; the rate limiter's state is written
    /// back with the claim.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`] when the resource's stored limits cannot be read
    /// (its steps then wait; other resources are not concerned).
    pub async fn resource_claim(
        &self,
        ask: &ResourceAsk<'_>,
        needs_outputs: &(dyn Fn(&ClaimedStep) -> bool + Sync),
    ) -> Result<ResourceClaim> {
        let ResourceAsk {
            owner,
            resource: name,
            workflow_keys,
            limit,
            busy,
        } = *ask;
        // A resource whose last claim took steps is likely busy still: no probe first.
        if workflow_keys.is_empty() || limit == 0 || (!busy && !self.resource_has_due(name).await?)
        {
            return Ok(ResourceClaim::default());
        }
        let txn = self.exec.begin().await?;
        let result = self
            .resource_claim_in(&txn, owner, name, workflow_keys, limit, needs_outputs)
            .await;
        if matches!(&result, Ok((c, _)) if !c.claimed.is_empty()) {
            self.pause_point(Unit::Claim, Point::BeforeCommit).await;
        }
        // Kept when it claimed or moved the breaker; otherwise it changed nothing.
        let kept = txn
            .end(result, |(c, dirty)| *dirty || !c.claimed.is_empty())
            .await?;
        Ok(kept.0)
    }

    /// The claim itself; also says whether it changed the resource's state (its breaker
    /// moved), which is then committed even when nothing was claimed.
    async fn resource_claim_in(
        &self,
        txn: &super::conn::Txn,
        owner: &str,
        name: &str,
        workflow_keys: &[String],
        limit: u32,
        needs_outputs: &(dyn Fn(&ClaimedStep) -> bool + Sync),
    ) -> Result<(ResourceClaim, bool)> {
        let Some(stored) = self.resource_lock(txn, name).await? else {
            return Ok((ResourceClaim::default(), false));
        };
        let (limits, now_ms) = (&stored.limits, stored.now_ms);
        let corrupt = |reason: String| Error::CorruptRow {
            table: "sagaflow_resources",
            id: name.to_owned(),
            reason,
        };
        if let Some(w) = &limits.windows
            && let WindowGate::ClosedFor(ms) = w.gate(now_ms).map_err(corrupt)?
        {
            return Ok((ResourceClaim::wait(ms), false));
        }
        let mut dirty = false;
        let mut probe = false;
        if let Some(b) = &limits.breaker {
            let (next, gate) = b.decide(&stored.breaker, now_ms);
            if next != stored.breaker {
                self.breaker_write(txn, name, &stored.breaker, &next)
                    .await?;
                dirty = true;
            }
            match gate {
                BreakerGate::Wait(ms) => return Ok((ResourceClaim::wait(ms), dirty)),
                BreakerGate::Probe => probe = true,
                BreakerGate::Pass => {}
            }
        }
        let mut room = limit;
        if let Some(batch) = limits.batch {
            if stored.batch_resume_at > now_ms {
                return Ok((ResourceClaim::wait(stored.batch_resume_at - now_ms), dirty));
            }
            let left = i64::from(batch.size)
                .saturating_sub(stored.batch_count)
                .max(1);
            room = room.min(u32::try_from(left).unwrap_or(u32::MAX));
        }
        let lanes = limits.lanes();
        let running = if limits.max_in_flight.is_some() || probe {
            self.resource_running(txn, name).await?
        } else {
            Running::default()
        };
        // Half-open: one probe, once nothing of the resource is in flight.
        if probe {
            room = room.min(u32::from(running.total() == 0));
        }
        // Each kind's room where a compensation share splits a limit; the shared room
        // (`room`) bounds both kinds together.
        let (mut forward_room, mut undo_room) = (u32::MAX, u32::MAX);
        if let Some(max) = limits.max_in_flight {
            match lanes.and_then(|(f, c)| f.max_in_flight.zip(c.max_in_flight)) {
                Some((f, c)) => {
                    forward_room = f.saturating_sub(running.forward);
                    undo_room = c.saturating_sub(running.compensations);
                }
                None => room = room.min(max.saturating_sub(running.total())),
            }
        }
        let now_us = now_ms.saturating_mul(1000);
        let mut retry_in_ms: Option<u64> = None;
        let mut wait_for = |wait_us: i64| {
            let ms = u64::try_from((wait_us + 999) / 1000).unwrap_or(1).max(1);
            retry_in_ms = Some(retry_in_ms.map_or(ms, |r| r.min(ms)));
        };
        let split_rate = lanes.and_then(|(f, c)| f.rate.zip(c.rate));
        match (limits.rate, split_rate) {
            (Some(_), Some((f, c))) => {
                let (allowed, wait_us) = f.allowance(stored.tat_us, now_us);
                if allowed == 0 {
                    wait_for(wait_us);
                }
                forward_room = forward_room.min(allowed);
                let (allowed, wait_us) = c.allowance(stored.comp_tat_us, now_us);
                if allowed == 0 {
                    wait_for(wait_us);
                }
                undo_room = undo_room.min(allowed);
            }
            (Some(rate), None) => {
                let (allowed, wait_us) = rate.allowance(stored.tat_us, now_us);
                if allowed == 0 {
                    wait_for(wait_us);
                }
                room = room.min(allowed);
            }
            (None, _) => {}
        }
        if room == 0 || (forward_room == 0 && undo_room == 0) {
            return Ok((
                ResourceClaim {
                    retry_in_ms,
                    ..ResourceClaim::default()
                },
                dirty,
            ));
        }
        let due = if lanes.is_some() {
            // Compensations first, from their own index, so that forward steps queued before
            // them never hide them; then forward steps in what room is left.
            let mut picked = Picked::default();
            self.resource_due_kind(
                txn,
                name,
                workflow_keys,
                Kind::Undo,
                room.min(undo_room),
                limits,
                &mut picked,
            )
            .await?;
            let left = room.saturating_sub(u32::try_from(picked.due.len()).unwrap_or(u32::MAX));
            self.resource_due_kind(
                txn,
                name,
                workflow_keys,
                Kind::Forward,
                left.min(forward_room),
                limits,
                &mut picked,
            )
            .await?;
            picked.due
        } else {
            let mut picked = Picked::default();
            self.resource_due_kind(
                txn,
                name,
                workflow_keys,
                Kind::Any,
                room,
                limits,
                &mut picked,
            )
            .await?;
            picked.due
        };
        let (claimed, inputs) = match self.backend {
            Backend::Postgres => {
                let (c, i) = self
                    .claim_by_ids_with_inputs(txn, owner, &due, needs_outputs)
                    .await?;
                (c, Some(i))
            }
            Backend::Sqlite => (self.claim_by_ids(txn, owner, &due).await?, None),
        };
        if !claimed.is_empty() {
            let count = |undo: bool| {
                let n = claimed
                    .iter()
                    .filter(|c| (c.state == StepState::Compensating) == undo)
                    .count();
                u32::try_from(n).unwrap_or(u32::MAX)
            };
            let n = u32::try_from(claimed.len()).unwrap_or(u32::MAX);
            let (tat, comp_tat) = match (limits.rate, split_rate) {
                (Some(_), Some((f, c))) => (
                    f.advance(stored.tat_us, now_us, count(false)),
                    c.advance(stored.comp_tat_us, now_us, count(true)),
                ),
                (Some(rate), None) => (rate.advance(stored.tat_us, now_us, n), stored.comp_tat_us),
                (None, _) => (stored.tat_us, stored.comp_tat_us),
            };
            let (count, resume_at) = match limits.batch {
                Some(b) if stored.batch_count + i64::from(n) >= i64::from(b.size) => (
                    0,
                    now_ms.saturating_add(i64::try_from(b.pause_ms).unwrap_or(i64::MAX)),
                ),
                Some(_) => (stored.batch_count + i64::from(n), stored.batch_resume_at),
                None => (stored.batch_count, stored.batch_resume_at),
            };
            if limits.rate.is_some() || limits.batch.is_some() {
                txn.execute(self.stmt(
                    "UPDATE sagaflow_resources SET tat_us = $2, batch_count = $3, \
                     batch_resume_at = $4, comp_tat_us = $5 WHERE name = $1",
                    vec![
                        name.to_owned().into(),
                        tat.into(),
                        count.into(),
                        resume_at.into(),
                        comp_tat.into(),
                    ],
                ))
                .await?;
            }
            if probe {
                tracing::info!(resource = name, "circuit breaker half-open: one probe sent");
            }
        }
        Ok((
            ResourceClaim {
                claimed,
                retry_in_ms,
                inputs,
            },
            dirty,
        ))
    }

    /// Writes a breaker's new state, saying so in the log when it opens or closes.
    async fn breaker_write(
        &self,
        txn: &super::conn::Txn,
        name: &str,
        before: &BreakerStatus,
        b: &BreakerStatus,
    ) -> Result<()> {
        txn.execute(self.stmt(
            "UPDATE sagaflow_resources SET breaker_state = $2, breaker_since = $3, \
             breaker_opened_at = $4, breaker_consecutive = $5, breaker_calls = $6, \
             breaker_failed = $7, breaker_window_at = $8 WHERE name = $1",
            vec![
                name.to_owned().into(),
                b.state.as_str().into(),
                b.since_ms.into(),
                b.opened_at_ms.into(),
                b.consecutive_failures.into(),
                b.window_calls.into(),
                b.window_failed.into(),
                b.window_at_ms.into(),
            ],
        ))
        .await?;
        match (before.state, b.state) {
            (BreakerState::Closed | BreakerState::HalfOpen, BreakerState::Open) => {
                tracing::warn!(
                    resource = name,
                    consecutive_failures = before.consecutive_failures,
                    window_calls = before.window_calls,
                    window_failed = before.window_failed,
                    "circuit breaker opened: the resource's steps wait for the cool-down"
                );
            }
            (BreakerState::HalfOpen, BreakerState::Closed) => {
                tracing::info!(
                    resource = name,
                    "circuit breaker closed: the probe succeeded"
                );
            }
            _ => {}
        }
        Ok(())
    }

    /// Adds the outcomes of ended attempts to the counters of their resources' breakers, in
    /// the transaction that writes the attempts' ends. A resource whose limits in force have
    /// no breaker is not written (the statement matches no row, and locks none).
    pub(crate) async fn resource_outcomes<C: Exec>(
        &self,
        conn: &C,
        outcomes: &[ResourceOutcomes],
    ) -> Result<()> {
        for o in outcomes {
            conn.execute(self.stmt(
                "UPDATE sagaflow_resources SET \
                   breaker_consecutive = CASE WHEN $2 > 0 THEN $4 ELSE breaker_consecutive + $3 END, \
                   breaker_calls = breaker_calls + $2 + $3, breaker_failed = breaker_failed + $3 \
                 WHERE name = $1 AND breaker_on",
                vec![
                    o.resource.clone().into(),
                    o.succeeded.into(),
                    o.failed.into(),
                    o.trailing_failures.into(),
                ],
            ))
            .await?;
        }
        Ok(())
    }

    /// Whether a step of the resource is due: one entry of its index, read without a lock, so
    /// that an idle resource costs its claim loop no transaction (and, on SQLite, no write
    /// lock). A step that falls due just after is taken by the next pass.
    async fn resource_has_due(&self, name: &str) -> Result<bool> {
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT id FROM sagaflow_steps \
                 WHERE resource = $1 AND state IN ('ready', 'compensation_ready') \
                   AND resource IS NOT NULL AND available_at <= {now} LIMIT 1",
                vec![name.to_owned().into()],
            ))
            .await?;
        Ok(row.is_some())
    }

    /// Reads a resource's limits, locking its row until the transaction ends (PostgreSQL;
    /// an SQLite transaction holds the file's write lock already).
    async fn resource_lock(&self, txn: &super::conn::Txn, name: &str) -> Result<Option<Stored>> {
        let lock = self.dialect().row_lock;
        let sql = format!(
            "SELECT defaults, override, tat_us, comp_tat_us, batch_count, batch_resume_at, {BREAKER_COLS}, \
               {{now}} AS db_now FROM sagaflow_resources WHERE name = $1{lock}"
        );
        let Some(r) = txn
            .query_one(self.stmt(&sql, vec![name.to_owned().into()]))
            .await?
        else {
            return Ok(None);
        };
        let limits = match r.try_get::<Option<String>>("", "override")? {
            Some(o) => limits_of(name, "override", &o)?,
            None => limits_of(name, "defaults", &r.try_get::<String>("", "defaults")?)?,
        };
        Ok(Some(Stored {
            limits,
            tat_us: r.try_get("", "tat_us")?,
            comp_tat_us: r.try_get("", "comp_tat_us")?,
            now_ms: r.try_get("", "db_now")?,
            batch_count: r.try_get("", "batch_count")?,
            batch_resume_at: r.try_get("", "batch_resume_at")?,
            breaker: breaker_of(name, &r)?,
        }))
    }

    /// Attempts of the resource's steps in flight, whoever runs them, by kind.
    async fn resource_running(&self, txn: &super::conn::Txn, name: &str) -> Result<Running> {
        let rows = txn
            .query_all(self.stmt(
                "SELECT state, COUNT(*) AS n FROM sagaflow_steps \
                 WHERE resource = $1 AND state IN ('running', 'compensating') AND resource IS NOT NULL \
                 GROUP BY state",
                vec![name.to_owned().into()],
            ))
            .await?;
        let mut running = Running::default();
        for r in rows {
            let n = u32::try_from(r.try_get::<i64>("", "n")?).unwrap_or(u32::MAX);
            if r.try_get::<String>("", "state")? == "compensating" {
                running.compensations = n;
            } else {
                running.forward = n;
            }
        }
        Ok(running)
    }

    /// Adds to `picked` up to `room` due steps of the resource of one kind, in claim order;
    /// under a per-key limit, shared fairly between flow keys ([`Store::resource_due_fair`]),
    /// counting what `picked` holds already.
    #[allow(clippy::too_many_arguments)] // one call per kind, from the claim alone
    async fn resource_due_kind(
        &self,
        txn: &super::conn::Txn,
        name: &str,
        workflow_keys: &[String],
        kind: Kind,
        room: u32,
        limits: &ResourceLimits,
        picked: &mut Picked,
    ) -> Result<()> {
        if room == 0 {
            return Ok(());
        }
        match limits.max_in_flight_per_key {
            None => {
                self.resource_due(txn, name, workflow_keys, kind, room, picked)
                    .await
            }
            Some(per_key) => {
                if picked.load.is_none() {
                    picked.load = Some(self.resource_running_per_key(txn, name).await?);
                }
                self.resource_due_fair(txn, name, workflow_keys, kind, room, per_key, picked)
                    .await
            }
        }
    }

    /// Up to `room` due steps of the resource of one kind in claim order, with when they fell
    /// due.
    async fn resource_due(
        &self,
        txn: &super::conn::Txn,
        name: &str,
        workflow_keys: &[String],
        kind: Kind,
        room: u32,
        picked: &mut Picked,
    ) -> Result<()> {
        let sql = format!(
            "SELECT id, available_at FROM sagaflow_steps \
             WHERE resource = $1 AND {states} AND resource IS NOT NULL \
               AND available_at <= {{now}} AND workflow_key IN ({keys}) \
             ORDER BY priority DESC, available_at LIMIT $2",
            states = kind.due_states(),
            keys = placeholders(3, workflow_keys.len()),
        );
        let mut values: Vec<Value> = vec![name.to_owned().into(), i64::from(room).into()];
        values.extend(workflow_keys.iter().map(|k| Value::from(k.clone())));
        for r in txn.query_all(self.stmt(&sql, values)).await? {
            picked
                .due
                .insert(r.try_get("", "id")?, r.try_get("", "available_at")?);
        }
        Ok(())
    }

    /// Attempts of the resource in flight per flow key.
    async fn resource_running_per_key(
        &self,
        txn: &super::conn::Txn,
        name: &str,
    ) -> Result<HashMap<Option<String>, i64>> {
        let mut running = HashMap::new();
        for r in txn
            .query_all(self.stmt(
                "SELECT flow_key, COUNT(*) AS n FROM sagaflow_steps \
                 WHERE resource = $1 AND state IN ('running', 'compensating') AND resource IS NOT NULL \
                 GROUP BY flow_key",
                vec![name.to_owned().into()],
            ))
            .await?
        {
            running.insert(r.try_get("", "flow_key")?, r.try_get("", "n")?);
        }
        Ok(running)
    }

    /// Up to `room` due steps of the resource of one kind, at most `per_key` in flight per
    /// flow key, shared fairly: the next step of the key with the fewest attempts in flight
    /// (counting those taken by this claim) goes first; among equals, the claim order
    /// (priority, then when due). Reads the due steps of the resource up to `per_key` per
    /// key, ranked per key by a window function.
    #[allow(clippy::too_many_arguments)] // the claim's own helper
    async fn resource_due_fair(
        &self,
        txn: &super::conn::Txn,
        name: &str,
        workflow_keys: &[String],
        kind: Kind,
        room: u32,
        per_key: u32,
        picked: &mut Picked,
    ) -> Result<()> {
        let sql = format!(
            "SELECT id, flow_key, available_at, priority, rn FROM ( \
               SELECT id, flow_key, available_at, priority, \
                 ROW_NUMBER() OVER (PARTITION BY flow_key ORDER BY priority DESC, available_at, id) AS rn \
               FROM sagaflow_steps \
               WHERE resource = $1 AND {states} AND resource IS NOT NULL \
                 AND available_at <= {{now}} AND workflow_key IN ({keys})) AS ranked \
             WHERE rn <= $2",
            states = kind.due_states(),
            keys = placeholders(3, workflow_keys.len()),
        );
        let mut values: Vec<Value> = vec![name.to_owned().into(), i64::from(per_key).into()];
        values.extend(workflow_keys.iter().map(|k| Value::from(k.clone())));
        let load = picked.load.get_or_insert_with(HashMap::new);
        // (load of its key once taken, priority, due time, id, key)
        let mut candidates: Vec<(i64, i32, i64, i64, Option<String>)> = Vec::new();
        for r in txn.query_all(self.stmt(&sql, values)).await? {
            let key: Option<String> = r.try_get("", "flow_key")?;
            let rn: i64 = r.try_get("", "rn")?;
            let key_load = load.get(&key).copied().unwrap_or(0) + rn;
            if key_load <= i64::from(per_key) {
                candidates.push((
                    key_load,
                    r.try_get("", "priority")?,
                    r.try_get("", "available_at")?,
                    r.try_get("", "id")?,
                    key,
                ));
            }
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        for (_, _, due, id, key) in candidates.into_iter().take(room as usize) {
            *load.entry(key).or_insert(0) += 1;
            picked.due.insert(id, due);
        }
        Ok(())
    }
}

/// The kinds of attempt a claim reads due steps of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Forward and compensation attempts alike, in one claim order (no share).
    Any,
    /// Forward attempts.
    Forward,
    /// Compensation attempts (through `sagaflow_steps_resource_undo`).
    Undo,
}

impl Kind {
    fn due_states(self) -> &'static str {
        match self {
            Self::Any => "state IN ('ready', 'compensation_ready')",
            Self::Forward => "state = 'ready'",
            Self::Undo => "state = 'compensation_ready'",
        }
    }
}

/// A resource's attempts in flight, by kind.
#[derive(Debug, Clone, Copy, Default)]
struct Running {
    forward: u32,
    compensations: u32,
}

impl Running {
    fn total(self) -> u32 {
        self.forward.saturating_add(self.compensations)
    }
}

/// What one claim picked so far: the due steps with when they fell due, and, under a per-key
/// limit, the attempts each flow key has in flight counting the picks.
#[derive(Debug, Default)]
struct Picked {
    due: HashMap<i64, i64>,
    load: Option<HashMap<Option<String>, i64>>,
}

fn view(r: &Row) -> Result<ResourceView> {
    let name: String = r.try_get("", "name")?;
    let defaults = limits_of(&name, "defaults", &r.try_get::<String>("", "defaults")?)?;
    let override_limits = r
        .try_get::<Option<String>>("", "override")?
        .map(|o| limits_of(&name, "override", &o))
        .transpose()?;
    let limits = override_limits.clone().unwrap_or_else(|| defaults.clone());
    // The state a breaker left when the limits in force lost it is not in force either: no
    // claim reads it (it is where a breaker put back later starts from).
    let breaker = match limits.breaker {
        Some(_) => breaker_of(&name, r)?,
        None => BreakerStatus::default(),
    };
    Ok(ResourceView {
        limits,
        defaults,
        override_limits,
        override_by: r.try_get("", "override_by")?,
        override_reason: r.try_get("", "override_reason")?,
        in_flight: r.try_get("", "in_flight")?,
        compensations_in_flight: r.try_get("", "undo_in_flight")?,
        waiting: r.try_get("", "waiting")?,
        compensations_waiting: r.try_get("", "undo_waiting")?,
        breaker,
        batch_resume_at_ms: r.try_get("", "batch_resume_at")?,
        name,
    })
}

impl super::StoreTx<'_> {
    /// Adds ended attempts' outcomes to their resources' breakers (see
    /// [`ResourceOutcomes`]), in this unit of work.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn resource_outcomes(&self, outcomes: &[ResourceOutcomes]) -> Result<()> {
        self.store.resource_outcomes(&self.txn, outcomes).await
    }
}
