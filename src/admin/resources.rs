//! `/api/v1/resources`: the remote resources' limits and load, and the operator's override
//! of their limits (see [`Operator::set_resource_limits`](crate::Operator::set_resource_limits)).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AdminState;
use super::actions::{REASON_MAX_CHARS, action_reason};
use super::answers::{ErrorBody, LimitsAnswer, ResourcesAnswer, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body, parse_body_objects};
use crate::{Error, ResourceLimits};

/// The body of `PUT /api/v1/resources/{name}/limits`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsBody {
    /// The limits every instance obeys instead of the code's, until cleared. A limit left
    /// out is unlimited.
    limits: ResourceLimits,
    /// Why, in the operator's words (required: it is stored with the override).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// The body of `DELETE /api/v1/resources/{name}/limits`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ClearBody {
    /// Why the code's limits apply again (required: it is logged with the operator).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// The remote resources
///
/// Each resource the fleet's engines declared: the limits in force, the code's defaults, the
/// operator's override with who set it and why, the attempts in flight and the steps due and
/// waiting now.
#[utoipa::path(
    get,
    path = "/api/v1/resources",
    tag = "resources",
    responses(
        (status = 200, description = "The resources, by name", body = ResourcesAnswer),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn resources(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let resources = s.engine.resources().await?;
    Ok(json(&ResourcesAnswer { resources }))
}

/// The members of a limits body that are objects (serde would also read them from arrays).
const LIMITS_OBJECTS: [&str; 6] = [
    "/limits",
    "/limits/rate",
    "/limits/windows",
    "/limits/batch",
    "/limits/breaker",
    "/limits/compensation_share",
];

/// Overrides a resource's limits
///
/// Every instance of the fleet obeys the given limits instead of the code's from its next
/// claim, until the override is cleared. Stored with the resource as set by
/// `api:<token name>` for the reason, and logged. Needs an operator token.
#[utoipa::path(
    put,
    path = "/api/v1/resources/{name}/limits",
    tag = "resources",
    operation_id = "set_resource_limits",
    params(("name" = String, Path, description = "The resource's name")),
    request_body = LimitsBody,
    responses(
        (status = 200, description = "Set; the resource with its limits now", body = LimitsAnswer),
        (status = 400, description = "`invalid_limits` (a zero limit, period or burst, a period over a day: the message says which), `reason_required` (1 to 2,000 characters), `invalid_json` or `invalid_body` (an unknown field, named in the message)", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`resource_not_found`: no engine declared it", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn set_limits(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let body: LimitsBody = parse_body_objects(
        body,
        r#"{"limits": {"max_in_flight"?: 8, "max_in_flight_per_key"?: 2, "rate"?: {"limit": 20, "period_ms": 1000, "burst"?: 1}, "windows"?: {"time_zone": "Europe/Moscow", "open": ["MON-FRI 00:00-06:00"]}, "batch"?: {"size": 50, "pause_ms": 30000}, "breaker"?: {"consecutive_failures"?: 5, "failure_percent"?: 50, "cool_down_ms": 30000}}, "reason": "…"}"#,
        &LIMITS_OBJECTS,
    )?;
    let reason = reason(&body.reason)?;
    body.limits.check().map_err(|e| invalid_limits(&name, &e))?;
    change(&s, &caller, &name, Some(body.limits), reason).await
}

/// Clears a resource's override
///
/// The limits the application's code declares apply again, on every instance from its next
/// claim. Logged with `api:<token name>` and the reason. Needs an operator token.
#[utoipa::path(
    delete,
    path = "/api/v1/resources/{name}/limits",
    tag = "resources",
    operation_id = "clear_resource_limits",
    params(("name" = String, Path, description = "The resource's name")),
    request_body = ClearBody,
    responses(
        (status = 200, description = "Cleared; the resource with the code's limits in force", body = LimitsAnswer),
        (status = 400, description = "`reason_required` (1 to 2,000 characters), `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`resource_not_found`: no engine declared it", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn clear_limits(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let body: ClearBody = parse_body(body, r#"{"reason": "…"}"#)?;
    let reason = reason(&body.reason)?;
    change(&s, &caller, &name, None, reason).await
}

/// The reason of a change, or 400 `reason_required`.
fn reason(text: &str) -> Result<&str, ApiError> {
    action_reason(text).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "changing a resource's limits needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded with the change"
            ),
        )
    })
}

fn invalid_limits(name: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_limits",
        format!("resource `{name}`: {why}"),
    )
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "resource_not_found",
        format!("no resource `{name}`: no engine of this database declared it"),
    )
}

/// Sets (`Some`) or clears (`None`) the override as `api:<token name>`, and answers with the
/// resource as it is now.
async fn change(
    s: &AdminState,
    caller: &Caller,
    name: &str,
    limits: Option<ResourceLimits>,
    reason: &str,
) -> Result<Json<Value>, ApiError> {
    let actor = format!("api:{}", caller.name);
    let op = s.engine.operator().on_behalf_of(actor.clone(), reason);
    match op.set_resource_limits(name, limits).await {
        Ok(true) => {}
        Ok(false) => return Err(not_found(name)),
        Err(Error::Config(why)) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_limits",
                why,
            ));
        }
        Err(e) => return Err(e.into()),
    }
    let resource = s
        .engine
        .resources()
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| not_found(name))?;
    Ok(json(&LimitsAnswer {
        resource,
        actor,
        reason: reason.to_owned(),
    }))
}
