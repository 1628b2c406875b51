//! Parked steps in storage: what a park writes after its attempt's end (a kept event
//! consumed, a child run started), events and callbacks delivered to waiting steps, the
//! leader's timer pass, and the wake of a parent's step when its child run ends. The units
//! of work that deliver (send an event, complete a callback, the timer pass) are the
//! engine's `deliver` module: they lock, call these, and commit.
//!
//! Every wake is the step rule `waiting --woken--> ready`: the step is due at once (or
//! parked, when its run is paused: the run's resume makes it due) and its next attempt reads
//! what woke it from its `wait` column. Deliveries lock the run first, as completion batches
//! do, so an event and the park that would consume it are serialised.

use sea_orm::Value;
use uuid::Uuid;

use super::Store;
use super::intake::{NewRun, RunInsertOutcome};
use super::row::Exec;
use super::tx::{HistoryEntry, StoreTx};
pub use crate::transition::writes::Park;
use crate::transition::{Trigger, step_rule};
use crate::wait::{WaitFor, WaitState, Woken};
use crate::{Error, Result, RunState, StepState};

/// What sending an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventDelivery {
    /// A waiting step took it and is due again.
    Delivered {
        /// The run.
        run_id: Uuid,
        /// The step that waited for it.
        step: String,
    },
    /// No step waits for it yet: it is kept for the first step of the run that will.
    Kept {
        /// The run.
        run_id: Uuid,
    },
}

impl EventDelivery {
    /// The run the event went to.
    pub fn run_id(&self) -> Uuid {
        match self {
            Self::Delivered { run_id, .. } | Self::Kept { run_id } => *run_id,
        }
    }
}

/// A waiting step as operators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitingStep {
    /// The run.
    pub run_id: Uuid,
    /// The step.
    pub step: String,
    /// What it waits for.
    pub wait: WaitState,
    /// When its time comes (epoch ms, database clock), if it is parked with one.
    pub due_at: Option<i64>,
}

/// The SQL that wakes one waiting step (`$1` its id, `$2` its new `wait`): due at once
/// unless its run is paused.
/// Whether a callback token (its hash `$1`, its run `$2`) is live: a step of the run holds
/// it while its attempt runs or waits, and no callback with it is kept yet (`$3`, the
/// event's name). A token is spent once its callback is kept or wakes its step (the wake
/// clears `wait_key`), so a replay is refused even while the resumed attempt runs.
const LIVE_CALLBACK: &str = "SELECT id FROM sagaflow_steps WHERE wait_key = $1 AND run_id = $2 \
     AND state IN ('running', 'waiting') AND NOT EXISTS (SELECT 1 FROM sagaflow_events e \
     WHERE e.run_id = $2 AND e.name = $3 AND e.consumed_at IS NULL)";

/// The `sagaflow_secrets` row of the key that signs callback tokens.
const CALLBACK_KEY: &str = "callback_mac";

fn corrupt_key(why: &str) -> Error {
    Error::CorruptRow {
        table: "sagaflow_secrets",
        id: CALLBACK_KEY.to_owned(),
        reason: format!("the callback key is unusable: {why}"),
    }
}

/// Wakes a waiting step (`$1`) with its new wait state (`$2`). Its `wait_key` is cleared: a
/// callback token is spent once it woke its step.
fn wake_sql() -> String {
    let to = step_rule(StepState::Waiting, Trigger::Woken).map_or(StepState::Ready, |r| r.to);
    format!(
        "UPDATE sagaflow_steps SET state = '{to}', wait = $2, wait_key = NULL, updated_at = {{now}}, \
           available_at = CASE WHEN EXISTS (SELECT 1 FROM sagaflow_runs r \
             WHERE r.id = sagaflow_steps.run_id AND r.state = 'paused') THEN NULL ELSE {{now}} END, \
           aging_from = {{now}} \
         WHERE id = $1 AND state = 'waiting'"
    )
}

