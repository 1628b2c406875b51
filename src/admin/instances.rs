//! `/api/v1/instances`: the fleet's engine instances and what each of them runs.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::AdminState;
use super::answers::{ErrorBody, json};
use super::error::ApiError;
use crate::InstanceInfo;

/// `GET /api/v1/instances`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct InstancesAnswer {
    /// The engine instances registered on the database, by id: whether each is live, and
    /// the `name@version` keys of the workflows it runs.
    pub(super) instances: Vec<InstanceInfo>,
}

/// The engine instances
///
/// Every engine instance with workers registered on the database, by id: when it started,
/// how long it has been silent, whether it counts as live, and the workflows it runs
/// (registered at its start or since, while it runs).
#[utoipa::path(
    get,
    path = "/api/v1/instances",
    tag = "instances",
    responses(
        (status = 200, description = "The instances, by id", body = InstancesAnswer),
        (status = 503, description = "`unavailable` or `shutdown`: the engine could not answer", body = ErrorBody),
    ),
)]
pub(super) async fn instances(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let instances = s.engine.instances().await?;
    Ok(json(&InstancesAnswer { instances }))
}
