//! History and finished-run partitions on PostgreSQL: made ahead of time, dropped behind it
//! (issue 32).
//!
//! `sagaflow_history` and the finished runs' table, [`RUNS_DONE`], are range-partitioned on
//! the run id, one partition of each per UTC day of run starts (see
//! `sagaflow_migrations::partitions`). A run that ends for good and holds no business key
//! moves into [`RUNS_DONE`] at its end; the others stay in `sagaflow_runs`, where retention
//! deletes them row by row. [`Store::history_partitions_maintain`] drops a day's two
//! partitions at once, when no run of that day is kept, which costs a catalog change instead
//! of a delete, a WAL record and a dead row per run and per event. The history of a run that
//! is gone cannot be read in the meantime ([`Store::run_history_after`] asks for the run).
//! SQLite keeps one table of each and deletes rows.

use sagaflow_migrations::partitions::{
    HISTORY_COLUMNS, HISTORY_DEFAULT_PARTITION, HISTORY_PARTITION_SPAN_MS, RUN_TABLE_COLUMNS,
    RUNS_DONE, history_partition_create, next_span, partition_create, partition_name, uuid_floor,
    uuid_ms,
};

use super::Store;
use super::row::Exec;
use crate::{Backend, Result};

/// How long after its day ends a partition is left alone: ids are minted on the engines'
/// clocks, and one whose clock runs behind the database's still starts runs "yesterday".
const DROP_MARGIN_MS: i64 = 3_600_000;

/// How long dropping a partition waits for the tables' locks before it gives up until the
/// next pass: history writes and run ends queue behind a waiting `DROP`, so it must not wait
/// long.
const DROP_LOCK_WAIT_MS: i64 = 500;

/// Days of partitions kept made ahead of the database's clock.
const DAYS_AHEAD: i64 = 2;

/// What one pass over the partitions did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPass {
    /// Partitions made ahead of time (of the history and of the finished runs).
    pub created: u64,
    /// Days dropped: the history partition, with the finished runs' of the same day.
    pub dropped: u64,
    /// History rows of runs still kept, moved to the default partition before their
    /// partition was dropped.
    pub moved_rows: u64,
    /// Finished runs the dropped days took with them.
    pub runs_dropped: u64,
    /// Days due to go that were left for the next pass: a lock was busy.
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

/// The statements that make the partitions of the UTC day starting at `day`, in both tables.
fn day_create(day: i64) -> [String; 2] {
    [
        history_partition_create(day),
        partition_create(RUNS_DONE, day),
    ]
}

