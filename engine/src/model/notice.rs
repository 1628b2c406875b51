//! Notices: what the outbox delivers to sinks — alerts, and the finish of a run whose start
//! asked to be told. A notice's body is the JSON text stored with it when the change it tells
//! of committed; every delivery sends exactly those bytes.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{Alert, Timestamp};
use crate::RunState;

/// What a notice tells of.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumString,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum NoticeTopic {
    /// An operator alert was raised.
    Alert,
    /// A run reached a final state (`completed`, `compensated`, `cancelled`), and its
    /// workflow or its start asked for a notification.
    RunFinished,
}

/// A run that finished, as a `run_finished` notice tells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunFinished {
    /// The run.
    pub id: Uuid,
    /// Its workflow.
    pub workflow: String,
    /// The workflow version it ran under.
    pub version: i32,
    /// Its business key, if it had one.
    pub business_key: Option<String>,
    /// The final state.
    pub state: RunState,
    /// The output (step outputs by step name) of a completed run.
    pub output: Option<Value>,
    /// The error envelope of a compensated or cancelled run.
    pub error: Option<Value>,
}

/// The JSON body of a notice, as delivered: `{"dedupe_id", "topic", "created_at", "alert"}`
/// or `{…, "run"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NoticeBody {
    /// The same for every delivery of this notice, to any sink: a receiver that sees it twice
    /// has seen the same notice twice.
    pub dedupe_id: String,
    /// What it tells of.
    pub topic: NoticeTopic,
    /// When the change it tells of committed (database clock).
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub created_at: Timestamp,
    /// The alert, for topic `alert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<Alert>,
    /// The run, for topic `run_finished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunFinished>,
}

/// One notice of the outbox, handed to a sink.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Notice {
    /// Its row in the outbox.
    pub id: i64,
    /// The same for every delivery of this notice (the body's `dedupe_id`).
    pub dedupe_id: String,
    /// What it tells of.
    pub topic: NoticeTopic,
    /// The JSON text to deliver (a [`NoticeBody`]).
    pub body: String,
}

impl Notice {
    /// A notice (for sinks' own tests and tools).
    pub fn new(id: i64, dedupe_id: String, topic: NoticeTopic, body: String) -> Self {
        Self {
            id,
            dedupe_id,
            topic,
            body,
        }
    }

    /// The body, decoded. `None` when it is not a [`NoticeBody`] (written by a newer
    /// version): a sink that only forwards the text does not need it.
    pub fn decoded(&self) -> Option<NoticeBody> {
        serde_json::from_str(&self.body).ok()
    }
}

/// Where one notice stands with one sink.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    strum::EnumString,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DeliveryState {
    /// Not delivered yet; tried again at `next_at`.
    Pending,
    /// The sink accepted it.
    Delivered,
    /// The sink refused it for good, or every try failed: dead-lettered. An operator can
    /// send it again.
    Dead,
}

/// How the outbox's notices stand with one sink: delivered, still to deliver, or given up
/// on. Notices every sink was finished with before this sink existed are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeliveryCounts {
    /// Notices the sink accepted.
    pub delivered: u64,
    /// Notices it has still to deliver: tried and failed for now, or not tried yet. The
    /// supervisor leader of whichever instance leads delivers them.
    pub pending: u64,
    /// Notices it gave up on (dead letters, which an operator can send again).
    pub dead: u64,
}

/// One notice's delivery to one sink, as the console and the command line show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// The notice's row in the outbox.
    pub notice_id: i64,
    /// The notice's dedupe id.
    pub dedupe_id: String,
    /// What the notice tells of.
    pub topic: NoticeTopic,
    /// The alert it carries, if any.
    pub alert_id: Option<i64>,
    /// The run it concerns, if any.
    pub run_id: Option<Uuid>,
    /// The sink's name.
    pub sink: String,
    /// Where it stands.
    pub state: DeliveryState,
    /// Tries so far.
    pub attempts: i32,
    /// The last failure, in words.
    pub last_error: Option<String>,
    /// When the notice was written (database clock).
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub created_at: Timestamp,
    /// When this delivery last changed.
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub updated_at: Timestamp,
}
