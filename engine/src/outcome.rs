//! The outcome envelope of a failed step attempt.
//!
//! A failed attempt answers two questions, and they are separate:
//!
//! - **Will another attempt help?** Any error is retryable by default; a step opts into a
//!   terminal failure with [`StepError::terminal`].
//! - **Did the effect happen?** An error does not say by itself whether the remote side acted
//!   before it failed: a connection reset after the request was sent, a 502 or 504 from a
//!   proxy, or a client timeout all leave the effect possibly applied. So the default
//!   [`Outcome`] is [`Outcome::Unknown`], and only an error the author classified as
//!   [`Outcome::NotApplied`] (a validation error, a refusal before acting, a local
//!   precondition) lets the engine skip the step's compensation. An unclassified error can
//!   cost an unneeded compensation call; it can never leave an applied effect un-compensated.
//!
//! The envelope is what is stored with the step and sent back over the agent response channel.

use serde::{Deserialize, Serialize};

/// Whether a failed attempt's effect may have taken place at the remote side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The request may have reached the remote and acted (transport error after sending,
    /// timeout, 5xx, a panic inside the step, an error nobody classified). The step becomes
    /// *maybe applied* for the rest of the run: if the run compensates, the step's
    /// compensation runs. The default.
    #[default]
    Unknown,
    /// The remote definitely did not act: it refused before doing anything (validation
    /// error, 409, a 429/503 that the remote documents as "not processed"), or the step
    /// failed before sending (a local precondition). A step whose attempts were all
    /// `NotApplied` is not compensated.
    NotApplied,
}

impl Outcome {
    /// The stored spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::NotApplied => "not_applied",
        }
    }
}

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
    /// Whether the effect may have happened. Envelopes stored before this field existed read
    /// as [`Outcome::Unknown`].
    #[serde(default)]
    pub outcome: Outcome,
    /// Optional structured details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl StepError {
    /// A retryable failure whose effect may have happened (the default for any error).
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            retryable: true,
            outcome: Outcome::Unknown,
            details: None,
        }
    }

    /// A terminal failure: retrying will not help, the saga compensates. Its outcome is
    /// [`Outcome::Unknown`] unless marked with [`StepError::not_applied`]: use
    /// [`StepError::refused`] for a remote's refusal.
    pub fn terminal(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            retryable: false,
            ..Self::retryable(code, message)
        }
    }

    /// A terminal failure that definitely did not apply the effect: the remote refused
    /// before acting (card declined, out of stock, a validation error).
    pub fn refused(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::terminal(code, message).not_applied()
    }

    /// Marks the failure as definitely not applied (see [`Outcome::NotApplied`]).
    #[must_use]
    pub fn not_applied(self) -> Self {
        self.with_outcome(Outcome::NotApplied)
    }

    /// Sets the outcome.
    #[must_use]
    pub fn with_outcome(mut self, outcome: Outcome) -> Self {
        self.outcome = outcome;
        self
    }

    /// Attaches structured details.
    #[must_use]
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    /// Whether the effect may have happened.
    pub fn may_have_applied(&self) -> bool {
        self.outcome == Outcome::Unknown
    }

    /// The envelope recorded when the supervisor finds a step past its deadline (its owner
    /// alive): the attempt may have acted.
    pub fn timeout(deadline_ms: i64) -> Self {
        Self::retryable(
            "timeout",
            format!("no result within the deadline of {deadline_ms} ms"),
        )
    }

    /// The envelope recorded when an attempt was lost with its engine instance (a crash, a
    /// frozen process, a shutdown): an interruption, not a failure. The attempt may have
    /// acted.
    pub fn interrupted(owner: &str, why: &str) -> Self {
        Self::retryable(
            "interrupted",
            format!("the attempt was lost with engine instance `{owner}` ({why})"),
        )
    }

    /// The code of a failure that is not the step's: the data the attempt needed could not
    /// be decoded (a damaged row, or stored JSON that no longer matches the workflow's types).
    /// Nothing was called; the run is set aside for an operator instead of compensated.
    pub const CORRUPT_ROW: &'static str = "corrupt_row";

    /// The data the attempt needed could not be decoded: `table`, `row` and `reason` (which
    /// names the column and the offending value) say what. See [`StepError::CORRUPT_ROW`].
    pub fn corrupt_row(table: &str, row: impl ToString, reason: impl Into<String>) -> Self {
        Self::refused(Self::CORRUPT_ROW, reason).with_details(serde_json::json!({
            "table": table,
            "row": row.to_string(),
        }))
    }

    /// Whether this is a [`StepError::CORRUPT_ROW`] report rather than a failure of the step.
    pub fn is_corrupt_row(&self) -> bool {
        self.code == Self::CORRUPT_ROW && self.outcome == Outcome::NotApplied
    }

    /// The stored JSON form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self)
            .unwrap_or_else(|_| serde_json::json!({ "code": self.code }).to_string())
    }
}

/// A JSON error raised inside a step. Its outcome is unknown: it may come from serialising
/// the output of a call that already acted.
impl From<serde_json::Error> for StepError {
    fn from(e: serde_json::Error) -> Self {
        Self::terminal("serde", e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unclassified_errors_may_have_applied() {
        assert!(StepError::retryable("x", "y").may_have_applied());
        assert!(StepError::terminal("x", "y").may_have_applied());
        assert!(!StepError::refused("x", "y").may_have_applied());
        assert!(!StepError::refused("x", "y").retryable);
        assert!(
            !StepError::retryable("x", "y")
                .not_applied()
                .may_have_applied()
        );
    }

    #[test]
    fn envelopes_without_an_outcome_read_as_unknown() {
        let old: StepError =
            serde_json::from_str(r#"{"code":"declined","message":"no","retryable":false}"#)
                .expect("old envelope");
        assert_eq!(old.outcome, Outcome::Unknown);
        let round: StepError =
            serde_json::from_str(&StepError::refused("a", "b").to_json()).expect("round trip");
        assert_eq!(round.outcome, Outcome::NotApplied);
    }
}
