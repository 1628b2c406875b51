//! Agents (SAS-2, SAS-3): the side of sagaflow that calls remote services.
//!
//! [`AgentPool`] receives [`Dispatch`](sagaflow_engine::protocol::Dispatch)es from the
//! scheduler's request channel, runs each attempt in its own task under the step's deadline,
//! and turns its outcome into an [`AgentResponse`](sagaflow_engine::protocol::AgentResponse)
//! on the reply channel. When the deadline passes, the attempt is cancelled and **nothing**
//! is reported (another instance may already own the step). A panicking step is reported as
//! a failed attempt; the engine carries on. A remote service is called from a step body, a
//! [`StepAction`](sagaflow_engine::StepAction), which passes
//! [`StepContext::idempotency_key`](sagaflow_engine::StepContext::idempotency_key) along.
//!
//! # What stays in the engine, and why
//!
//! The rest of calling a remote lives in `sagaflow-engine`, because the engine must not
//! depend on this crate (dependencies point `engine ← agents`) and each of these pieces is
//! used by the scheduler itself:
//!
//! - **The idempotency key.** The forward key `{run_id}:{step}` is stored in the step row
//!   when the run is started, and the compensation key (`…:compensate`) is derived when the
//!   claim loop builds the attempt's [`StepContext`](sagaflow_engine::StepContext)
//!   (`engine/src/scheduler/claim.rs`), together with the inputs and outputs it decodes from
//!   the claimed rows. A claimed step whose rows cannot be decoded is answered there on the
//!   agent's behalf, so the request never reaches this crate.
//! - **The deadline.** It is the database's `complete_by`; the claim converts what is left of
//!   it into the local instant this pool waits for, and the completion's fenced write
//!   compares against the database clock again.
//! - **The protocol.** [`AgentRequest`](sagaflow_engine::protocol::AgentRequest),
//!   `AgentResponse` and `Dispatch` are shared vocabulary in `engine/src/protocol.rs`: the
//!   scheduler sends and receives them.
//! - **Reading a reply.** What an answer means for the step (retry, fail, complete, maybe
//!   applied) is decided by the transition module when the completion loop persists it.
//!
//! # What this crate owns, and what it may use
//!
//! It owns the pool that runs attempts, and the HTTP agent a step calls a JSON API with
//! ([`http::HttpAgent`], feature `http`): the idempotency header, the trace context, the
//! timeout taken from the attempt's deadline, and the mapping of every answer to a step
//! outcome. It depends on `sagaflow-engine` for the protocol and the step definitions only,
//! never on its store, scheduler or supervisor, and nothing in the engine depends on it. The
//! `sagaflow` facade re-exports the HTTP agent as `sagaflow::http`.

#[cfg(feature = "http")]
pub mod http;
mod pool;

pub use pool::AgentPool;
