//! The outbox: notices (alerts, finished runs) written in the transaction of the change they
//! tell of, and their deliveries to each sink, recorded by the supervisor leader that makes
//! them. See the `sagaflow_outbox` migration for the tables.

use std::collections::{HashMap, HashSet};

use sea_orm::Value;
use uuid::Uuid;

use super::Store;
use super::row::{Exec, Row};
use super::rows::{quote, state_of};
use crate::model::{
    Alert, Delivery, DeliveryCounts, DeliveryState, Notice, NoticeBody, NoticeTopic, RunFinished,
    timestamp,
};
use crate::{Error, Result};

/// A notice not yet delivered to every sink, with what each sink made of it so far.
#[derive(Debug, Clone)]
pub struct PendingNotice {
    /// The notice.
    pub notice: Notice,
    /// Per sink name: its delivery so far (none: never tried).
    pub deliveries: HashMap<String, DeliveryRecord>,
}

/// One sink's delivery of one notice, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// Where it stands.
    pub state: DeliveryState,
    /// Tries so far.
    pub attempts: i32,
    /// When to try again (database clock, epoch ms).
    pub next_at: i64,
}

/// A page of pending notices and the database's clock when it was read.
#[derive(Debug, Clone)]
pub struct PendingPage {
    /// The notices, oldest first.
    pub notices: Vec<PendingNotice>,
    /// The database's clock (epoch ms).
    pub now_ms: i64,
}

/// What one try of one sink came to, to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryResult {
    /// Delivered.
    Delivered,
    /// Failed; try again `retry_in_ms` from now.
    Retry {
        /// Why.
        error: String,
        /// Delay before the next try.
        retry_in_ms: i64,
    },
    /// Failed for good: dead-lettered.
    Dead {
        /// Why.
        error: String,
    },
}

/// One try of one sink at one notice, to record ([`Store::delivery_record`]).
#[derive(Debug, Clone)]
pub struct DeliveryTry<'a> {
    /// The notice's id.
    pub notice: i64,
    /// The sink's name.
    pub sink: &'a str,
    /// Which try this was (1 for the first).
    pub attempt: i32,
    /// What it came to.
    pub result: DeliveryResult,
    /// The names of the engine's other sinks that take the notice's topic: once each of them
    /// has delivered it or given up on it, a final result of this one finishes the notice.
    pub others: &'a [&'a str],
}

/// Writes a notice in the caller's transaction.
pub(super) async fn insert_notice<C: Exec>(
    store: &Store,
    conn: &C,
    alert_id: Option<i64>,
    run_id: Option<Uuid>,
    body: &NoticeBody,
) -> Result<()> {
    // Strings, numbers and JSON values only: serialising cannot fail, but a failure would
    // be reported rather than written as an empty notice.
    let text = serde_json::to_string(body)
        .map_err(|e| sea_orm::DbErr::Custom(format!("a notice could not be encoded: {e}")))?;
    conn.execute(store.stmt(
        "INSERT INTO sagaflow_outbox (dedupe_id, topic, alert_id, run_id, body, created_at) \
         VALUES ($1, $2, $3, $4, $5, {now})",
        vec![
            body.dedupe_id.clone().into(),
            body.topic.as_ref().to_owned().into(),
            alert_id.into(),
            run_id.into(),
            text.into(),
        ],
    ))
    .await?;
    Ok(())
}

/// The notice of a stored alert.
pub(super) fn alert_notice(alert: &Alert) -> NoticeBody {
    NoticeBody {
        dedupe_id: Uuid::now_v7().to_string(),
        topic: NoticeTopic::Alert,
        created_at: alert.created_at,
        alert: Some(alert.clone()),
        run: None,
    }
}

/// The notice of a finished run, stamped `now_ms` (database clock).
pub(super) fn run_notice(run: RunFinished, now_ms: i64) -> NoticeBody {
    NoticeBody {
        dedupe_id: Uuid::now_v7().to_string(),
        topic: NoticeTopic::RunFinished,
        created_at: timestamp(now_ms),
        alert: None,
        run: Some(run),
    }
}

/// The row id of a delivery in damage reports: its notice and its sink.
fn delivery_row(notice_id: i64, sink: &str) -> String {
    format!("notice {notice_id}, sink {}", quote(sink))
}

