//! The request/response protocol between the scheduler and agents (SAS-2).
//!
//! The scheduler sends a [`Dispatch`] per claimed step over a channel; an agent runs the step
//! under its deadline and answers with an [`AgentResponse`] on the dispatch's reply channel,
//! or stays silent when the deadline passed (SAS-3): the fenced write would be refused anyway,
//! and the supervisor owns the step from then on.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use uuid::Uuid;

use crate::definition::{StepAction, StepContext};
use crate::state::Counters;
use crate::{StepError, StepState};

/// Identifies one attempt of one step: every write of its result is fenced by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLease {
    /// Step row id.
    pub step_id: i64,
    /// Run id.
    pub run_id: Uuid,
    /// `name@version`.
    pub workflow_key: String,
    /// Step name.
    pub step: String,
    /// `Running` (forward) or `Compensating`.
    pub state: StepState,
    /// The fencing token: the step's `attempt`, its claims of both phases (the step itself
    /// sees its attempt within the phase, [`StepContext::attempt`]).
    pub attempt: i32,
    /// The step's counters and limits when claimed (failures, interruptions, deadline).
    pub counters: Counters,
    /// The scheduler instance that claimed it (`LockedBy`).
    pub owner: String,
    /// When this instance claimed it (its clock): the attempt's duration is measured from it.
    pub claimed_at: tokio::time::Instant,
}

/// The work for an agent: what to run, with which context, until when.
pub struct AgentRequest {
    /// The lease to quote in the response.
    pub lease: StepLease,
    /// The action: the step's body or its compensation.
    pub action: Arc<dyn StepAction>,
    /// Context with the idempotency key, deadline, input and dependency outputs.
    pub context: StepContext,
}

impl fmt::Debug for AgentRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentRequest")
            .field("lease", &self.lease)
            .field("context", &self.context)
            .finish()
    }
}

/// The answer of an agent for one attempt.
#[derive(Debug)]
pub struct AgentResponse {
    /// The lease the request carried.
    pub lease: StepLease,
    /// The step's output, or why it failed.
    pub result: Result<serde_json::Value, StepError>,
}

/// A request together with its reply channel and the in-flight slot it occupies; dropping the
/// dispatch frees the slot.
#[derive(Debug)]
pub struct Dispatch {
    /// The request.
    pub request: AgentRequest,
    /// Where to answer.
    pub reply: mpsc::Sender<AgentResponse>,
    /// The scheduler's concurrency slot, released when the agent is done with the attempt.
    pub permit: OwnedSemaphorePermit,
}
