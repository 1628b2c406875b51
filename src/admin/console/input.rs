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
use crate::{Engine, Error, Run, RunState};

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

/// An operator's form that takes a reason and an input, as checked: the run, the reason,
/// the input.
pub(super) struct Checked {
    pub(super) run_id: Uuid,
    pub(super) reason: String,
    pub(super) input: serde_json::Value,
}

/// The run's page again with `msg` above it, answered with `status`.
async fn again(
    engine: &Engine,
    s: &Session,
    id: &str,
    status: StatusCode,
    msg: String,
) -> Response {
    super::run::render(engine, s, id, Some(flash("error", &msg)), status).await
}

/// The checks of a form that takes a reason and an input (a replaced input, a restart):
/// the session may post, the run id, a reason (`what` names the action in the refusal) and
/// JSON input. `Err` is the answer to give.
pub(super) async fn check_form(
    engine: &Engine,
    s: &Session,
    id: &str,
    (csrf, reason, input): (&str, &str, &str),
    what: &str,
) -> Result<Checked, Response> {
    check_post(s, csrf, Role::Operator).map_err(|refused| *refused)?;
    let Ok(run_id) = id.parse::<Uuid>() else {
        return Err(view::error_page(
            s,
            StatusCode::NOT_FOUND,
            "A run id is a UUID.",
        ));
    };
    let Some(reason) = action_reason(reason) else {
        let msg = format!("{what} needs a reason of 1 to {REASON_MAX_CHARS} characters.");
        return Err(again(engine, s, id, StatusCode::BAD_REQUEST, msg).await);
    };
    match serde_json::from_str::<serde_json::Value>(input) {
        Ok(input) => Ok(Checked {
            run_id,
            reason: reason.to_owned(),
            input,
        }),
        Err(e) => {
            let msg = format!("The input is not JSON: {e}. Nothing was changed.");
            Err(again(engine, s, id, StatusCode::BAD_REQUEST, msg).await)
        }
    }
}

/// The answer to an operator's form refused by the engine: the run's page saying why.
pub(super) async fn refused(engine: &Engine, s: &Session, id: &str, e: Error) -> Response {
    let (status, msg) = match &e {
        Error::InvalidInput { .. } | Error::PayloadTooLarge { .. } => (
            StatusCode::BAD_REQUEST,
            format!("Input refused: {e}. Nothing was changed."),
        ),
        Error::ActionNotAllowed { .. } | Error::DuplicateKey { .. } => {
            (StatusCode::CONFLICT, format!("Not allowed: {e}"))
        }
        Error::RunNotFound(_) => {
            return view::error_page(s, StatusCode::NOT_FOUND, &e.to_string());
        }
        _ => (StatusCode::SERVICE_UNAVAILABLE, error_message(&e)),
    };
    again(engine, s, id, status, msg).await
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
    let engine = &c.admin.engine;
    let fields = (
        form.csrf.as_str(),
        form.reason.as_str(),
        form.input.as_str(),
    );
    let f = match check_form(engine, &s, &id, fields, "Replacing an input").await {
        Ok(f) => f,
        Err(answer) => return answer,
    };
    let op = engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), f.reason);
    match op.replace_input(f.run_id, f.input).await {
        Ok(state) => {
            tracing::info!(run_id = %f.run_id, by = %s.name, %state, "console replaced a run's input");
            Redirect::to(&format!("/console/runs/{}?done={DONE}", f.run_id)).into_response()
        }
        Err(e) => refused(engine, &s, &id, e).await,
    }
}
