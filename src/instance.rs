//! This engine instance's life in the database: registration (releasing what a predecessor
//! with the same id left in flight), the heartbeat, and the release of its own in-flight
//! steps at shutdown. Steps released here are interruptions, decided by the transition
//! module: they never count as failures.

use std::time::Duration;

use sagaflow_engine::transition::rescue;
use sagaflow_engine::{Result, Store};
use tokio_util::sync::CancellationToken;

/// Steps released per statement.
const RELEASE_BATCH: u32 = 512;

/// Registers the instance under a fresh incarnation, running `workflows` (`name@version`), and
/// releases what a previous process
/// with the same id still held (it cannot be running here: this process just started).
pub(crate) async fn register(
    store: &Store,
    id: &str,
    incarnation: &str,
    workflows: &[String],
    stale_after: Duration,
) -> Result<u64> {
    let reg = store.instance_register(id, incarnation, workflows).await?;
    if let Some(silent) = reg.predecessor_silent_ms
        && silent < i64::try_from(stale_after.as_millis()).unwrap_or(i64::MAX)
    {
        tracing::warn!(
            instance = id,
            silent_ms = silent,
            "instance id registered while a previous holder heartbeat recently: a restart after \
             a crash is fine, two live processes with one id are not (each takes the other's work)"
        );
    }
    let released = release_owned(store, id).await?;
    if released > 0 {
        tracing::info!(
            instance = id,
            steps = released,
            "released steps a previous process of this instance left in flight"
        );
    }
    Ok(released)
}

/// Releases every running step `owner` holds, as interruptions.
pub(crate) async fn release_owned(store: &Store, owner: &str) -> Result<u64> {
    let mut total = 0;
    loop {
        let owned = store.step_list_owned(owner, RELEASE_BATCH).await?;
        if owned.is_empty() {
            return Ok(total);
        }
        let items: Vec<_> = owned.iter().map(rescue).collect();
        let counts = store.step_rescue(None, &items).await?;
        let moved = counts.interrupted + counts.failed;
        total += moved;
        if moved == 0 {
            return Ok(total);
        }
    }
}

/// Heartbeats until cancelled. Losing the registration (another process took the id) is
/// logged once.
pub(crate) async fn heartbeat(
    store: Store,
    id: String,
    incarnation: String,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut failing = false;
    let mut lost = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = cancel.cancelled() => return,
        }
        match store.instance_heartbeat(&id, &incarnation).await {
            Ok(true) => failing = false,
            Ok(false) => {
                if !lost {
                    tracing::error!(
                        instance = %id,
                        "another process registered this instance id; its steps are no longer ours"
                    );
                    lost = true;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(instance = %id, error = %e, "heartbeat failed; retrying");
                    failing = true;
                }
            }
        }
    }
}
