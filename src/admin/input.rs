//! `PUT /api/v1/runs/{id}/input`: an operator's corrected input for a run parked for an
//! operator (see [`Operator::replace_input`](crate::Operator::replace_input)).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AdminState;
use super::actions::{REASON_MAX_CHARS, action_reason};
use super::answers::{ErrorBody, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};
use super::runs::run_id;
use crate::RunState;

/// The body of `PUT /api/v1/runs/{id}/input`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct InputBody {
    /// The run's new input, checked against the workflow version the run is pinned to.
    #[schema(value_type = Object)]
    input: Value,
    /// Why, in the operator's words (required: it goes into the run's history).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// `PUT /api/v1/runs/{id}/input`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct InputAnswer {
    /// The run.
    id: Uuid,
    /// The run's state after it resumed.
    state: RunState,
    /// Who replaced the input (`api:<token name>`).
    actor: String,
    /// Why.
    reason: String,
}

/// Replaces a parked run's input
///
/// A run that is `paused` or in `error` (set aside for a damaged row, or not) takes a new
/// input, checked as a start's is against the version it is pinned to, and resumes: the
/// failed steps of the phase it stopped in are retried. Recorded in the run's history
/// (`operator_replace_input`, with the old input and the new one) as done by
/// `api:<token name>` for the reason. A refused input changes nothing. Needs an operator
/// token.
#[utoipa::path(
    put,
    path = "/api/v1/runs/{id}/input",
    tag = "runs",
    operation_id = "replace_run_input",
    params(("id" = Uuid, Path, description = "The run's id")),
    request_body = InputBody,
    responses(
        (status = 200, description = "Replaced; the run's state after it resumed", body = InputAnswer),
        (status = 400, description = "`invalid_input` (with the field, when the workflow's schema found it), `reason_required` (1 to 2,000 characters), `invalid_id`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`run_not_found` or `workflow_not_found` (this engine does not know the run's version)", body = ErrorBody),
        (status = 409, description = "`action_not_allowed`: the run is not paused or in error", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body, or the input over the engine's limit", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn set_input(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id = run_id(&id)?;
    let body: InputBody = parse_body(body, r#"{"input": {…}, "reason": "…"}"#)?;
    let Some(reason) = action_reason(&body.reason) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "replacing an input needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded in the run's history"
            ),
        ));
    };
    let actor = format!("api:{}", caller.name);
    let state = s
        .engine
        .operator()
        .on_behalf_of(actor.clone(), reason)
        .replace_input(id, body.input)
        .await?;
    Ok(json(&InputAnswer {
        id,
        state,
        actor,
        reason: reason.to_owned(),
    }))
}