impl StoreTx<'_> {
    /// What follows the parks a completion batch wrote: a child step's child run is started
    /// (once: its business key is `<parent run>:<step>`) and linked to the step; an event
    /// wait consumes the oldest event of its name kept for the run, and is woken at once.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn parks_follow_up(&mut self, parks: &[Park], actor: &str) -> Result<()> {
        for p in parks {
            match &p.request.on {
                WaitFor::Event { name } => {
                    if let Some((event_id, payload)) = self.take_kept_event(p.run_id, name).await? {
                        let wait = WaitState {
                            on: p.request.on.clone(),
                            timeout_ms: p.request.timeout_ms,
                            woken: Some(Woken::Event { payload }),
                        };
                        if self
                            .wake(p.run_id, p.step_id, &p.step, &wait, actor)
                            .await?
                        {
                            self.event_consumed(event_id, p.step_id).await?;
                        }
                    }
                }
                WaitFor::Child { .. } => {
                    if let Some(child) = &p.child {
                        self.start_child(p, child, actor).await?;
                    }
                }
                WaitFor::Timer => {}
            }
        }
        Ok(())
    }

    async fn start_child(&mut self, p: &Park, child: &NewRun, actor: &str) -> Result<()> {
        let s = self.store;
        let id = match s.run_insert(&self.txn, child).await? {
            RunInsertOutcome::Inserted(id) => {
                self.history.push(HistoryEntry {
                    run_id: id,
                    step: None,
                    event: "child_started".into(),
                    from: None,
                    to: Some(child.initial_state().as_str().into()),
                    attempt: None,
                    actor: actor.into(),
                    detail: Some(
                        serde_json::json!({"parent_run": p.run_id, "parent_step": p.step})
                            .to_string(),
                    ),
                });
                self.notify = true;
                id
            }
            RunInsertOutcome::Duplicate { existing, .. } => existing,
        };
        // The link, written only where it is not already there: a child an earlier attempt
        // of the step started is linked to it, and is then neither written nor locked (its
        // run is not this unit's, and a unit ending it may be waiting for this step).
        let sql = "UPDATE sagaflow_runs SET parent_step = $1 WHERE id = $2 \
                   AND (parent_step IS NULL OR parent_step <> $1)";
        self.txn
            .execute(s.stmt(sql, vec![p.step_id.into(), id.into()]))
            .await?;
        let wait = WaitState {
            on: WaitFor::Child {
                run_id: id,
                workflow: child.workflow.clone(),
            },
            timeout_ms: p.request.timeout_ms,
            woken: None,
        };
        let sql = "UPDATE sagaflow_steps SET wait = $1, wait_key = $2 WHERE id = $3";
        let values = vec![
            wait.to_json().into(),
            format!("child:{id}").into(),
            p.step_id.into(),
        ];
        self.txn.execute(s.stmt(sql, values)).await?;
        // The child may have ended already (an earlier attempt started it): wake at once.
        // (Read through the view: a run that held the child's key and finished before any
        // parent claimed it has left the runs table on PostgreSQL.)
        let row = self
            .txn
            .query_one(s.stmt(
                "SELECT state, output FROM sagaflow_runs_all WHERE id = $1",
                vec![id.into()],
            ))
            .await?;
        if let Some(r) = row {
            let state: String = r.try_get("", "state")?;
            let output: Option<String> = r.try_get("", "output")?;
            if let Ok(state) = state.parse::<RunState>()
                && state.is_final()
            {
                let woken = child_woken(state, output.as_deref());
                let wait = WaitState {
                    woken: Some(woken),
                    ..wait
                };
                self.wake(p.run_id, p.step_id, &p.step, &wait, actor)
                    .await?;
            }
        }
        Ok(())
    }

    /// The oldest event named `name` kept for `run`, if any.
    async fn take_kept_event(
        &self,
        run: Uuid,
        name: &str,
    ) -> Result<Option<(i64, serde_json::Value)>> {
        let s = self.store;
        let row = self
            .txn
            .query_one(s.stmt(
                "SELECT id, payload FROM sagaflow_events \
                 WHERE run_id = $1 AND name = $2 AND consumed_at IS NULL ORDER BY id LIMIT 1",
                vec![run.into(), name.to_owned().into()],
            ))
            .await?;
        let Some(r) = row else { return Ok(None) };
        let id: i64 = r.try_get("", "id")?;
        let raw: String = r.try_get("", "payload")?;
        let payload = serde_json::from_str(&raw)
            .map_err(|e| Error::corrupt("sagaflow_events", id, format!("payload: {e}")))?;
        Ok(Some((id, payload)))
    }

    async fn event_consumed(&self, event_id: i64, step_id: i64) -> Result<()> {
        let s = self.store;
        self.txn
            .execute(s.stmt(
                "UPDATE sagaflow_events SET consumed_at = {now}, step_id = $2 WHERE id = $1",
                vec![event_id.into(), step_id.into()],
            ))
            .await?;
        Ok(())
    }

    /// Wakes one waiting step with `wait` (what woke it); returns whether it was waiting.
    ///
    /// Whether the run is paused decides when the step is due, and the wake reads it in its
    /// statement. The caller holds the run (the unit of work that parked the step) or, on
    /// PostgreSQL, the step itself, locked by an earlier statement (a child's end,
    /// [`StoreTx::wake_parents`]): an operator's pause or resume, which locks the run's
    /// steps, has then committed before the wake's statement begins, or waits for the wake.
    /// (A wake that waited for the step's lock within its own statement would read the run
    /// as it was when the statement began, and a resume that committed meanwhile would
    /// leave the step ready but never due.)
    async fn wake(
        &mut self,
        run: Uuid,
        step_id: i64,
        step: &str,
        wait: &WaitState,
        actor: &str,
    ) -> Result<bool> {
        let s = self.store;
        let values = vec![step_id.into(), wait.to_json().into()];
        let n = self.txn.execute(s.stmt(&wake_sql(), values)).await?;
        if n == 0 {
            return Ok(false);
        }
        self.history.push(HistoryEntry {
            run_id: run,
            step: Some(step.to_owned()),
            event: Trigger::Woken.as_str().into(),
            from: Some(StepState::Waiting.as_str().into()),
            to: Some(StepState::Ready.as_str().into()),
            attempt: None,
            actor: actor.into(),
            detail: Some(woken_detail(wait)),
        });
        self.notify = true;
        Ok(true)
    }

    /// After runs finished (`finished`, with their new states and outputs): the steps of
    /// their parents that waited for them are woken, and the completed children among them
    /// are returned, whose steps are kept (their parent may yet compensate them).
    ///
    /// On PostgreSQL the parents' steps are read again under a lock (`FOR UPDATE`, in id
    /// order), so that a child's end and its parent's end meet there: a parent that ended
    /// first has taken its steps with it, and the child finds its step gone (an orphan,
    /// which moves as it is); a child that ends first holds up the parent's end, which locks
    /// its steps before it plans and then reads the child final ([`StoreTx::steps_leave`]).
    /// Read as of the statement's start, each would see the other as it was, and the child
    /// stayed behind. The lock is already held when the unit read its steps
    /// ([`StoreTx::steps_lock`] takes the parent's step of each unfinished child with them,
    /// in id order), so the re-read waits for nothing; taken here, after the unit's own
    /// steps, it closed a cycle with a unit holding the parent's steps and waiting for one
    /// of this unit's. The parent's run is not locked: a unit of work holding it may be
    /// waiting for the child's run (runs are locked in id order, a parent's before its
    /// child's).
    pub(super) async fn wake_parents(
        &mut self,
        finished: &[(Uuid, RunState, Option<String>)],
        actor: &str,
    ) -> Result<Parents> {
        let s = self.store;
        let ids: Vec<Uuid> = finished.iter().map(|(id, _, _)| *id).collect();
        // (child, its parent's step)
        let mut links: Vec<(Uuid, i64)> = Vec::new();
        for chunk in ids.chunks(super::tx::CHUNK) {
            let (cond, values) = s.in_list("id", 1, chunk)?;
            let sql = format!(
                "SELECT id, parent_step FROM sagaflow_runs WHERE {cond} AND parent_step IS NOT NULL"
            );
            for r in self.txn.query_all(s.stmt(&sql, values)).await? {
                links.push((r.try_get("", "id")?, r.try_get("", "parent_step")?));
            }
        }
        let lock = s.dialect().row_lock;
        let mut steps: Vec<i64> = links.iter().map(|l| l.1).collect();
        steps.sort_unstable();
        steps.dedup();
        let mut kept = Vec::new();
        let mut found = Vec::new();
        for chunk in steps.chunks(super::tx::CHUNK) {
            let (cond, values) = s.in_list("id", 1, chunk)?;
            let sql = format!(
                "SELECT id, run_id, name, state, wait FROM sagaflow_steps WHERE {cond} \
                 ORDER BY id{lock}"
            );
            let rows = self.txn.query_all(s.stmt(&sql, values)).await?;
            for r in rows {
                let step_id: i64 = r.try_get("", "id")?;
                let run_id: Uuid = r.try_get("", "run_id")?;
                let name: String = r.try_get("", "name")?;
                let state: String = r.try_get("", "state")?;
                let raw: Option<String> = r.try_get("", "wait")?;
                for &(child, _) in links.iter().filter(|l| l.1 == step_id) {
                    let Some((_, ended, output)) = finished.iter().find(|(id, _, _)| *id == child)
                    else {
                        continue;
                    };
                    found.push(child);
                    if *ended == RunState::Completed {
                        kept.push(child);
                    }
                    if state == StepState::Waiting.as_str() {
                        let Some(wait) = raw
                            .as_deref()
                            .and_then(|w| serde_json::from_str::<WaitState>(w).ok())
                        else {
                            continue;
                        };
                        let wait = WaitState {
                            woken: Some(child_woken(*ended, output.as_deref())),
                            ..wait
                        };
                        self.wake(run_id, step_id, &name, &wait, actor).await?;
                    } else if state == StepState::CompensationReady.as_str() {
                        // The parent's compensation waits for the child's: due now.
                        self.txn
                            .execute(s.stmt(
                                "UPDATE sagaflow_steps SET available_at = {now} \
                                 WHERE id = $1 AND state = 'compensation_ready' AND available_at IS NOT NULL",
                                vec![step_id.into()],
                            ))
                            .await?;
                        self.notify = true;
                    }
                }
            }
        }
        let orphans = ids.into_iter().filter(|id| !found.contains(id)).collect();
        Ok(Parents { kept, orphans })
    }
}

