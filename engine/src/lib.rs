//! The sagaflow engine: shared vocabulary (states, definitions, the agent protocol), the
//! storage seam, the planner and the scheduler.
//!
//! Applications depend on the `sagaflow` crate, which wires this engine together with the
//! agents and the supervisor; this crate is what those parts share.

mod error;
mod model;
mod outcome;
mod state;

pub mod clock;
pub mod crash;
pub mod cron;
pub mod definition;
pub mod interleave;
pub mod metrics;
pub mod migration;
pub mod operator;
pub mod protocol;
pub mod resource;
pub mod scheduler;
pub mod signals;
pub mod store;
pub mod trace;
pub mod transition;
pub mod wait;

pub use clock::Timestamp;
pub use definition::{
    BacklogAlert, DeadlinePolicy, FieldError, KeyPolicy, OnFailure, PRIORITY_MAX, PRIORITY_MIN,
    Registry, RetryLane, RetryPolicy, StepAction, StepContext, StepDescription, StepKind,
    StepSettings, Workflow, WorkflowBuilder, WorkflowDescription, workflow_key,
};
pub use error::{Error, Result, StartOption};
pub use model::{
    Alert, AlertKind, Attempts, Delivery, DeliveryCounts, DeliveryState, EntityState, HistoryEvent,
    HistoryKind, Notice, NoticeBody, NoticeTopic, RESOLVED_BY_ENGINE, Run, RunCounts, RunFinished,
    Step,
};
pub use outcome::{Outcome, StepError};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use signals::{
    AlertSink, ChannelSink, DeliveryError, DeliveryPolicy, LogSink, RunEvent, Signals,
};
pub use state::{RunState, StepState};
pub use store::{Backend, RunRow, StepRow, Store};
