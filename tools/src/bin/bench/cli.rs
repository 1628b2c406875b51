//! Command-line flags of `sagaflow-bench`.

use clap::Parser;

/// What to measure, on which database, with how many engine processes.
#[derive(Parser, Debug)]
#[command(about = "Measure sagaflow: workflows/s, start and end-to-end latency, peak RSS")]
pub(crate) struct Args {
    /// Database URL; default: a fresh SQLite file under ./.sagaflow/.
    #[arg(long, env = "DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Runs in the throughput phase.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) runs: usize,
    /// Runs in the latency phase (one at a time).
    #[arg(long, default_value_t = 100)]
    pub(crate) latency_runs: usize,
    /// Concurrent submitters in the throughput phase (64: the setting of the figures in
    /// docs/benchmarks.md).
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) submitters: usize,
    /// Steps in flight at most.
    #[arg(long, default_value_t = 512)]
    pub(crate) max_in_flight: usize,
    /// Steps per claim statement.
    #[arg(long, default_value_t = 128)]
    pub(crate) claim_batch: u32,
    /// Result batches each engine writes concurrently; default: the engine's.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) completion_writers: Option<usize>,
    /// Engine processes running the steps. With more than one, this process only submits
    /// (a client-only engine) and the workers are copies of this command; latencies then come
    /// from the runs' database timestamps, and the start latency is not measured.
    #[arg(long, default_value_t = 1)]
    pub(crate) processes: usize,
    /// Finished runs (with history) to insert before measuring: throughput must not depend
    /// on how much history the database holds (AT-5).
    #[arg(long, default_value_t = 0)]
    pub(crate) prefill_finished: u64,
    /// Samples of each console read (runs list pages, overview figures) timed after the
    /// prefill; 0 skips them.
    #[arg(long, default_value_t = 200)]
    pub(crate) console_samples: usize,
    /// Stop after the console reads (no throughput or latency phase).
    #[arg(long)]
    pub(crate) console_only: bool,
    /// Seconds to measure each raw ceiling of the database (single-row INSERT + UPDATE
    /// transactions through the same driver and durability), which workflows/s is printed as
    /// a ratio of; 0 skips it.
    #[arg(long, default_value_t = 3)]
    pub(crate) ceiling_secs: u64,
    /// SQLite only: `full` (every commit synced, the default) or `normal` (synced at
    /// checkpoints; the last commits can be lost to a power loss).
    #[arg(long, default_value = "full", value_parser = ["full", "normal"])]
    pub(crate) sqlite_sync: String,
    /// Every step calls one remote resource limited to this many attempts in flight (set it
    /// far above `--max-in-flight` to measure what flow control costs when it never holds a
    /// step back); without it the steps call no resource.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) resource_limit: Option<u32>,
    /// Instead of the throughput run: park this many runs (half on a 30-day timer, half
    /// waiting for an event), then measure the engine's resident memory and CPU while they
    /// wait, against the same engine idle before them.
    #[arg(long, value_name = "N")]
    pub(crate) parked: Option<usize>,
    /// Hostile callers: start `--latency-runs` runs through the HTTP API with no other
    /// traffic, then again while N clients (in this process) flood the API with refused
    /// requests, forged callbacks, read-only event streams and wrong logins; print both
    /// phases' latencies and how the flood was answered.
    #[arg(long, value_name = "N")]
    pub(crate) hostile: Option<usize>,
    /// How long each idle measurement of `--parked` lasts, in seconds.
    #[arg(long, default_value_t = 30)]
    pub(crate) idle_secs: u64,
    /// Run the worker processes of `--processes` in this many network namespaces
    /// `sfhost1..N` (made by `scripts/netns.sh up N`), worker p in host p mod N + 1, each
    /// reaching PostgreSQL at its host's root-side address 10.231.K.1; then print each host's
    /// share of the steps and Jain's fairness index. Needs root and a PostgreSQL URL.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=64))]
    pub(crate) netns_hosts: Option<u8>,
    /// Internal: run as a worker process until killed.
    #[arg(long, hide = true)]
    pub(crate) worker: Option<String>,
    /// Measures what a console left open costs the primary, reading it and then reading this
    /// PostgreSQL replica of `--database-url` (with `--prefill-finished` runs, 100,000 if
    /// not given).
    #[arg(long, value_name = "URL")]
    pub(crate) read_replica: Option<String>,
    /// How long each phase of `--read-replica` lasts, in seconds.
    #[arg(long, default_value_t = 20)]
    pub(crate) console_secs: u64,
    /// Measures the retention pass over this many finished runs: alone (time, WAL, the
    /// vacuum after it), then under the saga load (`--submitters` runs in flight) against
    /// the same load with nothing due.
    #[arg(long, value_name = "RUNS")]
    pub(crate) retention: Option<u64>,
    /// How long the quiet window of `--retention` lasts (and at least the busy one), in
    /// seconds.
    #[arg(long, default_value_t = 10)]
    pub(crate) load_secs: u64,
}
