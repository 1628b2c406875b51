//! Operator alerts, persisted before they are delivered.

use sea_orm::Value;

use super::row::{Exec, Row};
use uuid::Uuid;

use super::{LeaderFence, Store};
use crate::Result;
use crate::model::{Alert, AlertKind, RESOLVED_BY_ENGINE, timestamp};
pub use crate::transition::writes::NewAlert;

const ALERT_COLS: &str = "id, run_id, step, kind, reason, attempts, actions, created_at, \
     resolved_at, resolved_by, resolution";

/// Longest resolution stored: an operator's reason is at most 2,000 characters, and an
/// action's name goes before it.
const RESOLUTION_MAX_CHARS: usize = 2_100;

/// [`Store::alert_list`] on `conn`.
pub(super) async fn alert_list_on<C: Exec>(
    store: &Store,
    conn: &C,
    run_id: Option<Uuid>,
    open_only: bool,
) -> Result<Vec<Alert>> {
    let mut sql = format!("SELECT {ALERT_COLS} FROM sagaflow_alerts WHERE 1 = 1");
    let mut values: Vec<Value> = Vec::new();
    if let Some(r) = run_id {
        sql.push_str(" AND run_id = $1");
        values.push(r.into());
    }
    if open_only {
        sql.push_str(" AND resolved_at IS NULL");
    }
    sql.push_str(" ORDER BY id");
    let rows = conn.query_all(store.stmt(&sql, values)).await?;
    rows.iter().map(decode).collect()
}

/// Decodes one alert row.
fn decode(r: &Row) -> Result<Alert> {
    let actions: String = r.try_get("", "actions")?;
    let kind: String = r.try_get("", "kind")?;
    Ok(Alert {
        id: r.try_get("", "id")?,
        run_id: r.try_get("", "run_id")?,
        step: r.try_get("", "step")?,
        kind: AlertKind::named(&kind),
        reason: r.try_get("", "reason")?,
        attempts: r.try_get("", "attempts")?,
        actions: serde_json::from_str(&actions).unwrap_or_else(|_| vec![actions]),
        created_at: timestamp(r.try_get("", "created_at")?),
        resolved_at: r.try_get::<Option<i64>>("", "resolved_at")?.map(timestamp),
        resolved_by: r.try_get("", "resolved_by")?,
        resolution: r.try_get("", "resolution")?,
    })
}

pub(super) async fn insert_alert<C: Exec>(
    store: &Store,
    conn: &C,
    a: &NewAlert,
) -> Result<Option<Alert>> {
    insert_alert_where(store, conn, a, "TRUE", Vec::new()).await
}

/// [`insert_alert`] where `cond` holds (read in the insert; its parameters `values` from `$8`
/// on): `None` when it does not, as when one is open under the alert's key.
async fn insert_alert_where<C: Exec>(
    store: &Store,
    conn: &C,
    a: &NewAlert,
    cond: &str,
    values: Vec<Value>,
) -> Result<Option<Alert>> {
    // `SELECT … WHERE`: the condition is read in the insert's own statement. (SQLite needs
    // the `WHERE` to read `ON CONFLICT` as the upsert clause after a `SELECT`.)
    let sql = format!(
        "INSERT INTO sagaflow_alerts (run_id, step, kind, reason, attempts, actions, open_key, created_at) \
         SELECT $1, $2, $3, $4, $5, $6, $7, {{now}} WHERE {cond} \
         ON CONFLICT (open_key) DO NOTHING RETURNING {ALERT_COLS}"
    );
    let actions = serde_json::to_string(&a.actions).unwrap_or_else(|_| "[]".into());
    let mut bound = vec![
        a.run_id.into(),
        a.step.clone().into(),
        a.kind.as_ref().to_owned().into(),
        a.reason.clone().into(),
        a.attempts.into(),
        actions.into(),
        a.open_key.clone().into(),
    ];
    bound.extend(values);
    let row = conn.query_one(store.stmt(&sql, bound)).await?;
    let Some(alert) = row.as_ref().map(decode).transpose()? else {
        return Ok(None);
    };
    // The notice goes with the alert, in the same transaction: an alert is never stored
    // without being queued for delivery.
    super::outbox::insert_notice(
        store,
        conn,
        Some(alert.id),
        alert.run_id,
        &super::outbox::alert_notice(&alert),
    )
    .await?;
    Ok(Some(alert))
}

