//! Leader leases (LE-1..3): a row per lease with a holder, a term and an expiry on the
//! database clock. Every supervisor write is fenced by `(holder, term)`.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseTransaction};

use super::Store;
use crate::definition::millis;
use crate::{Error, Result};

/// Proof of leadership carried by every fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderFence {
    /// Lease name.
    pub name: String,
    /// Holder id.
    pub holder: String,
    /// Term won at election; a new election increments it.
    pub term: i64,
}

impl LeaderFence {
    /// How the holder appears in the history.
    pub fn actor(&self) -> String {
        format!("supervisor:{}#{}", self.holder, self.term)
    }
}

impl Store {
    /// Tries to take the lease `name` for `holder` if it is free or expired. Returns the new
    /// term on success.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_try_elect(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<LeaderFence>> {
        self.leader_try_elect_with(name, holder, ttl, None).await
    }

    /// Like [`Store::leader_try_elect`], and also takes the lease at once when it is held by
    /// this same holder id (a restart of the instance that led) or, with `stale_after`, by an
    /// instance whose heartbeat is older than that (it died or froze: LE-3).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_try_elect_with(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
        stale_after: Option<Duration>,
    ) -> Result<Option<LeaderFence>> {
        self.db
            .execute_raw(self.stmt(
                "INSERT INTO sagaflow_leases (name, holder, term, expires_at) VALUES ($1, NULL, 0, 0) \
                 ON CONFLICT (name) DO NOTHING",
                vec![name.to_owned().into()],
            ))
            .await?;
        let row = self
            .db
            .query_one_raw(self.stmt(
                "UPDATE sagaflow_leases SET holder = $2, term = term + 1, expires_at = {now} + $3 \
                 WHERE name = $1 AND (holder IS NULL OR expires_at <= {now} OR holder = $2 \
                   OR ($4 >= 0 AND holder IN \
                     (SELECT id FROM sagaflow_instances WHERE heartbeat_at < {now} - $4))) \
                 RETURNING term",
                vec![
                    name.to_owned().into(),
                    holder.to_owned().into(),
                    millis(ttl).into(),
                    stale_after.map_or(-1, millis).into(),
                ],
            ))
            .await?;
        Ok(match row {
            Some(r) => Some(LeaderFence {
                name: name.to_owned(),
                holder: holder.to_owned(),
                term: r.try_get("", "term")?,
            }),
            None => None,
        })
    }

    /// Extends the lease if `fence` still holds it and it has not expired.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_renew(&self, fence: &LeaderFence, ttl: Duration) -> Result<bool> {
        let res = self
            .db
            .execute_raw(self.stmt(
                "UPDATE sagaflow_leases SET expires_at = {now} + $4 \
                 WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > {now}",
                vec![
                    fence.name.clone().into(),
                    fence.holder.clone().into(),
                    fence.term.into(),
                    millis(ttl).into(),
                ],
            ))
            .await?;
        Ok(res.rows_affected() == 1)
    }

    /// Gives the lease up so another instance can take it at once (LE-2).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_release(&self, fence: &LeaderFence) -> Result<()> {
        self.db
            .execute_raw(self.stmt(
                "UPDATE sagaflow_leases SET holder = NULL, expires_at = 0 WHERE name = $1 AND holder = $2 AND term = $3",
                vec![fence.name.clone().into(), fence.holder.clone().into(), fence.term.into()],
            ))
            .await?;
        Ok(())
    }

    /// The current holder and term of a lease, if held and unexpired.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_current(&self, name: &str) -> Result<Option<LeaderFence>> {
        let row = self
            .db
            .query_one_raw(self.stmt(
                "SELECT holder, term FROM sagaflow_leases WHERE name = $1 AND holder IS NOT NULL AND expires_at > {now}",
                vec![name.to_owned().into()],
            ))
            .await?;
        Ok(match row {
            Some(r) => Some(LeaderFence {
                name: name.to_owned(),
                holder: r.try_get("", "holder")?,
                term: r.try_get("", "term")?,
            }),
            None => None,
        })
    }

    /// Inside a transaction: fails unless `fence` holds the unexpired lease. It takes no
    /// lock: a leader frozen inside its transaction must not block the next election (LE-3).
    /// Each fenced write repeats the check in its own `WHERE`, and the writes' guards on the
    /// step's state and attempt make a stale leader's late write match nothing.
    pub(super) async fn fence_check(
        &self,
        txn: &DatabaseTransaction,
        fence: &LeaderFence,
    ) -> Result<()> {
        let sql = "SELECT term FROM sagaflow_leases WHERE name = $1 AND holder = $2 AND term = $3 \
                   AND expires_at > {now}";
        let row = txn
            .query_one_raw(self.stmt(
                sql,
                vec![
                    fence.name.clone().into(),
                    fence.holder.clone().into(),
                    fence.term.into(),
                ],
            ))
            .await?;
        if row.is_none() {
            return Err(Error::LeaseLost {
                name: fence.name.clone(),
                term: fence.term,
            });
        }
        Ok(())
    }
}
