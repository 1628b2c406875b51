//! What the sagas of the throughput phase cost the database in writes, per saga: on
//! PostgreSQL the rows each table inserted, updated (and how many of those updates were HOT)
//! and deleted, the WAL bytes and the transactions committed, from `pg_stat_user_tables`,
//! `pg_stat_wal` and `pg_stat_database`; on SQLite the bytes this process handed to `write`
//! (the database file, its WAL and the odd line of output), from `/proc/self/io`, and what
//! that is in the database's pages. Figures that repeat where a time does not: a change to
//! the rows a saga writes shows in them on a noisy machine.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow::{Backend, Engine};

/// The tables a saga writes (the others hold leases and heartbeats, written by time, not by
/// sagas). A partitioned table's rows are counted by its partitions, summed under its name.
const SAGA_TABLES: &str = "'sagaflow_runs', 'sagaflow_runs_done', 'sagaflow_steps', \
    'sagaflow_history', 'sagaflow_outbox', 'sagaflow_alerts'";

/// A table's cumulative row counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Rows {
    inserted: i64,
    updated: i64,
    hot: i64,
    deleted: i64,
}

/// The counters at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Writes {
    Postgres {
        tables: BTreeMap<String, Rows>,
        wal_bytes: i64,
        commits: i64,
    },
    Sqlite {
        written: u64,
        page_size: u64,
    },
}

/// The counters now. PostgreSQL publishes a session's counters when its transaction ends,
/// at most once a second, and an idle session's within ten seconds: the read is repeated
/// until two reads a second apart agree (at most 15 s), so the last sagas' rows are in.
/// `None` when they cannot be read (no `/proc`, statistics not readable).
pub(crate) async fn now(engine: &Engine) -> Option<Writes> {
    match engine.backend() {
        Backend::Postgres => {
            let give_up = Instant::now() + Duration::from_secs(15);
            let mut last = postgres(engine).await?;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let next = postgres(engine).await?;
                if next == last || Instant::now() > give_up {
                    return Some(next);
                }
                last = next;
            }
        }
        Backend::Sqlite => {
            let io = std::fs::read_to_string("/proc/self/io").ok()?;
            let line = io.lines().find(|l| l.starts_with("wchar:"))?;
            let written = line.split_whitespace().nth(1)?.parse().ok()?;
            let conn = engine.connection();
            let page_size = conn
                .query_one_raw(Statement::from_string(
                    conn.get_database_backend(),
                    "PRAGMA page_size",
                ))
                .await
                .ok()??
                .try_get_by_index::<i64>(0)
                .ok()?;
            Some(Writes::Sqlite {
                written,
                page_size: u64::try_from(page_size).ok()?,
            })
        }
    }
}

async fn postgres(engine: &Engine) -> Option<Writes> {
    let conn = engine.connection();
    let sql = format!(
        "SELECT t.name, SUM(t.n_tup_ins)::bigint, SUM(t.n_tup_upd)::bigint, \
           SUM(t.n_tup_hot_upd)::bigint, SUM(t.n_tup_del)::bigint, \
           (SELECT wal_bytes FROM pg_stat_wal)::bigint AS wal_bytes, \
           (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) \
         FROM (SELECT COALESCE(p.relname, s.relname)::text AS name, s.n_tup_ins, s.n_tup_upd, \
                 s.n_tup_hot_upd, s.n_tup_del \
               FROM pg_stat_user_tables AS s \
               LEFT JOIN pg_inherits AS i ON i.inhrelid = s.relid \
               LEFT JOIN pg_class AS p ON p.oid = i.inhparent) AS t \
         WHERE t.name IN ({SAGA_TABLES}) GROUP BY t.name"
    );
    let rows = conn
        .query_all_raw(Statement::from_string(conn.get_database_backend(), sql))
        .await
        .ok()?;
    let mut tables = BTreeMap::new();
    let (mut wal_bytes, mut commits) = (0, 0);
    for r in rows {
        let name: String = r.try_get_by_index(0).ok()?;
        let counters = Rows {
            inserted: r.try_get_by_index(1).ok()?,
            updated: r.try_get_by_index(2).ok()?,
            hot: r.try_get_by_index(3).ok()?,
            deleted: r.try_get_by_index(4).ok()?,
        };
        wal_bytes = r.try_get_by_index(5).ok()?;
        commits = r.try_get_by_index(6).ok()?;
        tables.insert(name.trim_start_matches("sagaflow_").to_owned(), counters);
    }
    Some(Writes::Postgres {
        tables,
        wal_bytes,
        commits,
    })
}

