//! History partitions on PostgreSQL: made ahead of time, dropped behind it (issue 32).
//!
//! `sagaflow_history` is range-partitioned on `run_id`, one partition per UTC day of run
//! starts (see `sagaflow_migrations::partitions`). Retention deletes a finished run's row
//! and leaves its history where it is; [`Store::history_partitions_maintain`] drops a day's
//! partition once no run of that day is kept, which costs a catalog change instead of a
//! delete, a WAL record and a dead row per event. The history of a run that is gone cannot
//! be read in the meantime ([`Store::run_history_after`] asks for the run). SQLite keeps
//! one table and deletes rows.

use sagaflow_migrations::partitions::{
    HISTORY_COLUMNS, HISTORY_DEFAULT_PARTITION, HISTORY_PARTITION_SPAN_MS,
    history_partition_create, next_span, uuid_floor, uuid_ms,
};

use super::Store;
use super::row::Exec;
use crate::{Backend, Result};

/// How long after its day ends a partition is left alone: ids are minted on the engines'
/// clocks, and one whose clock runs behind the database's still starts runs "yesterday".
const DROP_MARGIN_MS: i64 = 3_600_000;

/// How long dropping a partition waits for the history table's lock before it gives up
/// until the next pass: history writes queue behind a waiting `DROP`, so it must not wait
/// long.
const DROP_LOCK_WAIT_MS: i64 = 500;

/// Days of partitions kept made ahead of the database's clock.
const DAYS_AHEAD: i64 = 2;

/// What one pass over the history partitions did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPass {
    /// Partitions made ahead of time.
    pub created: u64,
    /// Partitions dropped with the history they held.
    pub dropped: u64,
    /// History rows of runs still kept, moved to the default partition before their
    /// partition was dropped.
    pub moved_rows: u64,
    /// Partitions due to go that were left for the next pass: their lock was busy.
    pub busy: u64,
}

/// One partition: its table and the milliseconds its run ids cover (`lo` is `None` from the
/// lowest id on).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Partition {
    name: String,
    lo: Option<i64>,
    hi: i64,
}

impl Store {
    /// Makes the history partitions of the coming days and drops those of past days that
    /// hold no kept run (PostgreSQL; nothing on SQLite). A partition whose day ended more
    /// than `retention_ms` and one more day ago goes even if some of its runs are still
    /// kept (a run that waited for weeks, a child its parent may still undo): their history
    /// moves to the default partition first. A drop that would wait for the table's lock
    /// is left for the next pass.
    ///
    /// # Errors
    /// [`Error::Db`](crate::Error::Db) when the partitions cannot be listed; a partition that
    /// cannot be made or dropped is logged and counted, not an error.
    pub async fn history_partitions_maintain(&self, retention_ms: i64) -> Result<PartitionPass> {
        let mut pass = PartitionPass::default();
        if self.backend != Backend::Postgres {
            return Ok(pass);
        }
        let now = self.wall_now_ms().await?;
        let parts = self.history_partitions().await?;
        // Ahead: from where the partitions end, or from the next midnight when they end in
        // the past (the days between went to the default partition, and a partition over
        // them would be refused for the rows there).
        let mut day = match parts.iter().map(|p| p.hi).max() {
            Some(end) if end >= now => end,
            _ => next_span(now),
        };
        while day < now + DAYS_AHEAD * HISTORY_PARTITION_SPAN_MS {
            match self
                .exec
                .execute_unprepared(&history_partition_create(day))
                .await
            {
                Ok(_) => pass.created += 1,
                Err(e) => tracing::warn!(error = %e, day, "could not make a history partition"),
            }
            day += HISTORY_PARTITION_SPAN_MS;
        }
        // Behind.
        for part in parts.iter().filter(|p| p.hi <= now - DROP_MARGIN_MS) {
            // Saturating: a retention of "forever" is `i64::MAX` milliseconds.
            let stragglers_go = part.hi
                <= now
                    .saturating_sub(retention_ms)
                    .saturating_sub(HISTORY_PARTITION_SPAN_MS);
            if !stragglers_go && self.runs_in(&self.exec, part).await? {
                continue;
            }
            match self.history_partition_drop(part, stragglers_go).await {
                Ok(Some(moved)) => {
                    pass.dropped += 1;
                    pass.moved_rows += moved;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::info!(error = %e, partition = %part.name, "history partition left for the next pass");
                    pass.busy += 1;
                }
            }
        }
        Ok(pass)
    }

