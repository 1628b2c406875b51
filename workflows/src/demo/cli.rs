//! The command line of `sagaflow-demo`: its flags, defaults and value checks.

use clap::Parser;

/// Runs N order sagas (reserve stock → charge card → ship) through injected transient
/// errors, hung calls and permanent refusals, then shows what the engine did about them.
#[derive(Debug, Parser)]
#[command(name = "sagaflow-demo", version)]
pub(crate) struct Args {
    /// Number of orders (one saga run each).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) orders: u32,

    /// Database URL. Default: a fresh SQLite file, ./.sagaflow/sagaflow-demo.db.
    /// A URL you give is used as is (nothing is deleted).
    #[arg(long, env = "DATABASE_URL")]
    pub(crate) database_url: Option<String>,

    /// Share of calls (every service) that fail transiently without applying.
    #[arg(long, default_value_t = 0.10, value_parser = rate)]
    pub(crate) transient: f64,

    /// Share of calls (every service) that apply their effect and then never answer.
    #[arg(long, default_value_t = 0.02, value_parser = rate)]
    pub(crate) hang: f64,

    /// Share of calls (every service) that apply their effect and then lose the answer (a
    /// reset connection, a 502 or a 504): the outcome is unknown to the saga.
    #[arg(long, default_value_t = 0.03, value_parser = rate)]
    pub(crate) lose_reply: f64,

    /// Share of forward calls (reserve, charge, ship) refused for good.
    #[arg(long, default_value_t = 0.03, value_parser = rate)]
    pub(crate) permanent: f64,

    /// Seed of the random fault decisions.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,

    /// Deadline of a step attempt in milliseconds; the supervisor extends it up to 4x.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(crate) deadline_ms: u64,

    /// Simulated processing time of every remote call, in milliseconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub(crate) latency_ms: u64,

    /// Steps in flight at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) concurrency: u32,

    /// Skip the operator act (runs needing an operator stay in error).
    #[arg(long)]
    pub(crate) no_operator: bool,

    /// Silence the engine's own log lines (otherwise RUST_LOG, default `warn`).
    #[arg(long)]
    pub(crate) quiet_logs: bool,

    /// After the runs, keep the engine up and serve its HTTP API on this address (e.g.
    /// 127.0.0.1:8080) until Ctrl-C, with the token printed (or SAGAFLOW_ADMIN_TOKEN's).
    #[arg(long, value_name = "ADDR")]
    pub(crate) serve: Option<std::net::SocketAddr>,

    /// Also deliver every alert to this webhook (`http://…`): POSTed as JSON and signed with
    /// HMAC-SHA256 (`Sagaflow-Signature`), at least once, through the engine's outbox.
    #[arg(long, value_name = "URL")]
    pub(crate) webhook: Option<String>,

    /// The environment variable holding the webhook's signing secret (16 characters or more).
    #[arg(long, value_name = "NAME", default_value = "SAGAFLOW_WEBHOOK_SECRET")]
    pub(crate) webhook_secret_env: String,

    /// Give up waiting for the runs after this many seconds (default: 120 + 1 per 10 orders).
    #[arg(long, hide = true)]
    pub(crate) timeout_secs: Option<u64>,
}

/// A share between 0 and 1.
fn rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a share between 0 and 1"))
    }
}
