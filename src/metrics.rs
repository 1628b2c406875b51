//! The engine's metrics in the Prometheus text format.
//!
//! The engine records its metrics through the `metrics` crate's facade:
//! counters of runs started, finished (per final state) and errored, of step attempts per
//! outcome and of alerts per kind; histograms of step and run durations and of start and
//! claim latency; gauges of the queue per workflow, of the steps in flight on this instance
//! and of leadership. The names are the constants below; `docs/operations.md` (section
//! *Metrics*) lists each with its labels.
//!
//! Two ways to export them:
//!
//! - [`install_prometheus`] installs a Prometheus recorder for the process; the admin
//!   router then serves `GET /metrics` (a bearer token of either role), refreshing the queue
//!   gauges from the database on each scrape. `sagaflow serve` and the demo's `--serve` do
//!   this.
//! - An application that exports metrics of its own installs its own recorder (any
//!   `metrics` recorder) before building its engines, and calls [`describe`] after
//!   installing it. It receives the same metric names; the supervisor leader refreshes the
//!   queue gauges every 10 seconds (`with_backlog_interval`).
//!
//! Counters move after the transaction that made the change commits, by the instance that
//! committed it, so summing them over the instances counts each change once. The queue
//! gauges are read from the database and are the same on every instance: aggregate them with
//! `max()`, not `sum()`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let handle = sagaflow::metrics::install_prometheus()?;
//! let engine = sagaflow::Engine::builder()
//!     .with_database_url("sqlite://sagaflow.db?mode=rwc")
//!     .start()
//!     .await?;
//! // `engine.admin_router(..)` now serves GET /metrics; or render it yourself:
//! println!("{}", handle.render());
//! # Ok(()) }
//! ```

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use sagaflow_engine::metrics::{
    ALERTS, ALL, LATENCY_BUCKETS, LEADER, OLDEST_READY_AGE, RUN_DURATION, RUN_DURATION_BUCKETS,
    RUN_START_LATENCY, RUNS_ERRORED, RUNS_FINISHED, RUNS_STARTED, STEP_ATTEMPT_DURATION,
    STEP_ATTEMPTS, STEP_CLAIM_LATENCY, STEP_DURATION_BUCKETS, STEPS_IN_FLIGHT, STEPS_READY,
    STEPS_RUNNING, STEPS_SCHEDULED, describe,
};

/// How often the installed recorder's histograms are compacted between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Why the Prometheus recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// The process already has a metrics recorder that is not sagaflow's. The engine's
    /// metrics go to that recorder, under the same names.
    #[error(
        "another metrics recorder is already installed in this process; sagaflow's metrics go \
         to it under the same names (call sagaflow::metrics::describe() after installing it)"
    )]
    RecorderTaken,
    /// The exporter refused its configuration.
    #[error("the Prometheus exporter refused its configuration: {0}")]
    Exporter(String),
}

/// A handle on the installed Prometheus recorder.
#[derive(Clone)]
pub struct MetricsHandle(PrometheusHandle);

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsHandle")
    }
}

impl MetricsHandle {
    /// Every metric recorded so far, in the Prometheus text format. The queue gauges are
    /// those of the last refresh (the `/metrics` route refreshes them first).
    pub fn render(&self) -> String {
        self.0.render()
    }
}

static HANDLE: OnceLock<MetricsHandle> = OnceLock::new();

/// Installs the Prometheus recorder for this process, once: later calls return the same
/// handle. Histograms get the buckets [`STEP_DURATION_BUCKETS`], [`RUN_DURATION_BUCKETS`]
/// and [`LATENCY_BUCKETS`]; every metric is described ([`describe`]). Call it before
/// building engines, so that nothing is recorded to no recorder.
///
/// # Errors
/// [`MetricsError::RecorderTaken`] when the process installed another recorder.
pub fn install_prometheus() -> Result<MetricsHandle, MetricsError> {
    static INSTALL: Mutex<()> = Mutex::new(());
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let exporter =
        |e: metrics_exporter_prometheus::BuildError| MetricsError::Exporter(e.to_string());
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in [
        (STEP_ATTEMPT_DURATION, &STEP_DURATION_BUCKETS[..]),
        (RUN_DURATION, &RUN_DURATION_BUCKETS[..]),
        (RUN_START_LATENCY, &LATENCY_BUCKETS[..]),
        (STEP_CLAIM_LATENCY, &LATENCY_BUCKETS[..]),
    ] {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .map_err(exporter)?;
    }
    let recorder = builder.build_recorder();
    let prometheus = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::RecorderTaken)?;
    let upkeep = prometheus.clone();
    // Without a scrape, recorded histogram samples wait in the recorder: compact them now
    // and then (what the exporter's own listener would do).
    let spawned = std::thread::Builder::new()
        .name("sagaflow-metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no metrics upkeep thread: histograms are compacted at each scrape only");
    }
    describe();
    let handle = MetricsHandle(prometheus);
    let _ = HANDLE.set(handle.clone());
    Ok(handle)
}

/// The handle of the recorder [`install_prometheus`] installed, if it did.
pub fn prometheus_handle() -> Option<MetricsHandle> {
    HANDLE.get().cloned()
}
