//! The typed agent trait and its step adapter.

use std::fmt;
use std::sync::Arc;

use sagaflow_engine::{StepAction, StepContext, StepError};
use serde::Serialize;

/// A typed wrapper of one remote service.
///
/// `call` must pass [`StepContext::idempotency_key`] to the service so that a retried attempt
/// is de-duplicated remotely, and should give up by [`StepContext::remaining`] (the pool
/// drops the call at the deadline anyway).
#[async_trait::async_trait]
pub trait Agent: Send + Sync + 'static {
    /// What the service is asked.
    type Request: Send + 'static;
    /// What it answers; stored as the step's output.
    type Response: Serialize + Send + 'static;

    /// Name of the remote service, for logs.
    fn service(&self) -> &'static str;

    /// Performs one call.
    ///
    /// # Errors
    /// A [`StepError`]: retryable for transient faults, terminal when retrying cannot help.
    async fn call(
        &self,
        request: Self::Request,
        ctx: &StepContext,
    ) -> Result<Self::Response, StepError>;
}

/// A step body that builds a request from the context and sends it through an [`Agent`].
pub struct AgentStep<A, F> {
    agent: Arc<A>,
    make: F,
}

impl<A: Agent, F> fmt::Debug for AgentStep<A, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentStep")
            .field("service", &self.agent.service())
            .finish()
    }
}

/// Builds a step body calling `agent` with the request `make` derives from the context.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use sagaflow_agents::{Agent, agent_step};
/// use sagaflow_engine::{StepContext, StepError, Workflow};
///
/// struct Echo;
/// #[async_trait::async_trait]
/// impl Agent for Echo {
///     type Request = String;
///     type Response = String;
///     fn service(&self) -> &'static str { "echo" }
///     async fn call(&self, req: String, ctx: &StepContext) -> Result<String, StepError> {
///         Ok(format!("{req} under key {}", ctx.idempotency_key()))
///     }
/// }
///
/// let wf = Workflow::builder("echo", 1)
///     .step_with("say", agent_step(Arc::new(Echo), |ctx: &StepContext| ctx.input::<String>()))
///     .build()
///     .expect("valid");
/// assert_eq!(wf.steps()[0].name(), "say");
/// ```
pub fn agent_step<A, F>(agent: Arc<A>, make: F) -> AgentStep<A, F>
where
    A: Agent,
    F: Fn(&StepContext) -> Result<A::Request, StepError> + Send + Sync + 'static,
{
    AgentStep { agent, make }
}

#[async_trait::async_trait]
impl<A, F> StepAction for AgentStep<A, F>
where
    A: Agent,
    F: Fn(&StepContext) -> Result<A::Request, StepError> + Send + Sync + 'static,
{
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        let request = (self.make)(&ctx)?;
        let response = self.agent.call(request, &ctx).await?;
        serde_json::to_value(response).map_err(StepError::from)
    }
}