/// What the ends of child runs found of their parents ([`StoreTx::wake_parents`]).
#[derive(Debug, Default)]
pub(super) struct Parents {
    /// Completed children whose parent's step may yet compensate them: they keep their steps.
    pub(super) kept: Vec<Uuid>,
    /// Children whose parent's step is gone (the parent finished, or an operator ended it
    /// while the child ran): nothing can reopen them.
    pub(super) orphans: Vec<Uuid>,
}

fn child_woken(state: RunState, output: Option<&str>) -> Woken {
    Woken::Child {
        state,
        output: output.and_then(|o| serde_json::from_str(o).ok()),
    }
}

/// The history detail of a wake: what woke the step (without an event's payload, which may
/// be large or private: the step's output keeps it).
fn woken_detail(wait: &WaitState) -> String {
    let by = match &wait.woken {
        Some(Woken::Event { .. }) => "event".to_owned(),
        Some(Woken::Child { state, .. }) => format!("child {state}"),
        None => "time".to_owned(),
    };
    serde_json::json!({ "for": wait.on.describe(), "by": by }).to_string()
}

impl Store {
    /// Whether the callback token with `hash` of run `run_id` is live ([`LIVE_CALLBACK`]),
    /// read on `conn` with `lock` (a lock clause, or empty): the pool before any write, the
    /// unit of work under the run's lock and the step's.
    async fn callback_live<C: Exec>(
        &self,
        conn: &C,
        hash: &str,
        run_id: Uuid,
        name: &str,
        lock: &str,
    ) -> Result<bool> {
        let values: Vec<Value> = vec![
            hash.to_owned().into(),
            run_id.into(),
            name.to_owned().into(),
        ];
        Ok(conn
            .query_one(self.stmt(&format!("{LIVE_CALLBACK}{lock}"), values))
            .await?
            .is_some())
    }

