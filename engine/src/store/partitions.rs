//! History and finished-run partitions on PostgreSQL: made ahead of time, dropped behind it
//! (issue 32).
//!
//! `sagaflow_history` and the finished runs' table, [`RUNS_DONE`], are range-partitioned on
//! the run id, one partition of each per UTC day of run starts (see
//! `sagaflow_migrations::partitions`). A run that ends for good and is not a child run moves
//! into [`RUNS_DONE`] at its end; the others stay in `sagaflow_runs`, where retention deletes
//! them row by row. [`Store::history_partitions_maintain`] drops a day's two
//! partitions at once, when no run of that day is kept, which costs a catalog change instead
//! of a delete, a WAL record and a dead row per run and per event. The history of a run that
//! is gone cannot be read in the meantime ([`Store::run_history_after`] asks for the run).
//! SQLite keeps one table of each and deletes rows.

use sagaflow_migrations::partitions::{
    HISTORY_COLUMNS, HISTORY_DEFAULT_PARTITION, HISTORY_PARTITION_SPAN_MS, RUN_KEYS,
    RUN_TABLE_COLUMNS, RUNS_DONE, RUNS_DONE_DEFAULT_PARTITION, history_partition_create, next_span,
    partition_create, uuid_floor, uuid_ms,
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

/// The run-totals slot the day drops take their runs off: no unit of work writes it (they
/// write slots from 0 up), so a drop never waits for a unit's row lock while it holds the
/// tables' locks, nor a unit for the drop's.
const DROP_TOTALS_SLOT: i64 = -1;

/// One day to drop: the history partition of a range of run ids, if there is one, and the
/// finished runs' partitions within that range. The history's first partition
/// (`sagaflow_history_before`) covers every day before its upgrade; a finished runs'
/// partition with no history partition over it (its history went to the default partition)
/// is a day of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Day {
    lo: Option<i64>,
    hi: i64,
    history: Option<Partition>,
    done: Vec<Partition>,
}

impl Day {
    fn name(&self) -> &str {
        self.history
            .as_ref()
            .or(self.done.first())
            .map_or("", |p| p.name.as_str())
    }
}

