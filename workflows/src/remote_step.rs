//! Remote calls inside saga steps, shared by the order and travel sagas: a failed call as a
//! step outcome, and how a compensation learns what its forward step did.

use std::future::Future;

use sagaflow::{StepContext, StepError};
use serde::de::DeserializeOwned;

use sagaflow_testkit::services::ServiceError;

/// A remote failure as a step outcome. The simulated services document that a refusal
/// (HTTP 4xx), a 429 and a 503 are answered before anything is applied: those are *not
/// applied*. A call without a usable answer (a reset, a 502 or 504, a timeout) may hide an
/// applied effect: its outcome stays unknown, so the step's compensation runs if the saga
/// unwinds. A `Retry-After` travels in the error's details.
pub(crate) fn step_error(e: ServiceError) -> StepError {
    StepError::from(e)
}

/// In a compensation: what the forward step produced, or `None` when it applied nothing.
///
/// A step that completed left its output. A step whose outcome is unknown (an attempt timed
/// out or lost its reply) left none: then `replay` repeats the forward call under the key it
/// is given, `ctx.forward_idempotency_key()`, which returns what was applied without
/// applying it twice, or applies it now so that the compensation undoes it right after. A
/// refusal means nothing was applied, so there is nothing to undo; any other failure fails
/// the compensation, to be retried.
///
/// # Errors
/// The replay's failure, as a step outcome.
pub async fn forward_output<T, F, Fut>(ctx: &StepContext, replay: F) -> Result<Option<T>, StepError>
where
    T: DeserializeOwned,
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<T, ServiceError>>,
{
    if let Ok(output) = ctx.output() {
        return Ok(Some(output));
    }
    match replay(ctx.forward_idempotency_key().to_owned()).await {
        Ok(output) => Ok(Some(output)),
        Err(e) if !e.may_have_applied() && !e.is_retryable() => Ok(None),
        Err(e) => Err(step_error(e)),
    }
}
