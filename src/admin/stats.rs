//! `GET /api/v1/stats`: the queue and recent throughput.

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use super::AdminState;
use super::answers::{ErrorBody, json};
use super::error::ApiError;
use crate::Stats;

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
pub(super) async fn stats(State(s): State<AdminState>) -> Result<Json<Value>, ApiError> {
    let stats = s.engine.stats().await?;
    Ok(json(&stats))
}
