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
/// the `expected` shape when it is JSON of another shape ([`parse_body_objects`] with no
/// nested object).
pub(super) fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Json<Value>, JsonRejection>,
    expected: &str,
) -> Result<T, ApiError> {
    parse_body_objects(body, expected, &[])
}

/// Where a body carries the caller's own data, passed on untouched: a run's input, an
/// event's payload, a callback's output and its error's details.
const OPAQUE: [&str; 4] = ["/input", "/payload", "/ok", "/error/details"];

/// Past this magnitude a float no longer spells one integer exactly.
const WHOLE_FLOAT_MAX: f64 = 9_007_199_254_740_992.0;

/// [`parse_body`], read exactly as its JSON Schema in the OpenAPI document says:
///
/// - the body is an object, and so is each member at `objects` (JSON Pointers) when given and
///   not `null`: serde would read a struct from an array of its fields in order, which the
///   document does not allow;
/// - a number with no fraction (`2.0`) is the integer it equals, as JSON Schema has it,
///   outside the caller's own data ([`OPAQUE`]), which is passed on as sent.
pub(super) fn parse_body_objects<T: serde::de::DeserializeOwned>(
    body: Result<Json<Value>, JsonRejection>,
    expected: &str,
    objects: &[&str],
) -> Result<T, ApiError> {
    let Json(mut body) = body.map_err(|r| body_error(&r))?;
    let invalid = |e: &dyn std::fmt::Display| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("expected {expected}: {e}"),
        )
    };
    if !body.is_object() {
        return Err(invalid(&"the body is not a JSON object"));
    }
    for pointer in objects {
        if let Some(v) = body.pointer(pointer)
            && !(v.is_object() || v.is_null())
        {
            return Err(invalid(&format!("`{pointer}` is not a JSON object")));
        }
    }
    as_documented(&mut body, &mut String::new()).map_err(|at| {
        invalid(&format!(
            "`{at}` holds NUL (U+0000), which no text of the API may"
        ))
    })?;
    serde_json::from_value(body).map_err(|e| invalid(&e))
}

/// Turns each number of `v` (at the JSON Pointer `at`) with no fraction into the integer it
/// equals, outside [`OPAQUE`]; `Err` with the pointer of a string there that holds NUL,
/// which PostgreSQL cannot store in text (the caller's own data is stored as JSON, where it
/// is escaped).
fn as_documented(v: &mut Value, at: &mut String) -> Result<(), String> {
    if OPAQUE.contains(&at.as_str()) {
        return Ok(());
    }
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64())
                && f.fract() == 0.0
                && f.abs() <= WHOLE_FLOAT_MAX
            {
                // Exact: a whole float within 2^53 is an integer an i64 holds.
                *v = Value::from(f as i64);
            }
        }
        Value::String(text) if text.contains('\0') => return Err(at.clone()),
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let len = at.len();
                at.push('/');
                at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                as_documented(v, at)?;
                at.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter_mut().enumerate() {
                let len = at.len();
                at.push('/');
                at.push_str(&i.to_string());
                as_documented(v, at)?;
                at.truncate(len);
            }
        }
        _ => {}
    }
    Ok(())
}
