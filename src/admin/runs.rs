//! Runs: starting one (`POST /api/v1/workflows/{name}/runs`), listing them
//! (`GET /api/v1/runs`) and reading one (`GET /api/v1/runs/{id}`).

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use sagaflow_engine::{Error, FieldError};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AdminState;
use super::answers::{ErrorBody, RunAnswer, RunsAnswer, StartAnswer, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};
use crate::{PRIORITY_MAX, PRIORITY_MIN, RunOrder, RunQuery, RunState, StartOption, StartOptions};

/// The body of a start.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StartBody {
    /// The run's input.
    input: Value,
    /// Business key: a run already holding it is returned instead of a new one.
    #[serde(default)]
    business_key: Option<String>,
    /// When the run's first steps become due: an RFC 3339 time. Not with `start_after_ms`.
    #[serde(default)]
    #[schema(value_type = Option<chrono::DateTime<chrono::Utc>>)]
    start_at: Option<Value>,
    /// When the run's first steps become due: milliseconds after it is stored, at most 366
    /// days (`START_AHEAD_MAX`, stated in the document by `exact`). Not with `start_at`.
    #[serde(default)]
    #[schema(value_type = Option<u64>)]
    start_after_ms: Option<Value>,
    /// Claim priority, `PRIORITY_MIN` to `PRIORITY_MAX` (default: the workflow's default
    /// priority, 0 unless set; higher first).
    #[serde(default)]
    #[schema(value_type = Option<i32>, minimum = -1000, maximum = 1000)]
    priority: Option<Value>,
}

/// The shape of [`StartBody`], for `invalid_body` messages.
const START_BODY: &str = r#"{"input": …, "business_key"?: "…", "start_at"?: "<RFC 3339>" | "start_after_ms"?: <ms>, "priority"?: <integer>}"#;

impl StartBody {
    /// The start options it asks for, or a 400 `invalid_body` pointing at the field that is
    /// wrong.
    fn options(&self) -> Result<StartOptions, ApiError> {
        let mut options = StartOptions {
            business_key: self.business_key.clone(),
            ..StartOptions::default()
        };
        match (&self.start_at, &self.start_after_ms) {
            (Some(_), Some(_)) => {
                let both = "give either start_at or start_after_ms, not both";
                return Err(body_fields(&[
                    ("/start_at", both),
                    ("/start_after_ms", both),
                ]));
            }
            (Some(at), None) => {
                let at = at
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .ok_or_else(|| {
                        body_fields(&[(
                            "/start_at",
                            "expected an RFC 3339 time, such as 2030-01-01T08:00:00Z",
                        )])
                    })?;
                options = options.start_at(at.to_utc());
            }
            (None, Some(ms)) => {
                let ms = ms.as_u64().ok_or_else(|| {
                    body_fields(&[(
                        "/start_after_ms",
                        "expected a whole number of milliseconds, 0 or more",
                    )])
                })?;
                options = options.start_after(std::time::Duration::from_millis(ms));
            }
            (None, None) => {}
        }
        if let Some(p) = &self.priority {
            let range = format!("expected an integer from {PRIORITY_MIN} to {PRIORITY_MAX}");
            let p = p
                .as_i64()
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| body_fields(&[("/priority", &range)]))?;
            options = options.priority(p);
        }
        Ok(options)
    }
}

/// 400 `invalid_body` with `error.fields` pointing into the request body.
fn body_fields(fields: &[(&str, &str)]) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_body",
        format!("invalid start options; expected {START_BODY}"),
    )
    .with_fields(
        fields
            .iter()
            .map(|(pointer, message)| FieldError::new(*pointer, *message))
            .collect(),
    )
}

/// The engine's refusal of a start option, pointing at its body field; other errors as
/// usual.
fn start_error(e: Error) -> ApiError {
    match &e {
        Error::InvalidStartOption { option, reason } => {
            let pointer = match option {
                StartOption::StartAt => "/start_at",
                StartOption::StartAfter => "/start_after_ms",
                StartOption::Priority => "/priority",
                // The headers are checked before the start, and a malformed one ignored.
                StartOption::TraceParent | StartOption::TraceState => "/",
            };
            body_fields(&[(pointer, reason)])
        }
        _ => e.into(),
    }
}

