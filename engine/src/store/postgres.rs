//! PostgreSQL-specific SQL.

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