impl Store {
    /// Makes the partitions of the coming days (history and finished runs) and drops those of
    /// past days that hold no kept run (PostgreSQL; nothing on SQLite): a day goes once every
    /// run it started has either been purged from `sagaflow_runs` or finished more than
    /// `retention_ms` ago in the finished runs' table. A day that ended more than
    /// `retention_ms` and one more day ago goes even if some of its runs are still kept (a
    /// run that waited for weeks, a child its parent may still undo): their rows move to the
    /// default partitions first. A drop that would wait for the tables' locks is left for the
    /// next pass.
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
            for sql in day_create(day) {
                match self.exec.execute_unprepared(&sql).await {
                    Ok(_) => pass.created += 1,
                    Err(e) => tracing::warn!(error = %e, day, "could not make a partition"),
                }
            }
            day += HISTORY_PARTITION_SPAN_MS;
        }
        // Behind. Saturating: a retention of "forever" is `i64::MAX` milliseconds.
        let cutoff = now.saturating_sub(retention_ms);
        for part in parts.iter().filter(|p| p.hi <= now - DROP_MARGIN_MS) {
            let stragglers_go = part.hi <= cutoff.saturating_sub(HISTORY_PARTITION_SPAN_MS);
            if !stragglers_go && self.day_kept(&self.exec, part, cutoff).await? {
                continue;
            }
            match self.day_drop(part, cutoff, stragglers_go).await {
                Ok(Some((moved, runs))) => {
                    pass.dropped += 1;
                    pass.moved_rows += moved;
                    pass.runs_dropped += runs;
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

    /// Drops the day of `part` (its history partition and its finished runs' partition)
    /// under both tables' locks, after checking again that none of its runs is kept or, with
    /// `stragglers_go`, moving those that are out of the way: their history to the history's
    /// default partition, their finished rows to the finished runs' default partition (runs
    /// that are not finished stay in `sagaflow_runs`). The runs that go leave the run totals,
    /// and their alerts and kept events go with them. `None` when a run is kept and may not
    /// be moved yet; else how many history rows moved and how many finished runs went.
    async fn day_drop(
        &self,
        part: &Partition,
        cutoff: i64,
        stragglers_go: bool,
    ) -> Result<Option<(u64, u64)>> {
        let txn = self.exec.begin().await?;
        txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{DROP_LOCK_WAIT_MS}ms'"))
            .await?;
        // The parents first, in one order: a transaction that wrote history into the
        // partition, or ended a run into the day, has committed (and its run is seen below)
        // before this one goes on.
        txn.execute_unprepared(&format!(
            "LOCK TABLE sagaflow_history, {RUNS_DONE} IN ACCESS EXCLUSIVE MODE"
        ))
        .await?;
        let kept = self.day_kept(&txn, part, cutoff).await?;
        if kept && !stragglers_go {
            txn.rollback().await?;
            return Ok(None);
        }
        let range = range_of(part);
        let going = format!("{range} AND finished_at < {cutoff}");
        // The finished runs that go: off the totals, with their alerts and events.
        let rows = txn
            .query_all(self.stmt(
                &format!(
                    "SELECT workflow, state, COUNT(*) AS n FROM {RUNS_DONE} WHERE {going} \
                     GROUP BY workflow, state"
                ),
                vec![],
            ))
            .await?;
        let mut gone: Vec<(String, crate::RunState, i64)> = Vec::with_capacity(rows.len());
        let mut runs = 0;
        for r in &rows {
            let (workflow, state, n): (String, String, i64) = (
                r.try_get("", "workflow")?,
                r.try_get("", "state")?,
                r.try_get("", "n")?,
            );
            runs += u64::try_from(n).unwrap_or(0);
            // The totals are per run state: a stored state that is not one is left out.
            if let Ok(state) = state.parse() {
                gone.push((workflow, state, -n));
            }
        }
        super::stats::add_totals(
            self,
            &txn,
            0,
            gone.iter().map(|(w, st, n)| (w.as_str(), *st, *n)),
        )
        .await?;
        for table in ["sagaflow_alerts", "sagaflow_events"] {
            txn.execute_unprepared(&format!(
                "DELETE FROM {table} WHERE run_id IN (SELECT id FROM {RUNS_DONE} WHERE {going})"
            ))
            .await?;
        }
        let mut moved = 0;
        if kept {
            // No partition covers the range once detached: the rows land in the default
            // one, as will any history these runs write from here on.
            txn.execute_unprepared(&format!(
                "ALTER TABLE sagaflow_history DETACH PARTITION {}",
                part.name
            ))
            .await?;
            moved = txn
                .execute_unprepared(&format!(
                    "INSERT INTO sagaflow_history ({HISTORY_COLUMNS}) SELECT {HISTORY_COLUMNS} \
                     FROM {} WHERE run_id IN (SELECT id FROM sagaflow_runs WHERE {range} \
                     UNION ALL SELECT id FROM {RUNS_DONE} WHERE {range} AND finished_at >= {cutoff})",
                    part.name,
                ))
                .await?;
        }
        match self.done_partition_of(&txn, part).await? {
            Some(done) => {
                if kept {
                    txn.execute_unprepared(&format!(
                        "ALTER TABLE {RUNS_DONE} DETACH PARTITION {done}"
                    ))
                    .await?;
                    txn.execute_unprepared(&format!(
                        "INSERT INTO {RUNS_DONE} ({RUN_TABLE_COLUMNS}) SELECT {RUN_TABLE_COLUMNS} \
                         FROM {done} WHERE finished_at >= {cutoff}"
                    ))
                    .await?;
                }
                txn.execute_unprepared(&format!("DROP TABLE {done}"))
                    .await?;
            }
            // A day without a partition of finished runs (before there was the table, or
            // not made in time): its runs are in the default partition, deleted here.
            None => {
                txn.execute_unprepared(&format!("DELETE FROM {RUNS_DONE} WHERE {going}"))
                    .await?;
            }
        }
        txn.execute_unprepared(&format!("DROP TABLE {}", part.name))
            .await?;
        txn.commit().await?;
        Ok(Some((moved, runs)))
    }

    /// The finished runs' partition of the same day as the history partition `part`, if
    /// there is one and it is attached.
    async fn done_partition_of<C: Exec>(
        &self,
        conn: &C,
        part: &Partition,
    ) -> Result<Option<String>> {
        let Some(lo) = part.lo else { return Ok(None) };
        let name = partition_name(RUNS_DONE, lo);
        let row = conn
            .query_one(self.stmt(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM pg_inherits AS i JOIN pg_class AS c \
                     ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass('{RUNS_DONE}') \
                     AND c.relname = '{name}') AS attached"
                ),
                vec![],
            ))
            .await?;
        let attached = match row {
            Some(r) => r.try_get("", "attached")?,
            None => false,
        };
        Ok(attached.then_some(name))
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
            for sql in day_create(day) {
                if let Err(e) = self.exec.execute_unprepared(&sql).await {
                    tracing::debug!(error = %e, day, "no partition made for a filled day");
                }
            }
            day += HISTORY_PARTITION_SPAN_MS;
        }
    }

    /// Whether a run of the partition's day is kept: a run in the runs table (not finished,
    /// or finished and keeping its business key or its parent's claim), or a finished run
    /// that ended at or after `cutoff`. Two probes of indexes, however many runs there are.
    async fn day_kept<C: Exec>(&self, conn: &C, part: &Partition, cutoff: i64) -> Result<bool> {
        let range = range_of(part);
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM sagaflow_runs WHERE {range}) \
             OR EXISTS (SELECT 1 FROM {RUNS_DONE} WHERE {range} AND finished_at >= {cutoff}) AS kept"
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

/// The condition on a runs table's `id` for the partition's range.
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
