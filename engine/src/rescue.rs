//! Rescues as a unit of work: decided timeouts and interruptions written in one
//! transaction. The supervisor's pass writes them under its leader fence; an instance that
//! releases its own steps (or its dead predecessor's) writes them with the owner fence
//! alone. What each rescue is, the supervisor (or the instance) decides from the
//! transition rules; this writes the decisions and counts them.

use uuid::Uuid;

use crate::interleave::{Point, Unit};
use crate::store::{LeaderFence, RescueCounts, StepFinish, Store};
use crate::transition::Trigger;
use crate::{Result, StepState};

/// Writes decided rescues (timeouts and interruptions) in one transaction. With `fence`
/// (the supervisor), nothing is written unless it holds the leader lease
/// ([`crate::Error::LeaseLost`]); without (an instance releasing its own or its predecessor's
/// steps), the owner fence alone guards each write.
///
/// # Errors
/// [`crate::Error::Db`]; [`crate::Error::LeaseLost`] when the lease was lost.
pub async fn rescue_steps(
    store: &Store,
    fence: Option<&LeaderFence>,
    items: &[StepFinish],
) -> Result<RescueCounts> {
    let mut tx = store.begin().await?;
    if let Some(f) = fence {
        tx.fence_check(f).await?;
    }
    // Runs first, in id order: the lock order of every transaction that writes steps.
    let mut runs: Vec<Uuid> = items.iter().map(|r| r.run_id).collect();
    runs.sort_unstable();
    runs.dedup();
    tx.runs_mark_dirty(&runs).await?;
    tx.pause_point(Unit::Rescue, Point::AfterReads).await;
    let applied = tx.attempts_write(items, fence).await?;
    tx.steps_park_of_paused(&runs).await?;
    let counts = count(items, &applied);
    if counts.requeued + counts.failed + counts.interrupted > 0 {
        // Re-queued steps, and runs to evaluate for the ones that failed.
        tx.notify();
    }
    tx.pause_point(Unit::Rescue, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit().await?);
    Ok(counts)
}

/// What the rescues did, by which of them were written (`applied`).
fn count(items: &[StepFinish], applied: &[bool]) -> RescueCounts {
    let mut counts = RescueCounts::default();
    for (it, ok) in items.iter().zip(applied) {
        match (ok, it.change.to, it.change.on) {
            (false, _, _) => counts.skipped += 1,
            (true, StepState::Failed | StepState::CompensationFailed, _) => counts.failed += 1,
            (true, _, Trigger::Interrupted) => counts.interrupted += 1,
            (true, _, _) => counts.requeued += 1,
        }
    }
    counts
}
