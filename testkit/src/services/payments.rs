//! The payments service: charges and refunds.

use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::fault_plan::FaultPlan;
use super::faults::Faults;
use super::ledger::Ledger;
use super::operation::{Operation, Service};
use super::remote::Remote;

/// Charge the customer of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// The order being paid.
    pub order_id: String,
    /// Amount in cents.
    pub amount_cents: u64,
}

/// A successful charge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Charge {
    /// Identifier to pass to [`PaymentsApi::refund`].
    pub charge_id: String,
    /// The order paid.
    pub order_id: String,
    /// Amount charged, in cents.
    pub amount_cents: u64,
}

/// Refund a charge (compensates a charge).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RefundRequest {
    /// The order the charge belongs to.
    pub order_id: String,
    /// The charge to refund, as returned by [`PaymentsApi::charge`].
    pub charge_id: String,
}

/// A successful refund.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refund {
    /// The order refunded.
    pub order_id: String,
    /// The charge refunded.
    pub charge_id: String,
}

/// The payments remote, in-process or over HTTP.
///
/// Every call carries an idempotency key: repeating a call with the same key returns
/// the first answer without charging or refunding again.
#[async_trait]
pub trait PaymentsApi: Send + Sync + Debug + 'static {
    /// Charge the customer. Fails permanently when the card is declined.
    async fn charge(&self, key: &str, req: ChargeRequest) -> Result<Charge, ServiceError>;
    /// Refund a charge.
    async fn refund(&self, key: &str, req: RefundRequest) -> Result<Refund, ServiceError>;
}

/// In-process payments service writing to a shared [`Ledger`].
#[derive(Debug, Clone)]
pub struct Payments {
    remote: Remote,
}

impl Payments {
    /// A payments service recording into `ledger` and injecting faults per `plan`.
    pub fn new(ledger: Ledger, plan: FaultPlan) -> Self {
        Self {
            remote: Remote::new(Service::Payments, ledger, plan),
        }
    }

    /// The fault injector, e.g. to script outcomes.
    pub fn faults(&self) -> &Faults {
        &self.remote.faults
    }

    /// The ledger this service records into.
    pub fn ledger(&self) -> &Ledger {
        &self.remote.ledger
    }
}

#[async_trait]
impl PaymentsApi for Payments {
    async fn charge(&self, key: &str, req: ChargeRequest) -> Result<Charge, ServiceError> {
        let order_id = req.order_id.clone();
        self.remote
            .call(Operation::Charge, key, &order_id, &req, |seq| Charge {
                charge_id: format!("ch-{seq:06}"),
                order_id: req.order_id.clone(),
                amount_cents: req.amount_cents,
            })
            .await
    }

    async fn refund(&self, key: &str, req: RefundRequest) -> Result<Refund, ServiceError> {
        let order_id = req.order_id.clone();
        self.remote
            .call(Operation::Refund, key, &order_id, &req, |_| Refund {
                order_id: req.order_id.clone(),
                charge_id: req.charge_id.clone(),
            })
            .await
    }
}
