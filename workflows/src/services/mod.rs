//! Simulated remote services for the order saga, and the ledger that proves
//! exactly-once effects.
//!
//! * [`InventoryApi`], [`PaymentsApi`] and [`ShippingApi`] are what saga steps call,
//!   always with an idempotency key.
//! * [`Services`] runs the three in-process over one shared [`Ledger`], injecting the
//!   faults of a [`ServicePlans`] (transient errors, permanent refusals, and hangs that
//!   apply the effect but never answer) plus per-call [`Scripted`] outcomes.
//! * [`serve`] exposes a [`Services`] over loopback HTTP and [`HttpServices`] talks to it
//!   through the same traits.
//! * [`Ledger::report`] / [`Ledger::check_orders`] produce a [`LedgerReport`]: effect
//!   counts, replays, and every violation of exactly-once or net consistency.

mod bundle;
mod error;
mod faults;
mod http_client;
mod http_server;
mod inventory;
mod ledger;
mod operation;
mod payments;
mod remote;
mod report;
mod shipping;

#[cfg(test)]
mod tests;

pub use bundle::{ServicePlans, Services};
pub use error::{LostReply, ServiceError};
pub use faults::{FaultCounts, FaultPlan, Faults, Scripted};
pub use http_client::{HttpInventory, HttpPayments, HttpServices, HttpShipping};
pub use http_server::{IDEMPOTENCY_KEY_HEADER, ServerHandle, serve};
pub use inventory::{
    Inventory, InventoryApi, ReleaseRequest, Released, Reservation, ReserveRequest,
};
pub use ledger::{EffectRecord, Ledger};
pub use operation::{Operation, Service, UnknownOperation};
pub use payments::{Charge, ChargeRequest, Payments, PaymentsApi, Refund, RefundRequest};
pub use report::{LedgerReport, OperationCounts, OrderStatus};
pub use shipping::{ShipRequest, Shipment, Shipping, ShippingApi};
