//! Restart from a step: the form on the page of a run in error, compensated or completed,
//! and what it posts to (see [`Operator::restart_from`](crate::Operator::restart_from)).

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::input::{check_form, refused};
use super::session::Session;
use super::{Console, PageSession};
use crate::admin::actions::REASON_MAX_CHARS;
use crate::{Run, RunState};

/// What a redirect to the new run says (`?done=`).
pub(super) const DONE: &str = "restarted";

/// Whether the run may be the source of a restart: it stopped in error or finished, and was
/// not restarted already.
pub(super) fn applies(run: &Run) -> bool {
    matches!(
        run.state,
        RunState::Error | RunState::Compensated | RunState::Completed
    ) && run.restarted_as.is_none()
}

/// The form: the step to run from (the workflow's steps, in order), the input (the
/// source's, to edit), and a reason.
pub(super) fn section(run: &Run, steps: &[&str], s: &Session) -> Markup {
    let text = serde_json::to_string_pretty(&run.input).unwrap_or_default();
    html! {
        section.actions #restart {
            h2 { "Restart" }
            details.action data-action=(DONE) {
                summary { "Restart from a step" }
                form method="post" action={ "/console/runs/" (run.id) "/restart" } {
                    input type="hidden" name="csrf" value=(s.csrf);
                    p.muted { "A new run of the same workflow version takes over the steps the chosen step depends on as done (their effects are not applied again; undoing one undoes this run's effect) and runs the rest. It takes over the business key; this run is linked to it and takes no other action." }
                    label { "Step to run from"
                        select name="step" required {
                            @for name in steps { option value=(name) { (name) } }
                        }
                    }
                    label { "Input (JSON, checked against the workflow version)"
                        textarea.mono name="input" required rows="6" { (text) }
                    }
                    label { "Reason (recorded in both runs' histories)"
                        textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                    }
                    button.confirm type="submit" { "Confirm: restart from this step" }
                }
            }
        }
    }
}

/// The form's fields.
#[derive(Deserialize)]
pub(super) struct RestartForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    step: String,
    #[serde(default)]
    input: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/runs/{id}/restart`: a new run from the step, recorded as done by
/// `console:<token name>` for the given reason; then on to the new run's page, or back to
/// this one saying why the restart was refused.
pub(super) async fn restart(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(id): Path<String>,
    Form(form): Form<RestartForm>,
) -> Response {
    let engine = &c.admin.engine;
    let fields = (
        form.csrf.as_str(),
        form.reason.as_str(),
        form.input.as_str(),
    );
    let f = match check_form(engine, &s, &id, fields, "A restart").await {
        Ok(f) => f,
        Err(answer) => return answer,
    };
    let op = engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), f.reason);
    match op.restart_from(f.run_id, &form.step, Some(f.input)).await {
        Ok(r) => {
            tracing::info!(source = %f.run_id, run_id = %r.id, by = %s.name, step = %r.step, "console restarted a run");
            Redirect::to(&format!("/console/runs/{}?done={DONE}", r.id)).into_response()
        }
        Err(e) => refused(engine, &s, &id, e).await,
    }
}