impl Store {
    /// Persists an alert outside any run transaction (e.g. unknown version, corrupt row).
    /// Returns `None` when an open alert with the same key exists.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_insert(&self, alert: &NewAlert) -> Result<Option<Alert>> {
        let txn = self.exec.begin().await?;
        let row = insert_alert(self, &txn, alert).await?;
        txn.commit().await?;
        Ok(row)
    }

    /// [`Store::alert_insert`] for the leader of `fence`'s term (its maintenance services):
    /// nothing is stored unless that term still holds the lease, read again in the insert, so
    /// that a leader that lost its lease mid-pass raises nothing from what it read before
    /// (`None` when it lost it after the check).
    ///
    /// # Errors
    /// [`crate::Error::LeaseLost`]; [`crate::Error::Db`].
    pub async fn alert_insert_fenced(
        &self,
        alert: &NewAlert,
        fence: &LeaderFence,
    ) -> Result<Option<Alert>> {
        let txn = self.exec.begin().await?;
        // Checked first to answer `LeaseLost`, and again in the insert, which a successor
        // taking the lease in between would otherwise not stop (the check locks nothing).
        self.fence_check(&txn, fence).await?;
        let row = insert_alert_where(
            self,
            &txn,
            alert,
            "EXISTS (SELECT 1 FROM sagaflow_leases WHERE name = $8 AND holder = $9 \
               AND term = $10 AND expires_at > {wall_now})",
            vec![
                fence.name.clone().into(),
                fence.holder.clone().into(),
                fence.term.into(),
            ],
        )
        .await?;
        txn.commit().await?;
        Ok(row)
    }

    /// Open alerts, oldest first; or all alerts of one run.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_list(&self, run_id: Option<Uuid>, open_only: bool) -> Result<Vec<Alert>> {
        alert_list_on(self, &self.exec, run_id, open_only).await
    }

    /// Resolves one open alert, recording who (`by`) and why (`resolution`); returns whether
    /// it was open.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_resolve(&self, id: i64, by: &str, resolution: Option<&str>) -> Result<bool> {
        let res = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_alerts SET resolved_at = {now}, open_key = NULL, resolved_by = $2, \
                 resolution = $3 WHERE id = $1 AND resolved_at IS NULL",
                vec![id.into(), by.to_owned().into(), bounded(resolution).into()],
            ))
            .await?;
        Ok(res == 1)
    }

    /// Resolves the open alert with this `open_key`, if any (an alert whose cause went away by
    /// itself, such as `supervisor_stalled`), as [`RESOLVED_BY_ENGINE`] with `resolution`
    /// saying what went away; returns whether one was open.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_resolve_key(&self, open_key: &str, resolution: &str) -> Result<bool> {
        self.resolve_key_while(open_key, resolution, "", Vec::new())
            .await
    }

    /// [`Store::alert_resolve_key`] for the leader of `fence`'s term, only while that term
    /// holds the lease (read again in the write): a leader that lost its lease mid-pass does
    /// not resolve, from what it read before, an alert its successor raised since. Returns
    /// whether one was resolved.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_resolve_key_fenced(
        &self,
        open_key: &str,
        resolution: &str,
        fence: &LeaderFence,
    ) -> Result<bool> {
        self.resolve_key_while(
            open_key,
            resolution,
            " AND EXISTS (SELECT 1 FROM sagaflow_leases WHERE name = $4 AND holder = $5 \
               AND term = $6 AND expires_at > {wall_now})",
            vec![
                fence.name.clone().into(),
                fence.holder.clone().into(),
                fence.term.into(),
            ],
        )
        .await
    }

    /// Resolves the open alert under `open_key` that says lease `lease` has no sweeping
    /// leader, only while the lease row shows a sweep completed within `within_ms` (what the
    /// caller decided from, read again in the write): a stall another instance saw and
    /// raised after the caller's read stays open. Returns whether one was resolved.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_resolve_stall(
        &self,
        open_key: &str,
        lease: &str,
        within_ms: i64,
        resolution: &str,
    ) -> Result<bool> {
        self.resolve_key_while(
            open_key,
            resolution,
            " AND EXISTS (SELECT 1 FROM sagaflow_leases WHERE name = $4 \
               AND last_sweep_at IS NOT NULL AND {wall_now} - last_sweep_at <= $5)",
            vec![lease.to_owned().into(), within_ms.into()],
        )
        .await
    }

    /// Resolves the open alert under `open_key` as the engine, with `resolution`, where
    /// `cond` (a condition from ` AND …` on, its parameters `values` from `$4` on) holds.
    async fn resolve_key_while(
        &self,
        open_key: &str,
        resolution: &str,
        cond: &str,
        values: Vec<Value>,
    ) -> Result<bool> {
        let mut bound = vec![
            open_key.to_owned().into(),
            RESOLVED_BY_ENGINE.to_owned().into(),
            bounded(Some(resolution)).into(),
        ];
        bound.extend(values);
        let sql = format!(
            "UPDATE sagaflow_alerts SET resolved_at = {{now}}, open_key = NULL, resolved_by = $2, \
             resolution = $3 WHERE open_key = $1 AND resolved_at IS NULL{cond}"
        );
        let res = self.exec.execute(self.stmt(&sql, bound)).await?;
        Ok(res == 1)
    }

    /// Resolves the open alerts of a run, in the caller's transaction (an operator's action on
    /// the run: `by` is its actor, `resolution` the action and its reason).
    pub(super) async fn alert_resolve_run<C: Exec>(
        &self,
        conn: &C,
        run_id: Uuid,
        by: &str,
        resolution: Option<&str>,
    ) -> Result<()> {
        conn.execute(self.stmt(
            "UPDATE sagaflow_alerts SET resolved_at = {now}, open_key = NULL, resolved_by = $2, \
             resolution = $3 WHERE run_id = $1 AND resolved_at IS NULL",
            vec![
                run_id.into(),
                by.to_owned().into(),
                bounded(resolution).into(),
            ],
        ))
        .await?;
        Ok(())
    }
}

/// A resolution as stored: cut at [`RESOLUTION_MAX_CHARS`].
fn bounded(resolution: Option<&str>) -> Option<String> {
    resolution.map(|r| match r.char_indices().nth(RESOLUTION_MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &r[..cut]),
        None => r.to_owned(),
    })
}
