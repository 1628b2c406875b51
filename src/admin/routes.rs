//! Routes, handlers and the JSON error envelope.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router, middleware};
use sagaflow_engine::Error;
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

use sagaflow_engine::transition::operator::EXTEND_MAX;
use uuid::Uuid;

use super::AdminState;
use super::auth::{Caller, Role, require_token};
use crate::{Health, RunOrder, RunQuery, RunState, StartOptions};

pub(super) fn router(state: AdminState, body_limit: usize) -> Router {
    let api = Router::new()
        .route("/api/v1/definitions", get(definitions))
        .route("/api/v1/workflows/{name}/runs", post(start_run))
        .route("/api/v1/runs", get(list_runs))
        .route("/api/v1/runs/{id}", get(run))
        .route("/api/v1/runs/{id}/events", get(super::events::run_events))
        .route("/api/v1/runs/{id}/actions/{action}", post(act))
        .route("/api/v1/runs/actions/{action}", post(act_many))
        .route("/api/v1/alerts", get(alerts))
        .route("/api/v1/stats", get(stats))
        .route("/api/v1/alerts/{id}/resolve", post(resolve_alert))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(api)
        .merge(super::console::router(state.clone()))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// An error answer: a status and `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Where an input is wrong: `[{"pointer", "message"}]`, JSON Pointers into the input.
    fields: Option<Value>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            fields: None,
        }
    }

    /// The message, for people.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required (Authorization: Bearer …)",
        )
    }

    pub(crate) fn forbidden(needed: Role) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this needs a token with the {needed:?} role"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": { "code": self.code, "message": self.message } });
        if let Some(fields) = self.fields {
            body["error"]["fields"] = fields;
        }
        (self.status, Json(body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        use StatusCode as S;
        match &e {
            Error::WorkflowNotFound(_) | Error::VersionNotFound { .. } => {
                Self::new(S::NOT_FOUND, "workflow_not_found", e.to_string())
            }
            Error::RunNotFound(_) => Self::new(S::NOT_FOUND, "run_not_found", e.to_string()),
            Error::InvalidQuery(_) => Self::new(S::BAD_REQUEST, "invalid_query", e.to_string()),
            Error::InvalidInput { field, .. } => {
                let mut err = Self::new(S::BAD_REQUEST, "invalid_input", e.to_string());
                err.fields = field.as_ref().map(|f| json!([f]));
                err
            }
            Error::PayloadTooLarge { .. } => {
                Self::new(S::PAYLOAD_TOO_LARGE, "payload_too_large", e.to_string())
            }
            Error::DuplicateKey { .. } => Self::new(S::CONFLICT, "duplicate_key", e.to_string()),
            Error::ActionNotAllowed { .. } => {
                Self::new(S::CONFLICT, "action_not_allowed", e.to_string())
            }
            Error::Shutdown => Self::new(S::SERVICE_UNAVAILABLE, "shutdown", e.to_string()),
            // Database and internal errors: logged here, answered without their details (a
            // message may carry a host name or a statement).
            _ => {
                tracing::error!(error = %e, "admin API request failed");
                Self::new(
                    S::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the engine could not answer; see its logs",
                )
            }
        }
    }
}

/// A body that did not parse as JSON: 415 for another content type, 413 over the limit,
/// 400 otherwise.
fn body_error(r: &JsonRejection) -> ApiError {
    let status = r.status();
    let code = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        _ => "invalid_json",
    };
    ApiError::new(status, code, r.body_text())
}

/// A JSON body read as `T`: the JSON errors of [`body_error`], then 400 `invalid_body` naming
/// the `expected` shape when it is JSON of another shape.
fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Json<Value>, JsonRejection>,
    expected: &str,
) -> Result<T, ApiError> {
    let Json(body) = body.map_err(|r| body_error(&r))?;
    serde_json::from_value(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("expected {expected}: {e}"),
        )
    })
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn healthz(State(s): State<AdminState>) -> Response {
    match s.engine.health() {
        Health::Running => Json(json!({ "status": "running" })).into_response(),
        other => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": format!("{other:?}").to_lowercase() })),
        )
            .into_response(),
    }
}

async fn definitions(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let defs = s.engine.definitions().await?;
    let list: Vec<Value> = defs
        .into_iter()
        .map(|d| {
            let (description, error) = match d.description {
                Ok(desc) => (serde_json::to_value(desc).unwrap_or(Value::Null), None),
                Err(e) => (Value::Null, Some(e)),
            };
            json!({
                "key": d.key,
                "name": d.name,
                "version": d.version,
                "description": description,
                "description_error": error,
                "published_by": d.published_by,
                "published_at": d.published_at,
            })
        })
        .collect();
    Ok(Json(json!({ "definitions": list })))
}

/// The body of a start.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    /// The run's input.
    input: Value,
    /// Business key: a run already holding it is returned instead of a new one.
    #[serde(default)]
    business_key: Option<String>,
}

