//! How long the steps a SIGKILLed engine process held take to go back to the queue.

use std::time::{Duration, Instant};

use sagaflow::internals::store::Store;

/// How often a rescue watcher looks at the steps a killed process held.
const RESCUE_POLL: Duration = Duration::from_millis(50);
/// How long a rescue watcher waits before it reports the steps as never rescued.
const RESCUE_GIVE_UP: Duration = Duration::from_secs(120);
/// How long after the SIGKILL of `victim` (at `killed`) every step it held was released to
/// the queue, or `None` when it held nothing. The released steps are claimed by a live
/// process at once (they are queued and, on PostgreSQL, announced by NOTIFY).
pub(crate) async fn rescue_time(store: Store, victim: String, killed: Instant) -> Option<Duration> {
    let held = loop {
        match store.step_list_owned(&victim, 10_000).await {
            Ok(steps) => break steps,
            // PostgreSQL may be restarting.
            Err(_) if killed.elapsed() < RESCUE_GIVE_UP => {
                tokio::time::sleep(RESCUE_POLL).await;
            }
            Err(_) => return None,
        }
    };
    if held.is_empty() {
        return None;
    }
    while killed.elapsed() < RESCUE_GIVE_UP {
        if store
            .step_list_owned(&victim, 1)
            .await
            .is_ok_and(|s| s.is_empty())
        {
            return Some(killed.elapsed());
        }
        tokio::time::sleep(RESCUE_POLL).await;
    }
    Some(RESCUE_GIVE_UP)
}
