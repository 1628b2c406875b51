//! `GET /api/v1/definitions`: the workflow definitions the engines published.

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use super::AdminState;
use super::answers::{DefinitionsAnswer, ErrorBody, json};
use super::error::ApiError;

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
pub(super) async fn definitions(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let definitions = s.engine.definitions().await?;
    Ok(json(&DefinitionsAnswer { definitions }))
}
