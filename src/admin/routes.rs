//! Routes, handlers and the JSON error envelope.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router, middleware};
use sagaflow_engine::Error;
use sagaflow_engine::FieldError;
use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

use sagaflow_engine::transition::operator::EXTEND_MAX;
use uuid::Uuid;

use super::AdminState;
use super::answers::{
    ActionAnswer, AlertsAnswer, BulkAnswer, BulkResult, DefinitionsAnswer, DeliveriesAnswer,
    ErrorBody, ErrorDetail, HealthAnswer, RedeliverAnswer, ResolveAnswer, RunAnswer, RunsAnswer,
    StartAnswer, json,
};
use super::auth::{Caller, Role, require_token};
use super::openapi::Security;
use crate::{
    Health, PRIORITY_MAX, PRIORITY_MIN, RunOrder, RunQuery, RunState, StartOption, StartOptions,
    Stats,
};

/// Declares the routes under `/api/v1` once: the router that serves them and their table,
/// [`API_ROUTES`], which the OpenAPI document is tested against.
macro_rules! api_routes {
    ($($method:ident $path:literal => $handler:path,)*) => {
        /// Every route of the API under `/api/v1`: its method and path, as the router serves
        /// it and as the OpenAPI document names it.
        pub(crate) const API_ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn api_routes() -> Router<AdminState> {
            Router::new()$(.route($path, $method($handler)))*
        }
    };
}

api_routes! {
    get "/api/v1/definitions" => definitions,
    post "/api/v1/workflows/{name}/runs" => start_run,
    get "/api/v1/runs" => list_runs,
    get "/api/v1/runs/{id}" => run,
    get "/api/v1/runs/{id}/events" => super::events::run_events,
    post "/api/v1/runs/{id}/actions/{action}" => act,
    put "/api/v1/runs/{id}/input" => super::input::set_input,
    get "/api/v1/migrations/{name}/{from}/{to}/plan" => super::migrations::plan,
    post "/api/v1/migrations/{name}/{from}/{to}/apply" => super::migrations::apply,
    post "/api/v1/runs/actions/{action}" => act_many,
    get "/api/v1/alerts" => alerts,
    get "/api/v1/stats" => stats,
    post "/api/v1/alerts/{id}/resolve" => resolve_alert,
    get "/api/v1/deliveries" => deliveries,
    post "/api/v1/deliveries/{id}/redeliver" => redeliver,
    get "/api/v1/resources" => super::resources::resources,
    put "/api/v1/resources/{name}/limits" => super::resources::set_limits,
    delete "/api/v1/resources/{name}/limits" => super::resources::clear_limits,
    post "/api/v1/runs/{id}/events/{name}" => super::waits::send_event,
    post "/api/v1/workflows/{workflow}/keys/{key}/events/{name}" => super::waits::send_event_by_key,
    get "/api/v1/waiting" => super::waits::waiting,
    get "/api/v1/schedules" => super::schedules::schedules,
    post "/api/v1/schedules/{name}/pause" => super::schedules::pause,
    post "/api/v1/schedules/{name}/resume" => super::schedules::resume,
    get "/api/v1/instances" => super::instances::instances,
    get "/api/v1/openapi.json" => super::openapi::openapi_json,
    get "/metrics" => super::scrape::metrics,
}

/// The OpenAPI document of the API (served by [`super::openapi`]).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sagaflow HTTP API",
        description = "Start workflow runs, follow and read them, take operator actions, read \
                       alerts and statistics, read and override the limits of remote \
                       resources, read, pause and resume recurring schedules. Answers are JSON; an error answer is an \
                       resources, list the engine instances and what they run. Answers are JSON; an error answer is an \
                       `ErrorBody`."
    ),
    paths(
        healthz,
        definitions,
        start_run,
        list_runs,
        run,
        super::events::run_events,
        act,
        super::input::set_input,
        super::migrations::plan,
        super::migrations::apply,
        act_many,
        alerts,
        resolve_alert,
        deliveries,
        redeliver,
        super::resources::resources,
        super::resources::set_limits,
        super::resources::clear_limits,
        super::waits::send_event,
        super::waits::send_event_by_key,
        super::waits::callback_by_header,
        super::waits::callback,
        super::waits::waiting,
        super::schedules::schedules,
        super::schedules::pause,
        super::schedules::resume,
        super::instances::instances,
        stats,
        super::openapi::openapi_json,
        super::scrape::metrics,
    ),
    components(schemas(ErrorBody, RunOrder, super::answers::RunStateEvent)),
    modifiers(&Security),
)]
pub(super) struct ApiDoc;

pub(super) fn router(state: AdminState, body_limit: usize) -> Router {
    let api = api_routes()
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(healthz))
        // A remote's callback carries its own credential, the token in a header or the path.
        .route("/api/v1/callbacks", post(super::waits::callback_by_header))
        .route("/api/v1/callbacks/{token}", post(super::waits::callback))
        .merge(api)
        .merge(super::console::router(state.clone()))
        .layer(DefaultBodyLimit::max(body_limit))
        // Outermost: a request over a limit is refused before its token is compared.
        .layer(middleware::from_fn_with_state(
            state.throttle.clone(),
            super::throttle::limit,
        ))
        .with_state(state)
}

