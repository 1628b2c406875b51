//! Agents (SAS-2, SAS-3): the side of sagaflow that talks to remote services.
//!
//! - [`Agent`] is a typed wrapper of one remote service; [`agent_step`] turns it into a step
//!   body, building the request from the step's context.
//! - [`AgentPool`] receives [`Dispatch`](sagaflow_engine::protocol::Dispatch)es from the
//!   scheduler's request channel, runs each attempt in its own task under the step's
//!   deadline, and answers on the reply channel. When the deadline passes, the attempt is
//!   cancelled and **nothing** is reported (another instance may already own the step). A
//!   panicking step is reported as a failed attempt; the engine carries on.

mod agent;
mod pool;

pub use agent::{Agent, AgentStep, agent_step};
pub use pool::AgentPool;
