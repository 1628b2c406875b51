//! Command-line flags.

use std::path::PathBuf;

use clap::Parser;
use sagaflow_tools::Error;

/// Crash engine processes and PostgreSQL under a fault-injecting workload, then check that
/// no run was lost and no effect applied twice.
#[derive(Parser, Debug, Clone)]
#[command(name = "sagaflow-chaos")]
pub(crate) struct Args {
    /// PostgreSQL server to use (a fresh database is created on it and dropped at the end).
    /// Default: start a private throwaway cluster with scripts/pg.sh.
    #[arg(long, env = "DATABASE_URL")]
    pub(crate) database_url: Option<String>,
    /// Data directory of the server behind --database-url, to restart it mid-run with
    /// `pg_ctl restart -m immediate` (as the postgres OS user when running as root).
    #[arg(long)]
    pub(crate) pg_ctl_data_dir: Option<PathBuf>,
    /// Directory holding pg_ctl (default: SAGAFLOW_PG_BIN, then /usr/lib/postgresql/*/bin,
    /// then PATH).
    #[arg(long, env = "SAGAFLOW_PG_BIN")]
    pub(crate) pg_bin: Option<PathBuf>,
    /// Path of scripts/pg.sh (used only to start a private cluster).
    #[arg(long)]
    pub(crate) pg_script: Option<PathBuf>,
    /// Engine processes.
    #[arg(long, default_value_t = 4)]
    pub(crate) processes: usize,
    /// Order sagas to submit.
    #[arg(long, default_value_t = 5_000)]
    pub(crate) orders: usize,
    /// Runs of the parallel-roots workflow (`chaos_pair`: two roots, one refused for good
    /// in every third run) submitted beside the orders; 0: none.
    #[arg(long, default_value_t = 500)]
    pub(crate) pairs: usize,
    /// Runs of the long-lived workflow (`chaos_flow`: an event wait, a timer, a child run,
    /// migrated automatically from version 1 to 2) submitted beside the orders; 0: none.
    #[arg(long, default_value_t = 500)]
    pub(crate) flows: usize,
    /// Share of remote calls failing transiently (0..1).
    #[arg(long, default_value_t = 0.10)]
    pub(crate) transient: f64,
    /// Share of remote calls that apply their effect and then hang past the deadline (0..1).
    #[arg(long, default_value_t = 0.02)]
    pub(crate) hang: f64,
    /// Share of remote calls that apply their effect and then lose the answer (a reset
    /// connection, a 502 or a 504) (0..1).
    #[arg(long, default_value_t = 0.02)]
    pub(crate) lose_reply: f64,
    /// Share of idempotency keys of forward calls refused for good (0..1).
    #[arg(long, default_value_t = 0.01)]
    pub(crate) permanent: f64,
    /// Seed of the fault injection and of the choice of the process to kill.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// SIGKILLs of a random engine process (each restarted under a new instance id), spread
    /// over the run by progress, not by the clock: one each time another `runs / (kills +
    /// 1)` runs have ended (runs: orders, pairs and flows), so a faster machine gets as many kills as a slower one; 0: none.
    #[arg(long, default_value_t = 25)]
    pub(crate) kills: u64,
    /// SIGSTOPs of a random engine process for 1 to 3 s, then SIGCONT (a process frozen
    /// past its heartbeat: it must stop its own attempts before others take its steps
    /// over), spread over the run by progress like the kills; 0: none.
    #[arg(long, default_value_t = 10)]
    pub(crate) pauses: u64,
    /// SIGSTOPs of the supervisor leader's process (found through the lease) for 2.5 to
    /// 3.5 s, longer than the lease: another process must take over, and the frozen one step
    /// down when it wakes; spread over the run by progress; 0: none.
    #[arg(long, default_value_t = 5)]
    pub(crate) leader_pauses: u64,
    /// Operators' cancels of unfinished orders, at any point of them (a cancel that meets the
    /// pivot comes too late: the run goes forward), spread over the run by progress; 0: none.
    #[arg(long, default_value_t = 50)]
    pub(crate) cancels: u64,
    /// Bulk cancels: each cancels `--bulk-size` runs at once (unfinished runs of every kind,
    /// concurrently from the coordinator's client), spread over the run by progress; 0: none.
    #[arg(long, default_value_t = 10)]
    pub(crate) bulk_cancels: u64,
    /// Runs one bulk cancel picks.
    #[arg(long, default_value_t = 10)]
    pub(crate) bulk_size: u32,
    /// Retention window of finished runs in the engine processes, in milliseconds (0: keep
    /// them). The retention pass runs when a process becomes the supervisor leader and every
    /// 60 s; the coordinator records each run's final state before it can be purged.
    #[arg(long, default_value_t = 5_000)]
    pub(crate) retention_ms: u64,
    /// Restarts of PostgreSQL (`pg_ctl restart -m immediate`), spread over the run by
    /// progress: the k-th when k / (n + 2) of the runs ended (a single one at a third).
    #[arg(long, default_value_t = 1)]
    pub(crate) pg_restarts: u64,
    /// Do not restart PostgreSQL mid-run (as `--pg-restarts 0`).
    #[arg(long)]
    pub(crate) no_pg_restart: bool,
    /// Give up (and fail) after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout_secs: u64,
    /// Keep the chaos database (and a private cluster) at the end, for inspection.
    #[arg(long)]
    pub(crate) keep_db: bool,
    /// Also write the verdict (every invariant with its counts and violations, and the
    /// chaos tally) as JSON to this file.
    #[arg(long)]
    pub(crate) report_json: Option<PathBuf>,
    /// Where the engine processes write their logs (default: a new temp directory).
    #[arg(long)]
    pub(crate) log_dir: Option<PathBuf>,

