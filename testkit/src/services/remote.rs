//! The life of one simulated remote call: fault decision, apply-or-replay, latency, answer.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::ServiceError;
use super::fault_plan::FaultPlan;
use super::faults::{Fault, Faults};
use super::ledger::{Delivery, Ledger};
use super::operation::{Operation, Service};

/// The shared parts of every in-process service.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    pub(crate) ledger: Ledger,
    pub(crate) faults: Faults,
}

impl Remote {
    /// The parts of `service`, recording into `ledger` and injecting faults per `plan`.
    pub(crate) fn new(service: Service, ledger: Ledger, plan: FaultPlan) -> Self {
        let faults = Faults::new(service, plan);
        Self { ledger, faults }
    }

    /// Perform `op` under `key`. `make` builds the response from the ledger sequence
    /// number; it only runs when the effect is applied for the first time.
    ///
    /// Cancel-safe: the ledger is written synchronously before the first `.await`, so
    /// dropping the future never leaves an effect half-applied.
    pub(crate) async fn call<Req, Resp>(
        &self,
        op: Operation,
        key: &str,
        order_id: &str,
        request: &Req,
        make: impl FnOnce(u64) -> Resp,
    ) -> Result<Resp, ServiceError>
    where
        Req: Serialize,
        Resp: Serialize + DeserializeOwned,
    {
        if key.is_empty() {
            return Err(ServiceError::Permanent("missing idempotency key".into()));
        }
        // Faults follow the order, not the key: keys embed run ids, which differ every run,
        // while a seed must inject the same faults into the same orders every run.
        let result = match self.faults.decide(op, order_id) {
            Fault::None => self
                .ledger
                .apply_or_replay(key, op, order_id, request, make)
                .map(|(response, delivery)| {
                    if delivery == Delivery::Replayed {
                        tracing::debug!(%op, key, order_id, "replayed stored response");
                    }
                    response
                }),
            Fault::Transient(message) => {
                tracing::debug!(%op, key, order_id, "injected transient fault");
                Err(ServiceError::Transient(message))
            }
            Fault::Permanent(message) => {
                tracing::debug!(%op, key, order_id, "injected permanent fault");
                Err(ServiceError::Permanent(message))
            }
            Fault::LoseReply(how) => {
                // The remote does the work; the answer never arrives whole.
                let applied = self
                    .ledger
                    .apply_or_replay(key, op, order_id, request, make);
                tracing::debug!(%op, key, order_id, %how, applied = applied.is_ok(), "injected lost reply");
                Err(ServiceError::LostReply(how))
            }
            Fault::Refuse(e) => {
                tracing::debug!(%op, key, order_id, "injected refusal without applying");
                Err(e)
            }
            Fault::Hang => {
                // The remote does the work, then the answer is lost forever.
                let applied = self
                    .ledger
                    .apply_or_replay(key, op, order_id, request, make);
                tracing::debug!(%op, key, order_id, applied = applied.is_ok(), "injected hang");
                return std::future::pending().await;
            }
        };
        let latency = self.faults.plan().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        result
    }
}
