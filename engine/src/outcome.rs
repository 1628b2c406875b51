//! The outcome envelope of a failed step attempt.
//!
//! Any error is retryable by default; a step opts into a terminal failure with
//! [`StepError::terminal`]. The envelope is what is stored with the step and sent back over the
//! agent response channel.

use serde::{Deserialize, Serialize};

/// A failed step attempt, as stored and as sent back from an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct StepError {
    /// Short machine-readable code, e.g. `transient`, `declined`, `timeout`, `panic`.
    pub code: String,
    /// Human-readable message.
    pub message: String,
    /// Whether another attempt may succeed.
    pub retryable: bool,
    /// Optional structured details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl StepError {
    /// A retryable failure (the default for any error).
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            retryable: true,
            details: None,
        }
    }

    /// A terminal failure: retrying will not help, the saga compensates.
    pub fn terminal(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            retryable: false,
            details: None,
        }
    }

    /// Attaches structured details.
    #[must_use]
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The envelope recorded when the supervisor finds a step past its deadline.
    pub fn timeout(deadline_ms: i64) -> Self {
        Self::retryable(
            "timeout",
            format!("no result within the deadline of {deadline_ms} ms"),
        )
    }

    /// The stored JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| format!("{{\"code\":\"{}\"}}", self.code))
    }
}

impl From<serde_json::Error> for StepError {
    fn from(e: serde_json::Error) -> Self {
        Self::terminal("serde", e.to_string())
    }
}