async fn start_run(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let body: StartBody = parse_body(body, r#"{"input": …, "business_key"?: "…"}"#)?;
    let options = StartOptions {
        business_key: body.business_key,
        ..StartOptions::default()
    };
    let started = s.engine.start_with(&name, &body.input, options).await?;
    let status = if started.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let answer = json!({
        "id": started.id,
        "state": started.state,
        "created": started.created,
    });
    Ok((status, Json(answer)).into_response())
}

/// The query string of `GET /api/v1/runs`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    /// Only runs of this workflow.
    pub(super) workflow: Option<String>,
    /// Only runs in this state (`pending`, `running`, `compensating`, `completed`,
    /// `compensated`, `error`).
    pub(super) state: Option<String>,
    /// Only runs started with this business key.
    pub(super) business_key: Option<String>,
    /// Only runs created at or after this instant (epoch milliseconds).
    pub(super) created_after: Option<i64>,
    /// Only runs created before this instant (epoch milliseconds).
    pub(super) created_before: Option<i64>,
    /// `created` (newest first, the default) or `attempts` (most failed attempts first).
    pub(super) sort: Option<String>,
    /// Rows per page (default 50, at most 500).
    pub(super) limit: Option<u32>,
    /// The previous page's `next`.
    pub(super) cursor: Option<String>,
}

impl ListParams {
    /// Whether any filter narrows the runs (sorting and paging do not).
    fn filters(&self) -> bool {
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
        if let Some(state) = nonempty(self.state) {
            let state = state.parse::<RunState>().map_err(|_| {
                let all: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
                invalid(format!(
                    "no state `{state}`; the states are {}",
                    all.join(", ")
                ))
            })?;
            q = q.state(state);
        }
        if let Some(sort) = nonempty(self.sort) {
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

async fn list_runs(
    State(s): State<AdminState>,
    params: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params
        .map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", r.body_text()))?;
    let page = s.engine.list_runs(&params.query()?).await?;
    let damaged: Vec<String> = page.damaged.iter().map(ToString::to_string).collect();
    Ok(Json(json!({
        "runs": page.runs,
        "damaged": damaged,
        "next": page.next,
    })))
}

/// A run id from the path.
pub(super) fn run_id(id: &str) -> Result<Uuid, ApiError> {
    id.parse()
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "invalid_id", "a run id is a UUID"))
}

async fn run(State(s): State<AdminState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = run_id(&id)?;
    let Some(run) = s.engine.run(id).await? else {
        return Err(Error::RunNotFound(id).into());
    };
    let steps = s.engine.steps(id).await?;
    let history = s.engine.history(id).await?;
    let alerts = s.engine.run_alerts(id).await?;
    Ok(Json(json!({
        "run": run,
        "steps": steps,
        "history": history,
        "alerts": alerts,
    })))
}

/// The operator actions the API and the console take on a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Retry,
    Resume,
    Compensate,
    Cancel,
    Pause,
    Extend,
    Release,
    MarkCompensated,
}

impl Action {
    /// Every action, in the order they are listed.
    pub(super) const ALL: [Action; 8] = [
        Self::Retry,
        Self::Resume,
        Self::Compensate,
        Self::Cancel,
        Self::Pause,
        Self::Extend,
        Self::Release,
        Self::MarkCompensated,
    ];

    /// Its name in paths and forms.
    pub(super) const fn name(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Resume => "resume",
            Self::Compensate => "compensate",
            Self::Cancel => "cancel",
            Self::Pause => "pause",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::MarkCompensated => "mark_compensated",
        }
    }

    /// The action named `name`.
    pub(super) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether it acts on one step, named with it.
    pub(super) const fn needs_step(self) -> bool {
        matches!(self, Self::Retry | Self::MarkCompensated)
    }

    /// Takes the action on run `id` (`step` for the actions that name one, `by` for
    /// `extend`).
    pub(super) async fn perform(
        self,
        op: &crate::Operator<'_>,
        id: Uuid,
        step: &str,
        by: Duration,
    ) -> Result<RunState, Error> {
        match self {
            Self::Retry => op.retry_step(id, step).await,
            Self::Resume => op.resume(id).await,
            Self::Compensate => op.compensate(id).await,
            Self::Cancel => op.cancel(id).await,
            Self::Pause => op.pause(id).await,
            Self::Extend => op.extend(id, by).await,
            Self::Release => op.release(id).await,
            Self::MarkCompensated => op.mark_compensated(id, step).await,
        }
    }
}

/// Longest reason an action records.
pub(super) const REASON_MAX_CHARS: usize = 2_000;

/// The reason of an action, trimmed, if it is one an action records: 1 to
/// [`REASON_MAX_CHARS`] characters.
pub(super) fn action_reason(reason: &str) -> Option<&str> {
    let reason = reason.trim();
    (!reason.is_empty() && reason.chars().count() <= REASON_MAX_CHARS).then_some(reason)
}

/// The body of an action.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// Why, in the operator's words (required: it goes into the run's history).
    #[serde(default)]
    reason: String,
    /// The step, for `retry` and `mark_compensated`.
    #[serde(default)]
    step: Option<String>,
    /// Seconds to add to the deadlines in flight, for `extend`.
    #[serde(default)]
    by_seconds: Option<u64>,
}