/// An error answer: a status and `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Where an input is wrong: `[{"pointer", "message"}]`, JSON Pointers into the input.
    fields: Option<Vec<FieldError>>,
}

impl ApiError {
    /// 400 `invalid_query`: a query string the route's parameters do not take.
    pub(super) fn invalid_query(r: QueryRejection) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_query", r.body_text())
    }

    pub(super) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
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

    pub(crate) fn metrics_not_installed() -> Self {
        Self::new(
            StatusCode::NOT_IMPLEMENTED,
            "metrics_not_installed",
            "this process exports no Prometheus metrics (sagaflow::metrics::install_prometheus was not called)",
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
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
                fields: self.fields,
            },
        };
        (self.status, json(&body)).into_response()
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        use StatusCode as S;
        match &e {
            Error::WorkflowNotFound(_) | Error::VersionNotFound { .. } => {
                Self::new(S::NOT_FOUND, "workflow_not_found", e.to_string())
            }
            Error::RunNotFound(_) | Error::KeyNotFound { .. } => {
                Self::new(S::NOT_FOUND, "run_not_found", e.to_string())
            }
            Error::InvalidEvent(_) => Self::new(S::BAD_REQUEST, "invalid_event", e.to_string()),
            Error::UnknownCallback => Self::new(S::NOT_FOUND, "unknown_callback", e.to_string()),
            Error::InvalidQuery(_) => Self::new(S::BAD_REQUEST, "invalid_query", e.to_string()),
            Error::InvalidInput { field, .. } => {
                let mut err = Self::new(S::BAD_REQUEST, "invalid_input", e.to_string());
                err.fields = field.as_ref().map(|f| vec![f.clone()]);
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
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(
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

/// Whether the engine runs
///
/// No token needed: for load balancers and orchestrators.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses(
        (status = 200, description = "The engine runs: `{\"status\": \"running\"}`", body = HealthAnswer),
        (status = 503, description = "The engine stopped, and why", body = HealthAnswer),
    ),
)]
async fn healthz(State(s): State<AdminState>) -> Response {
    match s.engine.health() {
        Health::Running => json(&HealthAnswer {
            status: "running".to_owned(),
        })
        .into_response(),
        other => (
            StatusCode::SERVICE_UNAVAILABLE,
            json(&HealthAnswer {
                status: format!("{other:?}").to_lowercase(),
            }),
        )
            .into_response(),
    }
}