    /// The key that signs this database's callback tokens: read from `sagaflow_secrets` on
    /// first use (created there by the first engine that needs one; engines racing to create
    /// it agree on the row that won), then kept for the store's life.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`] when the stored key is not 64 hex digits.
    pub(crate) async fn callback_key(&self) -> Result<&crate::wait::CallbackKey> {
        self.callback_key
            .get_or_try_init(|| async {
                let fresh = crate::wait::CallbackKey::generate();
                self.exec
                    .execute(self.stmt(
                        "INSERT INTO sagaflow_secrets (name, value, created_at) \
                         VALUES ($1, $2, {now}) ON CONFLICT (name) DO NOTHING",
                        vec![CALLBACK_KEY.into(), fresh.to_hex().into()],
                    ))
                    .await?;
                let row = self
                    .exec
                    .query_one(self.stmt(
                        "SELECT value FROM sagaflow_secrets WHERE name = $1",
                        vec![CALLBACK_KEY.into()],
                    ))
                    .await?
                    .ok_or_else(|| corrupt_key("the row is missing"))?;
                let value: String = row.try_get("", "value")?;
                crate::wait::CallbackKey::from_hex(&value)
                    .ok_or_else(|| corrupt_key("it is not 64 hex digits"))
            })
            .await
    }

