//! Statement building for both backends: the `{now}` and `{wall_now}` clock tokens and `$n`
//! placeholders
//! ([`Store::stmt`]), the claim's lock clause, IN lists and many-row sources bound as one
//! parameter, and the JSON encoding of bound values they rely on.

use sea_orm::sea_query::ArrayType;
use sea_orm::{DbBackend, Statement, Value};

use super::{Backend, Store, postgres, sqlite};
use crate::{Error, Result};

impl Store {
    pub(super) fn now_sql(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => postgres::NOW,
            Backend::Sqlite => sqlite::NOW,
        }
    }

    pub(super) fn claim_lock(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => postgres::CLAIM_LOCK,
            Backend::Sqlite => sqlite::CLAIM_LOCK,
        }
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
        Ok(match self.backend {
            Backend::Postgres => {
                let ty = values.first().map_or(ArrayType::BigInt, array_type);
                (
                    format!("{column} = ANY(${first})"),
                    vec![Value::Array(ty, Some(Box::new(values)))],
                )
            }
            Backend::Sqlite => {
                let uuid = matches!(values.first(), Some(Value::Uuid(_)));
                let json = values
                    .into_iter()
                    .map(json_value)
                    .collect::<Result<Vec<_>>>()?;
                (
                    format!(
                        "{column} IN (SELECT {} FROM json_each(${first}))",
                        sqlite_cell("value", uuid)
                    ),
                    vec![serde_json::Value::Array(json).to_string().into()],
                )
            }
        })
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
        let objects = self.backend == Backend::Postgres;
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
        let param = vec![json.into()];
        let source = match self.backend {
            Backend::Postgres => {
                let defs: Vec<String> = cols.iter().map(|(n, t)| format!("{n} {t}")).collect();
                format!(
                    "json_to_recordset(CAST(${first} AS json)) AS v({})",
                    defs.join(", ")
                )
            }
            Backend::Sqlite => {
                let cells: Vec<String> = cols
                    .iter()
                    .enumerate()
                    .map(|(j, (n, t))| {
                        format!(
                            "{} AS {n}",
                            sqlite_cell(&format!("value ->> {j}"), *t == "uuid")
                        )
                    })
                    .collect();
                // `jsonb_each`, not `json_each`: each row comes back as a JSONB blob, which
                // `->>` reads in place. With `json_each` every `value ->> 'col'` first
                // rendered the whole row back to text, a cost that grows with the
                // square of the column count (the top of a callgrind profile of a
                // completion batch).
                format!(
                    "(SELECT {} FROM jsonb_each(${first})) AS v",
                    cells.join(", ")
                )
            }
        };
        Ok((source, param))
    }

    pub(super) fn db_backend(&self) -> DbBackend {
        match self.backend {
            Backend::Postgres => DbBackend::Postgres,
            Backend::Sqlite => DbBackend::Sqlite,
        }
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
        let wall;
        let sql = if sql.contains("{wall_now}") {
            wall = sql.replace("{wall_now}", self.now_sql());
            wall.as_str()
        } else {
            sql
        };
        let sql = match self.clock.as_ref().map(crate::clock::TestClock::offset_ms) {
            None | Some(0) => sql.replace("{now}", self.now_sql()),
            Some(offset) => sql.replace("{now}", &format!("({} + {offset})", self.now_sql())),
        };
        let sql = match self.backend {
            Backend::Postgres => sql,
            Backend::Sqlite => dollar_to_question(&sql),
        };
        Statement::from_sql_and_values(self.db_backend(), sql, values)
    }
}

/// `$12` → `?12`, leaving `$` inside string literals alone.
fn dollar_to_question(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut in_str = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_str = !in_str;
                out.push(c);
            }
            '$' if !in_str && chars.peek().is_some_and(char::is_ascii_digit) => out.push('?'),
            _ => out.push(c),
        }
    }
    out
}

/// The element type of an array parameter holding values like `v`.
fn array_type(v: &Value) -> ArrayType {
    match v {
        Value::Uuid(_) => ArrayType::Uuid,
        Value::String(_) => ArrayType::String,
        Value::Int(_) => ArrayType::Int,
        _ => ArrayType::BigInt,
    }
}

/// A JSON cell read back as SQLite stores it: UUIDs are 16-byte blobs there (as the driver
/// binds them), sent as hyphenated text.
fn sqlite_cell(expr: &str, uuid: bool) -> String {
    if uuid {
        format!("unhex(replace({expr}, '-', ''))")
    } else {
        expr.to_owned()
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

/// A bound value as JSON, for [`Store::in_list`] (only the types sagaflow binds).
fn json_value(v: Value) -> Result<serde_json::Value> {
    use serde_json::Value as J;
    Ok(match v {
        Value::Bool(b) => b.map_or(J::Null, J::Bool),
        Value::Int(i) => i.map_or(J::Null, J::from),
        Value::BigInt(i) => i.map_or(J::Null, J::from),
        Value::String(s) => s.map_or(J::Null, J::String),
        Value::Uuid(u) => u.map_or(J::Null, |u| J::String(u.to_string())),
        other => {
            return Err(Error::Config(format!(
                "internal: {other:?} cannot be sent in a row batch"
            )));
        }
    })
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
    fn placeholders_are_rewritten_outside_literals_only() {
        assert_eq!(
            dollar_to_question("a = $1 AND b = '$2' AND c = $10"),
            "a = ?1 AND b = '$2' AND c = ?10"
        );
        assert_eq!(placeholders(3, 3), "$3, $4, $5");
    }
}