/// Starts a run
///
/// Starts a run of the newest version of workflow `name`, or returns the run that already
/// holds the business key. Needs an operator token. A W3C `traceparent` header (and
/// `tracestate`) makes the run continue the caller's trace; a malformed one is ignored and
/// the run starts a new trace.
#[utoipa::path(
    post,
    path = "/api/v1/workflows/{name}/runs",
    tag = "runs",
    params(
        ("name" = String, Path, description = "The workflow's name"),
        ("traceparent" = Option<String>, Header, description = "W3C trace context the run continues: `00-<trace id>-<parent id>-<flags>`; ignored when malformed"),
        ("tracestate" = Option<String>, Header, description = "W3C trace state kept with `traceparent`; ignored when malformed"),
    ),
    request_body = StartBody,
    responses(
        (status = 201, description = "A new run", body = StartAnswer),
        (status = 200, description = "The run already holding the business key (`created`: `false`)", body = StartAnswer),
        (status = 400, description = "`invalid_input`: the workflow refuses the input (where, in `error.fields`); `invalid_json` or `invalid_body`: the body is not JSON or not of this shape", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`workflow_not_found`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body or the input is over its limit", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn start_run(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let body: StartBody = parse_body(body, START_BODY)?;
    let options = super::traceparent::with_trace_headers(body.options()?, &headers);
    let started = s
        .engine
        .start_with(&name, &body.input, options)
        .await
        .map_err(start_error)?;
    let status = if started.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let answer = StartAnswer {
        id: started.id,
        state: started.state,
        created: started.created,
    };
    Ok((status, json(&answer)).into_response())
}

/// The query string of `GET /api/v1/runs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListParams {
    /// Only runs of this workflow.
    pub(super) workflow: Option<String>,
    /// Only runs in this state (`pending`, `running`, `compensating`, `completed`,
    /// `compensated`, `error`).
    #[param(value_type = Option<RunState>)]
    pub(super) state: Option<String>,
    /// Only runs started with this business key.
    pub(super) business_key: Option<String>,
    /// Only runs created at or after this instant (epoch milliseconds).
    pub(super) created_after: Option<i64>,
    /// Only runs created before this instant (epoch milliseconds).
    pub(super) created_before: Option<i64>,
    /// `created` (newest first, the default) or `attempts` (most failed attempts first).
    #[param(value_type = Option<RunOrder>)]
    pub(super) sort: Option<String>,
    /// Rows per page (default 50, at most 500; a bulk action: default 100).
    #[param(minimum = 1, maximum = 500)]
    pub(super) limit: Option<u32>,
    /// The previous page's `next`.
    pub(super) cursor: Option<String>,
}

impl ListParams {
    /// Whether any filter narrows the runs (sorting and paging do not).
    pub(super) fn filters(&self) -> bool {
        let set = |v: &Option<String>| v.as_deref().is_some_and(|s| !s.is_empty());
        set(&self.workflow)
            || set(&self.state)
            || set(&self.business_key)
            || self.created_after.is_some()
            || self.created_before.is_some()
    }

    /// The engine's query, or 400 naming the parameter that is wrong.
    pub(super) fn query(self) -> Result<RunQuery, ApiError> {
        let invalid = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", m);
        if let Some(n) = self.limit {
            in_range("limit", n, 1, crate::RUN_PAGE_MAX)?;
        }
        let mut q = RunQuery::new()
            .created(self.created_after, self.created_before)
            .limit(self.limit.unwrap_or(0));
        let nonempty = |v: Option<String>| v.filter(|s| !s.is_empty());
        if let Some(w) = nonempty(self.workflow) {
            q = q.workflow(w);
        }
        if let Some(k) = nonempty(self.business_key) {
            q = q.business_key(k);
        }
        // A state or an order is one of its names: an empty one is refused like any other
        // name the list does not know (the document gives them as enums).
        if let Some(state) = self.state {
            let state = state.parse::<RunState>().map_err(|_| {
                let all: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
                invalid(format!(
                    "no state `{state}`; the states are {}",
                    all.join(", ")
                ))
            })?;
            q = q.state(state);
        }
        if let Some(sort) = self.sort {
            q = q.order(
                sort.parse::<RunOrder>()
                    .map_err(|e| invalid(e.to_string()))?,
            );
        }
        if let Some(c) = nonempty(self.cursor) {
            q = q.after(c);
        }
        Ok(q)
    }
}

/// Lists runs
///
/// One page of runs, filtered and sorted; `next` is the cursor of the following page.
#[utoipa::path(
    get,
    path = "/api/v1/runs",
    tag = "runs",
    params(ListParams),
    responses(
        (status = 200, description = "One page of runs", body = RunsAnswer),
        (status = 400, description = "`invalid_query`: an unknown parameter, state or sort, or a cursor the list did not give out", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn list_runs(
    State(s): State<AdminState>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(ApiError::invalid_query)?;
    let page = s.engine.list_runs(&params.query()?).await?;
    let damaged: Vec<String> = page.damaged.iter().map(ToString::to_string).collect();
    Ok(json(&RunsAnswer {
        runs: page.runs,
        damaged,
        next: page.next,
    }))
}

/// 400 `invalid_query` unless `value` of the query parameter `name` is within `min..=max`:
/// a limit the document states is kept, not silently cut.
pub(super) fn in_range(name: &str, value: u32, min: u32, max: u32) -> Result<u32, ApiError> {
    if (min..=max).contains(&value) {
        return Ok(value);
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        format!("`{name}` is {min} to {max}; got {value}"),
    ))
}

/// A run id from the path.
pub(super) fn run_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", "a run id is a UUID"))
}

/// Reads a run
///
/// The run with its steps, its history and its alerts.
#[utoipa::path(
    get,
    path = "/api/v1/runs/{id}",
    tag = "runs",
    operation_id = "get_run",
    params(("id" = Uuid, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run", body = RunAnswer),
        (status = 400, description = "`invalid_id`: not a UUID", body = ErrorBody),
        (status = 404, description = "`run_not_found`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn run(
    State(s): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = run_id(&id)?;
    let Some(crate::RunDetail {
        run,
        steps,
        history,
        alerts,
    }) = s.engine.run_detail(id).await?
    else {
        return Err(Error::RunNotFound(id).into());
    };
    Ok(json(&RunAnswer {
        run,
        steps,
        history,
        alerts,
    }))
}
