//! The travel saga's services: flights and hotels (one booking service each) and the
//! itinerary mailer. Payments are the order saga's [`Payments`](super::Payments).

use std::fmt::Debug;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::fault_plan::FaultPlan;
use super::ledger::Ledger;
use super::operation::{Operation, Service};
use super::remote::Remote;

/// Book something (a seat, a room) for a trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BookRequest {
    /// The trip the booking is for.
    pub trip_id: String,
    /// Who travels.
    pub traveller: String,
    /// What to book, e.g. `"LIS → OSL"` or `"3 nights in OSL"`.
    pub item: String,
}

/// A booking held for a trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Booking {
    /// Identifier to pass to [`BookingApi::cancel`].
    pub booking_id: String,
    /// The trip the booking is for.
    pub trip_id: String,
    /// What was booked.
    pub item: String,
}

impl Booking {
    /// The request that cancels this booking.
    pub fn cancellation(self) -> CancelRequest {
        CancelRequest {
            trip_id: self.trip_id,
            booking_id: self.booking_id,
        }
    }
}

/// Cancel a booking (compensates a booking).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelRequest {
    /// The trip the booking belongs to.
    pub trip_id: String,
    /// The booking to cancel, as returned by [`BookingApi::book`].
    pub booking_id: String,
}

/// Acknowledgement of a cancellation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancelled {
    /// The trip whose booking was cancelled.
    pub trip_id: String,
    /// The booking cancelled.
    pub booking_id: String,
}

/// A booking remote (flights or hotels).
///
/// Every call carries an idempotency key: repeating a call with the same key returns the
/// first answer without booking or cancelling again.
#[async_trait]
pub trait BookingApi: Send + Sync + Debug + 'static {
    /// Book. Fails permanently when nothing is left (flight full, hotel sold out).
    async fn book(&self, key: &str, req: BookRequest) -> Result<Booking, ServiceError>;
    /// Cancel a booking.
    async fn cancel(&self, key: &str, req: CancelRequest) -> Result<Cancelled, ServiceError>;
}

/// An in-process booking service writing to a shared [`Ledger`]: [`Bookings::flights`] or
/// [`Bookings::hotels`].
#[derive(Debug, Clone)]
pub struct Bookings {
    pub(super) remote: Remote,
    book: Operation,
    cancel: Operation,
    prefix: &'static str,
}

impl Bookings {
    /// The flights service (`book_flight`, `cancel_flight`; booking ids `fl-…`).
    pub fn flights(ledger: Ledger, plan: FaultPlan) -> Self {
        Self {
            remote: Remote::new(Service::Flights, ledger, plan),
            book: Operation::BookFlight,
            cancel: Operation::CancelFlight,
            prefix: "fl",
        }
    }

    /// The hotels service (`book_hotel`, `cancel_hotel`; booking ids `ht-…`).
    pub fn hotels(ledger: Ledger, plan: FaultPlan) -> Self {
        Self {
            remote: Remote::new(Service::Hotels, ledger, plan),
            book: Operation::BookHotel,
            cancel: Operation::CancelHotel,
            prefix: "ht",
        }
    }
}

#[async_trait]
impl BookingApi for Bookings {
    async fn book(&self, key: &str, req: BookRequest) -> Result<Booking, ServiceError> {
        let prefix = self.prefix;
        self.remote
            .call(self.book, key, &req.trip_id, &req, |seq| Booking {
                booking_id: format!("{prefix}-{seq:06}"),
                trip_id: req.trip_id.clone(),
                item: req.item.clone(),
            })
            .await
    }

    async fn cancel(&self, key: &str, req: CancelRequest) -> Result<Cancelled, ServiceError> {
        self.remote
            .call(self.cancel, key, &req.trip_id, &req, |_| Cancelled {
                trip_id: req.trip_id.clone(),
                booking_id: req.booking_id.clone(),
            })
            .await
    }
}

/// Send a trip's itinerary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItineraryRequest {
    /// The trip.
    pub trip_id: String,
    /// Who gets it.
    pub traveller: String,
    /// What it says.
    pub body: String,
}

/// An itinerary sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItinerarySent {
    /// Message identifier.
    pub message_id: String,
    /// The trip.
    pub trip_id: String,
}

/// The mailer remote. Sending is never undone: a mail cannot be unsent.
#[async_trait]
pub trait MailerApi: Send + Sync + Debug + 'static {
    /// Send the itinerary, once per idempotency key.
    async fn send_itinerary(
        &self,
        key: &str,
        req: ItineraryRequest,
    ) -> Result<ItinerarySent, ServiceError>;
}

/// In-process mailer writing to a shared [`Ledger`].
#[derive(Debug, Clone)]
pub struct Mailer {
    pub(super) remote: Remote,
}

impl Mailer {
    /// A mailer recording into `ledger` and injecting faults per `plan`.
    pub fn new(ledger: Ledger, plan: FaultPlan) -> Self {
        Self {
            remote: Remote::new(Service::Mailer, ledger, plan),
        }
    }
}

#[async_trait]
impl MailerApi for Mailer {
    async fn send_itinerary(
        &self,
        key: &str,
        req: ItineraryRequest,
    ) -> Result<ItinerarySent, ServiceError> {
        self.remote
            .call(Operation::SendItinerary, key, &req.trip_id, &req, |seq| {
                ItinerarySent {
                    message_id: format!("msg-{seq:06}"),
                    trip_id: req.trip_id.clone(),
                }
            })
            .await
    }
}
