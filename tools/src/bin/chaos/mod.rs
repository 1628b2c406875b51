//! The pieces of `sagaflow-chaos`: command line, setting the stage and PostgreSQL handling,
//! the engine worker process, the coordinator's run loop with its submission and rescue
//! watchers, and the final checks.

pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod coordinator;
pub(crate) mod fleet;
pub(crate) mod postgres;
pub(crate) mod rescue;
pub(crate) mod stage;
pub(crate) mod submit;
pub(crate) mod worker;
