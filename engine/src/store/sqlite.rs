//! SQLite-specific SQL (everything the statements of the other files take from [`DIALECT`]
//! when they run on SQLite), and the switch of a database file to WAL.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Value};

use super::rows::RUN_COLS;
use super::sql::{Bound, Dialect};
use crate::{Error, Result};

/// SQLite's SQL.
pub(super) const DIALECT: Dialect = Dialect {
    db: DbBackend::Sqlite,
    now: NOW,
    claim_lock: CLAIM_LOCK,
    wake_lock: CLAIM_LOCK,
    // A unit of work holds the file's write lock already.
    row_lock: "",
    explain: ("EXPLAIN QUERY PLAN", "detail"),
    folded_count: "json_array_length(then_states)",
    rows_as_objects: false,
    in_list,
    rows_from,
    numbered_rows,
    lock_runs,
    placeholders: dollar_to_question,
};

/// The database clock in epoch milliseconds (julianday keeps sub-second precision).
pub(super) const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// SQLite has one writer at a time: the claim's UPDATE is atomic without a row lock clause.
pub(super) const CLAIM_LOCK: &str = "";

/// How long a start keeps trying to switch the database file to WAL while other processes
/// hold it: as long as it waits for the migration lock next, since an engine that writes the
/// file without pause can hold either off for longer than a busy timeout.
pub(super) const WAL_SWITCH_WAIT: Duration = sagaflow_migrations::MIGRATION_LOCK_WAIT;

/// Puts the database file in WAL journaling.
///
/// The mode is stored in the file, so this is a no-op once any process has done it. Switching
/// takes an exclusive lock that SQLite does not wait for (its busy timeout does not apply):
/// when several engines start at once on a new file, all but one can get `SQLITE_BUSY` here.
/// Those retry, with short growing pauses, for at most [`WAL_SWITCH_WAIT`].
pub(super) async fn enable_wal(db: &DatabaseConnection) -> Result<(), DbErr> {
    let deadline = tokio::time::Instant::now() + WAL_SWITCH_WAIT;
    let mut pause = Duration::from_millis(5);
    loop {
        match db.execute_unprepared("PRAGMA journal_mode=WAL").await {
            Ok(_) => return Ok(()),
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "database file busy; retrying the switch to WAL");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether SQLite refused for a lock held by another connection (`SQLITE_BUSY`, or one of
/// its extended codes).
fn is_busy(e: &DbErr) -> bool {
    const SQLITE_BUSY: i32 = 5;
    Error::from(e.clone())
        .sqlite_code()
        .is_some_and(|c| c & 0xff == SQLITE_BUSY)
}

/// A JSON array parameter read by `json_each`.
fn in_list(column: &str, first: usize, values: Vec<Value>) -> Result<Bound> {
    let uuid = matches!(values.first(), Some(Value::Uuid(_)));
    let json = values
        .into_iter()
        .map(json_value)
        .collect::<Result<Vec<_>>>()?;
    Ok((
        format!(
            "{column} IN (SELECT {} FROM json_each(${first}))",
            cell("value", uuid)
        ),
        vec![serde_json::Value::Array(json).to_string().into()],
    ))
}

/// Rows sent as JSON arrays, their cells read by position.
fn rows_from(first: usize, cols: &[(&str, &str)]) -> String {
    let cells: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(j, (n, t))| format!("{} AS {n}", cell(&format!("value ->> {j}"), *t == "uuid")))
        .collect();
    // `jsonb_each`, not `json_each`: each row comes back as a JSONB blob, which `->>` reads
    // in place. With `json_each` every `value ->> 'col'` first rendered the whole row back to
    // text, a cost that grows with the square of the column count (the top of a callgrind
    // profile of a completion batch).
    format!(
        "(SELECT {} FROM jsonb_each(${first})) AS v",
        cells.join(", ")
    )
}

fn numbered_rows(n: u64, newest_ago: i64, step: i64) -> String {
    format!(
        "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < {n}) \
         SELECT randomblob(16) AS id, {{now}} - {newest_ago} - i * {step} AS t, i FROM g"
    )
}

/// The unit of work holds the file's write lock: the runs are "locked" by reading them, and
/// `dirty` is cleared in the same statement.
fn lock_runs(cond: &str, only: &str) -> String {
    format!(
        "UPDATE sagaflow_runs SET dirty = FALSE WHERE {cond}{only} RETURNING {RUN_COLS}, FALSE AS dirty"
    )
}

/// `$12` → `?12`, leaving `$` inside string literals alone.
///
/// Both characters are one ASCII byte, and neither byte occurs inside a multi-byte UTF-8
/// sequence, so the text is rewritten in place: no copy for each statement run.
fn dollar_to_question(sql: String) -> String {
    let mut bytes = sql.into_bytes();
    let mut in_str = false;
    for i in 0..bytes.len() {
        match bytes[i] {
            b'\'' => in_str = !in_str,
            b'$' if !in_str && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => bytes[i] = b'?',
            _ => {}
        }
    }
    // ASCII replaced by ASCII: still UTF-8, so the lossy path is never taken.
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// A JSON cell read back as SQLite stores it: UUIDs are 16-byte blobs there (as the driver
/// binds them), sent as hyphenated text.
fn cell(expr: &str, uuid: bool) -> String {
    if uuid {
        format!("unhex(replace({expr}, '-', ''))")
    } else {
        expr.to_owned()
    }
}

/// A bound value as JSON, for [`in_list`] (only the types sagaflow binds).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_rewritten_outside_literals_only() {
        assert_eq!(
            dollar_to_question("a = $1 AND b = '$2' AND c = $10".to_owned()),
            "a = ?1 AND b = '$2' AND c = ?10"
        );
        // Multi-byte text around the placeholders, and a `$` that starts no number.
        assert_eq!(
            dollar_to_question("é = $1 || '€$3' || $x || $2".to_owned()),
            "é = ?1 || '€$3' || $x || ?2"
        );
    }
}
