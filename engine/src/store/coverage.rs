//! Which workflows have due steps that no live instance runs: read by the supervisor leader
//! to raise (and resolve) the `no_instance_for_workflow` alerts.

use std::collections::HashSet;

use super::Store;
use super::instances::decode_workflows;
use super::row::Exec;
use crate::Result;
use crate::model::AlertKind;

/// Due steps of one `name@version` that no live instance runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncovered {
    /// `name@version`.
    pub workflow_key: String,
    /// Steps due now (forward or compensation).
    pub due: i64,
    /// How long the oldest of them has waited, in milliseconds (database clock).
    pub oldest_due_ms: i64,
}

impl Store {
    /// The workflow versions with steps due now that no live instance runs: instances whose
    /// heartbeat is younger than `stale_after_ms` and whose recorded workflows lack the key.
    /// One grouped statement over the due steps and one over the instances. When a live
    /// instance records no workflows (an older release), what it runs is unknown and nothing
    /// is reported.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn workflows_uncovered(&self, stale_after_ms: i64) -> Result<Vec<Uncovered>> {
        let due = self
            .exec
            .query_all(self.stmt(
                "SELECT workflow_key, COUNT(*) AS n, {now} - MIN(available_at) AS oldest \
                 FROM sagaflow_steps \
                 WHERE state IN ('ready', 'compensation_ready') AND available_at <= {now} \
                 GROUP BY workflow_key ORDER BY workflow_key",
                vec![],
            ))
            .await?;
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let live = self
            .exec
            .query_all(self.stmt(
                "SELECT workflows FROM sagaflow_instances WHERE heartbeat_at >= {wall_now} - $1",
                vec![stale_after_ms.into()],
            ))
            .await?;
        let mut runnable: HashSet<String> = HashSet::new();
        for r in &live {
            match decode_workflows(r.try_get("", "workflows")?) {
                Some(keys) => runnable.extend(keys),
                None => return Ok(Vec::new()),
            }
        }
        let mut out = Vec::new();
        for r in &due {
            let workflow_key: String = r.try_get("", "workflow_key")?;
            if runnable.contains(&workflow_key) {
                continue;
            }
            out.push(Uncovered {
                workflow_key,
                due: r.try_get("", "n")?,
                oldest_due_ms: r.try_get::<Option<i64>>("", "oldest")?.unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// The keys of the open alerts of `kind` that carry one.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn alert_open_keys(&self, kind: &AlertKind) -> Result<Vec<String>> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT open_key FROM sagaflow_alerts \
                 WHERE kind = $1 AND resolved_at IS NULL AND open_key IS NOT NULL \
                 ORDER BY id",
                vec![kind.as_ref().to_owned().into()],
            ))
            .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String>("", "open_key")?))
            .collect()
    }
}
