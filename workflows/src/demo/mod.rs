//! The parts of the `sagaflow-demo` command, one concept per module.

pub(crate) mod alerts;
pub(crate) mod cli;
pub(crate) mod database;
pub(crate) mod history;
pub(crate) mod ledger_check;
pub(crate) mod logging;
pub(crate) mod operator;
pub(crate) mod progress;
pub(crate) mod running;
pub(crate) mod serve;
pub(crate) mod setup;
pub(crate) mod summary;
pub(crate) mod table;
pub(crate) mod text;
pub(crate) mod tracker;
pub(crate) mod webhook;

/// An error the demo reports before giving up (the example commands share one error type).
pub(crate) type DemoError = sagaflow_workflows::Error;

/// A result whose error the demo reports and gives up on.
pub(crate) type DemoResult<T> = Result<T, DemoError>;
