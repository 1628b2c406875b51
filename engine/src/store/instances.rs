//! Engine instances: a row per instance id, heartbeaten on the database's wall clock
//! (`{wall_now}`: a test clock's offset does not apply to liveness). An instance
//! whose heartbeat is older than the configured staleness is dead (crashed, frozen, or
//! stopped): the supervisor leader releases what it held, as interruptions, and may take
//! over a leader lease it held.
//!
//! Each row also records what its instance runs: the `name@version` keys of the workflows
//! registered on it (`workflows`, a JSON array), written at registration and whenever a
//! definition is registered or unregistered while it runs. `NULL` (an instance of an older
//! release) means unknown.

use super::row::Exec;

use super::Store;
use crate::Result;

/// What registering an instance found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// Milliseconds since the previous incarnation with this id last heartbeat, if there was
    /// one (a restart with the same id).
    pub predecessor_silent_ms: Option<i64>,
}

/// One registered engine instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRow {
    /// Instance id.
    pub id: String,
    /// The process currently registered under it.
    pub incarnation: String,
    /// When that process registered (DB clock, epoch ms).
    pub started_at: i64,
    /// Its last heartbeat (0 once stopped).
    pub heartbeat_at: i64,
    /// When it stopped gracefully, if it did.
    pub stopped_at: Option<i64>,
    /// Milliseconds since its last heartbeat, by the database clock.
    pub silent_ms: i64,
    /// The `name@version` keys of the workflows it runs, sorted; `None` when unknown (an
    /// instance of an older release).
    pub workflows: Option<Vec<String>>,
}

/// The stored form of an instance's workflows: a JSON array of `name@version` keys.
fn encode_workflows(workflows: &[String]) -> String {
    let mut keys = workflows.to_vec();
    keys.sort();
    keys.dedup();
    serde_json::to_string(&keys).unwrap_or_else(|_| "[]".into())
}

/// Decodes a stored list of workflows; text that is no JSON array of strings reads as
/// unknown.
pub(super) fn decode_workflows(raw: Option<String>) -> Option<Vec<String>> {
    raw.and_then(|t| serde_json::from_str(&t).ok())
}

impl Store {
    /// Every registered instance, by id.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn instance_list(&self) -> Result<Vec<InstanceRow>> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT id, incarnation, started_at, heartbeat_at, stopped_at, workflows, \
                 {wall_now} - heartbeat_at AS silent_ms FROM sagaflow_instances ORDER BY id",
                vec![],
            ))
            .await?;
        rows.iter()
            .map(|r| {
                Ok(InstanceRow {
                    id: r.try_get("", "id")?,
                    incarnation: r.try_get("", "incarnation")?,
                    started_at: r.try_get("", "started_at")?,
                    heartbeat_at: r.try_get("", "heartbeat_at")?,
                    stopped_at: r.try_get("", "stopped_at")?,
                    silent_ms: r.try_get("", "silent_ms")?,
                    workflows: decode_workflows(r.try_get("", "workflows")?),
                })
            })
            .collect()
    }

    /// Registers (or re-registers, on a restart with the same id) instance `id` under a new
    /// `incarnation`, heartbeating now, running the workflows `workflows` (`name@version`),
    /// and loads the key that signs callback tokens (creating it on a new database).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn instance_register(
        &self,
        id: &str,
        incarnation: &str,
        workflows: &[String],
    ) -> Result<Registered> {
        let before = self
            .exec
            .query_one(self.stmt(
                "SELECT {wall_now} - heartbeat_at AS silent FROM sagaflow_instances WHERE id = $1",
                vec![id.to_owned().into()],
            ))
            .await?
            .map(|r| r.try_get::<i64>("", "silent"))
            .transpose()?;
        self.exec
            .execute(self.stmt(
                "INSERT INTO sagaflow_instances (id, incarnation, started_at, heartbeat_at, workflows) \
                 VALUES ($1, $2, {wall_now}, {wall_now}, $3) \
                 ON CONFLICT (id) DO UPDATE SET incarnation = $2, started_at = {wall_now}, \
                   heartbeat_at = {wall_now}, stopped_at = NULL, workflows = $3",
                vec![
                    id.to_owned().into(),
                    incarnation.to_owned().into(),
                    encode_workflows(workflows).into(),
                ],
            ))
            .await?;
        // The callback key, read now so that no callback request pays for it (nor a forged
        // one reaches the database because it came first).
        self.callback_key().await?;
        Ok(Registered {
            predecessor_silent_ms: before,
        })
    }

    /// Heartbeats instance `id` if `incarnation` still owns it; `false` means another process
    /// registered the same id since (this one must stop taking work).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn instance_heartbeat(&self, id: &str, incarnation: &str) -> Result<bool> {
        let res = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_instances SET heartbeat_at = {wall_now} WHERE id = $1 AND incarnation = $2",
                vec![id.to_owned().into(), incarnation.to_owned().into()],
            ))
            .await?;
        Ok(res == 1)
    }

    /// Records that instance `id`, while `incarnation` owns it, runs the workflows
    /// `workflows` (`name@version`) from now on. `false` means another process registered
    /// the same id since.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn instance_set_workflows(
        &self,
        id: &str,
        incarnation: &str,
        workflows: &[String],
    ) -> Result<bool> {
        let res = self
            .exec
            .execute(self.stmt(
                "UPDATE sagaflow_instances SET workflows = $3 WHERE id = $1 AND incarnation = $2",
                vec![
                    id.to_owned().into(),
                    incarnation.to_owned().into(),
                    encode_workflows(workflows).into(),
                ],
            ))
            .await?;
        Ok(res == 1)
    }

    /// Marks instance `id` stopped (its heartbeat is stale at once).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn instance_stop(&self, id: &str, incarnation: &str) -> Result<()> {
        self.exec
            .execute(self.stmt(
                "UPDATE sagaflow_instances SET heartbeat_at = 0, stopped_at = {wall_now} \
                 WHERE id = $1 AND incarnation = $2",
                vec![id.to_owned().into(), incarnation.to_owned().into()],
            ))
            .await?;
        Ok(())
    }

    /// Forgets instances silent for longer than `older_than_ms` that hold no step.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn instance_purge(&self, older_than_ms: i64) -> Result<u64> {
        let res = self
            .exec
            .execute(self.stmt(
                "DELETE FROM sagaflow_instances WHERE heartbeat_at < {wall_now} - $1 \
                 AND NOT EXISTS (SELECT 1 FROM sagaflow_steps \
                   WHERE state IN ('running', 'compensating') AND locked_by = sagaflow_instances.id)",
                vec![older_than_ms.into()],
            ))
            .await?;
        Ok(res)
    }
}
