//! PostgreSQL-specific SQL: everything the statements of the other files take from
//! [`DIALECT`] when they run on PostgreSQL.

use sea_orm::sea_query::ArrayType;
use sea_orm::{DbBackend, Value};

use super::rows::RUN_COLS;
use super::sql::{Bound, Dialect};
use crate::Result;

/// PostgreSQL's SQL.
pub(super) const DIALECT: Dialect = Dialect {
    db: DbBackend::Postgres,
    now: NOW,
    claim_lock: CLAIM_LOCK,
    row_lock: " FOR UPDATE",
    explain: ("EXPLAIN", "QUERY PLAN"),
    rows_as_objects: true,
    in_list,
    rows_from,
    numbered_rows,
    lock_runs,
    placeholders: std::convert::identity,
};

/// The database clock in epoch milliseconds. `statement_timestamp()`: one value for every use
/// within a statement (so `complete_by - db_now` is exactly the deadline), fresh for each
/// statement (unlike `now()`, which is frozen at the start of the transaction). SQLite's
/// `'now'` has the same per-statement stability.
pub(super) const NOW: &str = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT";

/// The channel on which transactions that queue steps notify every engine (LISTEN/NOTIFY):
/// a step made ready in one process starts in another within milliseconds; polling remains
/// the fallback, so a lost notification only costs latency.
pub const READY_CHANNEL: &str = "sagaflow_ready";

/// Row lock taken by the claim's inner SELECT: rows another scheduler is claiming are skipped,
/// never waited for and never handed out twice.
pub(super) const CLAIM_LOCK: &str = "FOR UPDATE SKIP LOCKED";

/// An array parameter: `column = ANY($first)`.
#[allow(clippy::unnecessary_wraps)] // the signature is the dialect's; SQLite's can fail
fn in_list(column: &str, first: usize, values: Vec<Value>) -> Result<Bound> {
    let ty = values.first().map_or(ArrayType::BigInt, array_type);
    Ok((
        format!("{column} = ANY(${first})"),
        vec![Value::Array(ty, Some(Box::new(values)))],
    ))
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

/// `json_to_recordset` over JSON objects, typed by the columns' PostgreSQL types.
fn rows_from(first: usize, cols: &[(&str, &str)]) -> String {
    let defs: Vec<String> = cols.iter().map(|(n, t)| format!("{n} {t}")).collect();
    format!(
        "json_to_recordset(CAST(${first} AS json)) AS v({})",
        defs.join(", ")
    )
}

fn numbered_rows(n: u64) -> String {
    format!(
        "SELECT gen_random_uuid() AS id, {{now}} - g AS t, g AS i FROM generate_series(1, {n}) AS g"
    )
}

/// Row locks, in id order (units of work lock runs in one order: no deadlock between two of
/// them); the caller clears `dirty` where it was set.
fn lock_runs(cond: &str, only: &str) -> String {
    format!("SELECT {RUN_COLS}, dirty FROM sagaflow_runs WHERE {cond}{only} ORDER BY id FOR UPDATE")
}
