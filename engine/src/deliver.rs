//! Deliveries to parked steps, as units of work: an event sent to a run, a remote's
//! callback, and the leader's timer pass. Each opens a unit of work, locks what it decides
//! from, lets the store write, and commits; the store's side is in `store/waits.rs`.
//!
//! Every wake is the step rule `waiting --woken--> ready`: the step is due at once (or
//! parked, when its run is paused: the run's resume makes it due). Deliveries lock the run
//! first, as completion batches do, so an event and the park that would consume it are
//! serialised.

use uuid::Uuid;

use crate::interleave::{Point, Unit};
use crate::store::{EventDelivery, Store, Wake};
use crate::wait::CallbackResult;
use crate::{Error, Result};

/// Sends the event `name` with `payload` to run `run_id`: the step of the run waiting for it
/// takes it and is due again; with none waiting, it is kept for the first that will.
/// Recorded in the run's history with `actor`.
///
/// # Errors
/// [`Error::RunNotFound`]; [`Error::ActionNotAllowed`] when the run is finished;
/// [`Error::Db`].
pub async fn send_event(
    store: &Store,
    run_id: Uuid,
    name: &str,
    payload: &serde_json::Value,
    actor: &str,
) -> Result<EventDelivery> {
    let mut tx = store.begin().await?;
    let state = tx.run_state_locked(run_id).await?;
    if state.is_final() {
        return Err(Error::ActionNotAllowed {
            action: "send an event to",
            run_id,
            reason: format!("the run is already {state}"),
        });
    }
    tx.pause_point(Unit::Deliver, Point::AfterReads).await;
    let delivery = tx.wait_deliver(run_id, name, payload, actor).await?;
    tx.pause_point(Unit::Deliver, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit_from(Wake::CLAIM, actor).await?);
    Ok(delivery)
}

/// Completes (or fails) the step that handed out `token` with `result`: one call of the
/// remote. Accepted while the attempt that issued the token waits for it or is still
/// running (an early callback is kept for its park).
///
/// # Errors
/// [`Error::UnknownCallback`] for a token that no step holds (forged, or spent: its step
/// moved on); [`Error::Db`].
pub async fn complete_callback(
    store: &Store,
    token: &str,
    result: &CallbackResult,
    actor: &str,
) -> Result<EventDelivery> {
    let unknown = || Error::UnknownCallback;
    // A forged token is refused by its MAC, without a database read.
    let run_id = store
        .callback_key()
        .await?
        .verify(token)
        .ok_or_else(unknown)?;
    let hash = crate::wait::token_hash(token);
    let name = crate::wait::callback_event(&hash);
    // A spent token is refused by one indexed read, before any write transaction. The same
    // check is made again under the run's lock below.
    if !store.callback_live_now(&hash, run_id, &name).await? {
        return Err(unknown());
    }
    let mut tx = store.begin().await?;
    // A database error is not a verdict on the token: the remote tries again later.
    let state = match tx.run_state_locked(run_id).await {
        Err(Error::RunNotFound(_)) => return Err(unknown()),
        other => other?,
    };
    if state.is_final() || !tx.callback_live(&hash, run_id, &name).await? {
        return Err(unknown());
    }
    tx.pause_point(Unit::Deliver, Point::AfterReads).await;
    let payload = serde_json::to_value(result).map_err(|e| Error::InvalidEvent(e.to_string()))?;
    let delivery = tx.wait_deliver(run_id, &name, &payload, actor).await?;
    tx.pause_point(Unit::Deliver, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit_from(Wake::CLAIM, actor).await?);
    Ok(delivery)
}

/// The leader's timer pass: wakes up to `limit` waiting steps whose time came (timers that
/// fire, waits that time out), oldest first. Steps of paused runs wait for their run's
/// resume. Returns how many were woken.
///
/// # Errors
/// [`Error::Db`].
pub async fn wake_due_steps(store: &Store, limit: u32, actor: &str) -> Result<u64> {
    let mut tx = store.begin().await?;
    let woken = tx.steps_wake_due(limit, actor).await?;
    if woken == 0 {
        return Ok(0);
    }
    tx.pause_point(Unit::Wake, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit_from(Wake::CLAIM, actor).await?);
    Ok(woken)
}