/// Decodes a delivery joined with its notice; a topic or state this version does not know is
/// a [`crate::Error::CorruptRow`] naming the row, the column and the value.
fn decode_delivery(r: &Row) -> Result<Delivery> {
    let notice_id: i64 = r.try_get("", "outbox_id")?;
    let sink: String = r.try_get("", "sink")?;
    let topic: String = r.try_get("", "topic")?;
    let topic = topic.parse::<NoticeTopic>().map_err(|_| {
        Error::corrupt(
            "sagaflow_outbox",
            notice_id,
            format!(
                "column `topic` holds {}, which is not a topic",
                quote(&topic)
            ),
        )
    })?;
    let state: String = r.try_get("", "state")?;
    let state = state_of(
        "sagaflow_deliveries",
        delivery_row(notice_id, &sink),
        &state,
    )?;
    Ok(Delivery {
        notice_id,
        dedupe_id: r.try_get("", "dedupe_id")?,
        topic,
        alert_id: r.try_get("", "alert_id")?,
        run_id: r.try_get("", "run_id")?,
        sink,
        state,
        attempts: r.try_get("", "attempts")?,
        last_error: r.try_get("", "last_error")?,
        created_at: timestamp(r.try_get("", "created_at")?),
        updated_at: timestamp(r.try_get("", "updated_at")?),
    })
}

