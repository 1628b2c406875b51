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
//! A third answer is neither success nor failure: [`StepError::try_again_after`], the remote's
//! "come back after this delay; nothing was done" (an HTTP 429 or 503 with `Retry-After`). The
//! engine then queues the step again after that delay without counting a failure: a
//! *deferral*.
//!
//! The envelope is what is stored with the step and sent back over the agent response channel.

use std::time::Duration;

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
    /// The remote acted: it answered success, but the answer could not be used (a 2xx body
    /// that does not decode). The engine treats it as [`Outcome::Unknown`] (the step becomes
    /// *maybe applied* and is compensated if the run unwinds); the stored envelope says what
    /// is known.
    Applied,
}

impl Outcome {
    /// The stored spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::NotApplied => "not_applied",
            Self::Applied => "applied",
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
    /// The delay the remote asked for before the next attempt, in milliseconds: set by
    /// [`StepError::try_again_after`]. In a stored envelope it is the delay the engine applied
    /// (capped by the step's [`RetryPolicy`](crate::RetryPolicy)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Not a failure but a park: the step waits (for a timer, an event, a callback, a child
    /// run). Built by [`StepContext::await_callback`](crate::StepContext::await_callback) and
    /// by the engine's waiting steps; see [`crate::wait`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Box<crate::wait::WaitRequest>>,
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
            retry_after_ms: None,
            wait: None,
        }
    }

    /// A deferral, not a failure: the remote asked to be called again after `delay`, and
    /// nothing was applied (an HTTP 429 or 503 with `Retry-After`, a service's "busy, come
    /// back later"). The engine queues the step again `delay` later on the database clock,
    /// without counting a failure or applying the retry backoff, and records a `deferred`
    /// history event. The delay is capped by [`RetryPolicy::max_deferral_delay`] (1 hour by
    /// default), and a step is deferred at most while its attempt number within the phase is
    /// at most [`RetryPolicy::max_deferrals`] (100 by default); past that the deferral is an
    /// ordinary retryable failure, so a remote that always answers "later" cannot hold a run
    /// forever.
    ///
    /// The error is retryable with outcome [`Outcome::NotApplied`]. Changing either (with
    /// [`StepError::with_outcome`], or by setting `retryable`) makes it an ordinary failure:
    /// only a request that did nothing can be deferred for free.
    ///
    /// [`RetryPolicy::max_deferral_delay`]: crate::RetryPolicy::max_deferral_delay
    /// [`RetryPolicy::max_deferrals`]: crate::RetryPolicy::max_deferrals
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sagaflow_engine::StepError;
    ///
    /// let e = StepError::try_again_after("busy", "payments answered 429", Duration::from_secs(2));
    /// assert!(e.is_deferral());
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    /// assert!(!e.may_have_applied());
    /// ```
    pub fn try_again_after(
        code: impl Into<String>,
        message: impl Into<String>,
        delay: Duration,
    ) -> Self {
        Self {
            retry_after_ms: Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            ..Self::retryable(code, message).not_applied()
        }
    }

    /// The delay the remote asked for, if any (see [`StepError::try_again_after`]).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }

    /// Whether the error is a park: the step asked to wait ([`crate::wait`]).
    pub fn is_park(&self) -> bool {
        self.wait.is_some()
    }

    /// Whether the engine defers the step instead of counting a failure: a retryable error
    /// that applied nothing and carries a delay ([`StepError::try_again_after`]).
    pub fn is_deferral(&self) -> bool {
        self.retryable && self.outcome == Outcome::NotApplied && self.retry_after_ms.is_some()
    }

    /// A terminal failure whose effect may have happened: retrying will not help, and the
    /// outcome is [`Outcome::Unknown`] (the remote may have acted). Before a pivot the saga
    /// compensates, the step included when it has a compensation; a pivot that ends this way
    /// stops its run in `error` for an operator, since the engine cannot tell whether the
    /// point of no return was passed. Use [`StepError::refused`] when the remote acted on
    /// nothing (a declined card, a validation error).
    pub fn terminal_unknown(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            retryable: false,
            ..Self::retryable(code, message)
        }
    }

    /// The former name of [`StepError::terminal_unknown`], whose outcome the name did not
    /// say: a saga that returned `terminal("declined", …)` for a refusal stops its pivot in
    /// `error`, where [`StepError::refused`] compensates.
    #[deprecated(
        since = "0.2.0",
        note = "say the outcome: `StepError::refused` when the remote acted on nothing, \
                `StepError::terminal_unknown` when it may have"
    )]
    pub fn terminal(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::terminal_unknown(code, message)
    }

    /// A terminal failure that definitely did not apply the effect: the remote refused
    /// before acting (card declined, out of stock, a validation error).
    pub fn refused(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::terminal_unknown(code, message).not_applied()
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

    /// Whether the effect may have happened (or did): the outcome is not
    /// [`Outcome::NotApplied`].
    pub fn may_have_applied(&self) -> bool {
        self.outcome != Outcome::NotApplied
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
        Self::terminal_unknown("serde", e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unclassified_errors_may_have_applied() {
        assert!(StepError::retryable("x", "y").may_have_applied());
        assert!(StepError::terminal_unknown("x", "y").may_have_applied());
        assert!(!StepError::refused("x", "y").may_have_applied());
        assert!(!StepError::refused("x", "y").retryable);
        assert!(
            !StepError::retryable("x", "y")
                .not_applied()
                .may_have_applied()
        );
    }

    #[test]
    fn only_a_retryable_not_applied_error_with_a_delay_is_a_deferral() {
        let d = StepError::try_again_after("busy", "later", Duration::from_millis(1500));
        assert!(d.is_deferral() && d.retryable && !d.may_have_applied());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1500)));
        assert!(!d.clone().with_outcome(Outcome::Unknown).is_deferral());
        let terminal = StepError {
            retryable: false,
            ..d.clone()
        };
        assert!(!terminal.is_deferral());
        assert!(!StepError::retryable("x", "y").not_applied().is_deferral());
        let round: StepError = serde_json::from_str(&d.to_json()).expect("round trip");
        assert_eq!(round, d);
        assert!(
            !StepError::refused("a", "b")
                .to_json()
                .contains("retry_after"),
            "absent unless set"
        );
        let huge = StepError::try_again_after("busy", "later", Duration::MAX);
        assert_eq!(huge.retry_after_ms, Some(u64::MAX));
    }

    #[test]
    fn an_applied_outcome_may_have_applied() {
        let e = StepError::terminal_unknown("bad_reply", "x").with_outcome(Outcome::Applied);
        assert!(e.may_have_applied());
        assert!(e.to_json().contains(r#""outcome":"applied""#));
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