    /// Leave `synchronous_commit` at the server's setting instead of forcing it on for the
    /// chaos database. With `off`, the PostgreSQL restart loses acknowledged commits, and the
    /// checks are expected to fail: this shows why the engine needs durable commits.
    #[arg(long, hide = true)]
    pub(crate) server_commit_mode: bool,
    /// Run the private cluster with `fsync=off` and `full_page_writes=off` (faster, but a
    /// server crash could lose data; the default is full durability).
    #[arg(long)]
    pub(crate) fast_unsafe: bool,

    /// Internal: run as one engine process of the fleet.
    #[arg(long, hide = true)]
    pub(crate) worker: bool,
    /// Internal: the engine process's instance id.
    #[arg(long, hide = true)]
    pub(crate) instance_id: Option<String>,
    /// Internal: base URL of the simulated services.
    #[arg(long, hide = true)]
    pub(crate) services_url: Option<String>,
}

impl Args {
    /// Runs submitted: orders, pairs and flows.
    pub(crate) fn runs(&self) -> usize {
        self.orders + self.pairs + self.flows
    }

    /// Rejects flag combinations that cannot work.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        for (name, v) in [
            ("--transient", self.transient),
            ("--hang", self.hang),
            ("--lose-reply", self.lose_reply),
            ("--permanent", self.permanent),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::Usage(format!(
                    "{name} must be between 0 and 1, got {v}"
                )));
            }
        }
        if self.transient + self.hang + self.lose_reply > 1.0 {
            return Err(Error::Usage(
                "--transient, --hang and --lose-reply must not add up to more than 1".into(),
            ));
        }
        if self.processes == 0 || self.orders == 0 {
            return Err(Error::Usage(
                "--processes and --orders must be at least 1".into(),
            ));
        }
        if self.kills >= self.runs() as u64 {
            return Err(Error::Usage(
                "--kills must be below --orders + --pairs + --flows (kills are spread over the runs)"
                    .into(),
            ));
        }
        if self.bulk_cancels > 0 && self.bulk_size == 0 {
            return Err(Error::Usage("--bulk-size must be at least 1".into()));
        }
        if self.timeout_secs == 0 {
            return Err(Error::Usage("--timeout-secs must be positive".into()));
        }
        Ok(())
    }
}
