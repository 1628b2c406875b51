//! A business refusal answered by an operation's handler.

use crate::services::ServiceError;

/// A handler's business "no": the remote refuses the request before acting, so nothing is
/// applied and nothing is recorded. A client sees it as a refused, not-applied step
/// ([`StepError::refused`](sagaflow::StepError::refused)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The request is refused on its merits (sold out, declined, invalid): HTTP 422.
    #[error("refused: {0}")]
    Rejected(String),
    /// The request conflicts with the remote's state (already cancelled, say): HTTP 409.
    #[error("conflict: {0}")]
    Conflict(String),
}

impl Refusal {
    /// A refusal on the request's merits (HTTP 422).
    pub fn rejected(reason: impl Into<String>) -> Self {
        Self::Rejected(reason.into())
    }

    /// A refusal because the request conflicts with the remote's state (HTTP 409).
    pub fn conflict(reason: impl Into<String>) -> Self {
        Self::Conflict(reason.into())
    }
}

impl From<Refusal> for ServiceError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Rejected(reason) => ServiceError::Permanent(reason),
            Refusal::Conflict(reason) => ServiceError::Conflict(reason),
        }
    }
}
