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
use uuid::Uuid;

use super::AdminState;
use super::auth::{Caller, Role, require_token};
use crate::{
    Health, PRIORITY_MAX, PRIORITY_MIN, RunOrder, RunQuery, RunState, StartOption, StartOptions,
};

pub(super) fn router(state: AdminState, body_limit: usize) -> Router {
    let api = Router::new()
        .route("/api/v1/definitions", get(definitions))
        .route("/api/v1/workflows/{name}/runs", post(start_run))
        .route("/api/v1/runs", get(list_runs))
        .route("/api/v1/runs/{id}", get(run))
        .route("/api/v1/runs/{id}/events", get(super::events::run_events))
        .route("/api/v1/runs/{id}/actions/{action}", post(act))
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
    /// When the run's first steps become due: an RFC 3339 time. Not with `start_after_ms`.
    #[serde(default)]
    start_at: Option<Value>,
    /// When the run's first steps become due: milliseconds after it is stored. Not with
    /// `start_at`.
    #[serde(default)]
    start_after_ms: Option<Value>,
    /// Claim priority, `PRIORITY_MIN` to `PRIORITY_MAX` (default 0; higher first).
    #[serde(default)]
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
    let mut err = ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_body",
        format!("invalid start options; expected {START_BODY}"),
    );
    let list: Vec<Value> = fields
        .iter()
        .map(|(pointer, message)| json!({ "pointer": pointer, "message": message }))
        .collect();
    err.fields = Some(Value::Array(list));
    err
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
            };
            body_fields(&[(pointer, reason)])
        }
        _ => e.into(),
    }
}

async fn start_run(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    caller.require(Role::Operator)?;
    let body: StartBody = parse_body(body, START_BODY)?;
    let options = body.options()?;
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
    Release,
    MarkCompensated,
}

impl Action {
    /// Every action, in the order they are listed.
    pub(super) const ALL: [Action; 6] = [
        Self::Retry,
        Self::Resume,
        Self::Compensate,
        Self::Cancel,
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

    /// Takes the action on run `id` (`step` for the actions that name one).
    pub(super) async fn perform(
        self,
        op: &crate::Operator<'_>,
        id: Uuid,
        step: &str,
    ) -> Result<RunState, Error> {
        match self {
            Self::Retry => op.retry_step(id, step).await,
            Self::Resume => op.resume(id).await,
            Self::Compensate => op.compensate(id).await,
            Self::Cancel => op.cancel(id).await,
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
}

async fn act(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id = run_id(&id)?;
    let Some(action) = Action::parse(&action) else {
        let known: Vec<&str> = Action::ALL.iter().map(|a| a.name()).collect();
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_action",
            format!("no action `{action}`; the actions are {}", known.join(", ")),
        ));
    };
    let body: ActionBody = parse_body(body, r#"{"reason": "…", "step"?: "…"}"#)?;
    let Some(reason) = action_reason(&body.reason) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "reason_required",
            format!(
                "an action needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded in the run's history"
            ),
        ));
    };
    let step = match (action.needs_step(), body.step.as_deref()) {
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
        (false, _) => "",
    };
    let op = s
        .engine
        .operator()
        .on_behalf_of(format!("api:{}", caller.name), reason);
    let state = action.perform(&op, id, step).await?;
    Ok(Json(
        json!({ "id": id, "action": action.name(), "state": state }),
    ))
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