/// Prints what happened between `before` and `after`, per saga of `runs`.
pub(crate) fn print(before: &Writes, after: &Writes, runs: usize) {
    let per = |n: i64| n as f64 / runs.max(1) as f64;
    match (before, after) {
        (
            Writes::Postgres {
                tables: t0,
                wal_bytes: w0,
                commits: c0,
            },
            Writes::Postgres {
                tables: t1,
                wal_bytes: w1,
                commits: c1,
            },
        ) => {
            println!("  writes/saga    table      inserted  updated (HOT)   deleted");
            for (name, d) in differences(t0, t1) {
                println!(
                    "                 {name:<10} {:>8.2} {:>8.2} ({:>5.2}) {:>8.2}",
                    per(d.inserted),
                    per(d.updated),
                    per(d.hot),
                    per(d.deleted)
                );
            }
            println!(
                "  WAL/saga       {:.0} bytes (the cluster's, over the phase)",
                per(w1 - w0)
            );
            println!(
                "  commits/saga   {:.2} (this database's transactions, every session's: the \
                 engines' and the submitters')",
                per(c1 - c0)
            );
        }
        (
            Writes::Sqlite { written: a, .. },
            Writes::Sqlite {
                written: b,
                page_size,
            },
        ) => {
            let bytes = i64::try_from(b.saturating_sub(*a)).unwrap_or(i64::MAX);
            let pages = i64::try_from(*page_size).unwrap_or(i64::MAX).max(1);
            println!(
                "  written/saga   {:.0} bytes, {:.1} pages of {page_size} bytes (this process's \
                 writes: the database file and its WAL)",
                per(bytes),
                per(bytes) / pages as f64
            );
        }
        _ => {}
    }
}

/// Each table's counters in `after` less those in `before`, the tables with no change left
/// out, and a last line `all` with their sum.
fn differences(
    before: &BTreeMap<String, Rows>,
    after: &BTreeMap<String, Rows>,
) -> Vec<(String, Rows)> {
    let mut out = Vec::new();
    let mut sum = Rows::default();
    for (name, b) in after {
        let a = before.get(name).copied().unwrap_or_default();
        let d = Rows {
            inserted: b.inserted - a.inserted,
            updated: b.updated - a.updated,
            hot: b.hot - a.hot,
            deleted: b.deleted - a.deleted,
        };
        if d == Rows::default() {
            continue;
        }
        sum.inserted += d.inserted;
        sum.updated += d.updated;
        sum.hot += d.hot;
        sum.deleted += d.deleted;
        out.push((name.clone(), d));
    }
    out.push(("all".to_owned(), sum));
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{Rows, differences};

    fn rows(inserted: i64, updated: i64, hot: i64, deleted: i64) -> Rows {
        Rows {
            inserted,
            updated,
            hot,
            deleted,
        }
    }

    #[test]
    fn the_differences_leave_out_unchanged_tables_and_end_with_their_sum() {
        let before: BTreeMap<String, Rows> = [
            ("runs".to_owned(), rows(10, 20, 5, 0)),
            ("alerts".to_owned(), rows(1, 0, 0, 0)),
        ]
        .into();
        let after: BTreeMap<String, Rows> = [
            ("runs".to_owned(), rows(12, 26, 6, 1)),
            ("alerts".to_owned(), rows(1, 0, 0, 0)),
            ("steps".to_owned(), rows(6, 9, 0, 0)),
        ]
        .into();
        assert_eq!(
            differences(&before, &after),
            vec![
                ("runs".to_owned(), rows(2, 6, 1, 1)),
                ("steps".to_owned(), rows(6, 9, 0, 0)),
                ("all".to_owned(), rows(8, 15, 1, 1)),
            ]
        );
    }
}