impl Store {
    /// Up to `limit` notices not yet delivered to every sink, oldest first, with their
    /// deliveries so far.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn outbox_pending(&self, limit: u32) -> Result<PendingPage> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT id, dedupe_id, topic, body, {now} AS now_ms FROM sagaflow_outbox \
                 WHERE done_at IS NULL ORDER BY id LIMIT $1",
                vec![i64::from(limit).into()],
            ))
            .await?;
        let mut now_ms = None;
        let mut notices = Vec::with_capacity(rows.len());
        for r in &rows {
            now_ms = Some(r.try_get::<i64>("", "now_ms")?);
            let topic: String = r.try_get("", "topic")?;
            let Ok(topic) = topic.parse::<NoticeTopic>() else {
                continue; // written by a newer version: its own leaders deliver it
            };
            notices.push(PendingNotice {
                notice: Notice::new(
                    r.try_get("", "id")?,
                    r.try_get("", "dedupe_id")?,
                    topic,
                    r.try_get("", "body")?,
                ),
                deliveries: HashMap::new(),
            });
        }
        let now_ms = match now_ms {
            Some(n) => n,
            None => self.now_ms().await?,
        };
        if !notices.is_empty() {
            let ids: Vec<i64> = notices.iter().map(|n| n.notice.id).collect();
            let (cond, values) = self.in_list("outbox_id", 1, &ids)?;
            let sql = format!(
                "SELECT outbox_id, sink, state, attempts, next_at FROM sagaflow_deliveries WHERE {cond}"
            );
            let index: HashMap<i64, usize> =
                ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
            let mut damaged = HashSet::new();
            for r in self.exec.query_all(self.stmt(&sql, values)).await? {
                let id: i64 = r.try_get("", "outbox_id")?;
                let sink: String = r.try_get("", "sink")?;
                let state: String = r.try_get("", "state")?;
                let Some(&i) = index.get(&id) else { continue };
                let state = match state_of::<DeliveryState>(
                    "sagaflow_deliveries",
                    delivery_row(id, &sink),
                    &state,
                ) {
                    Ok(state) => state,
                    Err(e) => {
                        // Read as pending, the sink would be sent the notice again at every
                        // pass; the notice waits instead, named in the log, until the row
                        // is repaired.
                        tracing::warn!(error = %e, "a notice with a delivery that does not decode is not delivered");
                        damaged.insert(id);
                        continue;
                    }
                };
                notices[i].deliveries.insert(
                    sink,
                    DeliveryRecord {
                        state,
                        attempts: r.try_get("", "attempts")?,
                        next_at: r.try_get("", "next_at")?,
                    },
                );
            }
            notices.retain(|n| !damaged.contains(&n.notice.id));
        }
        Ok(PendingPage { notices, now_ms })
    }

    /// Records one try of a sink at a notice. A delivery already `delivered` or `dead` is not
    /// changed (a leader that lost its term and still finished a try cannot undo what its
    /// successor recorded). A final result of the notice's last sink marks the notice done in
    /// the same transaction, so that no stop between the two leaves a delivered notice open.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn delivery_record(&self, tried: &DeliveryTry<'_>) -> Result<()> {
        let (state, error, delay) = match &tried.result {
            DeliveryResult::Delivered => (DeliveryState::Delivered, None, 0),
            DeliveryResult::Retry { error, retry_in_ms } => {
                (DeliveryState::Pending, Some(error.clone()), *retry_in_ms)
            }
            DeliveryResult::Dead { error } => (DeliveryState::Dead, Some(error.clone()), 0),
        };
        let record = self.stmt(
            "INSERT INTO sagaflow_deliveries (outbox_id, sink, state, attempts, next_at, last_error, updated_at) \
             VALUES ($1, $2, $3, $4, {now} + $5, $6, {now}) \
             ON CONFLICT (outbox_id, sink) DO UPDATE SET state = excluded.state, \
               attempts = excluded.attempts, next_at = excluded.next_at, \
               last_error = COALESCE(excluded.last_error, sagaflow_deliveries.last_error), \
               updated_at = excluded.updated_at \
             WHERE sagaflow_deliveries.state = 'pending'",
            vec![
                tried.notice.into(),
                tried.sink.to_owned().into(),
                state.as_ref().to_owned().into(),
                tried.attempt.into(),
                delay.into(),
                error.into(),
            ],
        );
        if state == DeliveryState::Pending {
            self.exec.execute(record).await?;
            return Ok(());
        }
        // The last of the sinks to finish a notice finishes it. The notice's row is locked
        // before the others' deliveries are counted, so that of two sinks finishing at once
        // the second counts the first (a statement after the lock sees what the holder
        // committed); on SQLite the delivery's write already serialises the two.
        let txn = self.exec.begin().await?;
        txn.execute(record).await?;
        txn.execute(self.stmt(
            &format!(
                "SELECT id FROM sagaflow_outbox WHERE id = $1{lock}",
                lock = self.dialect().row_lock
            ),
            vec![tried.notice.into()],
        ))
        .await?;
        let mut finish = String::from(
            "UPDATE sagaflow_outbox SET done_at = {now} WHERE id = $1 AND done_at IS NULL",
        );
        let mut values = vec![tried.notice.into()];
        if !tried.others.is_empty() {
            let (cond, names) = self.in_list("sink", 3, tried.others)?;
            finish.push_str(&format!(
                " AND (SELECT COUNT(*) FROM sagaflow_deliveries WHERE outbox_id = $1 \
                 AND state <> 'pending' AND {cond}) = $2"
            ));
            values.push(i64::try_from(tried.others.len()).unwrap_or(i64::MAX).into());
            values.extend(names);
        }
        txn.execute(self.stmt(&finish, values)).await?;
        txn.commit().await?;
        Ok(())
    }

    /// Marks notices done that every sink delivered or gave up on, as a delivery pass found
    /// them. A notice with a delivery pending again since (sent again by an operator while
    /// the pass ran) stays open: the rows are locked first, so that the check sees what such
    /// an operator committed.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn outbox_done(&self, ids: &[i64]) -> Result<()> {
        for chunk in ids.chunks(super::tx::CHUNK) {
            let txn = self.exec.begin().await?;
            let (cond, values) = self.in_list("id", 1, chunk)?;
            let lock = self.dialect().row_lock;
            txn.execute(self.stmt(
                &format!("SELECT id FROM sagaflow_outbox WHERE {cond}{lock}"),
                values.clone(),
            ))
            .await?;
            let sql = format!(
                "UPDATE sagaflow_outbox SET done_at = {{now}} WHERE {cond} AND done_at IS NULL \
                 AND NOT EXISTS (SELECT 1 FROM sagaflow_deliveries d \
                   WHERE d.outbox_id = sagaflow_outbox.id AND d.state = 'pending')"
            );
            txn.execute(self.stmt(&sql, values)).await?;
            txn.commit().await?;
        }
        Ok(())
    }

    /// Deliveries, newest change first: all of them, or those in `state`.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn delivery_list(
        &self,
        state: Option<DeliveryState>,
        limit: u32,
    ) -> Result<Vec<Delivery>> {
        let mut values: Vec<Value> = Vec::new();
        let mut sql = String::from(
            "SELECT d.outbox_id, d.sink, d.state, d.attempts, d.last_error, d.updated_at, \
                    o.dedupe_id, o.topic, o.alert_id, o.run_id, o.created_at \
             FROM sagaflow_deliveries d JOIN sagaflow_outbox o ON o.id = d.outbox_id",
        );
        if let Some(s) = state {
            sql.push_str(" WHERE d.state = $1");
            values.push(s.as_ref().to_owned().into());
        }
        sql.push_str(&format!(
            " ORDER BY d.updated_at DESC, d.outbox_id DESC LIMIT ${}",
            values.len() + 1
        ));
        values.push(i64::from(limit).into());
        let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
        let mut deliveries = Vec::with_capacity(rows.len());
        for r in &rows {
            match decode_delivery(r) {
                Ok(d) => deliveries.push(d),
                // One damaged row is left out of the list, named in the log; the others are
                // listed.
                Err(e @ Error::CorruptRow { .. }) => {
                    tracing::warn!(error = %e, "a delivery that does not decode was left out of the list");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(deliveries)
    }

    /// How the notices stand with `sink`: its delivered and dead-lettered deliveries, and the
    /// notices not yet done whose topic `accepts` takes and that it has not delivered or given
    /// up on (tried and failed for now, or never tried).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn delivery_counts(
        &self,
        sink: &str,
        accepts: impl Fn(NoticeTopic) -> bool,
    ) -> Result<DeliveryCounts> {
        let mut counts = DeliveryCounts::default();
        let finished = self
            .exec
            .query_all(self.stmt(
                "SELECT state, COUNT(*) AS n FROM sagaflow_deliveries \
                 WHERE sink = $1 AND state <> 'pending' GROUP BY state",
                vec![sink.to_owned().into()],
            ))
            .await?;
        for r in &finished {
            let state: String = r.try_get("", "state")?;
            let n = u64::try_from(r.try_get::<i64>("", "n")?).unwrap_or(0);
            match state.parse::<DeliveryState>() {
                Ok(DeliveryState::Delivered) => counts.delivered += n,
                Ok(DeliveryState::Dead) => counts.dead += n,
                _ => {}
            }
        }
        let pending = self
            .exec
            .query_all(self.stmt(
                "SELECT o.topic, COUNT(*) AS n FROM sagaflow_outbox o \
                 LEFT JOIN sagaflow_deliveries d ON d.outbox_id = o.id AND d.sink = $1 \
                 WHERE o.done_at IS NULL AND (d.state IS NULL OR d.state = 'pending') \
                 GROUP BY o.topic",
                vec![sink.to_owned().into()],
            ))
            .await?;
        for r in &pending {
            let topic: String = r.try_get("", "topic")?;
            // A topic this version does not know is for a newer version's leaders to deliver.
            if topic.parse::<NoticeTopic>().is_ok_and(&accepts) {
                counts.pending += u64::try_from(r.try_get::<i64>("", "n")?).unwrap_or(0);
            }
        }
        Ok(counts)
    }

    /// Sends a dead-lettered notice again: its dead deliveries start afresh (the sinks that
    /// delivered it are not tried again). Returns whether any delivery was dead.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn delivery_redeliver(&self, notice_id: i64) -> Result<bool> {
        // One transaction, the deliveries before the notice (the order in which a delivery's
        // outcome is recorded, so the two never wait on each other): a delivery pass that
        // decided the notice done before this commits cannot leave it done with deliveries
        // pending (`Store::outbox_done`, `Store::delivery_record` look again under lock).
        let txn = self.exec.begin().await?;
        let n = txn
            .execute(self.stmt(
                "UPDATE sagaflow_deliveries SET state = 'pending', attempts = 0, next_at = {now}, \
                 updated_at = {now} WHERE outbox_id = $1 AND state = 'dead'",
                vec![notice_id.into()],
            ))
            .await?;
        if n > 0 {
            txn.execute(self.stmt(
                "UPDATE sagaflow_outbox SET done_at = NULL WHERE id = $1",
                vec![notice_id.into()],
            ))
            .await?;
        }
        txn.commit().await?;
        Ok(n > 0)
    }

    /// Deletes up to `batch` notices done more than `age_ms` ago that no sink dead-lettered,
    /// with their deliveries; returns how many notices went.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn outbox_purge(&self, age_ms: i64, batch: u32) -> Result<u64> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT id FROM sagaflow_outbox o WHERE done_at IS NOT NULL AND done_at < {now} - $1 \
                 AND NOT EXISTS (SELECT 1 FROM sagaflow_deliveries d WHERE d.outbox_id = o.id AND d.state = 'dead') \
                 ORDER BY done_at LIMIT $2",
                vec![age_ms.into(), i64::from(batch).into()],
            ))
            .await?;
        let ids: Vec<i64> = rows
            .iter()
            .map(|r| r.try_get("", "id"))
            .collect::<std::result::Result<_, _>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        let (cond, values) = self.in_list("outbox_id", 1, &ids)?;
        self.exec
            .execute(self.stmt(
                &format!("DELETE FROM sagaflow_deliveries WHERE {cond}"),
                values,
            ))
            .await?;
        let (cond, values) = self.in_list("id", 1, &ids)?;
        self.exec
            .execute(self.stmt(&format!("DELETE FROM sagaflow_outbox WHERE {cond}"), values))
            .await?;
        Ok(ids.len() as u64)
    }
}
