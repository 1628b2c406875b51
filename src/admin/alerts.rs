//! Alerts: the open ones (`GET /api/v1/alerts`) and their resolution
//! (`POST /api/v1/alerts/{id}/resolve`).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AdminState;
use super::actions::{REASON_MAX_CHARS, action_reason};
use super::answers::{AlertsAnswer, ErrorBody, ResolveAnswer, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};

/// The open alerts
#[utoipa::path(
    get,
    path = "/api/v1/alerts",
    tag = "alerts",
    responses(
        (status = 200, description = "The open alerts of every instance, oldest first", body = AlertsAnswer),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn alerts(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let open = s.engine.open_alerts().await?;
    Ok(json(&AlertsAnswer { alerts: open }))
}

/// The body of an alert's resolution.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    /// Why it needs no more attention (required: it is stored with the alert as its
    /// `resolution`).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// Resolves an open alert
///
/// Stored with the alert: who (`resolved_by`: `api:<token name>`) and why (`resolution`:
/// the reason). Needs an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/alerts/{id}/resolve",
    tag = "alerts",
    params(("id" = i64, Path, description = "The alert's id")),
    request_body = ResolveBody,
    responses(
        (status = 200, description = "Resolved, by whom and why", body = ResolveAnswer),
        (status = 400, description = "`reason_required` (1 to 2,000 characters), `invalid_id` (not an integer), `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`alert_not_open`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn resolve_alert(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id = integer_id(&id, "an alert")?;
    let body: ResolveBody = parse_body(body, r#"{"reason": "…"}"#)?;
    let Some(reason) = action_reason(&body.reason) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "resolving an alert needs a reason of 1 to {REASON_MAX_CHARS} characters; it is stored with the alert"
            ),
        ));
    };
    let actor = format!("api:{}", caller.name);
    let op = s.engine.operator().on_behalf_of(actor.clone(), reason);
    if op.resolve_alert(id).await? {
        Ok(json(&ResolveAnswer {
            id,
            resolved: true,
            actor,
            reason: reason.to_owned(),
        }))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "alert_not_open",
            format!("no open alert {id}"),
        ))
    }
}

/// An alert's or a notice's id from the path: 400 `invalid_id` when it is no integer.
pub(super) fn integer_id(id: &str, what: &str) -> Result<i64, ApiError> {
    id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("{what} id is an integer"),
        )
    })
}
