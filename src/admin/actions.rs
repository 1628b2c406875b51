//! Operator actions on runs: on one run (`POST /api/v1/runs/{id}/actions/{action}`) or on a
//! filtered page of them (`POST /api/v1/runs/actions/{action}`), and the checks of their
//! reasons and arguments that the console's forms share.

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use sagaflow_engine::transition::operator::EXTEND_MAX;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AdminState;
use super::answers::{ActionAnswer, BulkAnswer, BulkResult, ErrorBody, json};
use super::auth::{Caller, Role};
use super::error::{ApiError, parse_body};
use super::openapi::ActionSchema;
use super::runs::{ListParams, run_id};
use crate::{ActionArgs, Error, OperatorAction, RunState};

/// Longest reason an action records.
pub(super) const REASON_MAX_CHARS: usize = crate::Operator::REASON_MAX_CHARS;

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
    #[schema(required = true, min_length = 1, max_length = 2000, pattern = r"\S")]
    reason: String,
    /// The step, for `retry`, `mark_compensated` and `rollback`.
    #[serde(default)]
    step: Option<String>,
    /// The run's new input, for `rollback` only (checked as a start's is); absent or `null`
    /// keeps it.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    input: Option<Value>,
    /// Seconds to add to the deadlines in flight, for `extend`.
    #[serde(default)]
    by_seconds: Option<u64>,
}

/// The extension of an `extend` action from its `by_seconds`; `None` for the other actions.
/// `by_seconds` is 1 to [`EXTEND_MAX`] whatever the action, as the document states it: the
/// other actions ignore it, but never one out of bounds.
pub(super) fn extension(
    action: OperatorAction,
    by_seconds: Option<u64>,
) -> Result<Option<Duration>, ApiError> {
    let by = match by_seconds {
        Some(s) if (1..=EXTEND_MAX.as_secs()).contains(&s) => Some(Duration::from_secs(s)),
        None => None,
        Some(_) => return Err(extension_required(action)),
    };
    match (action, by) {
        (OperatorAction::Extend, Some(by)) => Ok(Some(by)),
        (OperatorAction::Extend, None) => Err(extension_required(action)),
        _ => Ok(None),
    }
}

/// 400 `extension_required`: `by_seconds` missing on `extend`, or out of bounds.
fn extension_required(action: OperatorAction) -> ApiError {
    let max = EXTEND_MAX.as_secs();
    let message = if action == OperatorAction::Extend {
        format!("`extend` says by how much: {{\"by_seconds\": 1 to {max}}}")
    } else {
        format!("`by_seconds` is 1 to {max}")
    };
    ApiError::new(StatusCode::BAD_REQUEST, "extension_required", message)
}

/// An action with its checked arguments, as the API received it.
struct Request {
    action: OperatorAction,
    reason: String,
    args: ActionArgs,
}

