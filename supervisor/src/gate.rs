//! A test-only gate in front of the leader's sweeps (not a public API).

use std::sync::Arc;

use tokio::sync::watch;

/// Test hook: while closed, every sweep of a supervisor configured with this gate waits
/// before doing any work, as a sweep blocked on a stuck query would, while lease renewal
/// goes on. Clones share one gate. A supervisor without a gate (the default) never looks at
/// one. Not part of the supported API.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct SweepGate(Arc<watch::Sender<bool>>);

impl Default for SweepGate {
    fn default() -> Self {
        Self::new()
    }
}

impl SweepGate {
    /// An open gate.
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(true)))
    }

    /// Makes sweeps wait from their next start (a sweep already past the gate finishes).
    pub fn close(&self) {
        self.0.send_replace(false);
    }

    /// Lets waiting and later sweeps through.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Waits until the gate is open.
    pub(crate) async fn pass(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|open| *open).await;
    }
}
