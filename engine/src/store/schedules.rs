//! Recurring schedules (`sagaflow_schedules`): written by every engine at its start from
//! the code's declarations, fired by the supervisor leader, paused and resumed by operators.
//!
//! A tick is fired once: the leader moves a schedule's `next_tick_at` with a conditional
//! update in the transaction that inserts the tick's runs, so a second leader (or a second
//! pass) finding the same tick due updates no row and rolls its inserts back.

use sea_orm::Value;
use uuid::Uuid;

use super::Store;
use super::row::{Exec, Row};
use super::tx::HistoryEntry;
use crate::cron::{CronSpec, MissedTicks, Schedule, ScheduleView};
use crate::model::timestamp;
use crate::{Error, Result, RunState};

/// Columns of a schedule read back.
const COLS: &str = "name, workflow, expression, zone, input, missed, next_tick_at, \
    last_fired_at, last_run_id, paused, paused_by, paused_reason, updated_at";

/// A schedule as the leader fires it.
#[derive(Debug, Clone)]
pub struct DueSchedule {
    /// Its name.
    pub name: String,
    /// The workflow it starts.
    pub workflow: String,
    /// Its expression and zone, parsed.
    pub spec: CronSpec,
    /// The input of its runs.
    pub input: serde_json::Value,
    /// Its missed-tick policy.
    pub missed: MissedTicks,
    /// The tick that is due (epoch milliseconds), as stored: the fence of its firing.
    pub next_tick_at: i64,
}

/// The schedules due now, and when the next of the others is.
#[derive(Debug, Clone, Default)]
pub struct DueSchedules {
    /// The database's clock when they were read (epoch milliseconds).
    pub now: i64,
    /// The schedules due (not paused, next tick at or before `now`), earliest first.
    pub due: Vec<DueSchedule>,
    /// The earliest next tick of the schedules not due and not paused.
    pub next_tick_at: Option<i64>,
}

fn corrupt(name: &str, reason: String) -> Error {
    Error::CorruptRow {
        table: "sagaflow_schedules",
        id: name.to_owned(),
        reason,
    }
}

fn view(r: &Row) -> Result<ScheduleView> {
    let name: String = r.try_get("", "name")?;
    let input: String = r.try_get("", "input")?;
    let missed: String = r.try_get("", "missed")?;
    let last_run: Option<String> = r.try_get("", "last_run_id")?;
    Ok(ScheduleView {
        workflow: r.try_get("", "workflow")?,
        expression: r.try_get("", "expression")?,
        zone: r.try_get("", "zone")?,
        input: serde_json::from_str(&input).map_err(|e| corrupt(&name, format!("input: {e}")))?,
        missed: MissedTicks::from_stored(&missed)
            .ok_or_else(|| corrupt(&name, format!("missed-tick policy `{missed}`")))?,
        next_tick_at: timestamp(r.try_get("", "next_tick_at")?),
        last_fired_at: r
            .try_get::<Option<i64>>("", "last_fired_at")?
            .map(timestamp),
        last_run_id: last_run.and_then(|id| id.parse::<Uuid>().ok()),
        paused: r.try_get("", "paused")?,
        paused_by: r.try_get("", "paused_by")?,
        paused_reason: r.try_get("", "paused_reason")?,
        updated_at: timestamp(r.try_get("", "updated_at")?),
        name,
    })
}

/// A schedule's move from its due tick to the next: see [`Store::schedule_advance`].
#[derive(Debug, Clone, Copy)]
pub struct ScheduleTick<'a> {
    /// The schedule.
    pub name: &'a str,
    /// The tick that was due (the move happens only if it still is).
    pub due: i64,
    /// The next tick.
    pub next: i64,
    /// When it fired, if it did (a tick skipped for the catch-up policy did not).
    pub fired: Option<i64>,
}

