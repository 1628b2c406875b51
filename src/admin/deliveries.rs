//! Deliveries of notices to the sinks (`GET /api/v1/deliveries`) and sending a
//! dead-lettered notice again (`POST /api/v1/deliveries/{id}/redeliver`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::Value;

use super::AdminState;
use super::alerts::integer_id;
use super::answers::{DeliveriesAnswer, ErrorBody, RedeliverAnswer, json};
use super::auth::{Caller, Role};
use super::error::ApiError;

/// The parameters of `GET /api/v1/deliveries`.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct DeliveryParams {
    /// `pending`, `delivered` or `dead` (the dead letters); all when left out (or empty).
    #[param(value_type = Option<crate::DeliveryState>)]
    state: Option<String>,
    /// At most this many (default 100, at most 500).
    #[param(minimum = 1, maximum = 500)]
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
pub(super) async fn deliveries(
    State(s): State<AdminState>,
    params: Result<Query<DeliveryParams>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(params) = params.map_err(ApiError::invalid_query)?;
    let state = params
        .state
        .as_deref()
        .filter(|v| !v.is_empty())
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
    let limit = super::runs::in_range("limit", params.limit.unwrap_or(100), 1, 500)?;
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
pub(super) async fn redeliver(
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
