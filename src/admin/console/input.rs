//! A parked run's corrected input: the form on the run's page, and what it posts to
//! (see [`Operator::replace_input`](crate::Operator::replace_input)).

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::pages::error_message;
use super::session::Session;
use super::view::{self, flash};
use super::{Console, PageSession, check_post};
use crate::admin::actions::{REASON_MAX_CHARS, action_reason};
use crate::admin::auth::Role;
use crate::{Error, Run, RunState};

/// What a redirect after a replaced input says (`?done=`).
pub(super) const DONE: &str = "set_input";

/// Whether the run takes a new input: it is paused or in error.
pub(super) fn applies(run: &Run) -> bool {
    matches!(run.state, RunState::Paused | RunState::Error)
}

/// The form: the run's input to edit, and a reason.
pub(super) fn form(run: &Run, s: &Session) -> Markup {
    let text = serde_json::to_string_pretty(&run.input).unwrap_or_default();
    html! {
        details.action data-action=(DONE) {
            summary { "Replace input" }
            form method="post" action={ "/console/runs/" (run.id) "/input" } {
                input type="hidden" name="csrf" value=(s.csrf);
                label { "New input (JSON, checked against the run's workflow version; the run resumes with it)"
                    textarea.mono name="input" required rows="8" { (text) }
                }
                label { "Reason (recorded in the run's history with the old input and the new one)"
                    textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                }
                button.confirm type="submit" { "Confirm: replace input and resume" }
            }
        }
    }
}

/// The form's fields.
#[derive(Deserialize)]
pub(super) struct InputForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    input: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/runs/{id}/input`: replaces the run's input, recorded as done by
/// `console:<token name>` for the given reason; then back to the run's page, which says
/// what happened or why the input was refused.
pub(super) async fn set_input(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(id): Path<String>,
    Form(form): Form<InputForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let engine = &c.admin.engine;
    let Ok(run_id) = id.parse::<Uuid>() else {
        return view::error_page(&s, StatusCode::NOT_FOUND, "A run id is a UUID.");
    };
    let refused = |status, msg: String| {
        let engine = engine.clone();
        let s = s.clone();
        async move { super::run::render(&engine, &s, &id, Some(flash("error", &msg)), status).await }
    };
    let Some(reason) = action_reason(&form.reason) else {
        return refused(
            StatusCode::BAD_REQUEST,
            format!("Replacing an input needs a reason of 1 to {REASON_MAX_CHARS} characters."),
        )
        .await;
    };
    let input = match serde_json::from_str::<serde_json::Value>(&form.input) {
        Ok(v) => v,
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!("The new input is not JSON: {e}. Nothing was changed."),
            )
            .await;
        }
    };
    let op = engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), reason);
    match op.replace_input(run_id, input).await {
        Ok(state) => {
            tracing::info!(run_id = %run_id, by = %s.name, %state, "console replaced a run's input");
            Redirect::to(&format!("/console/runs/{run_id}?done={DONE}")).into_response()
        }
        Err(e @ (Error::InvalidInput { .. } | Error::PayloadTooLarge { .. })) => {
            refused(
                StatusCode::BAD_REQUEST,
                format!("Input refused: {e}. Nothing was changed."),
            )
            .await
        }
        Err(e @ Error::ActionNotAllowed { .. }) => {
            refused(StatusCode::CONFLICT, format!("Not allowed: {e}")).await
        }
        Err(e @ Error::RunNotFound(_)) => {
            view::error_page(&s, StatusCode::NOT_FOUND, &e.to_string())
        }
        Err(e) => refused(StatusCode::SERVICE_UNAVAILABLE, error_message(&e)).await,
    }
}
