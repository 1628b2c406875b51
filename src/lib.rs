//! # sagaflow
//!
//! Durable sagas for Rust services, on the Scheduler-Agent-Supervisor pattern.
//!
//! Define a business process as a graph of steps, each with an optional compensation; start
//! runs of it on an embedded SQLite file or on PostgreSQL; sagaflow runs every accepted run to
//! **Completed**, undoes it to **Compensated**, or stops it in **Error** with an operator
//! alert — through retries, hung remote calls, permanent failures and crashes.
//!
//! - The **scheduler** claims due steps in batches (one atomic statement), keeps per-step state
//!   (`NotStarted`, `Running` with a `CompleteBy` deadline, `Completed`, `Failed`, and the
//!   compensation states) and advances runs.
//! - **Agents** run each attempt against its remote service with a stable idempotency key,
//!   and go silent when the deadline passes.
//! - The **supervisor** (one leader at a time) re-queues timed-out steps with a longer
//!   deadline, or fails them at their threshold so the saga compensates.
//!
//! ```no_run
//! use std::time::Duration;
//! use sagaflow::prelude::*;
//!
//! /// The input, checked at every start; its JSON Schema is published with the workflow.
//! #[derive(serde::Deserialize, sagaflow::schemars::JsonSchema)]
//! #[schemars(crate = "sagaflow::schemars")]
//! struct Order {
//!     sku: String,
//! }
//!
//! # async fn demo() -> Result<(), sagaflow::Error> {
//! let order = Workflow::builder("order", 1)
//!     .input::<Order>()
//!     .step("reserve", |ctx: StepContext| async move {
//!         // call the inventory service with ctx.idempotency_key() …
//!         Ok::<_, StepError>("reservation-1")
//!     })
//!     .compensate(|_ctx: StepContext| async move { Ok::<_, StepError>(()) })
//!     .step("charge", |_ctx: StepContext| async move { Ok::<_, StepError>("charge-1") })
//!     .after(["reserve"])
//!     .pivot()
//!     .build()?;
//!
//! let engine = Engine::builder()
//!     .with_database_url("sqlite://sagaflow.db?mode=rwc")
//!     .with_workflow(order)
//!     .start()
//!     .await?;
//! let id = engine.start("order", &serde_json::json!({ "sku": "A-1" })).await?;
//! let run = engine.wait(id, Duration::from_secs(30)).await?;
//! assert_eq!(run.state, RunState::Completed);
//! engine.shutdown().await;
//! # Ok(()) }
//! ```

pub mod admin;
mod builder;
pub mod check;
mod correction;
mod engine;
mod events;
mod follow;
mod hotplug;
mod instance;
mod limits;
pub mod metrics;
mod migrate;
mod operator;
mod restart;
mod schedule;
mod start;
mod submit;
pub mod webhook;

#[cfg(feature = "http")]
pub use sagaflow_agents::http;
#[cfg(feature = "otel")]
pub mod otel;

/// Test hooks, for tests of sagas (`sagaflow-testkit` turns the `testing` feature on; no
/// production code needs it): a clock a test moves ([`TestClock`](testing::TestClock), given
/// with `EngineBuilder::with_test_clock`), the points where a test kills an engine
/// ([`CrashPoint`](testing::CrashPoint)), and the points where it holds one of an engine's
/// units of work ([`interleave`](testing::interleave)).
#[cfg(feature = "testing")]
pub mod testing {
    pub use sagaflow_engine::clock::TestClock;
    #[doc(hidden)]
    pub use sagaflow_engine::crash::CrashHook;
    pub use sagaflow_engine::crash::CrashPoint;
    pub use sagaflow_engine::interleave;
}

