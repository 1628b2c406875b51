//! `GET /metrics`: the engine's metrics in the Prometheus text format, with the queue gauges
//! read from the database first.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AdminState;
use super::answers::ErrorBody;
use super::error::ApiError;

/// The content type of the Prometheus text format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Metrics in the Prometheus text format
///
/// Counters, histograms and gauges of the engine (see `docs/operations.md`, section
/// *Metrics*). The queue gauges are read from the database on each request. Answers 501
/// `metrics_not_installed` when the process did not install sagaflow's Prometheus recorder
/// (`sagaflow::metrics::install_prometheus`).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "metrics",
    responses(
        (status = 200, description = "The metrics, Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
        (status = 501, description = "`metrics_not_installed`: this process exports no Prometheus metrics", body = ErrorBody),
    ),
)]
pub(super) async fn metrics(State(s): State<AdminState>) -> Response {
    let Some(handle) = crate::metrics::prometheus_handle() else {
        return ApiError::metrics_not_installed().into_response();
    };
    if let Err(e) = s.engine.refresh_queue_gauges().await {
        // The counters are still worth a scrape; the queue gauges keep their last values.
        tracing::warn!(error = %e, "metrics: could not read the queue from the database");
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, TEXT_FORMAT)],
        handle.render(),
    )
        .into_response()
}
