//! `GET /api/v1/runs/{id}/events`: a run's state changes as server-sent events, the status
//! channel back to whoever submitted it.
//!
//! The stream opens with the run's stored state, then sends each change until the run is
//! `completed` or `compensated`, and ends. An `error` run stays followed (an operator may
//! resume it). Changes made by this instance arrive as they happen (its run events); changes
//! made by another instance of a fleet are found by reading the run again every
//! [`EVENTS_POLL`], so a follower on any instance sees every state, late by at most that.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use sagaflow_engine::signals::RunEvent;
use sagaflow_engine::{Error, RunState};
use serde_json::json;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::AdminState;
use super::routes::{ApiError, run_id};
use crate::Engine;

/// How often a followed run is read again, for changes made by other instances.
pub const EVENTS_POLL: Duration = Duration::from_secs(1);

/// A follower's position.
struct Follow {
    engine: Engine,
    id: Uuid,
    events: broadcast::Receiver<RunEvent>,
    last: Option<RunState>,
    ended: bool,
}

pub(super) async fn run_events(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = run_id(&id)?;
    // Subscribed before the first read, so no change falls between the two.
    let events = s.engine.subscribe();
    if s.engine.run(id).await?.is_none() {
        return Err(Error::RunNotFound(id).into());
    }
    let follow = Follow {
        engine: s.engine.clone(),
        id,
        events,
        last: None,
        ended: false,
    };
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        let state = next_state(&mut f).await?;
        f.last = Some(state);
        f.ended = state.is_final();
        let data = json!({ "run_id": f.id, "state": state });
        Some((
            Ok(Event::default().event("state").data(data.to_string())),
            f,
        ))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The next state to send, or `None` when the stream is over.
async fn next_state(f: &mut Follow) -> Option<RunState> {
    if f.ended || f.engine.inner.cancel.is_cancelled() {
        return None;
    }
    loop {
        // The stored state: at the start, after missed events, and on every poll.
        match f.engine.run(f.id).await {
            Ok(Some(run)) if Some(run.state) != f.last => return Some(run.state),
            Ok(Some(_)) => {}
            // Purged meanwhile: nothing more will happen to it.
            Ok(None) => return None,
            Err(e) => tracing::warn!(run_id = %f.id, error = %e, "reading a followed run failed"),
        }
        let poll = tokio::time::sleep(EVENTS_POLL);
        tokio::pin!(poll);
        loop {
            tokio::select! {
                e = f.events.recv() => match e {
                    Ok(e) if e.run_id == f.id && Some(e.state) != f.last => return Some(e.state),
                    Ok(_) => continue,
                    // Missed some: read the run again.
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    // The engine shut down.
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                () = &mut poll => break,
                // The engine shuts down: the stream ends, so a graceful shutdown of the server
                // does not wait for its followers.
                () = f.engine.inner.cancel.cancelled() => return None,
            }
        }
    }
}
