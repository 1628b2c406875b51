//! The events the flows wait for: the coordinator sends `approve` to each accepted flow that
//! is to get it, 0.1 to 1.5 s after its acceptance (by business key, from its client
//! engine), so some arrive while the step waits and some before (kept for it). The others
//! are never sent: their wait times out and the flow compensates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sagaflow::{Engine, EventTarget};
use tokio::sync::mpsc::UnboundedReceiver;

use super::mix::{APPROVE, FLOW_WORKFLOW};

/// Attempts per event before it counts as failed (PostgreSQL may be restarting).
const SEND_ATTEMPTS: u32 = 40;

/// What the event sender did.
#[derive(Debug, Default)]
pub(crate) struct EventTally {
    /// Events taken (delivered to the waiting step, or kept for it).
    pub(crate) sent: AtomicU64,
    /// Events refused because the run had finished (cancelled meanwhile).
    pub(crate) refused: AtomicU64,
    /// Events that could not be sent at all.
    pub(crate) failed: AtomicU64,
}

/// The delay before the event of flow `key`: 0.1 to 1.5 s, by a hash of its key.
fn delay(key: &str) -> Duration {
    let h = key
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    Duration::from_millis(100 + h % 1_400)
}

async fn send_one(engine: Engine, key: String, tally: Arc<EventTally>) {
    tokio::time::sleep(delay(&key)).await;
    let payload = serde_json::json!({ "approved": true, "by": "chaos" });
    for _ in 0..SEND_ATTEMPTS {
        match engine
            .send_event(
                EventTarget::key(FLOW_WORKFLOW, key.clone()),
                APPROVE,
                &payload,
            )
            .await
        {
            Ok(_) => {
                tally.sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(sagaflow::Error::ActionNotAllowed { .. }) => {
                tally.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    tally.failed.fetch_add(1, Ordering::Relaxed);
}

/// Sends the event of every flow key received on `keys`, until the channel closes and every
/// send is done.
pub(crate) async fn send_events(
    engine: Engine,
    mut keys: UnboundedReceiver<String>,
    tally: Arc<EventTally>,
) {
    let mut sends = tokio::task::JoinSet::new();
    while let Some(key) = keys.recv().await {
        sends.spawn(send_one(engine.clone(), key, tally.clone()));
    }
    while sends.join_next().await.is_some() {}
}
