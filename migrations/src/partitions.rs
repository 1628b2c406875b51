//! Names and bounds of the history partitions on PostgreSQL (migration `m0024`), shared with
//! the engine, which creates the partitions ahead of time and drops them behind it.
//!
//! `sagaflow_history` is range-partitioned on `run_id`. Run ids are UUIDv7s: their first 48
//! bits are the milliseconds since the Unix epoch at which the run was started, so a range of
//! ids is a range of start times, and all of a run's history lies in the partition of the
//! day it started. Each partition covers one UTC day ([`HISTORY_PARTITION_SPAN_MS`]);
//! [`HISTORY_BEFORE_PARTITION`] holds what was written before the migration and
//! [`HISTORY_DEFAULT_PARTITION`] whatever no other partition covers.

/// The time each history partition covers: one UTC day of run starts.
pub const HISTORY_PARTITION_SPAN_MS: i64 = 24 * 3_600_000;

/// The partition of the history rows whose run ids no other partition covers: runs started
/// on a day whose partition was not made (or was already dropped), and the history of runs
/// moved out of a partition that was dropped while they were still kept.
pub const HISTORY_DEFAULT_PARTITION: &str = "sagaflow_history_default";

/// The partition made of the history table as it was before the migration: every run id up
/// to the first UTC midnight after the migration ran.
pub const HISTORY_BEFORE_PARTITION: &str = "sagaflow_history_before";

/// The table of finished runs (migration `m0025`): on PostgreSQL a run that ends for good
/// and is not a child run moves here from `sagaflow_runs`, into the partition of the day it
/// started, the same days as the history's.
pub const RUNS_DONE: &str = "sagaflow_runs_done";

/// The partition of the finished runs whose ids no day's partition covers.
pub const RUNS_DONE_DEFAULT_PARTITION: &str = "sagaflow_runs_done_default";

/// The business keys runs hold, on PostgreSQL (migration `m0025`): the intake's arbiter. A
/// keyed start inserts its key here (`ON CONFLICT DO NOTHING`) in the statement that inserts
/// the run; the key stays while the run holds it, whichever table the run is in, and goes
/// when its end releases it, a restart takes it over, or retention deletes the run.
pub const RUN_KEYS: &str = "sagaflow_run_keys";

/// Every run, live or finished, for reads: a view over `sagaflow_runs` and, on PostgreSQL,
/// [`RUNS_DONE`].
pub const RUNS_ALL: &str = "sagaflow_runs_all";

/// The columns of `sagaflow_runs`, and of [`RUNS_DONE`], in their order.
pub const RUN_TABLE_COLUMNS: &str = "id, workflow, version, workflow_key, business_key, active_key, \
     state, input, output, error, dirty, created_at, updated_at, finished_at, failed_attempts, \
     priority, start_at, notify, trace_parent, trace_state, flow_key, parent_step, \
     restarted_from, restarted_as";

/// The history table's columns, in their order.
pub const HISTORY_COLUMNS: &str =
    "id, run_id, step, event, from_state, to_state, attempt, actor, detail, at, then_states";

/// The lowest UUID of the millisecond `ms` (the 48 time bits of a UUIDv7, then zeros): a
/// run started at `ms` or later has an id at or above it.
#[must_use]
pub fn uuid_floor(ms: i64) -> String {
    let ms = ms.clamp(0, (1 << 48) - 1);
    format!(
        "{:08x}-{:04x}-0000-0000-000000000000",
        ms >> 16,
        ms & 0xffff
    )
}

/// The milliseconds a UUIDv7 carries (its first 48 bits), from its text form.
#[must_use]
pub fn uuid_ms(uuid: &str) -> Option<i64> {
    let hex: String = uuid.chars().filter(|c| *c != '-').take(12).collect();
    if hex.len() < 12 {
        return None;
    }
    i64::from_str_radix(&hex, 16).ok()
}

/// The start of the span after the one holding `ms`: the next UTC midnight.
#[must_use]
pub fn next_span(ms: i64) -> i64 {
    (ms.div_euclid(HISTORY_PARTITION_SPAN_MS) + 1) * HISTORY_PARTITION_SPAN_MS
}

/// The name of the history partition of the UTC day that starts at `day_ms`:
/// `sagaflow_history_YYYYMMDD`.
#[must_use]
pub fn history_partition_name(day_ms: i64) -> String {
    partition_name("sagaflow_history", day_ms)
}

/// The statement that makes the history partition of the UTC day that starts at `day_ms`
/// (nothing if a table of that name exists).
#[must_use]
pub fn history_partition_create(day_ms: i64) -> String {
    partition_create("sagaflow_history", day_ms)
}

/// The name of the partition of table `table` for the UTC day that starts at `day_ms`:
/// `<table>_YYYYMMDD`.
#[must_use]
pub fn partition_name(table: &str, day_ms: i64) -> String {
    let (y, m, d) = civil_date(day_ms.div_euclid(HISTORY_PARTITION_SPAN_MS));
    format!("{table}_{y:04}{m:02}{d:02}")
}

/// The statement that makes the partition of `table` (the history or the finished runs)
/// for the UTC day that starts at `day_ms` (nothing if a table of that name exists).
#[must_use]
pub fn partition_create(table: &str, day_ms: i64) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} FOR VALUES FROM ('{}') TO ('{}')",
        partition_name(table, day_ms),
        uuid_floor(day_ms),
        uuid_floor(day_ms + HISTORY_PARTITION_SPAN_MS)
    )
}

/// The proleptic Gregorian date of the `days`-th day after 1970-01-01: the usual
/// era-of-400-years arithmetic. Written here rather than taken from a date crate because it
/// is the only date this crate names.
fn civil_date(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_named_by_their_utc_date() {
        assert_eq!(history_partition_name(0), "sagaflow_history_19700101");
        // 2026-11-29T00:00:00Z and the leap day of 2024.
        assert_eq!(
            history_partition_name(1_795_910_400_000),
            "sagaflow_history_20261129"
        );
        assert_eq!(
            history_partition_name(1_709_164_800_000),
            "sagaflow_history_20240229"
        );
        assert_eq!(
            history_partition_name(1_709_251_199_999),
            "sagaflow_history_20240229"
        );
    }

    #[test]
    fn bounds_carry_the_milliseconds_of_a_uuidv7() {
        let ms = 1_795_910_400_123;
        assert_eq!(uuid_ms(&uuid_floor(ms)), Some(ms));
        assert_eq!(uuid_floor(0), "00000000-0000-0000-0000-000000000000");
        assert_eq!(uuid_ms("not a uuid"), None);
        assert_eq!(
            next_span(1_795_910_400_000),
            1_795_910_400_000 + HISTORY_PARTITION_SPAN_MS
        );
        assert_eq!(next_span(1_795_910_399_999), 1_795_910_400_000);
    }
}
