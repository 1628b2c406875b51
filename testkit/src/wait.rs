//! Waiting on conditions with a bounded timeout, never sleeping and hoping.

use std::future::Future;
use std::time::Duration;

use sagaflow::{Engine, Run, RunState, Uuid};

/// Waits until `check` is true, polling every 20 ms, at most `timeout`.
///
/// # Panics
/// When the condition does not hold in time.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(timeout, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// Waits until `probe` yields a value and returns it, polling every 20 ms, at most
/// `timeout`.
///
/// # Panics
/// When no value comes in time.
pub async fn eventually_some<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a run to reach a terminal state and asserts which.
///
/// # Panics
/// On timeout or another terminal state.
pub async fn expect_state(engine: &Engine, id: Uuid, state: RunState, backend: &str) -> Run {
    let run = engine
        .wait(id, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("[{backend}] waiting for run {id}: {e}"));
    if run.state != state {
        let history = engine.history(id).await.unwrap_or_default();
        let lines: Vec<String> = history.iter().map(|h| format!("  {h}")).collect();
        panic!(
            "[{backend}] run {id} ended {} instead of {state} (error: {:?}); history:\n{}",
            run.state,
            run.error,
            lines.join("\n")
        );
    }
    run
}