    /// Drops `part` under the history table's lock, after checking again that none of its
    /// runs is kept or, with `stragglers_go`, moving the history of those that are to the
    /// default partition. `None` when a run is kept and may not be moved yet; else how many
    /// history rows moved.
    async fn history_partition_drop(
        &self,
        part: &Partition,
        stragglers_go: bool,
    ) -> Result<Option<u64>> {
        let txn = self.exec.begin().await?;
        txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{DROP_LOCK_WAIT_MS}ms'"))
            .await?;
        // The parent first: a transaction that wrote history into the partition has
        // committed (and its run is seen below) before this one goes on.
        txn.execute_unprepared("LOCK TABLE sagaflow_history IN ACCESS EXCLUSIVE MODE")
            .await?;
        let mut moved = 0;
        if self.runs_in(&txn, part).await? {
            if !stragglers_go {
                txn.rollback().await?;
                return Ok(None);
            }
            txn.execute_unprepared(&format!(
                "ALTER TABLE sagaflow_history DETACH PARTITION {}",
                part.name
            ))
            .await?;
            // No partition covers the range now: the rows land in the default one, as will
            // any history these runs write from here on.
            moved = txn
                .execute_unprepared(&format!(
                    "INSERT INTO sagaflow_history ({HISTORY_COLUMNS}) SELECT {HISTORY_COLUMNS} \
                     FROM {} WHERE run_id IN (SELECT id FROM sagaflow_runs WHERE {})",
                    part.name,
                    range_of(part)
                ))
                .await?;
        }
        txn.execute_unprepared(&format!("DROP TABLE {}", part.name))
            .await?;
        txn.commit().await?;
        Ok(Some(moved))
    }

    /// Makes the partitions of the days between `from_ms` and `to_ms` (database clock) where
    /// none is: what an engine running then would have made. For [`Store::run_fill_finished`];
    /// a day another partition (or the default one's rows) covers is left to it.
    pub(super) async fn history_partitions_back_to(&self, from_ms: i64, to_ms: i64) {
        if self.backend != Backend::Postgres {
            return;
        }
        let mut day = next_span(from_ms) - HISTORY_PARTITION_SPAN_MS;
        while day <= to_ms {
            if let Err(e) = self
                .exec
                .execute_unprepared(&history_partition_create(day))
                .await
            {
                tracing::debug!(error = %e, day, "no history partition made for a filled day");
            }
            day += HISTORY_PARTITION_SPAN_MS;
        }
    }

    /// Whether a run of the partition's range of ids is kept: one probe of the runs' primary
    /// key, however many there are.
    async fn runs_in<C: Exec>(&self, conn: &C, part: &Partition) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM sagaflow_runs WHERE {}) AS kept",
            range_of(part)
        );
        let row = conn.query_one(self.stmt(&sql, vec![])).await?;
        Ok(match row {
            Some(r) => r.try_get("", "kept")?,
            None => false,
        })
    }

    /// The history table's partitions but the default one, from the catalog.
    async fn history_partitions(&self) -> Result<Vec<Partition>> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound \
                 FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid \
                 WHERE i.inhparent = to_regclass('sagaflow_history')",
                vec![],
            ))
            .await?;
        let mut parts = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = r.try_get("", "name")?;
            let bound: String = r.try_get("", "bound")?;
            if name == HISTORY_DEFAULT_PARTITION {
                continue;
            }
            match parse_bound(&bound) {
                Some((lo, hi)) => parts.push(Partition { name, lo, hi }),
                None => {
                    tracing::warn!(partition = %name, %bound, "a history partition of a bound sagaflow did not make; left alone")
                }
            }
        }
        parts.sort_by_key(|p| p.hi);
        Ok(parts)
    }
}

/// The condition on `sagaflow_runs.id` for the partition's range.
fn range_of(part: &Partition) -> String {
    let hi = uuid_floor(part.hi);
    match part.lo {
        Some(lo) => format!("id >= '{}' AND id < '{hi}'", uuid_floor(lo)),
        None => format!("id < '{hi}'"),
    }
}

/// `FOR VALUES FROM ('…') TO ('…')`, or `FROM (MINVALUE) TO ('…')`, as milliseconds.
fn parse_bound(bound: &str) -> Option<(Option<i64>, i64)> {
    let rest = bound.strip_prefix("FOR VALUES FROM (")?;
    let (from, to) = rest.split_once(") TO (")?;
    let to = to.strip_suffix(')')?;
    let quoted = |s: &str| {
        s.strip_prefix('\'')
            .and_then(|s| s.strip_suffix('\''))
            .and_then(uuid_ms)
    };
    let lo = if from == "MINVALUE" {
        None
    } else {
        Some(quoted(from)?)
    };
    Some((lo, quoted(to)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_read_back_from_the_catalog_form() {
        let day = 1_795_910_400_000;
        let b = format!(
            "FOR VALUES FROM ('{}') TO ('{}')",
            uuid_floor(day),
            uuid_floor(day + HISTORY_PARTITION_SPAN_MS)
        );
        assert_eq!(
            parse_bound(&b),
            Some((Some(day), day + HISTORY_PARTITION_SPAN_MS))
        );
        let b = format!("FOR VALUES FROM (MINVALUE) TO ('{}')", uuid_floor(day));
        assert_eq!(parse_bound(&b), Some((None, day)));
        assert_eq!(parse_bound("DEFAULT"), None);
        assert_eq!(parse_bound("FOR VALUES IN (1)"), None);
    }

    #[test]
    fn a_uuidv7_falls_in_the_range_of_its_millisecond() {
        let id = uuid::Uuid::now_v7();
        let ms = uuid_ms(&id.to_string()).expect("a v7 id carries its time");
        let (secs, nanos) = id.get_timestamp().expect("v7").to_unix();
        assert_eq!(
            ms,
            i64::try_from(secs * 1000).expect("in range") + i64::from(nanos / 1_000_000)
        );
        assert!(id.to_string().as_str() >= uuid_floor(ms).as_str());
        assert!(id.to_string().as_str() < uuid_floor(ms + 1).as_str());
    }
}
