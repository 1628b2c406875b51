//! The pieces of `sagaflow-chaos`: command line, setting the stage and PostgreSQL handling,
//! the engine worker process, the coordinator's run loop with its submission and rescue
//! watchers, and the final checks.

pub(crate) mod cancels;
pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod client;
pub(crate) mod coordinator;
pub(crate) mod events;
pub(crate) mod facts;
pub(crate) mod fleet;
pub(crate) mod gather;
pub(crate) mod mix;
pub(crate) mod observer;
pub(crate) mod postgres;
pub(crate) mod rescue;
pub(crate) mod stage;
pub(crate) mod stats;
pub(crate) mod submit;
pub(crate) mod summary;
pub(crate) mod worker;