    /// Registers a callback token's hash on the attempt `(step_id, attempt)` while it runs;
    /// returns `false` when the attempt no longer holds the step.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn callback_register(&self, step_id: i64, attempt: i32, hash: &str) -> Result<bool> {
        let n = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_steps SET wait_key = $3 \
                 WHERE id = $1 AND attempt = $2 AND state = 'running'",
                vec![step_id.into(), attempt.into(), hash.to_owned().into()],
            ))
            .await?;
        Ok(n == 1)
    }

    /// Whether the callback token with `hash` of run `run_id` is live, read on the pool
    /// before any write transaction: a flood of spent tokens never queues for the writer
    /// (SQLite) nor holds a run's row lock (PostgreSQL).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn callback_live_now(&self, hash: &str, run_id: Uuid, name: &str) -> Result<bool> {
        self.callback_live(&self.exec, hash, run_id, name, "").await
    }

    /// The waiting steps of a run (all runs when `run` is `None`), due soonest first, at most
    /// `limit`.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn steps_waiting(&self, run: Option<Uuid>, limit: u32) -> Result<Vec<WaitingStep>> {
        let (filter, mut values): (&str, Vec<Value>) = match run {
            Some(id) => (" AND run_id = $2", vec![id.into()]),
            None => ("", vec![]),
        };
        values.insert(0, i64::from(limit).into());
        let sql = format!(
            "SELECT run_id, name, wait, available_at FROM sagaflow_steps \
             WHERE wait IS NOT NULL AND state = 'waiting'{filter} ORDER BY available_at LIMIT $1"
        );
        let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let raw: Option<String> = r.try_get("", "wait")?;
            let Some(wait) = raw.and_then(|w| serde_json::from_str(&w).ok()) else {
                continue;
            };
            out.push(WaitingStep {
                run_id: r.try_get("", "run_id")?,
                step: r.try_get("", "name")?,
                wait,
                due_at: r.try_get("", "available_at")?,
            });
        }
        Ok(out)
    }

    /// The child run started by the parent's step `parent_step`, with its state.
    ///
    /// # Errors
    /// [`Error::Db`], [`Error::CorruptRow`].
    pub async fn run_child_of_step(&self, parent_step: i64) -> Result<Option<(Uuid, RunState)>> {
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT id, state FROM sagaflow_runs WHERE parent_step = $1",
                vec![parent_step.into()],
            ))
            .await?;
        let Some(r) = row else { return Ok(None) };
        let id: Uuid = r.try_get("", "id")?;
        let state: String = r.try_get("", "state")?;
        let state = state
            .parse::<RunState>()
            .map_err(|e| Error::corrupt("sagaflow_runs", id, format!("state: {e}")))?;
        Ok(Some((id, state)))
    }

    /// How many steps wait.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn steps_waiting_count(&self) -> Result<u64> {
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT COUNT(*) AS n FROM sagaflow_steps WHERE wait IS NOT NULL AND state = 'waiting'",
                vec![],
            ))
            .await?;
        let n: i64 = row.map(|r| r.try_get("", "n")).transpose()?.unwrap_or(0);
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