/// The published definitions
///
/// Each workflow version some engine published, with its graph, policies and input schema.
#[utoipa::path(
    get,
    path = "/api/v1/definitions",
    tag = "definitions",
    responses(
        (status = 200, description = "The published definitions", body = DefinitionsAnswer),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
async fn definitions(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let definitions = s.engine.definitions().await?;
    Ok(json(&DefinitionsAnswer { definitions }))
}

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
    /// When the run's first steps become due: milliseconds after it is stored. Not with
    /// `start_at`.
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
    let mut err = ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_body",
        format!("invalid start options; expected {START_BODY}"),
    );
    err.fields = Some(
        fields
            .iter()
            .map(|(pointer, message)| FieldError::new(*pointer, *message))
            .collect(),
    );
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
async fn start_run(
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
async fn list_runs(
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
async fn run(State(s): State<AdminState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let id = run_id(&id)?;
    let Some(run) = s.engine.run(id).await? else {
        return Err(Error::RunNotFound(id).into());
    };
    let steps = s.engine.steps(id).await?;
    let history = s.engine.history(id).await?;
    let alerts = s.engine.run_alerts(id).await?;
    Ok(json(&RunAnswer {
        run,
        steps,
        history,
        alerts,
    }))
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
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    /// Why, in the operator's words (required: it goes into the run's history).
    #[serde(default)]
    #[schema(required = true, min_length = 1)]
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

/// Takes an operator action on a run
///
/// Recorded in the run's history with the reason, as done by `api:<token name>`. Needs an
/// operator token.
#[utoipa::path(
    post,
    path = "/api/v1/runs/{id}/actions/{action}",
    tag = "runs",
    operation_id = "act_on_run",
    params(
        ("id" = Uuid, Path, description = "The run's id"),
        ("action" = Action, Path, description = "The action"),
    ),
    request_body = ActionBody,
    responses(
        (status = 200, description = "Taken; the run's state after it", body = ActionAnswer),
        (status = 400, description = "`reason_required` (1 to 2,000 characters), `step_required`, `extension_required` (`extend` needs `by_seconds`, 1 to 86,400), `invalid_id`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`unknown_action` or `run_not_found`", body = ErrorBody),
        (status = 409, description = "`action_not_allowed`: the run's state does not allow it, and why", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
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
    Ok(json(&ActionAnswer {
        id,
        action: request.action,
        state,
    }))
}

/// Runs one bulk action takes by default.
pub(super) const BULK_DEFAULT: u32 = 100;

/// Takes an operator action on every run of one page of the filtered list
///
/// The action on each run the filters select (one page of the list: `limit`, default 100, at
/// most 500; `next` pages on), each through the same rules and audit as a single action;
/// answered with a result per run, a refusal of one run not stopping the others. At least one
/// filter is required, so that no action applies to every run by accident. Needs an operator
/// token.
#[utoipa::path(
    post,
    path = "/api/v1/runs/actions/{action}",
    tag = "runs",
    operation_id = "act_on_runs",
    params(
        ("action" = Action, Path, description = "The action"),
        ListParams,
    ),
    request_body = ActionBody,
    responses(
        (status = 200, description = "Taken on each run that allowed it; a result per run", body = BulkAnswer),
        (status = 400, description = "`filter_required`, `invalid_query`, `reason_required`, `step_required`, `extension_required`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`unknown_action`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
async fn act_many(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(action): Path<String>,
    params: Result<Query<ListParams>, QueryRejection>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let Query(mut params) = params.map_err(ApiError::invalid_query)?;
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
                results.push(BulkResult {
                    id: run.id,
                    ok: true,
                    state: Some(state),
                    status: None,
                    error: None,
                });
            }
            Err(e) => {
                refused += 1;
                let e = ApiError::from(e);
                results.push(BulkResult {
                    id: run.id,
                    ok: false,
                    state: None,
                    status: Some(e.status.as_u16()),
                    error: Some(ErrorDetail {
                        code: e.code,
                        message: e.message,
                        fields: None,
                    }),
                });
            }
        }
    }
    tracing::info!(action = request.action.name(), done, refused, by = %caller.name, "bulk action over the API");
    Ok(json(&BulkAnswer {
        action: request.action,
        done,
        refused,
        results,
        damaged: page.damaged.iter().map(ToString::to_string).collect(),
        next: page.next,
    }))
}

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
async fn alerts(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
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
    #[schema(required = true, min_length = 1)]
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
async fn resolve_alert(
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
fn integer_id(id: &str, what: &str) -> Result<i64, ApiError> {
    id.parse().map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            format!("{what} id is an integer"),
        )
    })
}

/// The parameters of `GET /api/v1/deliveries`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct DeliveryParams {
    /// `pending`, `delivered` or `dead` (the dead letters); all when left out.
    state: Option<String>,
    /// At most this many (default 100, at most 500).
    limit: Option<u32>,
}

/// Deliveries of notices to the sinks
///
/// What the outbox did with each alert and run notification, per sink: the dead letters
/// (`state=dead`) are what an operator may send again.
#[utoipa::path(
    get,
    path = "/api/v1/deliveries",
    tag = "alerts",
    params(DeliveryParams),
    responses(
        (status = 200, description = "Deliveries, most recently changed first", body = DeliveriesAnswer),
        (status = 400, description = "`invalid_query`: an unknown parameter or state", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
async fn deliveries(
    State(s): State<AdminState>,
    params: Result<Query<DeliveryParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(ApiError::invalid_query)?;
    let state = params
        .state
        .as_deref()
        .map(|v| {
            v.parse::<crate::DeliveryState>().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_query",
                    format!("unknown delivery state `{v}`: pending, delivered or dead"),
                )
            })
        })
        .transpose()?;
    let limit = params.limit.unwrap_or(100).clamp(1, 500);
    let deliveries = s.engine.deliveries(state, limit).await?;
    Ok(json(&DeliveriesAnswer { deliveries }))
}

/// Sends a dead-lettered notice again
///
/// Its dead deliveries start afresh; the sinks that delivered it are not tried again. Needs
/// an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/deliveries/{id}/redeliver",
    tag = "alerts",
    params(("id" = i64, Path, description = "The notice's id (`notice_id` of a delivery)")),
    responses(
        (status = 200, description = "Pending again", body = RedeliverAnswer),
        (status = 400, description = "`invalid_id`: not an integer", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`not_dead_lettered`: no dead delivery of that notice", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
async fn redeliver(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id = integer_id(&id, "a notice")?;
    let op = s
        .engine
        .operator()
        .on_behalf_of(format!("api:{}", caller.name), "sent again over the API");
    if op.redeliver(id).await? {
        Ok(json(&RedeliverAnswer {
            notice_id: id,
            redelivered: true,
        }))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_dead_lettered",
            format!("notice {id} has no dead-lettered delivery"),
        ))
    }
}

/// The queue and recent throughput
///
/// Steps due now, due later and in flight, the oldest due step's wait, unfinished runs per
/// workflow and state, and runs finished in the last 1, 5 and 15 minutes.
#[utoipa::path(
    get,
    path = "/api/v1/stats",
    tag = "stats",
    responses(
        (status = 200, description = "The statistics", body = Stats),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
async fn stats(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let stats = s.engine.stats().await?;
    Ok(json(&stats))
}
