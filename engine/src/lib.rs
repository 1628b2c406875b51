//! The sagaflow engine: shared vocabulary (states, definitions, the agent protocol), the
//! storage seam, the planner and the scheduler.
//!
//! Applications depend on the `sagaflow` crate, which wires this engine together with the
//! agents and the supervisor; this crate is what those parts share.
//!
//! # Layers
//!
//! The modules sit in six layers; a module uses its own layer and those below, never one
//! above (`tests/layers.rs` checks every import, with no exception):
//!
//! 0. nouns: [`state`](crate::RunState) and step counters, the [operator's
//!    actions](crate::OperatorAction), errors, [`clock`], [`crash`] and
//!    [`interleave`] points, [`cron`], [`trace`] context, [`resource`] windows, the
//!    [`rows`] units of work read, and the read model ([`Run`], [`Step`], [`HistoryEvent`],
//!    [`Alert`], [`Notice`]);
//! 1. [`definition`]s, the agent [`protocol`] with its outcomes ([`StepError`]) and [`wait`]
//!    types; a step reaches the engine only through the services its context carries;
//! 2. the pure [`transition`]s and their write intents ([`transition::writes`]);
//! 3. the [`store`]: SQL only; a unit of work's commit returns what it did
//!    ([`store::Happened`]);
//! 4. [`metrics`] (recording what a commit returned) and [`signals`];
//! 5. the use cases, the only code that commits a unit of work: the [`scheduler`], the
//!    [`operator`] actions, the [`migration`] of runs between versions, the [`deliver`]ies
//!    to parked steps and the [`rescue`] of lost attempts.

mod action;
mod error;
mod model;
mod outcome;
mod state;

pub mod clock;
pub mod crash;
pub mod cron;
pub mod definition;
pub mod deliver;
pub mod interleave;
pub mod metrics;
pub mod migration;
pub mod operator;
pub mod protocol;
pub mod rescue;
pub mod resource;
pub mod rows;
pub mod scheduler;
pub mod signals;
pub mod store;
pub mod trace;
pub mod transition;
pub mod wait;

pub use action::OperatorAction;
pub use clock::Timestamp;
pub use definition::{
    BacklogAlert, DeadlinePolicy, FieldError, KeyPolicy, OnFailure, PRIORITY_MAX, PRIORITY_MIN,
    PROGRESS_MAX_BYTES, PROGRESS_MIN_INTERVAL, Registry, RetryLane, RetryPolicy, StepAction,
    StepContext, StepDescription, StepKind, StepSettings, Workflow, WorkflowBuilder,
    WorkflowDescription, workflow_key,
};
pub use error::{DbError, Error, Result, StartOption};
pub use model::{
    Alert, AlertKind, Attempts, Delivery, DeliveryCounts, DeliveryState, EntityState, HistoryEvent,
    HistoryKind, KeptStep, Notice, NoticeBody, NoticeTopic, RESOLVED_BY_ENGINE, Run, RunCounts,
    RunFinished, Step, Undo, UndoOutcome, UndoPreview, UndoStep,
};
pub use outcome::{Outcome, StepError};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use signals::{
    ChannelSink, DeliveryError, DeliveryPolicy, LogSink, NoticeSink, RunEvent, Signals,
};
pub use state::{RunState, StepState};
pub use store::{Backend, RunRow, StepRow, Store};
