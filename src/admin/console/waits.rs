//! The run page's waiting steps: what each waits for and when its time comes, and for an
//! operator a form that sends the event a step waits for.

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::pages::error_message;
use super::session::Session;
use super::view::{self, time};
use super::{Console, PageSession, check_post};
use crate::admin::auth::Role;
use crate::{Error, EventTarget, Timestamp, WaitFor, WaitingStep};

/// The "Waiting" section of a run's page (nothing when no step waits).
pub(super) fn section(run: Uuid, waiting: &[WaitingStep], s: &Session) -> Markup {
    if waiting.is_empty() {
        return html! {};
    }
    html! {
        section #waiting {
            h2 { "Waiting" }
            div.scroll {
                table #waiting-steps {
                    thead { tr { th { "step" } th { "waits for" } th { "time comes" } } }
                    tbody {
                        @for w in waiting {
                            tr data-step=(w.step) {
                                td { code { (w.step) } }
                                td { (w.wait.on.describe()) }
                                td {
                                    @match w.due_at.and_then(Timestamp::from_timestamp_millis) {
                                        Some(t) => { (time(&t)) }
                                        None => { "—" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if s.is_operator() {
                @for w in waiting {
                    @if let WaitFor::Event { name } = &w.wait.on {
                        @if !name.starts_with("callback:") {
                            (event_form(run, name, s))
                        }
                    }
                }
            }
        }
    }
}

fn event_form(run: Uuid, name: &str, s: &Session) -> Markup {
    html! {
        details.action data-action="send_event" data-event=(name) {
            summary { "Send event " code { (name) } }
            form method="post" action={ "/console/runs/" (run) "/events" } {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="name" value=(name);
                label { "Payload (JSON; the waiting step's output)"
                    textarea name="payload" rows="3" { "{}" }
                }
                button.confirm type="submit" { "Confirm: send " (name) }
            }
        }
    }
}

/// The event form's fields.
#[derive(Deserialize)]
pub(super) struct EventForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    payload: String,
}

/// `POST /console/runs/{id}/events`: sends the event, recorded as sent by
/// `console:<token name>`; then back to the run's page.
pub(super) async fn send(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(id): Path<String>,
    Form(form): Form<EventForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let Ok(run_id) = id.parse::<Uuid>() else {
        return view::error_page(&s, StatusCode::NOT_FOUND, "A run id is a UUID.");
    };
    let payload = match form.payload.trim() {
        "" => serde_json::Value::Null,
        text => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => v,
            Err(e) => {
                return view::error_page(
                    &s,
                    StatusCode::BAD_REQUEST,
                    &format!("The payload is not JSON: {e}"),
                );
            }
        },
    };
    let actor = format!("console:{}", s.name);
    match c
        .admin
        .engine
        .send_event_as(EventTarget::Run(run_id), form.name.trim(), &payload, &actor)
        .await
    {
        Ok(_) => {
            tracing::info!(run_id = %run_id, event = %form.name, by = %s.name, "console event");
            Redirect::to(&format!("/console/runs/{run_id}?done=send_event")).into_response()
        }
        Err(e @ (Error::ActionNotAllowed { .. } | Error::InvalidEvent(_))) => {
            view::error_page(&s, StatusCode::CONFLICT, &format!("Not sent: {e}"))
        }
        Err(e @ Error::RunNotFound(_)) => {
            view::error_page(&s, StatusCode::NOT_FOUND, &e.to_string())
        }
        Err(e) => view::error_page(&s, StatusCode::SERVICE_UNAVAILABLE, &error_message(&e)),
    }
}
