//! The JSON bodies the API answers with: one type per answer, which the handler serializes
//! and the OpenAPI document describes, so that the two cannot tell different stories.

use axum::Json;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::{
    Alert, Delivery, FieldError, HistoryEvent, OperatorAction, PublishedDefinition, ResourceView,
    Run, RunState, RunSummary, Step,
};

use super::openapi::ActionSchema;

/// `answer` as the JSON body of a response, its object keys in alphabetical order at every
/// level, as the API has always written them.
pub(super) fn json<T: Serialize>(answer: &T) -> Json<Value> {
    Json(serde_json::to_value(answer).unwrap_or(Value::Null))
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// What went wrong.
    pub(crate) error: ErrorDetail,
}

/// What went wrong, for a program (`code`) and for a person (`message`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// Machine-readable: each response of the document names the codes it carries.
    pub(crate) code: &'static str,
    /// What went wrong, in words.
    pub(crate) message: String,
    /// Where an input is wrong (`invalid_input` only): JSON Pointers into the input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fields: Option<Vec<FieldError>>,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct HealthAnswer {
    /// `running`; otherwise what stopped the engine (`stopped`, or `failed(…)` with why).
    pub(super) status: String,
}

/// `GET /api/v1/definitions`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DefinitionsAnswer {
    /// The published definitions, of every engine that shares the database.
    pub(super) definitions: Vec<PublishedDefinition>,
}

/// `POST /api/v1/workflows/{name}/runs`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct StartAnswer {
    /// The run's id.
    pub(super) id: Uuid,
    /// `running` for a new run (`pending` when it was given a start time); the state of the
    /// run holding the business key otherwise.
    pub(super) state: RunState,
    /// Whether a new run was created (`false`: the run holding the business key).
    pub(super) created: bool,
}

/// `GET /api/v1/runs`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct RunsAnswer {
    /// The runs, in the query's order.
    pub(super) runs: Vec<RunSummary>,
    /// Rows of this page that could not be decoded, each as its error in words.
    pub(super) damaged: Vec<String>,
    /// The cursor of the next page (`cursor=…`); `null` on the last.
    pub(super) next: Option<String>,
}

/// `GET /api/v1/runs/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct RunAnswer {
    /// The run.
    pub(super) run: Run,
    /// Its steps, while it is unfinished.
    pub(super) steps: Vec<Step>,
    /// Its history, oldest first.
    pub(super) history: Vec<HistoryEvent>,
    /// Its alerts, open and resolved.
    pub(super) alerts: Vec<Alert>,
}

/// `POST /api/v1/runs/{id}/actions/{action}`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ActionAnswer {
    /// The run.
    pub(super) id: Uuid,
    /// The action taken.
    #[schema(value_type = ActionSchema)]
    pub(super) action: OperatorAction,
    /// The run's state after it.
    pub(super) state: RunState,
}

/// `POST /api/v1/runs/actions/{action}`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct BulkAnswer {
    /// The action taken.
    #[schema(value_type = ActionSchema)]
    pub(super) action: OperatorAction,
    /// On how many runs it was taken.
    pub(super) done: usize,
    /// How many runs refused it (their state did not allow it).
    pub(super) refused: usize,
    /// One per run of the page, in the list's order.
    pub(super) results: Vec<BulkResult>,
    /// Rows of the page that could not be decoded: not acted on.
    pub(super) damaged: Vec<String>,
    /// The cursor of the next page of runs the filters select; `null` on the last.
    pub(super) next: Option<String>,
}

/// What an action did to one run of a bulk action.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct BulkResult {
    /// The run.
    pub(super) id: Uuid,
    /// Whether the action was taken.
    pub(super) ok: bool,
    /// The run's state after it, when it was taken.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) state: Option<RunState>,
    /// The status a single action would have answered, when it was refused (409 mostly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) status: Option<u16>,
    /// Why it was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<ErrorDetail>,
}

/// `GET /api/v1/alerts`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct AlertsAnswer {
    /// The open alerts, oldest first.
    pub(super) alerts: Vec<Alert>,
}

/// `POST /api/v1/alerts/{id}/resolve`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ResolveAnswer {
    /// The alert.
    pub(super) id: i64,
    /// Always `true`.
    pub(super) resolved: bool,
    /// Who resolved it, as stored in its `resolved_by`: `api:<token name>`.
    pub(super) actor: String,
    /// Why, as stored in its `resolution`.
    pub(super) reason: String,
}

/// `GET /api/v1/deliveries`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct DeliveriesAnswer {
    /// Deliveries of notices to sinks, most recently changed first.
    pub(super) deliveries: Vec<Delivery>,
}

/// `POST /api/v1/deliveries/{notice}/redeliver`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct RedeliverAnswer {
    /// The notice.
    pub(super) notice_id: i64,
    /// Always `true`: its dead deliveries are pending again.
    pub(super) redelivered: bool,
}

/// The data of a `state` event of `GET /api/v1/runs/{id}/events`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct RunStateEvent {
    /// The run.
    pub(super) run_id: Uuid,
    /// The state it is in now.
    pub(super) state: RunState,
}

/// `GET /api/v1/resources`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ResourcesAnswer {
    /// The remote resources the fleet's engines declared, by name: the limits in force, the
    /// code's defaults, the operator's override and the load now.
    pub(super) resources: Vec<ResourceView>,
}

/// `PUT` and `DELETE /api/v1/resources/{name}/limits`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct LimitsAnswer {
    /// The resource after the change.
    pub(super) resource: ResourceView,
    /// Who changed its limits: `api:<token name>`.
    pub(super) actor: String,
    /// Why.
    pub(super) reason: String,
}