impl StoreTx<'_> {
    /// Locks run `run_id` (its row lock on PostgreSQL, the write lock on SQLite) and reads
    /// its state.
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::CorruptRow`]; [`Error::Db`].
    pub async fn run_state_locked(&self, run_id: Uuid) -> Result<RunState> {
        lock_run_state(self, run_id).await
    }

    /// Whether the callback token with `hash` of run `run_id` is live, read in this unit of
    /// work (under the run's lock). The step that holds the token is locked too: the timer
    /// pass then passes over it (or, having woken it first, leaves
    /// the token spent), so a wait's timeout and its callback never both win (the callback
    /// kept for a step its timeout already woke, the remote told it was accepted).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn callback_live(&self, hash: &str, run_id: Uuid, name: &str) -> Result<bool> {
        let lock = self.store.dialect().row_lock;
        self.store
            .callback_live(&self.txn, hash, run_id, name, lock)
            .await
    }

    /// Wakes up to `limit` waiting steps whose time came (timers that fire, waits that time
    /// out), oldest first, through the partial index `sagaflow_steps_waiting`, with their
    /// history, and asks for the wake-up notification when it woke any. Steps of paused runs
    /// wait for their run's resume. Returns how many were woken.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn steps_wake_due(&mut self, limit: u32, actor: &str) -> Result<u64> {
        let s = self.store;
        let to = step_rule(StepState::Waiting, Trigger::Woken).map_or(StepState::Ready, |r| r.to);
        let sql = format!(
            "UPDATE sagaflow_steps SET state = '{to}', available_at = {{now}}, aging_from = {{now}}, \
               updated_at = {{now}}, wait_key = NULL \
             WHERE state = 'waiting' AND id IN (SELECT s.id FROM sagaflow_steps s \
               JOIN sagaflow_runs r ON r.id = s.run_id \
               WHERE s.wait IS NOT NULL AND s.available_at <= {{now}} AND s.state = 'waiting' \
               AND r.state <> 'paused' \
               ORDER BY s.available_at LIMIT $1 {lock}) \
             RETURNING run_id, name, wait",
            // A step whose run is being planned is locked by that unit of work, or its run
            // is: skipped (woken at the next pass), never waited for, so that the pass holds
            // no lock while it waits for another (a lock-order cycle with a batch
            // evaluation). The run is held shared until the commit, and its state read again
            // when it was taken: a pause that commits between this statement's snapshot and
            // its lock is seen, and one that comes after waits for the wake and then parks
            // the woken step. (Read from the snapshot alone, a pause committing meanwhile
            // left the woken step due in a paused run, for any claim to start.)
            lock = s.dialect().wake_lock,
        );
        let rows = self
            .txn
            .query_all(s.stmt(&sql, vec![i64::from(limit).into()]))
            .await?;
        for r in &rows {
            let run_id: Uuid = r.try_get("", "run_id")?;
            let name: String = r.try_get("", "name")?;
            let wait: Option<String> = r.try_get("", "wait")?;
            let detail = wait
                .and_then(|w| serde_json::from_str::<WaitState>(&w).ok())
                .map(|w| woken_detail(&w));
            self.history.push(HistoryEntry {
                run_id,
                step: Some(name),
                event: Trigger::Woken.as_str().into(),
                from: Some(StepState::Waiting.as_str().into()),
                to: Some(to.as_str().into()),
                attempt: None,
                actor: actor.into(),
                detail,
            });
        }
        if !rows.is_empty() {
            self.notify = true;
        }
        Ok(rows.len() as u64)
    }

    /// Delivers an event to run `run_id` (locked by the caller): to the step waiting for it,
    /// or kept.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::InvalidEvent`].
    pub async fn wait_deliver(
        &mut self,
        run_id: Uuid,
        name: &str,
        payload: &serde_json::Value,
        actor: &str,
    ) -> Result<EventDelivery> {
        let s = self.store;
        let rows = self
            .txn
            .query_all(s.stmt(
                "SELECT id, name, wait FROM sagaflow_steps WHERE run_id = $1 AND state = 'waiting' \
                 ORDER BY id",
                vec![run_id.into()],
            ))
            .await?;
        for r in rows {
            let raw: Option<String> = r.try_get("", "wait")?;
            let Some(wait) = raw.and_then(|w| serde_json::from_str::<WaitState>(&w).ok()) else {
                continue;
            };
            if !matches!(&wait.on, WaitFor::Event { name: n } if n == name) {
                continue;
            }
            let step_id: i64 = r.try_get("", "id")?;
            let step: String = r.try_get("", "name")?;
            let wait = WaitState {
                woken: Some(Woken::Event {
                    payload: payload.clone(),
                }),
                ..wait
            };
            if self.wake(run_id, step_id, &step, &wait, actor).await? {
                self.event_recorded(run_id, name, payload, actor, Some(step_id))
                    .await?;
                return Ok(EventDelivery::Delivered { run_id, step });
            }
        }
        self.event_recorded(run_id, name, payload, actor, None)
            .await?;
        Ok(EventDelivery::Kept { run_id })
    }

    /// Stores an event: consumed by `step` already, or kept.
    async fn event_recorded(
        &mut self,
        run_id: Uuid,
        name: &str,
        payload: &serde_json::Value,
        actor: &str,
        step: Option<i64>,
    ) -> Result<()> {
        let s = self.store;
        let consumed = if step.is_some() { "{now}" } else { "NULL" };
        let sql = format!(
            "INSERT INTO sagaflow_events (run_id, name, payload, actor, received_at, consumed_at, step_id) \
             VALUES ($1, $2, $3, $4, {{now}}, {consumed}, $5)"
        );
        let values = vec![
            run_id.into(),
            name.to_owned().into(),
            payload.to_string().into(),
            actor.to_owned().into(),
            step.into(),
        ];
        self.txn.execute(s.stmt(&sql, values)).await?;
        let shown = if name.starts_with(crate::wait::CALLBACK_EVENT) {
            "callback"
        } else {
            name
        };
        self.history.push(HistoryEntry {
            run_id,
            step: None,
            event: "event_received".into(),
            from: None,
            to: None,
            attempt: None,
            actor: actor.into(),
            detail: Some(serde_json::json!({ "event": shown, "kept": step.is_none() }).to_string()),
        });
        Ok(())
    }
}

/// Locks run `id` (its row lock on PostgreSQL, the write lock on SQLite) and reads its state.
async fn lock_run_state(tx: &StoreTx<'_>, id: Uuid) -> Result<RunState> {
    let s = tx.store;
    let row = match tx
        .txn
        .query_one(s.stmt(
            "UPDATE sagaflow_runs SET updated_at = updated_at WHERE id = $1 RETURNING state",
            vec![id.into()],
        ))
        .await?
    {
        Some(row) => row,
        None => tx
            .run_finished_locked(id, "")
            .await?
            .ok_or(Error::RunNotFound(id))?,
    };
    let state: String = row.try_get("", "state")?;
    state
        .parse::<RunState>()
        .map_err(|e| Error::corrupt("sagaflow_runs", id, format!("state: {e}")))
}
