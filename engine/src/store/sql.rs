//! Statement building for both backends: the [`Dialect`] each backend's module fills in, the
//! `{now}` and `{wall_now}` clock tokens and `$n` placeholders ([`Store::stmt`]), IN lists and
//! many-row sources bound as one parameter, and the JSON encoding of bound values they rely on.

use sea_orm::{DbBackend, Statement, Value};

use super::{Backend, Store, postgres, sqlite};
use crate::{Error, Result};

/// A statement fragment with the values it binds.
pub(super) type Bound = (String, Vec<Value>);

/// What differs between the backends' SQL: one value per backend, `postgres::DIALECT` and
/// `sqlite::DIALECT`, so that each backend's text sits in its own module and the statements
/// of the other files stay backend-neutral.
#[derive(Debug)]
pub(super) struct Dialect {
    /// sea-orm's name for the backend.
    pub(super) db: DbBackend,
    /// The database clock in epoch milliseconds, per statement.
    pub(super) now: &'static str,
    /// The lock clause of a claim's inner `SELECT`: rows another claimer holds are skipped.
    pub(super) claim_lock: &'static str,
    /// The lock clause of the timer pass's inner `SELECT` over steps `s` joined to their runs
    /// `r`: steps another unit of work holds are skipped, and so are steps whose run another
    /// holds; a run taken is held shared, so that no pause commits under the wake.
    pub(super) wake_lock: &'static str,
    /// The lock clause of a read whose rows the unit of work decides from (` FOR UPDATE`).
    pub(super) row_lock: &'static str,
    /// The query-plan prefix and the column its lines come back in.
    pub(super) explain: (&'static str, &'static str),
    /// The length of the JSON array in the text column `then_states`.
    pub(super) folded_count: &'static str,
    /// Whether a many-row source is sent as JSON objects (else as arrays read by position).
    pub(super) rows_as_objects: bool,
    /// `column IN (…)` over `values` bound as one parameter numbered `first`.
    pub(super) in_list: fn(&str, usize, Vec<Value>) -> Result<Bound>,
    /// The `FROM` source named `v` over the JSON parameter `first` with typed columns.
    pub(super) rows_from: fn(usize, &[(&str, &str)]) -> String,
    /// A source of `n` numbered rows `(id, t, i)`: fresh ids, `{now} - i` and `i`.
    pub(super) numbered_rows: fn(u64, i64, i64) -> String,
    /// The statement that locks the runs matching `cond` (and `only`) for a unit of work
    /// and returns their columns and `dirty`, clearing `dirty` where the lock is the file's.
    pub(super) lock_runs: fn(&str, &str) -> String,
    /// Rewrites `$n` placeholders as the backend binds them.
    pub(super) placeholders: fn(String) -> String,
}

