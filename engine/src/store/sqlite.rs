//! SQLite-specific SQL.

/// The database clock in epoch milliseconds (julianday keeps sub-second precision).
pub(super) const NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// SQLite has one writer at a time: the claim's UPDATE is atomic without a row lock clause.
pub(super) const CLAIM_LOCK: &str = "";
