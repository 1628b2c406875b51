//! `/api/v1/schedules`: the recurring schedules, and an operator's pause and resume of one
//! (see [`Operator::pause_schedule`](crate::Operator::pause_schedule)).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::AdminState;
use super::actions::{REASON_MAX_CHARS, action_reason};
use super::answers::{ErrorBody, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};
use crate::{Error, ScheduleView};

/// `GET /api/v1/schedules`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SchedulesAnswer {
    /// The schedules the fleet's engines declared, by name, with their next tick.
    pub(super) schedules: Vec<ScheduleView>,
}

/// `POST /api/v1/schedules/{name}/pause` and `/resume`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PauseAnswer {
    /// The schedule after the change.
    pub(super) schedule: ScheduleView,
    /// Who paused or resumed it: `api:<token name>`.
    pub(super) actor: String,
    /// Why.
    pub(super) reason: String,
}

/// The body of a pause or resume.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseBody {
    /// Why, in the operator's words (required: a pause stores it with the schedule, and both
    /// are logged with the operator).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// The recurring schedules
///
/// Each schedule the fleet's engines declared: the workflow it starts, its cron expression
/// and time zone, its next tick, its last firing and run, and an operator's pause with who
/// paused it and why.
#[utoipa::path(
    get,
    path = "/api/v1/schedules",
    tag = "schedules",
    responses(
        (status = 200, description = "The schedules, by name", body = SchedulesAnswer),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn schedules(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let schedules = s.engine.schedules().await?;
    Ok(json(&SchedulesAnswer { schedules }))
}

/// Pauses a schedule
///
/// No tick of the schedule fires, on any instance, until it is resumed. Stored with the
/// schedule as done by `api:<token name>` for the reason, and logged. Needs an operator
/// token.
#[utoipa::path(
    post,
    path = "/api/v1/schedules/{name}/pause",
    tag = "schedules",
    operation_id = "pause_schedule",
    params(("name" = String, Path, description = "The schedule's name")),
    request_body = PauseBody,
    responses(
        (status = 200, description = "Paused; the schedule now", body = PauseAnswer),
        (status = 400, description = "`reason_required` (1 to 2,000 characters), `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`schedule_not_found`: no engine declared it", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn pause(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    change(&s, &caller, &name, body, true).await
}

/// Resumes a schedule
///
/// The schedule is due again at its first tick after now: the ticks that passed while it was
/// paused are not fired. Logged with `api:<token name>` and the reason. Needs an operator
/// token.
#[utoipa::path(
    post,
    path = "/api/v1/schedules/{name}/resume",
    tag = "schedules",
    operation_id = "resume_schedule",
    params(("name" = String, Path, description = "The schedule's name")),
    request_body = PauseBody,
    responses(
        (status = 200, description = "Resumed; the schedule now, with its next tick", body = PauseAnswer),
        (status = 400, description = "`reason_required` (1 to 2,000 characters), `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`schedule_not_found`: no engine declared it", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn resume(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    change(&s, &caller, &name, body, false).await
}

/// Pauses (`true`) or resumes a schedule as `api:<token name>`, and answers with the schedule
/// as it is now.
async fn change(
    s: &AdminState,
    caller: &Caller,
    name: &str,
    body: Result<Json<Value>, JsonRejection>,
    paused: bool,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let body: PauseBody = parse_body(body, r#"{"reason": "…"}"#)?;
    let reason = action_reason(&body.reason).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "pausing or resuming a schedule needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded with the change"
            ),
        )
    })?;
    let actor = format!("api:{}", caller.name);
    let op = s.engine.operator().on_behalf_of(actor.clone(), reason);
    let done = if paused {
        op.pause_schedule(name).await
    } else {
        op.resume_schedule(name).await
    };
    let schedule = match done {
        Ok(v) => v,
        Err(e @ Error::ScheduleNotFound(_)) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "schedule_not_found",
                format!("{e}: no engine of this database declared it"),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    Ok(json(&PauseAnswer {
        schedule,
        actor,
        reason: reason.to_owned(),
    }))
}
