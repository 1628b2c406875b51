//! The error every simulated remote call can return.

use serde::{Deserialize, Serialize};

/// Why a remote call failed.
///
/// Serialized as `{"kind": "transient" | "permanent" | "transport", "message": "..."}`,
/// which is also the JSON error body of the HTTP face.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "message", rename_all = "snake_case")]
pub enum ServiceError {
    /// The remote failed this time; a retry (with the same idempotency key) may succeed.
    #[error("transient remote failure: {0}")]
    Transient(String),
    /// The remote refused the request; retrying will not help (card declined, out of stock...).
    #[error("permanent remote failure: {0}")]
    Permanent(String),
    /// The HTTP client could not get an answer (connect error, timeout, bad response).
    /// Treat as transient: the remote may or may not have applied the effect.
    #[error("transport failure: {0}")]
    Transport(String),
}

impl ServiceError {
    /// Whether retrying the same call (same idempotency key) may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transient(_) | Self::Transport(_) => true,
            Self::Permanent(_) => false,
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
        assert!(!ServiceError::Permanent("x".into()).is_retryable());
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
