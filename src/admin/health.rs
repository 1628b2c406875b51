//! `GET /healthz`: whether the engine runs, for load balancers and orchestrators.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::AdminState;
use super::answers::{HealthAnswer, json};
use crate::Health;

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
pub(super) async fn healthz(State(s): State<AdminState>) -> Response {
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
