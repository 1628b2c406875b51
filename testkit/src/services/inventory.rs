//! The inventory service: stock reservations.

use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::fault_plan::FaultPlan;
use super::faults::Faults;
use super::ledger::Ledger;
use super::operation::{Operation, Service};
use super::remote::Remote;

/// Reserve `qty` units of `sku` for an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReserveRequest {
    /// The order the stock is for.
    pub order_id: String,
    /// Stock-keeping unit.
    pub sku: String,
    /// Units to reserve.
    pub qty: u32,
}

/// A stock reservation held for an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// Identifier to pass to [`InventoryApi::release`].
    pub reservation_id: String,
    /// The order the stock is held for.
    pub order_id: String,
    /// Stock-keeping unit.
    pub sku: String,
    /// Units reserved.
    pub qty: u32,
}

/// Release a reservation (compensates a reserve).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    /// The order the reservation belongs to.
    pub order_id: String,
    /// The reservation to release, as returned by [`InventoryApi::reserve`].
    pub reservation_id: String,
}

/// Acknowledgement of a release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Released {
    /// The order whose reservation was released.
    pub order_id: String,
}

/// The inventory remote, in-process or over HTTP.
///
/// Every call carries an idempotency key: repeating a call with the same key returns
/// the first answer without reserving or releasing again.
#[async_trait]
pub trait InventoryApi: Send + Sync + Debug + 'static {
    /// Reserve stock. Fails permanently when out of stock.
    async fn reserve(&self, key: &str, req: ReserveRequest) -> Result<Reservation, ServiceError>;
    /// Release a reservation.
    async fn release(&self, key: &str, req: ReleaseRequest) -> Result<Released, ServiceError>;
}

/// In-process inventory service writing to a shared [`Ledger`].
#[derive(Debug, Clone)]
pub struct Inventory {
    remote: Remote,
}

impl Inventory {
    /// An inventory service recording into `ledger` and injecting faults per `plan`.
    pub fn new(ledger: Ledger, plan: FaultPlan) -> Self {
        Self {
            remote: Remote::new(Service::Inventory, ledger, plan),
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
impl InventoryApi for Inventory {
    async fn reserve(&self, key: &str, req: ReserveRequest) -> Result<Reservation, ServiceError> {
        let order_id = req.order_id.clone();
        self.remote
            .call(Operation::Reserve, key, &order_id, &req, |seq| {
                Reservation {
                    reservation_id: format!("rsv-{seq:06}"),
                    order_id: req.order_id.clone(),
                    sku: req.sku.clone(),
                    qty: req.qty,
                }
            })
            .await
    }

    async fn release(&self, key: &str, req: ReleaseRequest) -> Result<Released, ServiceError> {
        let order_id = req.order_id.clone();
        self.remote
            .call(Operation::Release, key, &order_id, &req, |_| Released {
                order_id: req.order_id.clone(),
            })
            .await
    }
}