/// The days to consider, from the partitions of the two tables, by their end.
fn days_of(history: Vec<Partition>, done: Vec<Partition>) -> Vec<Day> {
    let mut days: Vec<Day> = history
        .into_iter()
        .map(|h| Day {
            lo: h.lo,
            hi: h.hi,
            history: Some(h),
            done: Vec::new(),
        })
        .collect();
    for d in done {
        let within = |day: &Day| {
            d.hi <= day.hi
                && match (day.lo, d.lo) {
                    (None, _) => true,
                    (Some(lo), Some(dlo)) => dlo >= lo,
                    (Some(_), None) => false,
                }
        };
        match days.iter_mut().find(|day| within(day)) {
            Some(day) => day.done.push(d),
            None => days.push(Day {
                lo: d.lo,
                hi: d.hi,
                history: None,
                done: vec![d],
            }),
        }
    }
    days.sort_by_key(|d| d.hi);
    days
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
        // Days are days of run ids, minted on real clocks; `finished_at` is on the clock
        // the engine stamps it with (a test clock moves it).
        let now = self.wall_now_ms().await?;
        // Never within the margin of now: the drop adjusts totals, alerts, events and keys
        // for the runs that go before it takes the tables' locks, so a run that goes must
        // have ended (its unit of work committed) before the pass began, which a run that
        // ended an hour ago has.
        let cutoff = self
            .now_ms()
            .await?
            .saturating_sub(retention_ms.max(DROP_MARGIN_MS));
        let history = self
            .partitions_of("sagaflow_history", HISTORY_DEFAULT_PARTITION)
            .await?;
        // Ahead: from where the partitions end, or from the next midnight when they end in
        // the past (the days between went to the default partition, and a partition over
        // them would be refused for the rows there).
        let mut day = match history.iter().map(|p| p.hi).max() {
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
        let done = self
            .partitions_of(RUNS_DONE, RUNS_DONE_DEFAULT_PARTITION)
            .await?;
        for day in days_of(history, done)
            .iter()
            .filter(|d| d.hi <= now - DROP_MARGIN_MS)
        {
            let stragglers_go = day.hi <= cutoff.saturating_sub(HISTORY_PARTITION_SPAN_MS);
            if !stragglers_go && self.day_kept(&self.exec, day, cutoff).await? {
                continue;
            }
            match self.day_drop(day, cutoff, stragglers_go).await {
                Ok(Some((moved, runs))) => {
                    pass.dropped += 1;
                    pass.moved_rows += moved;
                    pass.runs_dropped += runs;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::info!(error = %e, partition = %day.name(), "a day's partitions left for the next pass");
                    pass.busy += 1;
                }
            }
        }
        Ok(pass)
    }

    /// Drops `day` (its history partition and its finished runs' partitions) after checking
    /// again, under both tables' locks, that none of its runs is kept or, with
    /// `stragglers_go`, moving those that are out of the way: their history to the
    /// history's default partition, their finished rows to the finished runs' default
    /// partition (runs that are not finished stay in `sagaflow_runs`). The runs that go
    /// leave the run totals, and their alerts, kept events and any history of theirs in the
    /// default partition go with them: all of it before the tables' locks are taken (a past
    /// day's runs that finished before the cutoff never change), so the locks are held for
    /// the catalog changes and the stragglers alone. `None` when a run is kept and may not
    /// be moved yet; else how many history rows moved and how many finished runs went.
    async fn day_drop(
        &self,
        day: &Day,
        cutoff: i64,
        stragglers_go: bool,
    ) -> Result<Option<(u64, u64)>> {
        let range = range_of(day.lo, day.hi);
        let going = format!("{range} AND finished_at < {cutoff}");
        let txn = self.exec.begin().await?;
        txn.execute_unprepared(&format!("SET LOCAL lock_timeout = '{DROP_LOCK_WAIT_MS}ms'"))
            .await?;
        // A child run of the day still in the runs table (its parent runs on) moves into the
        // day as it is, with its old `finished_at`, when its parent ends: one that moved
        // after the adjustments below would go unadjusted. Counted first, and again under
        // the locks (a move waits for them, so none is half seen); one gone meanwhile
        // leaves the day for the next pass.
        let children_before = if stragglers_go {
            self.day_children(&txn, &range).await?
        } else {
            0
        };
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
            DROP_TOTALS_SLOT,
            gone.iter().map(|(w, st, n)| (w.as_str(), *st, *n)),
        )
        .await?;
        let mut tables = vec!["sagaflow_alerts", "sagaflow_events", RUN_KEYS];
        // History of the day in the default partition (its day had no partition): rare, so
        // looked for first, by the range of the key.
        let in_default = txn
            .query_one(self.stmt(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM {HISTORY_DEFAULT_PARTITION} WHERE {}) AS any",
                    range.replace("id", "run_id")
                ),
                vec![],
            ))
            .await?
            .map(|r| r.try_get::<bool>("", "any"))
            .transpose()?
            .unwrap_or(false);
        if in_default {
            tables.push(HISTORY_DEFAULT_PARTITION);
        }
        for table in tables {
            txn.execute_unprepared(&format!(
                "DELETE FROM {table} WHERE run_id IN (SELECT id FROM {RUNS_DONE} WHERE {going})"
            ))
            .await?;
        }
        self.pause_point(
            crate::interleave::Unit::Purge,
            crate::interleave::Point::AfterReads,
        )
        .await;
        // The tables in the writers' order: a unit of work that ends a run moves it into the
        // finished runs, then writes its history at its commit.
        txn.execute_unprepared(&format!(
            "LOCK TABLE {RUNS_DONE}, sagaflow_history IN ACCESS EXCLUSIVE MODE"
        ))
        .await?;
        let kept = self.day_kept(&txn, day, cutoff).await?;
        if kept && !stragglers_go
            || children_before > 0 && self.day_children(&txn, &range).await? < children_before
        {
            txn.rollback().await?;
            return Ok(None);
        }
        let mut moved = 0;
        if kept {
            // No partition covers the range once detached: the rows land in the default
            // one, as will any history these runs write from here on.
            if let Some(h) = &day.history {
                txn.execute_unprepared(&format!(
                    "ALTER TABLE sagaflow_history DETACH PARTITION {}",
                    h.name
                ))
                .await?;
                moved = txn
                    .execute_unprepared(&format!(
                        "INSERT INTO sagaflow_history ({HISTORY_COLUMNS}) SELECT {HISTORY_COLUMNS} \
                         FROM {} WHERE run_id IN (SELECT id FROM sagaflow_runs WHERE {range} \
                         UNION ALL SELECT id FROM {RUNS_DONE} WHERE {range} AND finished_at >= {cutoff})",
                        h.name,
                    ))
                    .await?;
            }
            for d in &day.done {
                txn.execute_unprepared(&format!(
                    "ALTER TABLE {RUNS_DONE} DETACH PARTITION {}",
                    d.name
                ))
                .await?;
                txn.execute_unprepared(&format!(
                    "INSERT INTO {RUNS_DONE} ({RUN_TABLE_COLUMNS}) SELECT {RUN_TABLE_COLUMNS} \
                     FROM {} WHERE finished_at >= {cutoff}",
                    d.name
                ))
                .await?;
            }
        }
        for d in &day.done {
            txn.execute_unprepared(&format!("DROP TABLE {}", d.name))
                .await?;
        }
        // What of the day no partition of its own held: the default partition's.
        txn.execute_unprepared(&format!("DELETE FROM {RUNS_DONE} WHERE {going}"))
            .await?;
        if let Some(h) = &day.history {
            txn.execute_unprepared(&format!("DROP TABLE {}", h.name))
                .await?;
        }
        txn.commit().await?;
        Ok(Some((moved, runs)))
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

    /// How many child runs of the day (`range` of ids) are in the runs table: on the
    /// partial index of `parent_step`.
    async fn day_children<C: Exec>(&self, conn: &C, range: &str) -> Result<i64> {
        let sql = format!(
            "SELECT COUNT(*) AS n FROM sagaflow_runs WHERE parent_step IS NOT NULL AND {range}"
        );
        let row = conn.query_one(self.stmt(&sql, vec![])).await?;
        Ok(match row {
            Some(r) => r.try_get("", "n")?,
            None => 0,
        })
    }

    /// Whether a run of the day is kept: a run in the runs table (not finished, a finished
    /// child run whose parent runs on, or one that finished before the upgrade), or a
    /// finished run that ended at or after `cutoff`. Two probes of indexes, however many
    /// runs there are.
    async fn day_kept<C: Exec>(&self, conn: &C, day: &Day, cutoff: i64) -> Result<bool> {
        let range = range_of(day.lo, day.hi);
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

    /// The partitions of `table` but its default one `default`, from the catalog.
    async fn partitions_of(&self, table: &str, default: &str) -> Result<Vec<Partition>> {
        let rows = self
            .exec
            .query_all(self.stmt(
                "SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound \
                 FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid \
                 WHERE i.inhparent = to_regclass($1)",
                vec![table.into()],
            ))
            .await?;
        let mut parts = Vec::with_capacity(rows.len());
        for r in &rows {
            let name: String = r.try_get("", "name")?;
            let bound: String = r.try_get("", "bound")?;
            if name == default {
                continue;
            }
            match parse_bound(&bound) {
                Some((lo, hi)) => parts.push(Partition { name, lo, hi }),
                None => {
                    tracing::warn!(partition = %name, %bound, "a partition of a bound sagaflow did not make; left alone")
                }
            }
        }
        parts.sort_by_key(|p| p.hi);
        Ok(parts)
    }
}

