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

use axum::Extension;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use sagaflow_engine::signals::RunEvent;
use sagaflow_engine::{Error, RunState};
use tokio::sync::broadcast;
use uuid::Uuid;

use super::AdminState;
use super::answers::{ErrorBody, RunStateEvent};
use super::auth::Caller;
use super::error::ApiError;
use super::runs::run_id;
use super::throttle::StreamPlace;
use crate::Engine;

/// How often a followed run is read again, for changes made by other instances.
pub const EVENTS_POLL: Duration = Duration::from_secs(1);

/// A follower's position.
struct Follow {
    /// The stream's place among the followers of its token, freed when the stream ends.
    _place: StreamPlace,
    engine: Engine,
    id: Uuid,
    events: broadcast::Receiver<RunEvent>,
    last: Option<RunState>,
    ended: bool,
}

/// Follows a run's state
///
/// Server-sent events, one `state` event per state: the run's state now, then each change,
/// until the run is `completed` or `compensated`, when the stream ends (an `error` run stays
/// followed: an operator may resume it). Each event's `data` is a `RunStateEvent` in JSON.
#[utoipa::path(
    get,
    path = "/api/v1/runs/{id}/events",
    tag = "runs",
    params(("id" = Uuid, Path, description = "The run's id")),
    responses(
        (
            status = 200,
            description = "A stream of `state` events whose `data` is a `RunStateEvent` (see the schema of that name)",
            content_type = "text/event-stream",
            body = String,
            example = "event: state\ndata: {\"run_id\":\"0199a1b2-0000-7000-8000-000000000000\",\"state\":\"running\"}\n\n",
        ),
        (status = 400, description = "`invalid_id`: not a UUID", body = ErrorBody),
        (status = 404, description = "`run_not_found`", body = ErrorBody),
        (status = 429, description = "`too_many_requests`: this token follows as many streams as it may, or the server does", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn run_events(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = run_id(&id)?;
    let place = s.throttle.stream_place(&caller.name)?;
    // Subscribed before the first read, so no change falls between the two.
    let events = s.engine.subscribe();
    if s.engine.run(id).await?.is_none() {
        return Err(Error::RunNotFound(id).into());
    }
    let follow = Follow {
        _place: place,
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
        let data = RunStateEvent {
            run_id: f.id,
            state,
        };
        let data = serde_json::to_string(&data).unwrap_or_default();
        Some((Ok(Event::default().event("state").data(data)), f))
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
        match f.engine.run_shown(f.id).await {
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

/// The query of `GET /api/v1/runs/{id}/follow`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct FollowParams {
    /// Resume after this position (an event's `id`); the `Last-Event-ID` header, which a
    /// reconnecting `EventSource` sends, wins over it.
    #[param(max_length = 40, pattern = r"^[0-9]{1,19}(\.[0-9]{1,10})?$")]
    after: Option<String>,
}

/// Follows a run's history and progress
///
/// Server-sent events: `history` events (the run's history, durable, each with its position
/// as the event `id`: reconnecting with `Last-Event-ID` resumes right after it), then each
/// new one as it is written, and `progress` events (a step's latest reported progress, best
/// effort, no `id`), until the run is `completed` or `compensated` and every event was
/// sent. Each `data` is a `RunUpdate` in JSON. Changes made on other instances arrive
/// within a second.
#[utoipa::path(
    get,
    path = "/api/v1/runs/{id}/follow",
    tag = "runs",
    params(
        ("id" = Uuid, Path, description = "The run's id"),
        ("Last-Event-ID" = Option<String>, Header, description = "The position to resume after (`<row>.<index>`), as sent by a reconnecting `EventSource`"),
        FollowParams,
    ),
    responses(
        (
            status = 200,
            description = "A stream of `history` and `progress` events whose `data` is a `RunUpdate`",
            content_type = "text/event-stream",
            body = String,
            example = "event: history\nid: 41.0\ndata: {\"kind\":\"event\",\"position\":\"41.0\",\"event\":{…}}\n\nevent: progress\ndata: {\"kind\":\"progress\",\"step\":\"import\",\"progress\":{\"done\":40,\"of\":100}}\n\n",
        ),
        (status = 400, description = "`invalid_id`: not a UUID; `invalid_query`: a position that is not one", body = ErrorBody),
        (status = 404, description = "`run_not_found`", body = ErrorBody),
        (status = 429, description = "`too_many_requests`: this token follows as many streams as it may, or the server does", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn follow_run(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    query: Result<axum::extract::Query<FollowParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id = run_id(&id)?;
    let query = query.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_query",
            e.body_text(),
        )
    })?;
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or(query.0.after);
    let place = s.throttle.stream_place(&caller.name)?;
    let updates = s.engine.follow(id, after.as_deref()).await?;
    let stream = futures_util::StreamExt::filter_map(updates, move |u| {
        let _place = &place;
        let event = match u {
            Ok(u) => {
                let data = serde_json::to_string(&u).unwrap_or_default();
                Some(match &u {
                    crate::RunUpdate::Event { position, .. } => Event::default()
                        .event("history")
                        .id(position.clone())
                        .data(data),
                    _ => Event::default().event("progress").data(data),
                })
            }
            Err(e) => {
                tracing::warn!(run_id = %id, error = %e, "following a run failed");
                None
            }
        };
        std::future::ready(event.map(Ok))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
