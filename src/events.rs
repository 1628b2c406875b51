//! Talking to waiting runs: named events sent by run id or business key, callbacks completed
//! with their token, and the list of waiting steps.

use sagaflow_engine::store::{EventDelivery, WaitingStep};
use sagaflow_engine::wait::CallbackResult;
use sagaflow_engine::{Error, Result};
use serde::Serialize;
use uuid::Uuid;

use crate::engine::Engine;

/// Which run an event is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTarget {
    /// The run with this id.
    Run(Uuid),
    /// The newest run of `workflow` started with `business_key`.
    Key {
        /// The workflow's name.
        workflow: String,
        /// The business key.
        business_key: String,
    },
}

impl From<Uuid> for EventTarget {
    fn from(id: Uuid) -> Self {
        Self::Run(id)
    }
}

impl EventTarget {
    /// The run of `workflow` keyed `business_key`.
    pub fn key(workflow: impl Into<String>, business_key: impl Into<String>) -> Self {
        Self::Key {
            workflow: workflow.into(),
            business_key: business_key.into(),
        }
    }
}

/// The longest event name.
pub const EVENT_NAME_MAX: usize = 200;

impl Engine {
    /// Sends the event `name` with `payload` to a run: the step waiting for it (a
    /// [`wait_for_event`](crate::WorkflowBuilder::wait_for_event) step) completes with the
    /// payload; if no step waits for it yet, it is kept and the first step of the run to wait
    /// for `name` takes it. Recorded in the run's history as sent by `operator` (see
    /// [`Engine::send_event_as`]).
    ///
    /// # Errors
    /// [`Error::RunNotFound`] (no such run or key); [`Error::ActionNotAllowed`] for a
    /// finished run; [`Error::InvalidEvent`] for an empty or too long name;
    /// [`Error::PayloadTooLarge`]; [`Error::Db`].
    pub async fn send_event<P: Serialize>(
        &self,
        target: impl Into<EventTarget>,
        name: &str,
        payload: &P,
    ) -> Result<EventDelivery> {
        self.send_event_as(target, name, payload, "operator").await
    }

    /// [`Engine::send_event`], recorded as sent by `actor` (`api:<token>` over HTTP).
    ///
    /// # Errors
    /// As [`Engine::send_event`].
    pub async fn send_event_as<P: Serialize>(
        &self,
        target: impl Into<EventTarget>,
        name: &str,
        payload: &P,
        actor: &str,
    ) -> Result<EventDelivery> {
        let invalid = Error::InvalidEvent;
        if name.is_empty() || name.len() > EVENT_NAME_MAX || name.starts_with("callback:") {
            return Err(invalid(format!(
                "an event name is 1 to {EVENT_NAME_MAX} bytes and does not start with `callback:`"
            )));
        }
        let payload = serde_json::to_value(payload).map_err(|e| invalid(e.to_string()))?;
        self.check_payload(&payload, "event payload")?;
        let run_id = self.event_run(target.into()).await?;
        let delivery =
            sagaflow_engine::deliver::send_event(&self.inner.store, run_id, name, &payload, actor)
                .await?;
        self.wake();
        Ok(delivery)
    }

    /// Completes or fails the step that handed out `token`
    /// ([`StepContext::callback_token`](crate::StepContext::callback_token)), as its remote
    /// would over HTTP (`POST /api/v1/callbacks` with the token in the
    /// `Sagaflow-Callback-Token` header, or `POST /api/v1/callbacks/{token}`).
    ///
    /// # Errors
    /// [`Error::UnknownCallback`] for a token no step holds (forged, or spent);
    /// [`Error::PayloadTooLarge`]; [`Error::Db`].
    pub async fn complete_callback(
        &self,
        token: &str,
        result: &CallbackResult,
        actor: &str,
    ) -> Result<EventDelivery> {
        if let CallbackResult::Ok(v) = result {
            self.check_payload(v, "callback output")?;
        }
        let delivery =
            sagaflow_engine::deliver::complete_callback(&self.inner.store, token, result, actor)
                .await?;
        self.wake();
        Ok(delivery)
    }

    /// The steps waiting for a timer, an event, a callback or a child run: of one run, or
    /// of all (`None`), due soonest first, at most `limit`.
    ///
    /// # Errors
    /// [`Error::Db`].
    pub async fn waiting_steps(&self, run: Option<Uuid>, limit: u32) -> Result<Vec<WaitingStep>> {
        self.reads().steps_waiting(run, limit).await
    }

    async fn event_run(&self, target: EventTarget) -> Result<Uuid> {
        match target {
            EventTarget::Run(id) => Ok(id),
            EventTarget::Key {
                workflow,
                business_key,
            } => self
                .inner
                .store
                .run_by_key(&workflow, &business_key)
                .await?
                .map(|r| r.run.id)
                .ok_or(Error::KeyNotFound {
                    workflow,
                    business_key,
                }),
        }
    }

    fn check_payload(&self, payload: &serde_json::Value, what: &str) -> Result<()> {
        let size = payload.to_string().len();
        if size > self.inner.max_input_bytes {
            return Err(Error::PayloadTooLarge {
                what: what.to_owned(),
                size,
                limit: self.inner.max_input_bytes,
            });
        }
        Ok(())
    }
}