impl Store {
    /// Writes the schedules the application's code declares: a new one is due at its first
    /// tick after now; a known one takes the code's workflow, input and policy, and keeps its
    /// next tick (and an operator's pause) unless its expression or zone changed.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::InvalidSchedule`] when no tick follows now.
    pub async fn schedules_publish(&self, schedules: &[Schedule]) -> Result<()> {
        if schedules.is_empty() {
            return Ok(());
        }
        let now = self.now_ms().await?;
        // In name order: engines starting at once lock the rows in the same order.
        let mut ordered: Vec<&Schedule> = schedules.iter().collect();
        ordered.sort_by(|a, b| a.name().cmp(b.name()));
        let txn = self.exec.begin().await?;
        let result = async {
            for s in ordered {
                let first = s
                    .spec()
                    .next_after(now)
                    .map_err(|reason| Error::InvalidSchedule {
                        name: s.name().to_owned(),
                        reason,
                    })?;
                txn.execute(self.stmt(
                    "INSERT INTO sagaflow_schedules (name, workflow, expression, zone, input, missed, \
                       next_tick_at, paused, updated_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, FALSE, {now}) \
                     ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow, \
                       input = excluded.input, missed = excluded.missed, updated_at = {now}, \
                       next_tick_at = CASE WHEN sagaflow_schedules.expression = excluded.expression \
                         AND sagaflow_schedules.zone = excluded.zone \
                         THEN sagaflow_schedules.next_tick_at ELSE excluded.next_tick_at END, \
                       expression = excluded.expression, zone = excluded.zone",
                    vec![
                        s.name().to_owned().into(),
                        s.workflow_name().to_owned().into(),
                        s.expression().to_owned().into(),
                        s.zone().to_owned().into(),
                        s.input_value().to_string().into(),
                        s.missed_policy().as_stored().into(),
                        first.into(),
                    ],
                ))
                .await?;
            }
            Ok(())
        }
        .await;
        txn.end(result, |()| true).await
    }

    /// Every stored schedule, by name.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`].
    pub async fn schedule_list(&self) -> Result<Vec<ScheduleView>> {
        let sql = format!("SELECT {COLS} FROM sagaflow_schedules ORDER BY name");
        let rows = self.exec.query_all(self.stmt(&sql, vec![])).await?;
        rows.iter().map(view).collect()
    }

    /// The schedules due now (at most `limit`, earliest first) and the earliest next tick of
    /// the others; paused schedules are left out.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`] for a stored expression, zone, input or policy
    /// that does not read (that schedule is left out and logged; the others fire).
    pub async fn schedules_due(&self, limit: u32) -> Result<DueSchedules> {
        let now = self.now_ms().await?;
        let sql = format!(
            "SELECT {COLS} FROM sagaflow_schedules WHERE NOT paused AND next_tick_at <= $1 \
             ORDER BY next_tick_at LIMIT $2"
        );
        let rows = self
            .exec
            .query_all(self.stmt(&sql, vec![now.into(), i64::from(limit).into()]))
            .await?;
        let mut due = Vec::with_capacity(rows.len());
        for r in &rows {
            let parsed = view(r).and_then(|v| {
                let spec = CronSpec::parse(&v.expression, &v.zone)
                    .map_err(|reason| corrupt(&v.name, reason))?;
                Ok(DueSchedule {
                    next_tick_at: r.try_get("", "next_tick_at")?,
                    name: v.name,
                    workflow: v.workflow,
                    spec,
                    input: v.input,
                    missed: v.missed,
                })
            });
            match parsed {
                Ok(d) => due.push(d),
                Err(e) => tracing::error!(error = %e, "a schedule row cannot be read; not fired"),
            }
        }
        let next = self
            .exec
            .query_one(self.stmt(
                "SELECT MIN(next_tick_at) AS next FROM sagaflow_schedules \
                 WHERE NOT paused AND next_tick_at > $1",
                vec![now.into()],
            ))
            .await?
            .map(|r| r.try_get::<Option<i64>>("", "next"))
            .transpose()?
            .flatten();
        Ok(DueSchedules {
            now,
            due,
            next_tick_at: next,
        })
    }

