//! `/api/v1/migrations/{name}/{from}/{to}`: the dry run and the apply of a migration of
//! in-flight runs between two versions of a workflow (see
//! [`Operator::migration_plan`](crate::Operator::migration_plan)).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AdminState;
use super::actions::{REASON_MAX_CHARS, action_reason};
use super::answers::{ErrorBody, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};

/// The body of `POST /api/v1/migrations/{name}/{from}/{to}/apply`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ApplyBody {
    /// Why, in the operator's words (required: it goes into each migrated run's history).
    #[serde(default)]
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
}

/// The query of the dry run: a page.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct PlanParams {
    /// The page starts after this run (the `next_after` of the page before).
    after: Option<uuid::Uuid>,
    /// At most this many runs (default 100, at most 500).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
}

/// The dry run of a migration
///
/// For one page of the unfinished runs of `name@from` (by id, oldest first): whether each
/// would migrate to `to` (each step's state before and after) or is refused, and why;
/// `next_after` names where the next page starts. Read without a transaction or a lock;
/// changes nothing.
#[utoipa::path(
    get,
    path = "/api/v1/migrations/{name}/{from}/{to}/plan",
    tag = "migrations",
    operation_id = "migration_plan",
    params(
        ("name" = String, Path, description = "The workflow"),
        ("from" = i32, Path, minimum = 1, description = "The version runs leave"),
        ("to" = i32, Path, minimum = 1, description = "The version runs move to"),
        PlanParams,
    ),
    responses(
        (status = 200, description = "A page of the plan: `{\"workflow\",\"from\",\"to\",\"runs\",\"next_after\"}`"),
        (status = 400, description = "`invalid_query`: the same version twice", body = ErrorBody),
        (status = 404, description = "`workflow_not_found`: a version neither registered nor published", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn plan(
    State(s): State<AdminState>,
    Path((name, from, to)): Path<(String, i32, i32)>,
    query: Result<Query<PlanParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(p) = query.map_err(ApiError::invalid_query)?;
    let limit = super::runs::in_range(
        "limit",
        p.limit.unwrap_or(100),
        1,
        crate::migration::PLAN_PAGE_MAX,
    )?;
    let plan = s
        .engine
        .operator()
        .migration_plan_page(&name, from, to, p.after, limit)
        .await?;
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
        ("from" = i32, Path, minimum = 1, description = "The version runs leave"),
        ("to" = i32, Path, minimum = 1, description = "The version runs move to"),
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
