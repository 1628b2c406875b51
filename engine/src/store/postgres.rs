//! PostgreSQL-specific SQL: everything the statements of the other files take from
//! [`DIALECT`] when they run on PostgreSQL, and the statements only PostgreSQL runs (a
//! submission in one statement, the claim that returns when each step fell due, and the
//! claim that reads the claimed steps' inputs with it), which the files of their nouns
//! choose by backend and execute.

use sea_orm::sea_query::ArrayType;
use sea_orm::{DbBackend, Value};

use super::rows::RUN_COLS;
use super::sql::{Bound, Dialect, placeholders};
use crate::Result;

/// PostgreSQL's SQL.
pub(super) const DIALECT: Dialect = Dialect {
    db: DbBackend::Postgres,
    now: NOW,
    claim_lock: CLAIM_LOCK,
    wake_lock: "FOR UPDATE OF s SKIP LOCKED FOR SHARE OF r SKIP LOCKED",
    row_lock: " FOR UPDATE",
    explain: ("EXPLAIN", "QUERY PLAN"),
    folded_count: "json_array_length(then_states::json)",
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

fn numbered_rows(n: u64, newest_ago: i64, step: i64) -> String {
    // A UUIDv7's layout: 48 bits of epoch milliseconds, the version nibble, then random bits.
    format!(
        "SELECT (lpad(to_hex(t), 12, '0') || '7' || substr(md5(random()::text), 1, 19))::uuid AS id, \
         t, g AS i FROM (SELECT {{now}} - {newest_ago} - g * {step} AS t, g \
         FROM generate_series(1, {n}) AS g) AS s"
    )
}

/// Row locks, in id order (units of work lock runs in one order: no deadlock between two of
/// them); the caller clears `dirty` where it was set.
fn lock_runs(cond: &str, only: &str) -> String {
    format!("SELECT {RUN_COLS}, dirty FROM sagaflow_runs WHERE {cond}{only} ORDER BY id FOR UPDATE")
}

/// A whole submission in one statement: `runs` (an `INSERT … RETURNING id` of runs), `steps`
/// (the insert of their steps, which reads the ids from `r`), the runs' `submitted` history
/// and the wake-up notification with `payload`. It returns the ids of the runs inserted.
///
/// `pg_notify(…) IS NOT NULL` is always true: it sends one notification (PostgreSQL folds
/// repeats within a transaction) when at least one run was inserted. Its payload asks
/// claimers only (new runs need no evaluation) and names no sender: the store does not know
/// which engine submits, so every engine, the submitter's included, hears it.
///
/// With `keys` (the insert of the batch's business keys into the key table, returning the
/// runs whose key it took), that insert comes first, as `k`, and `runs` reads it.
pub(super) fn intake(keys: Option<&str>, runs: &str, steps: &str, payload: &str) -> String {
    let keys = keys.map_or(String::new(), |k| format!("k AS ({k}), "));
    format!(
        "WITH {keys}r AS ({runs}), s AS ({steps}), \
         h AS ( \
           INSERT INTO sagaflow_history (run_id, event, to_state, actor, at) \
           SELECT id, 'submitted', state, 'api', {{now}} FROM r) \
         SELECT id FROM r WHERE pg_notify('{READY_CHANNEL}', '{payload}') IS NOT NULL"
    )
}

/// The claim statement, with the claim's writes `set`: `$1` the owner, `$2` the limit, `$3…`
/// the `keys` workflow keys. It returns when each step fell due (`due_at`) from the rows it
/// selected; SQLite, whose `RETURNING` sees only the updated row, claims in two statements.
pub(super) fn claim(set: &str, keys: usize) -> String {
    format!(
        "UPDATE sagaflow_steps AS s {set} FROM ( \
           SELECT id, available_at FROM sagaflow_steps \
           WHERE state IN ('ready', 'compensation_ready') AND resource IS NULL AND available_at <= {{now}} \
           AND workflow_key IN ({keys}) \
           ORDER BY priority DESC, available_at LIMIT $2 {CLAIM_LOCK}) AS q \
         WHERE s.id = q.id \
         RETURNING s.id, s.run_id, s.workflow_key, s.name, s.state, s.attempt, \
           s.forward_attempts, s.compensation_attempts, s.failure_count, s.max_failures, \
           s.interruptions, s.max_interruptions, s.deadline_ms, s.deadline_cap_ms, \
           s.complete_by, s.idempotency_key, s.output, s.wait, {{now}} AS db_now, \
           q.available_at AS due_at",
        keys = placeholders(3, keys),
    )
}

/// A claim statement wrapped so that it also returns what the claimed steps need. The outer
/// query reads the snapshot the claim started from; a claim changes neither a run's input
/// nor a completed step's output. Outputs come as a JSON array of `[name, output]` pairs per
/// claimed step.
pub(super) fn with_inputs(claim: &str) -> String {
    format!(
        "WITH c AS ({claim}) \
         SELECT c.*, r.input AS run_input, r.trace_parent AS run_trace_parent, \
           r.trace_state AS run_trace_state, \
           (SELECT json_agg(json_build_array(d.name, d.output))::text FROM sagaflow_steps d \
            WHERE d.run_id = c.run_id AND d.output IS NOT NULL) AS run_outputs \
         FROM c LEFT JOIN sagaflow_runs r ON r.id = c.run_id"
    )
}