    /// Moves schedule `tick.name` from its due tick to the next on `conn` (the transaction
    /// that starts the tick's runs), recording its firing when it fired.
    /// Returns whether it moved: `false` when the tick was fired (or the schedule paused,
    /// changed or removed) meanwhile, and the caller must roll back.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn schedule_advance<C: Exec>(
        &self,
        conn: &C,
        tick: &ScheduleTick<'_>,
    ) -> Result<bool> {
        let ScheduleTick {
            name,
            due,
            next,
            fired,
        } = *tick;
        let n = conn
            .execute(self.stmt(
                "UPDATE sagaflow_schedules SET next_tick_at = $3, \
                   last_fired_at = COALESCE($4, last_fired_at), updated_at = {now} \
                 WHERE name = $1 AND next_tick_at = $2 AND NOT paused",
                vec![
                    name.to_owned().into(),
                    due.into(),
                    next.into(),
                    fired.into(),
                ],
            ))
            .await?;
        Ok(n == 1)
    }

    /// Records on `conn` that schedule `name` started `runs` (inserted by this firing, with
    /// their business keys and the states they were stored in): its last run, and a `scheduled` entry in each run's history
    /// whose actor is `schedule:<name>`, with the business key (which names the tick) in its
    /// detail.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn schedule_started<C: Exec>(
        &self,
        conn: &C,
        name: &str,
        runs: &[(Uuid, String, RunState)],
        last_run: Option<Uuid>,
    ) -> Result<()> {
        if let Some(id) = last_run {
            conn.execute(self.stmt(
                "UPDATE sagaflow_schedules SET last_run_id = $2 WHERE name = $1",
                vec![name.to_owned().into(), Value::from(id.to_string())],
            ))
            .await?;
        }
        let history: Vec<HistoryEntry> = runs
            .iter()
            .map(|(run_id, key, state)| HistoryEntry {
                run_id: *run_id,
                step: None,
                event: "scheduled".into(),
                from: None,
                to: Some(state.as_str().into()),
                attempt: None,
                actor: format!("schedule:{name}"),
                detail: Some(serde_json::json!({ "business_key": key }).to_string()),
            })
            .collect();
        self.history_insert_many(conn, &history).await
    }

    /// Pauses schedule `name`, recording `actor` and `reason`. Returns whether the schedule
    /// exists.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn schedule_pause(&self, name: &str, actor: &str, reason: &str) -> Result<bool> {
        let n = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_schedules SET paused = TRUE, paused_by = $2, \
                   paused_reason = $3, updated_at = {now} WHERE name = $1",
                vec![
                    name.to_owned().into(),
                    actor.to_owned().into(),
                    reason.to_owned().into(),
                ],
            ))
            .await?;
        Ok(n == 1)
    }

    /// Resumes the schedule `read`, due at `resume_at` (the caller's first tick after now,
    /// by the expression it read), so that the ticks that passed while it was paused are not
    /// fired; only while it is still paused with that expression and zone. Returns whether it
    /// resumed: `false` when it is gone or another writer changed it since the read (resumed
    /// it, and its next tick may have fired since; or published another expression), and the
    /// caller reads it again.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn schedule_resume(&self, read: &ScheduleView, resume_at: i64) -> Result<bool> {
        let n = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_schedules SET paused = FALSE, paused_by = NULL, \
                   paused_reason = NULL, next_tick_at = $2, updated_at = {now} \
                 WHERE name = $1 AND paused AND expression = $3 AND zone = $4",
                vec![
                    read.name.clone().into(),
                    resume_at.into(),
                    read.expression.clone().into(),
                    read.zone.clone().into(),
                ],
            ))
            .await?;
        Ok(n == 1)
    }

    /// Schedule `name` as stored, if it is.
    ///
    /// # Errors
    /// [`Error::Db`]; [`Error::CorruptRow`].
    pub async fn schedule_get(&self, name: &str) -> Result<Option<ScheduleView>> {
        let sql = format!("SELECT {COLS} FROM sagaflow_schedules WHERE name = $1");
        let row = self
            .exec
            .query_one(self.stmt(&sql, vec![name.to_owned().into()]))
            .await?;
        row.as_ref().map(view).transpose()
    }
}
