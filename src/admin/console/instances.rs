//! The instances page: the engine instances registered on the database, whether each is
//! live, and the workflows each of them runs (registered at its start or since).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::pages::error_message;
use super::view::{self, Page, Tab, time};
use super::{Console, PageSession};

/// `GET /console/instances`.
pub(super) async fn page(State(c): State<Console>, PageSession(s): PageSession) -> Response {
    let instances = match c.admin.engine.instances().await {
        Ok(i) => i,
        Err(e) => {
            return view::error_page(&s, StatusCode::SERVICE_UNAVAILABLE, &error_message(&e));
        }
    };
    Page {
        title: "Instances".into(),
        tab: Tab::Instances,
        events: None,
        session: &s,
    }
    .render(html! {
        h1 { "Instances" }
        p.muted {
            "The engine instances that run steps on this database, and the workflow versions each of them runs. "
            "A step is claimed only by an instance that runs its workflow version; when none that is live does, its runs wait."
        }
        @if instances.is_empty() {
            p.muted { "No engine instance registered on this database." }
        } @else {
            div.scroll {
                table #instances {
                    thead { tr {
                        th { "instance" } th { "state" } th { "started" } th.num { "silent for" } th { "workflows" }
                    } }
                    tbody {
                        @for i in &instances {
                            tr data-instance=(i.id) {
                                td { code { (i.id) } }
                                td.state {
                                    @if i.live { span.badge.st-running { "live" } }
                                    @else if i.stopped_at.is_some() { span.badge.st-completed { "stopped" } }
                                    @else { span.badge.st-error { "silent" } }
                                }
                                td { (time(&i.started_at)) }
                                td.num { (i.silent_ms / 1000) " s" }
                                td.workflows {
                                    @match &i.workflows {
                                        Some(w) if w.is_empty() => { span.muted { "none" } }
                                        Some(w) => {
                                            @for (n, key) in w.iter().enumerate() {
                                                @if n > 0 { ", " }
                                                code { (key) }
                                            }
                                        }
                                        None => { span.muted { "not recorded (an older release)" } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    })
    .into_response()
}