pub use builder::{EngineBuilder, MAX_INPUT_DEFAULT};
pub use engine::{Engine, Health, RunDetail, SupervisorStatus};
pub use events::{EVENT_NAME_MAX, EventTarget};
pub use follow::{FOLLOW_POLL, RunUpdate};
pub use hotplug::InstanceInfo;
pub use limits::{describe_limits, describe_state};
pub use operator::{ActionArgs, Operator};
pub use sagaflow_engine::cron::{MissedTicks, Schedule, ScheduleView};
pub use sagaflow_engine::operator::Restarted;
pub use sagaflow_engine::resource::{
    Batch, Breaker, BreakerState, BreakerStatus, CompensationShare, Rate, Resource, ResourceLimits,
    ResourceName, ResourceView, Window, Windows,
};
pub use sagaflow_engine::store::{
    ActiveCount, FinishedCounts, PublishedDefinition, RUN_PAGE_DEFAULT, RUN_PAGE_MAX, RunOrder,
    RunPage, RunQuery, RunSummary, SqliteSync, Stats, StoreOptions, WorkflowQueue, redact_url,
};
pub use sagaflow_engine::store::{EventDelivery, WaitingStep};
pub use sagaflow_engine::wait::{
    CallbackResult, EventWait, OnTimeout, StepWait, WaitFor, WaitState, Woken,
};
pub use sagaflow_engine::{
    Alert, AlertKind, Attempts, Backend, BacklogAlert, ChannelSink, DbError, DeadlinePolicy,
    Delivery, DeliveryCounts, DeliveryError, DeliveryPolicy, DeliveryState, EntityState, Error,
    FieldError, HistoryEvent, HistoryKind, KeptStep, KeyPolicy, LogSink, Notice, NoticeBody,
    NoticeSink, NoticeTopic, OnFailure, OperatorAction, Outcome, PROGRESS_MAX_BYTES,
    PROGRESS_MIN_INTERVAL, RESOLVED_BY_ENGINE, Result, RetryLane, RetryPolicy, Run, RunCounts,
    RunEvent, RunFinished, RunState, StartOption, Step, StepAction, StepContext, StepDescription,
    StepError, StepKind, StepState, Timestamp, Undo, UndoOutcome, UndoPreview, UndoStep, Workflow,
    WorkflowBuilder, WorkflowDescription,
};
pub use sagaflow_supervisor::{
    PRIORITY_AGING_DEFAULT, RETENTION_INTERVAL_DEFAULT, SupervisorStats,
};
pub use start::{
    OnDuplicate, PRIORITY_MAX, PRIORITY_MIN, START_AHEAD_MAX, StartOptions, StartTime, Started,
};
pub use webhook::WebhookSink;

/// Moving in-flight runs from one version of their workflow to the next: register a
/// [`Migration`](migration::Migration) with
/// [`EngineBuilder::with_migration`](crate::EngineBuilder::with_migration), then
/// [`Operator::migration_plan`](crate::Operator::migration_plan) (the dry run) and
/// [`Operator::migrate`](crate::Operator::migrate).
pub mod migration {
    pub use sagaflow_engine::migration::{
        MapFn, MigratingRun, MigratingStep, Migration, MigrationOutcome, MigrationPlan,
        MigrationRefusal, PLAN_PAGE_MAX, RunMigration, StepMigration,
    };
}

/// The engine's lower layers, for this project's own tests and tools (the `internals`
/// feature). Not part of the product's API: no stability promise, absent from its listing.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use sagaflow_engine::{
        Registry, deliver, interleave, operator, protocol, rescue, scheduler, signals, store,
        trace, transition,
    };
    pub use sagaflow_supervisor::{Supervisor, SupervisorConfig, SweepGate};

    /// Every route of the HTTP API under `/api/v1` as (method, path): the router's own table.
    pub const API_ROUTES: &[(&str, &str)] = crate::admin::API_ROUTES;
}

/// Re-exported so that an application derives `JsonSchema` for its input types (the
/// schema published with each workflow, see [`WorkflowBuilder::input`]) without a direct
/// dependency: `#[derive(sagaflow::schemars::JsonSchema)]` with
/// `#[schemars(crate = "sagaflow::schemars")]`.
pub use schemars;

/// Re-exported so that applications can begin transactions for [`Engine::start_in`] without
/// a direct dependency.
pub use sea_orm;

/// Re-exported so that an application names run ids and implements step traits with one
/// line in its Cargo.toml.
pub use async_trait::async_trait;
pub use uuid::{self, Uuid};

/// The names most applications need.
pub mod prelude {
    pub use crate::{
        DeadlinePolicy, Engine, KeyPolicy, OnDuplicate, OnFailure, RetryLane, RetryPolicy,
        RunState, StartOptions, StepContext, StepError, StepState, Uuid, Workflow,
    };
}
