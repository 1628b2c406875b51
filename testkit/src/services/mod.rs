//! Simulated remote services for the order and travel sagas, and the ledger that proves
//! exactly-once effects.
//!
//! * [`InventoryApi`], [`PaymentsApi`] and [`ShippingApi`] (order saga), [`BookingApi`]
//!   (flights, hotels) and [`MailerApi`] (travel saga) are what saga steps call, always
//!   with an idempotency key.
//! * [`Services`] runs them all in-process over one shared [`Ledger`], injecting the
//!   faults of a [`ServicePlans`] (transient errors, permanent refusals, and hangs that
//!   apply the effect but never answer) plus per-call [`Scripted`] outcomes.
//! * [`serve`] exposes the order saga's services of a [`Services`] over loopback HTTP and
//!   [`HttpServices`] talks to them through the same traits.
//! * [`Ledger::report`] / [`Ledger::check_orders`] produce a [`LedgerReport`]: effect
//!   counts, replays, and every violation of exactly-once or net consistency of orders;
//!   [`Ledger::check_trips`] gives a [`TripReport`], the same for trips.

mod bundle;
mod error;
mod fault_plan;
pub(crate) mod faults;
pub(crate) mod http_client;
pub(crate) mod http_server;
mod inventory;
mod ledger;
mod operation;
mod order_checks;
mod payments;
mod remote;
mod report;
mod shipping;
mod travel;
mod trips;

#[cfg(test)]
mod tests;

pub use bundle::{ServicePlans, Services};
pub use error::{LostReply, ServiceError};
pub use fault_plan::{FaultCounts, FaultPlan, Scripted};
pub use faults::Faults;
pub use http_client::{HttpInventory, HttpPayments, HttpServices, HttpShipping};
pub use http_server::{
    IDEMPOTENCY_KEY_HEADER, ServerHandle, TRACEPARENT_HEADER, TRACESTATE_HEADER, serve,
};
pub use inventory::{
    Inventory, InventoryApi, ReleaseRequest, Released, Reservation, ReserveRequest,
};
pub use ledger::{EffectRecord, Ledger};
pub use operation::{Operation, Service, UnknownOperation};
pub use payments::{Charge, ChargeRequest, Payments, PaymentsApi, Refund, RefundRequest};
pub use report::{LedgerReport, OperationCounts, OrderStatus};
pub use shipping::{ShipRequest, Shipment, Shipping, ShippingApi};
pub use travel::{
    BookRequest, Booking, BookingApi, Bookings, CancelRequest, Cancelled, ItineraryRequest,
    ItinerarySent, Mailer, MailerApi,
};
pub use trips::{TripReport, TripStatus};
