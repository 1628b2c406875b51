//! `GET /console/events`: tells a page when to fetch its live regions again.
//!
//! With `?run=ID` the stream sends a `change` event whenever the run, its steps, history or
//! alerts changed (woken by this instance's run events, and reading the run again every
//! [`EVENTS_POLL`] for changes made by other instances). With `?page=…` (overview, runs,
//! alerts) it sends one when the queue, the unfinished runs, recent throughput or the open
//! alerts changed, read every [`EVENTS_POLL`] (not on each run event). Each stream ends when the engine shuts down.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use sagaflow_engine::signals::RunEvent;
use serde::Deserialize;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::{Console, LiveSession};
use crate::Engine;
use crate::admin::{EVENTS_POLL, Recent};

/// What a stream follows.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Follow {
    #[serde(default)]
    run: Option<Uuid>,
}

struct Watch {
    /// The stream's place among its token's followers, freed when the stream ends.
    _place: crate::admin::throttle::StreamPlace,
    engine: Engine,
    run: Option<Uuid>,
    events: broadcast::Receiver<RunEvent>,
    last: Option<String>,
    overview: Arc<Overview>,
}

/// The fingerprint of the pages that follow no run (the statistics and the open alerts),
/// read at most once per [`EVENTS_POLL`] however many pages follow it: without it each open
/// tab ran the statistics query every second.
#[derive(Default)]
pub(super) struct Overview(Recent<Option<String>>);

impl Overview {
    async fn get(&self, engine: &Engine) -> Option<String> {
        self.0
            .get_or(EVENTS_POLL, || overview_fingerprint(engine))
            .await
    }
}

/// A summary of run `id` that differs whenever something its page shows changed.
async fn fingerprint(engine: &Engine, id: Uuid) -> Option<String> {
    let mut fp = String::new();
    let page = engine.run_detail(id).await.ok()??;
    let r = &page.run;
    let _ = write!(fp, "{}|{}|", r.state, r.updated_at.timestamp_millis());
    for s in &page.steps {
        let a = s.attempts;
        let _ = write!(
            fp,
            "{}:{}:{}:{}:{};",
            s.name, s.state, a.forward, a.compensation, a.failures
        );
    }
    let _ = write!(fp, "|h{}", page.history.last().map_or(0, |h| h.id));
    for a in &page.alerts {
        let _ = write!(fp, "|a{}:{}", a.id, a.resolved_at.is_some());
    }
    Some(fp)
}

/// The fingerprint of the overview: the statistics and the open alerts.
async fn overview_fingerprint(engine: &Engine) -> Option<String> {
    let mut fp = String::new();
    let stats = engine.stats().await.ok()?;
    let _ = write!(fp, "{stats:?}");
    for a in engine.open_alerts().await.ok()? {
        let _ = write!(fp, "|a{}", a.id);
    }
    Some(fp)
}

/// Waits for the next change; `None` once the engine shuts down.
async fn next_change(w: &mut Watch) -> Option<()> {
    loop {
        if w.engine.inner.cancel.is_cancelled() {
            return None;
        }
        let fp = match w.run {
            Some(id) => fingerprint(&w.engine, id).await,
            None => w.overview.get(&w.engine).await,
        };
        if let Some(fp) = fp
            && w.last.as_ref() != Some(&fp)
        {
            let first = w.last.is_none();
            w.last = Some(fp);
            if !first {
                return Some(());
            }
        }
        let poll = tokio::time::sleep(EVENTS_POLL);
        tokio::pin!(poll);
        loop {
            tokio::select! {
                e = w.events.recv() => match e {
                    // Pages without a run are read on the poll only: under load, run events
                    // arrive by the thousand a second, and each would be a read per tab.
                    Ok(e) if w.run != Some(e.run_id) => continue,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                () = &mut poll => break,
                () = w.engine.inner.cancel.cancelled() => return None,
            }
        }
    }
}

/// `GET /console/events`.
pub(super) async fn events(
    State(c): State<Console>,
    s: LiveSession,
    Query(follow): Query<Follow>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Response> {
    // Counted with the API's streams of the same token: held while the stream lives.
    let place = c
        .admin
        .throttle
        .stream_place(&s.0.name)
        .map_err(IntoResponse::into_response)?;
    let watch = Watch {
        _place: place,
        events: c.admin.engine.subscribe(),
        engine: c.admin.engine.clone(),
        run: follow.run,
        last: None,
        overview: c.overview.clone(),
    };
    // A first event at once: the page may have been rendered before a change that happened
    // while the stream was opening.
    let hello = futures_util::stream::once(async {
        Ok::<_, Infallible>(Event::default().event("change").data("open"))
    });
    let changes = futures_util::stream::unfold(watch, |mut w| async move {
        next_change(&mut w).await?;
        Some((Ok(Event::default().event("change").data("changed")), w))
    });
    use futures_util::StreamExt as _;
    Ok(Sse::new(hello.chain(changes)).keep_alive(KeepAlive::default()))
}
