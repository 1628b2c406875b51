//! The shipping service: dispatching orders.

use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::fault_plan::FaultPlan;
use super::faults::Faults;
use super::ledger::Ledger;
use super::operation::{Operation, Service};
use super::remote::Remote;

/// Ship an order to an address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShipRequest {
    /// The order to ship.
    pub order_id: String,
    /// Delivery address.
    pub address: String,
}

/// A dispatched shipment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shipment {
    /// Carrier tracking number.
    pub tracking_id: String,
    /// The order shipped.
    pub order_id: String,
}

/// The shipping remote, in-process or over HTTP.
///
/// Every call carries an idempotency key: repeating a call with the same key returns
/// the first answer without shipping again. Shipping has no compensation: it is the
/// saga's point of no return.
#[async_trait]
pub trait ShippingApi: Send + Sync + Debug + 'static {
    /// Dispatch the order. Fails permanently when the address is undeliverable.
    async fn ship(&self, key: &str, req: ShipRequest) -> Result<Shipment, ServiceError>;
}

/// In-process shipping service writing to a shared [`Ledger`].
#[derive(Debug, Clone)]
pub struct Shipping {
    remote: Remote,
}

impl Shipping {
    /// A shipping service recording into `ledger` and injecting faults per `plan`.
    pub fn new(ledger: Ledger, plan: FaultPlan) -> Self {
        Self {
            remote: Remote::new(Service::Shipping, ledger, plan),
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
impl ShippingApi for Shipping {
    async fn ship(&self, key: &str, req: ShipRequest) -> Result<Shipment, ServiceError> {
        let order_id = req.order_id.clone();
        self.remote
            .call(Operation::Ship, key, &order_id, &req, |seq| Shipment {
                tracking_id: format!("trk-{seq:06}"),
                order_id: req.order_id.clone(),
            })
            .await
    }
}
