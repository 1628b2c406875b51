//! Leader leases (LE-1..3): a row per lease with a holder, a term and an expiry on the
//! database's wall clock (`{wall_now}`: a test clock's offset does not apply, so moving it
//! expires no lease). Every supervisor write is fenced by `(holder, term)`. The row also records
//! when the leader's last sweep completed (`last_sweep_at`), so followers can tell a leader
//! that renews but no longer works (LE-3).

use std::time::Duration;

use super::row::Exec;

use super::conn::Txn;

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

/// What [`Store::leader_progress`] reads from a lease row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderProgress {
    /// Current holder, if the lease is held and unexpired.
    pub holder: Option<String>,
    /// Latest term (of the current or the last holder).
    pub term: i64,
    /// Milliseconds (database clock) since a leader last completed a sweep.
    pub since_sweep_ms: i64,
}

impl LeaderFence {
    /// How the holder appears in the history.
    pub fn actor(&self) -> String {
        format!("supervisor:{}#{}", self.holder, self.term)
    }
}

/// What an instance asks for when it stands for a lease: see [`Store::leader_try_elect_with`].
#[derive(Debug, Clone, Copy)]
pub struct Election<'a> {
    /// The lease's name.
    pub name: &'a str,
    /// The instance standing.
    pub holder: &'a str,
    /// How long the lease is held without a renewal.
    pub ttl: Duration,
    /// Take the lease from a holder whose heartbeat is older than this.
    pub stale_after: Option<Duration>,
    /// Restart the sweep record when the lease was free for longer than this.
    pub vacant_after: Option<Duration>,
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
        self.leader_try_elect_with(&Election {
            name,
            holder,
            ttl,
            stale_after: None,
            vacant_after: None,
        })
        .await
    }

    /// Like [`Store::leader_try_elect`], and also takes the lease at once when it is held by
    /// this same holder id (a restart of the instance that led) or, with `stale_after`, by an
    /// instance whose heartbeat is older than that (it died or froze: LE-3).
    ///
    /// The lease's last-sweep time carries over from term to term, so leaders that keep
    /// stalling show as one growing gap. It restarts at the election when none is recorded
    /// yet or, with `vacant_after`, when the lease had been free for longer than that (no
    /// instance competed, as when every engine was stopped: that idle time is nobody's
    /// stall).
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_try_elect_with(&self, e: &Election<'_>) -> Result<Option<LeaderFence>> {
        let Election {
            name,
            holder,
            ttl,
            stale_after,
            vacant_after,
        } = *e;
        self.exec
            .execute(self.stmt(
                "INSERT INTO sagaflow_leases (name, holder, term, expires_at) VALUES ($1, NULL, 0, 0) \
                 ON CONFLICT (name) DO NOTHING",
                vec![name.to_owned().into()],
            ))
            .await?;
        let row = self
            .exec
            .query_one(self.stmt(
                "UPDATE sagaflow_leases SET holder = $2, term = term + 1, expires_at = {wall_now} + $3, \
                   last_sweep_at = CASE WHEN last_sweep_at IS NULL \
                     OR ($5 >= 0 AND expires_at < {wall_now} - $5) THEN {wall_now} ELSE last_sweep_at END \
                 WHERE name = $1 AND (holder IS NULL OR expires_at <= {wall_now} OR holder = $2 \
                   OR ($4 >= 0 AND holder IN \
                     (SELECT id FROM sagaflow_instances WHERE heartbeat_at < {wall_now} - $4))) \
                 RETURNING term",
                vec![
                    name.to_owned().into(),
                    holder.to_owned().into(),
                    millis(ttl).into(),
                    stale_after.map_or(-1, millis).into(),
                    vacant_after.map_or(-1, millis).into(),
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
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_leases SET expires_at = {wall_now} + $4 \
                 WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > {wall_now}",
                vec![
                    fence.name.clone().into(),
                    fence.holder.clone().into(),
                    fence.term.into(),
                    millis(ttl).into(),
                ],
            ))
            .await?;
        Ok(res == 1)
    }

    /// Gives the lease up so another instance can take it at once (LE-2). The expiry is set
    /// to the release time, which records since when the lease is free.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_release(&self, fence: &LeaderFence) -> Result<()> {
        self.exec
            .execute(self.stmt(
                "UPDATE sagaflow_leases SET holder = NULL, expires_at = {wall_now} \
                 WHERE name = $1 AND holder = $2 AND term = $3",
                vec![
                    fence.name.clone().into(),
                    fence.holder.clone().into(),
                    fence.term.into(),
                ],
            ))
            .await?;
        Ok(())
    }

    /// Records that the leader of `fence` completed a sweep now (database clock). Returns
    /// `false`, writing nothing, when `fence` no longer holds the unexpired lease.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_record_sweep(&self, fence: &LeaderFence) -> Result<bool> {
        let res = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_leases SET last_sweep_at = {wall_now} \
                 WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > {wall_now}",
                vec![
                    fence.name.clone().into(),
                    fence.holder.clone().into(),
                    fence.term.into(),
                ],
            ))
            .await?;
        Ok(res == 1)
    }

    /// How long ago (database clock) a leader of lease `name` last completed a sweep, with the
    /// lease's current holder. `None` when the lease row does not exist or records no sweep
    /// yet.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_progress(&self, name: &str) -> Result<Option<LeaderProgress>> {
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT CASE WHEN expires_at > {wall_now} THEN holder END AS holder, term, \
                   {wall_now} - last_sweep_at AS since_sweep_ms \
                 FROM sagaflow_leases WHERE name = $1 AND last_sweep_at IS NOT NULL",
                vec![name.to_owned().into()],
            ))
            .await?;
        Ok(match row {
            Some(r) => Some(LeaderProgress {
                holder: r.try_get("", "holder")?,
                term: r.try_get("", "term")?,
                since_sweep_ms: r.try_get("", "since_sweep_ms")?,
            }),
            None => None,
        })
    }

    /// The current holder and term of a lease, if held and unexpired.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn leader_current(&self, name: &str) -> Result<Option<LeaderFence>> {
        let row = self
            .exec
            .query_one(self.stmt(
                "SELECT holder, term FROM sagaflow_leases WHERE name = $1 AND holder IS NOT NULL AND expires_at > {wall_now}",
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
    pub(super) async fn fence_check(&self, txn: &Txn, fence: &LeaderFence) -> Result<()> {
        let sql = "SELECT term FROM sagaflow_leases WHERE name = $1 AND holder = $2 AND term = $3 \
                   AND expires_at > {wall_now}";
        let row = txn
            .query_one(self.stmt(
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
