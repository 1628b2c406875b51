//! `POST /api/v1/runs/{id}/restart`: a new run from a step of a run in `error`,
//! `compensated` or `completed` (see [`Operator::restart_from`](crate::Operator::restart_from)).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
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

/// The body of `POST /api/v1/runs/{id}/restart`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RestartBody {
    /// The step the new run runs from: the steps it depends on are taken over as done.
    #[schema(min_length = 1)]
    step: String,
    /// The new run's input, checked as a start's is; absent or `null`: the source's input.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    input: Option<Value>,
    /// Why, in the operator's words (required: it goes into both runs' histories).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// `POST /api/v1/runs/{id}/restart`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct RestartAnswer {
    /// The new run.
    id: Uuid,
    /// The run it was restarted from.
    source: Uuid,
    /// The step it runs from.
    step: String,
    /// The steps it took over from the source as completed, in the workflow's order.
    reused: Vec<String>,
    /// Who restarted it (`api:<token name>`).
    actor: String,
    /// Why.
    reason: String,
}

/// Restarts a run from a step
///
/// A run in `error`, `compensated` or `completed` becomes the source of a new run of the
/// same workflow version that takes over the steps the named step depends on as completed
/// (with the source's outputs and idempotency keys: their effects are not applied again)
/// and runs the rest; it takes the source's input (or the one given), priority and business
/// key. The two runs name each other (`restarted_from`, `restarted_as`) and both histories
/// record it as done by `api:<token name>` for the reason; the source's open alerts are
/// resolved, and it takes no other action. Refused, changing nothing, for a run in another
/// state, a child run, a run restarted already, an unknown step, or a step whose
/// dependencies are not completed in the source (a compensated run restarts only from a
/// step with no dependencies). Needs an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/runs/{id}/restart",
    tag = "runs",
    operation_id = "restart_run",
    params(("id" = Uuid, Path, description = "The source run's id")),
    request_body = RestartBody,
    responses(
        (status = 201, description = "The new run", body = RestartAnswer),
        (status = 400, description = "`invalid_input` (with the field, when the workflow's schema found it), `reason_required` (1 to 2,000 characters), `invalid_id`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`run_not_found` or `workflow_not_found` (this engine does not know the run's version)", body = ErrorBody),
        (status = 409, description = "`action_not_allowed` with the reason the restart is refused, or `duplicate_key`: another run holds the business key", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body, or the input over the engine's limit", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn restart_run(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let id = run_id(&id)?;
    let body: RestartBody = parse_body(body, r#"{"step": "…", "input"?: {…}, "reason": "…"}"#)?;
    let Some(reason) = action_reason(&body.reason) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "a restart needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded in both runs' histories"
            ),
        ));
    };
    let actor = format!("api:{}", caller.name);
    let restarted = s
        .engine
        .operator()
        .on_behalf_of(actor.clone(), reason)
        .restart_from(id, &body.step, body.input.filter(|v| !v.is_null()))
        .await?;
    let answer = RestartAnswer {
        id: restarted.id,
        source: restarted.source,
        step: restarted.step,
        reused: restarted.reused,
        actor,
        reason: reason.to_owned(),
    };
    Ok((StatusCode::CREATED, json(&answer)).into_response())
}