impl Store {
    /// This store's backend's SQL.
    pub(super) const fn dialect(&self) -> &'static Dialect {
        match self.backend {
            Backend::Postgres => &postgres::DIALECT,
            Backend::Sqlite => &sqlite::DIALECT,
        }
    }

    pub(super) const fn claim_lock(&self) -> &'static str {
        self.dialect().claim_lock
    }

    /// `column IN (…)` over a list of values, written so that the statement text does not
    /// depend on the list's length: every batch then reuses one prepared statement instead of
    /// parsing (and on PostgreSQL planning) a new one per list length, and binds one parameter
    /// instead of hundreds (binding is quadratic in the parameter count with SQLite's driver;
    /// both showed up at the top of our profiles). PostgreSQL gets an array (`= ANY($n)`),
    /// SQLite a JSON array read by `json_each`. `first` is the number of the placeholder; the
    /// value to bind comes back with the fragment.
    pub(super) fn in_list<T: Clone + Into<Value>>(
        &self,
        column: &str,
        first: usize,
        ids: &[T],
    ) -> Result<(String, Vec<Value>)> {
        let values: Vec<Value> = ids.iter().map(|i| i.clone().into()).collect();
        (self.dialect().in_list)(column, first, values)
    }

    /// A row source of many rows for `FROM` (bulk updates) or `INSERT … SELECT` (bulk
    /// inserts), named `v` with the given columns, from one JSON parameter (one statement
    /// text whatever the row count, NULLs included, which the driver's array parameters
    /// cannot carry):
    /// `json_to_recordset` on PostgreSQL, `jsonb_each` on SQLite. `cols` pairs each column's
    /// name with its PostgreSQL type.
    pub(super) fn rows_source(
        &self,
        first: usize,
        cols: &[(&str, &str)],
        rows: Vec<Vec<Value>>,
    ) -> Result<(String, Vec<Value>)> {
        // Written straight as JSON text: no map per row. PostgreSQL's `json_to_recordset`
        // reads objects; SQLite reads arrays, whose cells it finds by position (`->> 2`)
        // rather than by comparing each key on the way: a third of the lookup's cost, and
        // 8% fewer instructions over the benchmark (callgrind).
        let dialect = self.dialect();
        let objects = dialect.rows_as_objects;
        let (open, close) = if objects { ('{', '}') } else { ('[', ']') };
        let mut json = String::with_capacity(rows.len() * cols.len() * 24 + 2);
        json.push('[');
        for (i, row) in rows.into_iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push(open);
            for (j, ((name, _), v)) in cols.iter().zip(row).enumerate() {
                if j > 0 {
                    json.push(',');
                }
                if objects {
                    // Column names are plain identifiers of ours: no escaping needed.
                    json.push('"');
                    json.push_str(name);
                    json.push_str("\":");
                }
                write_json_value(&mut json, v)?;
            }
            json.push(close);
        }
        json.push(']');
        Ok(((dialect.rows_from)(first, cols), vec![json.into()]))
    }

    /// Builds a statement from SQL written with `$n` placeholders, `{now}` for the database
    /// clock and `{wall_now}` for the same clock without a test clock's offset. SQLite reads
    /// `$n` as a *named* parameter, so placeholders become `?n`, which SQLite binds by number.
    ///
    /// `{now}` is business time: deadlines, backoff, scheduled starts, windows, retention.
    /// `{wall_now}` judges whether a process is alive (instance heartbeats, leader leases and
    /// the leader's sweep progress): a test that moves its clock by hours must not make every
    /// live instance look dead, so those columns are written and compared on the wall clock.
    pub(super) fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
        let dialect = self.dialect();
        let wall;
        let sql = if sql.contains("{wall_now}") {
            wall = sql.replace("{wall_now}", dialect.now);
            wall.as_str()
        } else {
            sql
        };
        let sql = match self.clock.as_ref().map(crate::clock::TestClock::offset_ms) {
            None | Some(0) => sql.replace("{now}", dialect.now),
            Some(offset) => sql.replace("{now}", &format!("({} + {offset})", dialect.now)),
        };
        Statement::from_sql_and_values(dialect.db, (dialect.placeholders)(sql), values)
    }
}

/// Appends a bound value as JSON text, for [`Store::rows_source`] (only the types sagaflow
/// binds).
fn write_json_value(out: &mut String, v: Value) -> Result<()> {
    use std::fmt::Write as _;
    match v {
        Value::Bool(Some(b)) => out.push_str(if b { "true" } else { "false" }),
        Value::Int(Some(i)) => {
            let _ = write!(out, "{i}");
        }
        Value::BigInt(Some(i)) => {
            let _ = write!(out, "{i}");
        }
        Value::String(Some(s)) => {
            let quoted = serde_json::to_string(&s)
                .map_err(|e| Error::Config(format!("internal: cannot encode a string: {e}")))?;
            out.push_str(&quoted);
        }
        Value::Uuid(Some(u)) => {
            let _ = write!(out, "\"{u}\"");
        }
        Value::Bool(None)
        | Value::Int(None)
        | Value::BigInt(None)
        | Value::String(None)
        | Value::Uuid(None) => out.push_str("null"),
        other => {
            return Err(Error::Config(format!(
                "internal: {other:?} cannot be sent in a row batch"
            )));
        }
    }
    Ok(())
}

/// `$from, $from+1, …` placeholders for an IN list of `n` values.
pub(super) fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_values_are_written_as_json_text() {
        let mut out = String::new();
        for v in [
            Value::from(true),
            Value::from(7_i32),
            Value::from(-9_i64),
            Value::from("a \"quoted\"\n line".to_owned()),
            Value::Uuid(Some(uuid::Uuid::nil())),
            Value::String(None),
        ] {
            write_json_value(&mut out, v).expect("supported");
            out.push(' ');
        }
        assert_eq!(
            out,
            r#"true 7 -9 "a \"quoted\"\n line" "00000000-0000-0000-0000-000000000000" null "#
        );
        assert!(write_json_value(&mut out, Value::Double(Some(1.0))).is_err());
    }

    #[test]
    fn placeholders_are_numbered_from_the_first() {
        assert_eq!(placeholders(3, 3), "$3, $4, $5");
    }
}
