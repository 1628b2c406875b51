//! Engines for tests: short intervals, so that recovery and retries take milliseconds.

use std::time::Duration;

use sagaflow::{Engine, EngineBuilder, Workflow};

use crate::db::TestDb;

/// Turns on test logging once (`RUST_LOG` decides what is shown).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// An engine builder with short intervals for tests.
pub fn fast_builder(db: &TestDb) -> EngineBuilder {
    fast_builder_on(&db.url)
}

/// [`fast_builder`] for a database URL.
pub(crate) fn fast_builder_on(url: &str) -> EngineBuilder {
    Engine::builder()
        .with_database_url(url.to_owned())
        .with_pool_size(8)
        .with_poll_interval(Duration::from_millis(50))
        .with_error_pause(Duration::from_millis(100))
        .with_sweep_interval(Duration::from_millis(100))
        .with_timer_interval(Duration::from_millis(50))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400))
}

/// Starts an engine with fast settings and the given workflows.
///
/// # Panics
/// When the engine does not start.
pub async fn engine(db: &TestDb, workflows: Vec<Workflow>) -> Engine {
    init_logging();
    let mut b = fast_builder(db);
    for wf in workflows {
        b = b.with_workflow(wf);
    }
    b.start()
        .await
        .unwrap_or_else(|e| panic!("[{}] engine start: {e}", db.backend))
}