/// The extension of an `extend` action from its `by_seconds`.
pub(super) fn extension(action: Action, by_seconds: Option<u64>) -> Result<Duration, ApiError> {
    match (action, by_seconds) {
        (Action::Extend, Some(s)) if (1..=EXTEND_MAX.as_secs()).contains(&s) => {
            Ok(Duration::from_secs(s))
        }
        (Action::Extend, _) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "extension_required",
            format!(
                "`extend` says by how much: {{\"by_seconds\": 1 to {}}}",
                EXTEND_MAX.as_secs()
            ),
        )),
        _ => Ok(Duration::ZERO),
    }
}

/// An action with its checked arguments, as the API received it.
struct Request {
    action: Action,
    reason: String,
    step: String,
    by: Duration,
}

impl Request {
    /// The action named in the path with its body, or 404 / 400 saying what is wrong.
    fn parse(action: &str, body: Result<Json<Value>, JsonRejection>) -> Result<Self, ApiError> {
        let Some(action) = Action::parse(action) else {
            let known: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("no action `{action}`; the actions are {}", known.join(", ")),
            ));
        };
        let body: ActionBody =
            parse_body(body, r#"{"reason": "…", "step"?: "…", "by_seconds"?: 300}"#)?;
        let Some(reason) = action_reason(&body.reason) else {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "reason_required",
                format!(
                    "an action needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded in the run's history"
                ),
            ));
        };
        let step = match (action.needs_step(), body.step) {
            (true, Some(step)) => step,
            (true, None) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "step_required",
                    format!(
                        "`{}` names the step it acts on: {{\"step\": \"…\"}}",
                        action.name()
                    ),
                ));
            }
            (false, _) => String::new(),
        };
        let by = extension(action, body.by_seconds)?;
        Ok(Self {
            action,
            reason: reason.to_owned(),
            step,
            by,
        })
    }

    async fn perform(&self, s: &AdminState, caller: &Caller, id: Uuid) -> Result<RunState, Error> {
        let op = s
            .engine
            .operator()
            .on_behalf_of(format!("api:{}", caller.name), self.reason.clone());
        self.action.perform(&op, id, &self.step, self.by).await
    }
}

async fn act(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id = run_id(&id)?;
    let request = Request::parse(&action, body)?;
    let state = request.perform(&s, &caller, id).await?;
    Ok(Json(
        json!({ "id": id, "action": request.action.name(), "state": state }),
    ))
}

/// Runs one bulk action takes by default.
pub(super) const BULK_DEFAULT: u32 = 100;

/// `POST /api/v1/runs/actions/{action}?<the list's filters>`: the action on each run the
/// filters select (one page of the list: `limit`, default [`BULK_DEFAULT`], at most
/// [`RUN_PAGE_MAX`](crate::RUN_PAGE_MAX); `next` pages on), each through the same rules and
/// audit as a single action; answered with a result per run. A filter is required: no
/// action applies to every run by accident.
async fn act_many(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(action): Path<String>,
    params: Result<Query<ListParams>, QueryRejection>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let Query(mut params) = params
        .map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", r.body_text()))?;
    let request = Request::parse(&action, body)?;
    if !params.filters() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "filter_required",
            "a bulk action needs at least one filter (workflow, state, business_key, created_after, created_before)",
        ));
    }
    params.limit = Some(params.limit.unwrap_or(BULK_DEFAULT));
    let page = s.engine.list_runs(&params.query()?).await?;
    let mut results = Vec::with_capacity(page.runs.len());
    let (mut done, mut refused) = (0, 0);
    for run in &page.runs {
        match request.perform(&s, &caller, run.id).await {
            Ok(state) => {
                done += 1;
                results.push(json!({ "id": run.id, "ok": true, "state": state }));
            }
            Err(e) => {
                refused += 1;
                let e = ApiError::from(e);
                results.push(json!({
                    "id": run.id,
                    "ok": false,
                    "status": e.status.as_u16(),
                    "error": { "code": e.code, "message": e.message },
                }));
            }
        }
    }
    tracing::info!(action = request.action.name(), done, refused, by = %caller.name, "bulk action over the API");
    let damaged: Vec<String> = page.damaged.iter().map(ToString::to_string).collect();
    Ok(Json(json!({
        "action": request.action.name(),
        "done": done,
        "refused": refused,
        "results": results,
        "damaged": damaged,
        "next": page.next,
    })))
}

async fn alerts(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let open = s.engine.open_alerts().await?;
    Ok(Json(json!({ "alerts": open })))
}

async fn resolve_alert(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id: i64 = id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            "an alert id is an integer",
        )
    })?;
    if s.engine.operator().resolve_alert(id).await? {
        tracing::info!(alert = id, by = %caller.name, "alert resolved over the API");
        Ok(Json(json!({ "id": id, "resolved": true })))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "alert_not_open",
            format!("no open alert {id}"),
        ))
    }
}

async fn stats(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let stats = s.engine.stats().await?;
    Ok(Json(serde_json::to_value(stats).unwrap_or(Value::Null)))
}
