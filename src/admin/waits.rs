//! Waiting runs over HTTP: events sent by run id or business key, the callback a remote
//! makes with its token, and the list of waiting steps.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::AdminState;
use super::answers::{ErrorBody, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};
use super::runs::run_id;
use crate::{CallbackResult, EventDelivery, EventTarget};

/// The body of an event.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct EventBody {
    /// What the event carries: the waiting step's output.
    #[serde(default)]
    payload: Value,
}

/// What sending an event did.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EventAnswer {
    /// The run.
    run_id: uuid::Uuid,
    /// Whether a waiting step took it (`delivered`) or it is kept for the first step that
    /// will wait for it (`kept`).
    outcome: &'static str,
    /// The step that took it.
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

impl From<EventDelivery> for EventAnswer {
    fn from(d: EventDelivery) -> Self {
        match d {
            EventDelivery::Delivered { run_id, step } => Self {
                run_id,
                outcome: "delivered",
                step: Some(step),
            },
            EventDelivery::Kept { run_id } => Self {
                run_id,
                outcome: "kept",
                step: None,
            },
        }
    }
}

const EVENT_SHAPE: &str = r#"{"payload"?: any JSON}"#;

/// Sends an event to a run
///
/// The step of the run waiting for the event `name` completes with the payload; with none
/// waiting yet, the event is kept for the first step that will wait for it. Recorded in the
/// run's history as sent by `api:<token name>`. Needs an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/runs/{id}/events/{name}",
    tag = "runs",
    operation_id = "send_event",
    params(
        ("id" = uuid::Uuid, Path, description = "The run"),
        ("name" = String, Path, description = "The event's name"),
    ),
    request_body = EventBody,
    responses(
        (status = 200, description = "Delivered to a waiting step, or kept", body = EventAnswer),
        (status = 400, description = "`invalid_id`, `invalid_event` (the name), `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`run_not_found`", body = ErrorBody),
        (status = 409, description = "`action_not_allowed`: the run is finished", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn send_event(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path((id, name)): Path<(String, String)>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let target = EventTarget::Run(run_id(&id)?);
    deliver(&s, &caller, target, &name, body).await
}

/// Sends an event to a run by business key
///
/// As `POST /api/v1/runs/{id}/events/{name}`, to the newest run of `workflow` started with
/// the business key `key`. Needs an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/workflows/{workflow}/keys/{key}/events/{name}",
    tag = "runs",
    operation_id = "send_event_by_key",
    params(
        ("workflow" = String, Path, description = "The workflow's name"),
        ("key" = String, Path, description = "The run's business key"),
        ("name" = String, Path, description = "The event's name"),
    ),
    request_body = EventBody,
    responses(
        (status = 200, description = "Delivered to a waiting step, or kept", body = EventAnswer),
        (status = 400, description = "`invalid_event` (the name), `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`run_not_found`: no run has the key", body = ErrorBody),
        (status = 409, description = "`action_not_allowed`: the run is finished", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn send_event_by_key(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path((workflow, key, name)): Path<(String, String, String)>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    deliver(&s, &caller, EventTarget::key(workflow, key), &name, body).await
}

async fn deliver(
    s: &AdminState,
    caller: &Caller,
    target: EventTarget,
    name: &str,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let body: EventBody = parse_body(body, EVENT_SHAPE)?;
    let actor = format!("api:{}", caller.name);
    let delivery = s
        .engine
        .send_event_as(target, name, &body.payload, &actor)
        .await?;
    Ok(json(&EventAnswer::from(delivery)))
}

/// The header that carries a callback token on `POST /api/v1/callbacks`.
pub(super) const CALLBACK_TOKEN_HEADER: &str = "sagaflow-callback-token";

/// The members of a callback's `error` the API reads (`CallbackBody` in the document).
const CALLBACK_ERROR_MEMBERS: [&str; 6] = [
    "code",
    "message",
    "retryable",
    "outcome",
    "details",
    "retry_after_ms",
];

/// The body of a callback, as the remote is told to send it.
const CALLBACK_SHAPE: &str =
    r#"{"ok": output} or {"error": {"code": "…", "message": "…", "retryable": false}}"#;

/// Completes a step waiting for its callback (the token in a header)
///
/// The one call a remote makes when it finishes the work a step handed it: the token in the
/// `Sagaflow-Callback-Token` header is the credential (no API token is needed, and only the
/// step's own token works, once). The header keeps the token out of the request line that
/// proxies and access logs record; prefer it to the path form. The body is `{"ok": output}`
/// (the step completes with `output`) or `{"error": {"code", "message", "retryable"}}` (the
/// step fails with it, and is retried when `retryable`).
#[utoipa::path(
    post,
    path = "/api/v1/callbacks",
    tag = "runs",
    operation_id = "complete_callback_by_header",
    params(("Sagaflow-Callback-Token" = String, Header, description = "The token the step handed out")),
    request_body(content = Value, description = r#"{"ok": output} or {"error": {"code", "message", "retryable"}}"#),
    responses(
        (status = 202, description = "Accepted: the step completes (or fails) as told", body = EventAnswer),
        (status = 400, description = "`invalid_json`, `invalid_body` or `missing_callback_token`", body = ErrorBody),
        (status = 404, description = "`unknown_callback`: no step holds the token (forged, or spent)", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
    security(()),
)]
pub(super) async fn callback_by_header(
    State(s): State<AdminState>,
    headers: HeaderMap,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let token = headers
        .get(CALLBACK_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "missing_callback_token",
                "send the step's callback token in the Sagaflow-Callback-Token header",
            )
        })?;
    complete(&s, token, body).await
}

/// Completes a step waiting for its callback (the token in the path)
///
/// As `POST /api/v1/callbacks` with the token in the path instead of a header, for remotes
/// that can only be given a URL to call. The token then sits in the request line, which
/// proxies and access logs record: keep such logs private, or use the header form.
#[utoipa::path(
    post,
    path = "/api/v1/callbacks/{token}",
    tag = "runs",
    operation_id = "complete_callback",
    params(("token" = String, Path, description = "The token the step handed out")),
    request_body(content = Value, description = r#"{"ok": output} or {"error": {"code", "message", "retryable"}}"#),
    responses(
        (status = 202, description = "Accepted: the step completes (or fails) as told", body = EventAnswer),
        (status = 400, description = "`invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 404, description = "`unknown_callback`: no step holds the token (forged, or spent)", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
    security(()),
)]
pub(super) async fn callback(
    State(s): State<AdminState>,
    Path(token): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    complete(&s, &token, body).await
}

async fn complete(
    s: &AdminState,
    token: &str,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    // Members of `error` beyond those documented are ignored, as they always were: dropped
    // before the body is read, so that nothing in them is checked or kept.
    let body = body.map(|Json(mut v)| {
        if let Some(error) = v.get_mut("error").and_then(Value::as_object_mut) {
            error.retain(|k, _| CALLBACK_ERROR_MEMBERS.contains(&k.as_str()));
        }
        Json(v)
    });
    let result: CallbackResult = parse_body(body, CALLBACK_SHAPE)?;
    let delivery = s
        .engine
        .complete_callback(token, &result, "callback")
        .await?;
    Ok((StatusCode::ACCEPTED, json(&EventAnswer::from(delivery))))
}

/// The query of `GET /api/v1/waiting`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct WaitingParams {
    /// Only this run's waiting steps.
    run: Option<uuid::Uuid>,
    /// At most this many (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// One waiting step.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct WaitingAnswer {
    /// The run.
    run_id: uuid::Uuid,
    /// The step.
    step: String,
    /// What it waits for: `timer`, `event <name>`, `callback`, `child <workflow> <id>`.
    waits_for: String,
    /// When its time comes (a timer fires, a wait times out), RFC 3339.
    due_at: Option<String>,
}

/// Lists waiting steps
///
/// Steps parked on a timer, an event, a callback or a child run, due soonest first.
#[utoipa::path(
    get,
    path = "/api/v1/waiting",
    tag = "runs",
    params(WaitingParams),
    responses(
        (status = 200, description = "The waiting steps", body = [WaitingAnswer]),
        (status = 400, description = "`invalid_query`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn waiting(
    State(s): State<AdminState>,
    params: Result<Query<WaitingParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(p) = params
        .map_err(|r| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", r.body_text()))?;
    let limit = super::runs::in_range("limit", p.limit.unwrap_or(100), 1, 1000)?;
    let steps = s.engine.waiting_steps(p.run, limit).await?;
    let answer: Vec<WaitingAnswer> = steps
        .into_iter()
        .map(|w| WaitingAnswer {
            run_id: w.run_id,
            step: w.step,
            waits_for: w.wait.on.describe(),
            due_at: w.due_at.and_then(|ms| {
                sagaflow_engine::Timestamp::from_timestamp_millis(ms).map(|t| t.to_rfc3339())
            }),
        })
        .collect();
    Ok(json(&answer))
}
