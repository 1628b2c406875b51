//! `/api/v1/migrations/{name}/{from}/{to}`: the dry run and the apply of a migration of
//! in-flight runs between two versions of a workflow (see
//! [`Operator::migration_plan`](crate::Operator::migration_plan)).

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AdminState;
use super::answers::{ErrorBody, json};
use super::auth::{Caller, Role};
use super::routes::{ApiError, REASON_MAX_CHARS, action_reason, parse_body};

/// The body of `POST /api/v1/migrations/{name}/{from}/{to}/apply`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplyBody {
    /// Why, in the operator's words (required: it goes into each migrated run's history).
    #[serde(default)]
    #[schema(required = true, min_length = 1)]
    reason: String,
}

/// The dry run of a migration
///
/// For every unfinished run of `name@from`: whether it would migrate to `to` (each step's
/// state before and after) or is refused, and why. Changes nothing.
#[utoipa::path(
    get,
    path = "/api/v1/migrations/{name}/{from}/{to}/plan",
    tag = "migrations",
    operation_id = "migration_plan",
    params(
        ("name" = String, Path, description = "The workflow"),
        ("from" = i32, Path, description = "The version runs leave"),
        ("to" = i32, Path, description = "The version runs move to"),
    ),
    responses(
        (status = 200, description = "The plan: `{\"workflow\",\"from\",\"to\",\"runs\"}`"),
        (status = 400, description = "`invalid_query`: the same version twice", body = ErrorBody),
        (status = 404, description = "`workflow_not_found`: a version neither registered nor published", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn plan(
    State(s): State<AdminState>,
    Path((name, from, to)): Path<(String, i32, i32)>,
) -> Result<Json<Value>, ApiError> {
    let plan = s.engine.operator().migration_plan(&name, from, to).await?;
    Ok(json(&plan))
}

/// Applies a migration
///
/// Migrates each unfinished run of `name@from` to `to`, each in its own transaction under its
/// row lock; answers with every run, migrated or refused (with why). Recorded in each
/// migrated run's history (`migrated`) as done by `api:<token name>` with the reason. Needs
/// an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/migrations/{name}/{from}/{to}/apply",
    tag = "migrations",
    operation_id = "migration_apply",
    params(
        ("name" = String, Path, description = "The workflow"),
        ("from" = i32, Path, description = "The version runs leave"),
        ("to" = i32, Path, description = "The version runs move to"),
    ),
    request_body = ApplyBody,
    responses(
        (status = 200, description = "Applied: `{\"workflow\",\"from\",\"to\",\"runs\"}`, each run `migrated` or `refused`"),
        (status = 400, description = "`reason_required`, `invalid_query`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`workflow_not_found`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn apply(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path((name, from, to)): Path<(String, i32, i32)>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let body: ApplyBody = parse_body(body, r#"{"reason": "…"}"#)?;
    let Some(reason) = action_reason(&body.reason) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "a migration needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded in each run's history"
            ),
        ));
    };
    let report = s
        .engine
        .operator()
        .on_behalf_of(format!("api:{}", caller.name), reason)
        .migrate(&name, from, to)
        .await?;
    Ok(json(&report))
}
