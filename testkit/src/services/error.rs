//! The error every simulated remote call can return.

use serde::{Deserialize, Serialize};

/// Why a remote call failed, and whether the remote may have acted.
///
/// Serialized as `{"kind": "transient" | "busy" | "permanent" | "conflict" | "transport" |
/// "lost_reply", "message": ...}`, which is also the JSON error body of the HTTP face.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum ServiceError {
    /// The remote failed this time without acting (HTTP 503, which these services document
    /// as "not processed", or a connection that was never made); a retry with the same
    /// idempotency key may succeed.
    #[error("transient remote failure: {0}")]
    Transient(String),
    /// The remote is overloaded and did not act (HTTP 429); retry after the delay it asked
    /// for, if any.
    #[error("remote busy: {message}")]
    Busy {
        /// What the remote said.
        message: String,
        /// Its `Retry-After`, in milliseconds.
        retry_after_ms: Option<u64>,
    },
    /// The remote refused the request before acting; retrying will not help (card declined,
    /// out of stock, a validation error: HTTP 422 and other 4xx).
    #[error("permanent remote failure: {0}")]
    Permanent(String),
    /// The remote refused because the request conflicts with its state, without acting
    /// (HTTP 409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// No usable answer (a reset after the request was sent, a 502 or 504 from a proxy, a
    /// timeout, an unreadable body): the remote may or may not have applied the effect.
    #[error("transport failure: {0}")]
    Transport(String),
    /// The simulated remote applied the effect and then lost its answer, the way the given
    /// kind of fault does. In-process callers see it as they would a [`ServiceError::Transport`];
    /// the HTTP face turns it into that fault on the wire.
    #[error("the effect was applied but the reply was lost ({0})")]
    LostReply(LostReply),
}

/// How an applied effect's reply gets lost on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReply {
    /// The connection is dropped without an answer.
    Reset,
    /// A proxy answers 502 Bad Gateway.
    BadGateway,
    /// A proxy answers 504 Gateway Timeout.
    GatewayTimeout,
}

impl std::fmt::Display for LostReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Reset => "connection reset",
            Self::BadGateway => "502 bad gateway",
            Self::GatewayTimeout => "504 gateway timeout",
        })
    }
}

impl ServiceError {
    /// Whether retrying the same call (same idempotency key) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transient(_) | Self::Busy { .. } | Self::Transport(_) | Self::LostReply(_) => {
                true
            }
            Self::Permanent(_) | Self::Conflict(_) => false,
        }
    }

    /// Whether the remote may have applied the effect (the answer does not say it did not).
    pub fn may_have_applied(&self) -> bool {
        matches!(self, Self::Transport(_) | Self::LostReply(_))
    }

    /// The error's message, whatever its kind.
    pub fn message(&self) -> String {
        match self {
            Self::Transient(m) | Self::Permanent(m) | Self::Conflict(m) | Self::Transport(m) => {
                m.clone()
            }
            Self::Busy { message, .. } => message.clone(),
            Self::LostReply(how) => how.to_string(),
        }
    }
}

/// A failed remote call as the outcome of a saga step, classified the way the engine needs
/// it: a refusal (`permanent`, `conflict`) is terminal and not applied, so the step is not
/// compensated; a 503 or 429 (`transient`, `busy`) is retried and was not applied (a
/// `Retry-After` travels in the details as `retry_after_ms`); a call without a usable answer
/// (`transport`: a reset, a 502 or 504, a timeout) is retried with its outcome unknown, so
/// the step is compensated if the saga unwinds.
impl From<ServiceError> for sagaflow::StepError {
    fn from(e: ServiceError) -> Self {
        let code = match &e {
            ServiceError::Transient(_) => "transient",
            ServiceError::Busy { .. } => "busy",
            ServiceError::Permanent(_) => "permanent",
            ServiceError::Conflict(_) => "conflict",
            ServiceError::Transport(_) | ServiceError::LostReply(_) => "transport",
        };
        let message = e.to_string();
        let mut err = if e.is_retryable() {
            Self::retryable(code, message)
        } else {
            Self::terminal_unknown(code, message)
        };
        if !e.may_have_applied() {
            err = err.not_applied();
        }
        match e {
            ServiceError::Busy {
                retry_after_ms: Some(ms),
                ..
            } => err.with_details(serde_json::json!({ "retry_after_ms": ms })),
            _ => err,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classification() {
        assert!(ServiceError::Transient("x".into()).is_retryable());
        assert!(ServiceError::Transport("x".into()).is_retryable());
        assert!(ServiceError::LostReply(LostReply::Reset).is_retryable());
        assert!(!ServiceError::Permanent("x".into()).is_retryable());
        assert!(!ServiceError::Conflict("x".into()).is_retryable());
    }

    #[test]
    fn only_unanswered_calls_may_have_applied() {
        assert!(ServiceError::Transport("x".into()).may_have_applied());
        assert!(ServiceError::LostReply(LostReply::BadGateway).may_have_applied());
        for not in [
            ServiceError::Transient("x".into()),
            ServiceError::Permanent("x".into()),
            ServiceError::Conflict("x".into()),
            ServiceError::Busy {
                message: "x".into(),
                retry_after_ms: Some(1000),
            },
        ] {
            assert!(!not.may_have_applied(), "{not:?}");
        }
    }

    #[test]
    fn step_outcomes_follow_the_classification() {
        use sagaflow::StepError;
        let refused = StepError::from(ServiceError::Conflict("x".into()));
        assert!(!refused.retryable && !refused.may_have_applied());
        let busy = StepError::from(ServiceError::Busy {
            message: "x".into(),
            retry_after_ms: Some(2000),
        });
        assert!(busy.retryable && !busy.may_have_applied());
        assert_eq!(
            busy.details,
            Some(serde_json::json!({ "retry_after_ms": 2000 }))
        );
        let lost = StepError::from(ServiceError::LostReply(LostReply::Reset));
        assert!(lost.retryable && lost.may_have_applied());
        assert_eq!(lost.code, "transport");
    }

    #[test]
    fn json_shape() -> Result<(), serde_json::Error> {
        let err = ServiceError::Permanent("card declined".into());
        let json = serde_json::to_value(&err)?;
        assert_eq!(
            json,
            serde_json::json!({"kind": "permanent", "message": "card declined"})
        );
        let back: ServiceError = serde_json::from_value(json)?;
        assert_eq!(back, err);
        Ok(())
    }
}
