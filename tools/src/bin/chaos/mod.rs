//! The pieces of `sagaflow-chaos`: command line, PostgreSQL handling, the engine worker
//! process, the coordinator's run loop, and the final checks.

pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod coordinator;
pub(crate) mod fleet;
pub(crate) mod postgres;
pub(crate) mod worker;