impl Request {
    /// The action named in the path with its body, or 404 / 400 saying what is wrong.
    fn parse(action: &str, body: Result<Json<Value>, JsonRejection>) -> Result<Self, ApiError> {
        let Ok(action) = action.parse::<OperatorAction>() else {
            let known: Vec<&str> = OperatorAction::ALL.iter().map(|a| a.as_str()).collect();
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("no action `{action}`; the actions are {}", known.join(", ")),
            ));
        };
        let body: ActionBody = parse_body(
            body,
            r#"{"reason": "…", "step"?: "…", "by_seconds"?: 300, "input"?: {…}}"#,
        )?;
        let Some(reason) = action_reason(&body.reason) else {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "reason_required",
                format!(
                    "an action needs a reason of 1 to {REASON_MAX_CHARS} characters; it is recorded in the run's history"
                ),
            ));
        };
        let mut args = ActionArgs::default();
        if action.needs_step() {
            let Some(step) = body.step else {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "step_required",
                    format!("`{action}` names the step it acts on: {{\"step\": \"…\"}}"),
                ));
            };
            args = args.with_step(step);
        }
        args.extension = extension(action, body.by_seconds)?;
        match body.input.filter(|v| !v.is_null()) {
            Some(input) if action == OperatorAction::Rollback => args = args.with_input(input),
            Some(_) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "input_not_taken",
                    format!("`{action}` takes no input; only `rollback` does"),
                ));
            }
            None => {}
        }
        Ok(Self {
            action,
            reason: reason.to_owned(),
            args,
        })
    }

    async fn perform(
        &self,
        s: &AdminState,
        caller: &Caller,
        id: Uuid,
        listed: Option<RunState>,
    ) -> Result<RunState, Error> {
        let mut op = s
            .engine
            .operator()
            .on_behalf_of(format!("api:{}", caller.name), self.reason.clone());
        if let Some(state) = listed {
            op = op.if_still(state);
        }
        op.perform(self.action, id, &self.args).await
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
        ("action" = ActionSchema, Path, description = "The action"),
    ),
    request_body = ActionBody,
    responses(
        (status = 200, description = "Taken; the run's state after it", body = ActionAnswer),
        (status = 400, description = "`reason_required` (1 to 2,000 characters), `step_required`, `extension_required` (`extend` needs `by_seconds`, 1 to 86,400), `input_not_taken` (only `rollback` takes an input), `invalid_input` (a `rollback` input the workflow refuses), `invalid_id`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`unknown_action`, `run_not_found`, or `workflow_not_found` (a `rollback` on an engine that does not know the run's version)", body = ErrorBody),
        (status = 409, description = "`action_not_allowed`: the run's state does not allow it, and why", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn act(
    State(s): State<AdminState>,
    Extension(caller): Extension<Caller>,
    Path((id, action)): Path<(String, String)>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Role::Operator)?;
    let id = run_id(&id)?;
    let request = Request::parse(&action, body)?;
    let state = request.perform(&s, &caller, id, None).await?;
    Ok(json(&ActionAnswer {
        id,
        action: request.action,
        state,
    }))
}

/// Previews an undo of a run
///
/// What `cancel` or `compensate` would do to the run now, without doing it: the
/// compensations in order (the steps of a group run side by side), which steps may have
/// taken effect, the output each compensation reads and the resource it uses, the steps left
/// as they are and why, and how the run would end (`compensated`, `stops_in_error`,
/// `goes_forward` when a cancel comes after the pivot, `waits` while a pivot is in flight).
/// Worked out by the rules that carry the action out, each compensation taken to succeed;
/// `in_flight` says what it assumed of the attempts running now. Writes nothing; any token.
#[utoipa::path(
    get,
    path = "/api/v1/runs/{id}/actions/{action}/preview",
    tag = "runs",
    operation_id = "preview_undo",
    params(
        ("id" = Uuid, Path, description = "The run's id"),
        ("action" = crate::Undo, Path, description = "The undo to preview: `cancel` or `compensate`"),
    ),
    responses(
        (status = 200, description = "What the action would do", body = crate::UndoPreview),
        (status = 400, description = "`invalid_id`: not a UUID", body = ErrorBody),
        (status = 404, description = "`unknown_action` (only `cancel` and `compensate` are previewed), `run_not_found`, or `workflow_not_found` (this instance lacks the run's workflow version)", body = ErrorBody),
        (status = 409, description = "`action_not_allowed`: the action would be refused (a finished run), and why", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn preview(
    State(s): State<AdminState>,
    Path((id, action)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let id = run_id(&id)?;
    let undo = match action.parse::<OperatorAction>() {
        Ok(OperatorAction::Cancel) => crate::Undo::Cancel,
        Ok(OperatorAction::Compensate) => crate::Undo::Compensate,
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("no preview of `{action}`; the previewed actions are cancel, compensate"),
            ));
        }
    };
    Ok(json(&s.engine.preview_undo(id, undo).await?))
}

/// Runs one bulk action takes by default.
pub(super) const BULK_DEFAULT: u32 = 100;

/// Takes an operator action on every run of one page of the filtered list
///
/// The action on each run the filters select (one page of the list: `limit`, default 100, at
/// most 500; `next` pages on), each through the same rules and audit as a single action;
/// answered with a result per run, a refusal of one run not stopping the others. A run that
/// left the state it was listed in before the action reached it (another operator resumed
/// it, it finished) is refused (`action_not_allowed`) and left as it is. At least one filter
/// is required, so that no action applies to every run by accident. Needs an operator token.
#[utoipa::path(
    post,
    path = "/api/v1/runs/actions/{action}",
    tag = "runs",
    operation_id = "act_on_runs",
    params(
        ("action" = ActionSchema, Path, description = "The action"),
        ListParams,
    ),
    request_body = ActionBody,
    responses(
        (status = 200, description = "Taken on each run that allowed it; a result per run", body = BulkAnswer),
        (status = 400, description = "`filter_required`, `invalid_query`, `reason_required`, `step_required`, `extension_required`, `input_not_taken`, `invalid_json` or `invalid_body`", body = ErrorBody),
        (status = 403, description = "`forbidden`: a read-only token", body = ErrorBody),
        (status = 404, description = "`unknown_action`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = ErrorBody),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn act_many(
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
        // Each run is acted on only while it is as it was listed.
        match request.perform(&s, &caller, run.id, Some(run.state)).await {
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
                let (status, error) = ApiError::from(e).into_parts();
                results.push(BulkResult {
                    id: run.id,
                    ok: false,
                    state: None,
                    status: Some(status.as_u16()),
                    error: Some(error),
                });
            }
        }
    }
    tracing::info!(action = request.action.as_str(), done, refused, by = %caller.name, "bulk action over the API");
    Ok(json(&BulkAnswer {
        action: request.action,
        done,
        refused,
        results,
        damaged: page.damaged.iter().map(ToString::to_string).collect(),
        next: page.next,
    }))
}
