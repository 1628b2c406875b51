//! The API's error answer, `{"error": {"code", "message"}}` with its status, the engine's
//! errors mapped to it, and the errors of reading a request's body.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sagaflow_engine::{Error, FieldError};
use serde_json::Value;

use super::answers::{ErrorBody, ErrorDetail, json};
use super::auth::Role;

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

    /// The same error, pointing at where the input is wrong.
    pub(super) fn with_fields(mut self, fields: Vec<FieldError>) -> Self {
        self.fields = Some(fields);
        self
    }

    /// The message, for people.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// Its status and the body's `error`.
    pub(super) fn into_parts(self) -> (StatusCode, ErrorDetail) {
        let detail = ErrorDetail {
            code: self.code,
            message: self.message,
            fields: self.fields,
        };
        (self.status, detail)
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
        let (status, error) = self.into_parts();
        (status, json(&ErrorBody { error })).into_response()
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
                let err = Self::new(S::BAD_REQUEST, "invalid_input", e.to_string());
                match field {
                    Some(f) => err.with_fields(vec![f.clone()]),
                    None => err,
                }
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
