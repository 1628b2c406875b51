//! This engine instance's life in the database: registration (releasing what a predecessor
//! with the same id left in flight), the heartbeat, and the release of its own in-flight
//! steps at shutdown. Steps released here are interruptions, decided by the transition
//! module: they never count as failures.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use sagaflow_engine::transition::rescue;
use sagaflow_engine::{Result, Scheduler, Store};
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
        let counts = sagaflow_engine::rescue::rescue_steps(store, None, &items).await?;
        let moved = counts.interrupted + counts.failed;
        total += moved;
        if moved == 0 {
            return Ok(total);
        }
    }
}

/// What an instance's heartbeat needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Heartbeat {
    /// This process's registration of the instance id.
    pub(crate) incarnation: String,
    /// How often it beats.
    pub(crate) every: Duration,
    /// How long silence lasts before other instances count this one dead.
    pub(crate) stale_after: Duration,
}

impl Heartbeat {
    /// How long after the start of its last heartbeat that landed the instance stops its
    /// own attempts: a margin before `stale_after` (a quarter of it, or half of the room
    /// between a beat and `stale_after` when that is smaller), so that it has stopped acting
    /// before any other instance may take its steps over.
    pub(crate) fn fence_after(&self) -> Duration {
        let margin = (self.stale_after / 4).min(self.stale_after.saturating_sub(self.every) / 2);
        self.stale_after.saturating_sub(margin)
    }
}

/// Heartbeats until cancelled, and fences the instance while its liveness is in doubt: when
/// no heartbeat has landed for [`Heartbeat::fence_after`] (the database is slow or out of
/// reach, the process was frozen), the scheduler stops every attempt in flight and claims
/// nothing, before the leader may count the instance dead and re-queue its steps. The
/// next heartbeat that lands releases what the stopped attempts still held (interruptions)
/// and lets the instance claim again. Losing the registration (another process took the
/// id) fences it for good, logged once.
pub(crate) async fn heartbeat(
    store: Store,
    scheduler: Arc<Scheduler>,
    beat: Heartbeat,
    cancel: CancellationToken,
) {
    let id = scheduler.owner().to_owned();
    let fence_after = beat.fence_after();
    // Registration just landed: liveness is measured from here.
    let mut last_ok = Instant::now();
    let mut next = last_ok + beat.every;
    let mut failing = false;
    let mut lost = false;
    loop {
        let fence_at = last_ok + fence_after;
        tokio::select! {
            () = tokio::time::sleep_until(if scheduler.is_fenced() { next } else { next.min(fence_at) }) => {}
            () = cancel.cancelled() => return,
        }
        if Instant::now() >= next {
            let sent = Instant::now();
            next = sent + beat.every;
            // A beat that hangs must not hold the fence back.
            let wait = if scheduler.is_fenced() {
                beat.every
            } else {
                fence_at.saturating_duration_since(sent)
            };
            let landed =
                tokio::time::timeout(wait, store.instance_heartbeat(&id, &beat.incarnation)).await;
            match landed {
                Ok(Ok(true)) if !lost => {
                    last_ok = sent;
                    failing = false;
                    if scheduler.is_fenced() {
                        unfence(&store, &scheduler, &id).await;
                    }
                }
                Ok(Ok(_)) => {
                    if !lost {
                        tracing::error!(
                            instance = %id,
                            "another process registered this instance id; its steps are no longer ours"
                        );
                        lost = true;
                        scheduler.fence();
                    }
                }
                Ok(Err(e)) => {
                    if !failing {
                        tracing::warn!(instance = %id, error = %e, "heartbeat failed; retrying");
                        failing = true;
                    }
                }
                Err(_) => {}
            }
        }
        if !scheduler.is_fenced() && last_ok.elapsed() >= fence_after {
            let stopped = scheduler.fence();
            tracing::error!(
                instance = %id,
                silent_ms = u64::try_from(last_ok.elapsed().as_millis()).unwrap_or(u64::MAX),
                stopped,
                "no heartbeat landed in time: this instance stopped its attempts before another \
                 may take its steps over; it claims again once a heartbeat lands"
            );
        }
    }
}

/// After a heartbeat landed again: releases what the stopped attempts still hold (as
/// interruptions, decided by the transition module) and lets the instance claim again.
async fn unfence(store: &Store, scheduler: &Scheduler, id: &str) {
    match release_owned(store, id).await {
        Ok(released) => {
            tracing::info!(instance = %id, released, "a heartbeat landed again: claiming again");
            scheduler.unfence();
        }
        Err(e) => {
            tracing::warn!(instance = %id, error = %e, "could not release the stopped attempts; still fenced");
        }
    }
}
