//! The client a step body calls the [`EffectServer`](super::EffectServer) with.

use sagaflow::{StepContext, StepError};
use serde::Serialize;

use crate::services::http_client::Http;

/// Calls operations of an [`EffectServer`](super::EffectServer) and answers the way a saga
/// step needs. Cheap to clone.
///
/// # Examples
///
/// ```no_run
/// use sagaflow::{StepContext, StepError, Workflow};
/// use sagaflow_testkit::effects::EffectClient;
///
/// let hotels = EffectClient::new("http://127.0.0.1:4000");
/// let wf = Workflow::builder("trip", 1)
///     .step_using("hotel", hotels, |hotels, ctx: StepContext| async move {
///         let body = serde_json::json!({ "nights": 3 });
///         hotels.call_in(&ctx, "book_hotel", &body).await
///     })
///     .build();
/// assert!(wf.is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct EffectClient {
    http: Http,
}

impl EffectClient {
    /// A client of the server at `base_url` (e.g. [`EffectServer::base_url`](super::EffectServer::base_url)),
    /// with no request timeout: the step's deadline bounds each call.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::with_client(base_url, reqwest::Client::new())
    }

    /// Like [`new`](Self::new) with a caller-configured client (timeouts, pool...).
    pub fn with_client(base_url: impl Into<String>, client: reqwest::Client) -> Self {
        Self {
            http: Http::new(base_url, client),
        }
    }

    /// The base URL requests go to.
    pub fn base_url(&self) -> &str {
        self.http.base_url()
    }

    /// `POST /{operation}` with `key` as the idempotency key and `body` as JSON; the
    /// response body on a 2xx.
    ///
    /// # Errors
    /// The failure as a step outcome (see `From<ServiceError> for StepError`):
    /// - a refusal (409, 422 and other 4xx, such as the 400 of a missing key): terminal and
    ///   not applied, as [`StepError::refused`];
    /// - a 503, 408 or 429, or a connection that could not be made: retryable and not
    ///   applied;
    /// - a reset connection, a 502, a 504, a timeout or an unreadable answer: retryable with
    ///   an unknown outcome, so the step is compensated if the saga unwinds.
    pub async fn call<B: Serialize + ?Sized>(
        &self,
        key: &str,
        operation: &str,
        body: &B,
    ) -> Result<serde_json::Value, StepError> {
        let path = format!("/{operation}");
        Ok(self.http.post(&path, key, body).await?)
    }

    /// [`call`](Self::call) from a step attempt: the step's idempotency key, and its W3C
    /// trace context in the `traceparent` (and `tracestate`) headers, which the server
    /// records per call ([`EffectServer::calls`](super::EffectServer::calls)).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn call_in<B: Serialize + ?Sized>(
        &self,
        ctx: &StepContext,
        operation: &str,
        body: &B,
    ) -> Result<serde_json::Value, StepError> {
        let path = format!("/{operation}");
        let parent = ctx.trace_parent();
        let trace = Some((parent.as_str(), ctx.trace_state()));
        Ok(self
            .http
            .post_traced(&path, ctx.idempotency_key(), trace, body)
            .await?)
    }
}
