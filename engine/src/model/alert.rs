//! Operator alerts as applications receive them: a typed kind, the reason in words, the
//! attempts of the failed phase and the actions an operator can take.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Timestamp;

/// What an alert is about.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    strum::EnumString,
    strum::AsRefStr,
    strum::Display,
    strum::EnumIter,
)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum AlertKind {
    /// A run stopped in `Error`: a compensation failed, a step failed after the pivot, a
    /// retriable step failed for good, or the pivot may have taken effect.
    RunError,
    /// A step failed and the run's workflow pauses instead of compensating: the run waits
    /// in `Paused` for an operator to resume or compensate it.
    RunPaused,
    /// A step was interrupted more often than its cap allows (it may crash its process).
    PoisonStep,
    /// Runs of a workflow version no engine instance registers are waiting.
    UnknownVersion,
    /// A row could not be decoded; its run is set aside until an operator repairs it.
    CorruptRow,
    /// No supervisor has completed a sweep for too long.
    SupervisorStalled,
    /// An engine started with another step graph or other policies under a workflow version
    /// that has unfinished runs.
    DefinitionChanged,
    /// A sink gave up on a notice (a webhook that kept failing, or refused it): the notice
    /// is dead-lettered until an operator sends it again.
    DeliveryDeadLettered,
    /// A workflow's queue grew past its threshold: more due steps, or an older due step,
    /// than its backlog alert allows.
    BacklogGrowing,
    /// A remote resource's circuit breaker has stayed open (or half-open) longer than its
    /// policy allows: its steps wait.
    BreakerOpen,
    /// Steps of a workflow version are due and no live engine instance runs it (none has it
    /// registered): they wait, and its runs with them, until one registers it.
    NoInstanceForWorkflow,
    /// More than one server of the database's cluster accepts writes (a standby promoted
    /// while its primary still runs): the engines follow the newest timeline, and what the
    /// others accept is on no other server until they are fenced.
    SplitBrain,
    /// A kind this version does not know (raised by a newer one).
    #[strum(default)]
    Other(String),
}

impl AlertKind {
    /// The kind stored under `name` (`Other(name)` when this version does not know it).
    pub fn named(name: &str) -> Self {
        name.parse()
            .unwrap_or_else(|_| Self::Other(name.to_owned()))
    }
}

/// Stored and sent as its name; a name this version does not know reads as `Other(name)`.
impl Serialize for AlertKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_ref())
    }
}

impl<'de> Deserialize<'de> for AlertKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Ok(Self::named(&name))
    }
}

/// A string: the names of the known kinds, or a name a newer version raised.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for AlertKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use strum::IntoEnumIterator as _;
        let known: Vec<String> = AlertKind::iter()
            .filter(|k| !matches!(k, AlertKind::Other(_)))
            .map(|k| k.to_string())
            .collect();
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(format!(
                "What the alert is about: {}; or a kind raised by a newer version",
                known.join(", ")
            )))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for AlertKind {}

/// An operator alert, stored before it is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Alert {
    /// Alert id.
    pub id: i64,
    /// The run concerned, if any.
    pub run_id: Option<Uuid>,
    /// The step concerned, if any.
    pub step: Option<String>,
    /// What it is about.
    pub kind: AlertKind,
    /// What happened, in words.
    pub reason: String,
    /// Attempts the step made in the phase that failed (forward or compensation); 0 when the
    /// alert names no step.
    pub attempts: i32,
    /// What the operator can do.
    pub actions: Vec<String>,
    /// When it was raised (database clock).
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub created_at: Timestamp,
    /// When it was resolved.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub resolved_at: Option<Timestamp>,
    /// Who resolved it: the operator's actor (`cli:<name>`, `api:<token name>`,
    /// `console:<token name>`, or the actor given to `Operator::on_behalf_of`; `operator`
    /// by default), or [`RESOLVED_BY_ENGINE`] when its cause went away by itself. `None`
    /// while it is open, and for alerts resolved before this was recorded.
    pub resolved_by: Option<String>,
    /// Why it was resolved: the operator's reason (for an action on its run, the action and
    /// its reason, such as `resume: card service is back`), or what went away.
    pub resolution: Option<String>,
}

/// The [`Alert::resolved_by`] of an alert the engine resolved itself, its cause gone (a
/// supervisor sweeping again, a backlog drained, a sink delivering again).
pub const RESOLVED_BY_ENGINE: &str = "engine";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_stored_in_snake_case_and_unknown_ones_are_kept() {
        assert_eq!(
            AlertKind::SupervisorStalled.to_string(),
            "supervisor_stalled"
        );
        assert_eq!(
            "from_the_future".parse::<AlertKind>().ok(),
            Some(AlertKind::Other("from_the_future".into()))
        );
    }
}