/// The condition on a runs table's `id` for the range of ids from `lo` (`None`: from the
/// lowest) to `hi`.
fn range_of(lo: Option<i64>, hi: i64) -> String {
    let hi = uuid_floor(hi);
    match lo {
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
    fn finished_runs_partitions_join_the_history_partition_over_their_day() {
        let span = HISTORY_PARTITION_SPAN_MS;
        let part = |name: &str, lo: Option<i64>, hi: i64| Partition {
            name: name.into(),
            lo,
            hi,
        };
        let before = part("sagaflow_history_before", None, 3 * span);
        let h3 = part("sagaflow_history_3", Some(3 * span), 4 * span);
        let d2 = part("sagaflow_runs_done_2", Some(2 * span), 3 * span);
        let d3 = part("sagaflow_runs_done_3", Some(3 * span), 4 * span);
        let d5 = part("sagaflow_runs_done_5", Some(5 * span), 6 * span);
        let days = days_of(
            vec![before.clone(), h3.clone()],
            vec![d5.clone(), d3.clone(), d2.clone()],
        );
        assert_eq!(
            days,
            vec![
                // The history's first partition covers every day before it: the finished
                // runs' partition of its last day goes with it.
                Day {
                    lo: None,
                    hi: 3 * span,
                    history: Some(before),
                    done: vec![d2],
                },
                Day {
                    lo: Some(3 * span),
                    hi: 4 * span,
                    history: Some(h3),
                    done: vec![d3],
                },
                // A day whose history went to the default partition is a day of its own.
                Day {
                    lo: Some(5 * span),
                    hi: 6 * span,
                    history: None,
                    done: vec![d5],
                },
            ]
        );
    }

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
