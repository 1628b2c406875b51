//! One engine process of the fleet: `sagaflow-chaos --worker --instance-id … --database-url …
//! --services-url …`. It runs a full engine (scheduler, agents, supervisor candidate) until
//! it is SIGKILLed, or until its standard input closes (the coordinator finished or died),
//! when it shuts down and exits.

use std::io::Read as _;
use std::time::{Duration, Instant};

use sagaflow::{DeadlinePolicy, Engine, RetryPolicy};
use sagaflow_testkit::services::HttpServices;
use sagaflow_workflows::order::{OrderApis, OrderSettings, order_saga};
use tracing_subscriber::EnvFilter;

use super::cli::Args;
use super::mix;

/// Deadline of a step's first attempt (the supervisor doubles it after each timeout).
pub(crate) const DEADLINE: Duration = Duration::from_secs(3);
/// Ceiling of the extended deadline.
pub(crate) const DEADLINE_CAP: Duration = Duration::from_secs(6);
/// Failed attempts (errors and timeouts) at which a step fails for good.
pub(crate) const MAX_FAILURES: u32 = 4;
/// Leader lease lifetime and renewal period.
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(2);
pub(crate) const LEASE_RENEW: Duration = Duration::from_millis(500);
/// Supervisor sweep period.
pub(crate) const SWEEP: Duration = Duration::from_millis(200);
/// The supervisor leader's timer pass: timers fire, event waits time out and the automatic
/// migration runs at most this late.
pub(crate) const TIMER_PASS: Duration = Duration::from_millis(250);
/// How long a worker keeps trying to start its engine (PostgreSQL may be restarting).
const START_PATIENCE: Duration = Duration::from_secs(60);

/// The order saga's settings, identical in every process of the fleet.
pub(crate) fn order_settings() -> OrderSettings {
    OrderSettings {
        version: 1,
        retry: RetryPolicy::default()
            .with_max_failures(MAX_FAILURES)
            .with_backoff(Duration::from_millis(20), Duration::from_millis(500)),
        deadline: DeadlinePolicy::new(DEADLINE, DEADLINE_CAP),
    }
}

/// The worker's main: returns the process exit code.
pub(crate) async fn worker_main(args: &Args) -> u8 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("warn,sagaflow_engine::signals=off")),
        )
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
    let (Some(id), Some(db), Some(services)) = (
        args.instance_id.clone(),
        args.database_url.clone(),
        args.services_url.clone(),
    ) else {
        eprintln!("worker: --instance-id, --database-url and --services-url are required");
        return 2;
    };

    // Standard input closes when the coordinator is done with us, or dies: either way, stop.
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = closed_tx.send(());
    });

    let http = HttpServices::new(services);
    let apis = mix::Apis::from(&http);
    // Retention is off with 0 (as `None`).
    let retention = (args.retention_ms > 0).then(|| Duration::from_millis(args.retention_ms));
    let started = Instant::now();
    let engine = loop {
        let wf = match order_saga(OrderApis::from(&http), order_settings()) {
            Ok(wf) => wf,
            Err(e) => {
                eprintln!("worker {id}: order saga: {e}");
                return 2;
            }
        };
        let mixed = match mix::workflows(&apis, &[1, 2]) {
            Ok(wfs) => wfs,
            Err(e) => {
                eprintln!("worker {id}: mixed workload: {e}");
                return 2;
            }
        };
        let mut builder = Engine::builder()
            .with_database_url(db.clone())
            .with_instance_id(id.clone())
            .with_workflow(wf);
        for wf in mixed {
            builder = builder.with_workflow(wf);
        }
        let attempt = builder
            .with_migration(mix::flow_migration())
            .with_timer_interval(TIMER_PASS)
            .with_poll_interval(Duration::from_millis(100))
            .with_error_pause(Duration::from_millis(250))
            .with_sweep_interval(SWEEP)
            .with_lease(LEASE_TTL, LEASE_RENEW)
            .with_retention(retention)
            .start()
            .await;
        match attempt {
            Ok(engine) => break engine,
            // PostgreSQL may be restarting right now: keep trying for a while.
            Err(e) if started.elapsed() < START_PATIENCE => {
                tracing::warn!(error = %e, "engine start failed; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => {
                eprintln!("worker {id}: engine did not start within {START_PATIENCE:?}: {e}");
                return 3;
            }
        }
    };
    tracing::info!(instance = %id, "engine started");
    let _ = closed_rx.await;
    if tokio::time::timeout(Duration::from_secs(10), engine.shutdown())
        .await
        .is_err()
    {
        eprintln!("worker {id}: engine shutdown took over 10 s");
        return 4;
    }
    0
}
