//! Names of the simulated services and of the operations they expose.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One of the simulated remote services: the order saga's (inventory, payments, shipping)
/// and the travel saga's (flights, hotels, payments, mailer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Service {
    /// Stock reservations.
    Inventory,
    /// Card charges and refunds.
    Payments,
    /// Parcel dispatch.
    Shipping,
    /// Flight bookings and cancellations.
    Flights,
    /// Hotel bookings and cancellations.
    Hotels,
    /// Itinerary e-mails.
    Mailer,
}

impl Service {
    /// All services, in a stable order.
    pub const ALL: [Service; 6] = [
        Service::Inventory,
        Service::Payments,
        Service::Shipping,
        Service::Flights,
        Service::Hotels,
        Service::Mailer,
    ];

    /// The lowercase name: `"inventory"`, `"payments"`, `"shipping"`, `"flights"`,
    /// `"hotels"` or `"mailer"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inventory => "inventory",
            Self::Payments => "payments",
            Self::Shipping => "shipping",
            Self::Flights => "flights",
            Self::Hotels => "hotels",
            Self::Mailer => "mailer",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One remote operation. Each belongs to exactly one [`Service`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Inventory: reserve stock for an order.
    Reserve,
    /// Inventory: release a reservation (compensates `Reserve`).
    Release,
    /// Payments: charge the customer.
    Charge,
    /// Payments: refund a charge (compensates `Charge`).
    Refund,
    /// Shipping: dispatch the order.
    Ship,
    /// Flights: book a seat for a trip.
    BookFlight,
    /// Flights: cancel a flight booking (compensates `BookFlight`).
    CancelFlight,
    /// Hotels: book a room for a trip.
    BookHotel,
    /// Hotels: cancel a hotel booking (compensates `BookHotel`).
    CancelHotel,
    /// Mailer: send a trip's itinerary to the traveller.
    SendItinerary,
}

impl Operation {
    /// All operations, in a stable order.
    pub const ALL: [Operation; 10] = [
        Operation::Reserve,
        Operation::Release,
        Operation::Charge,
        Operation::Refund,
        Operation::Ship,
        Operation::BookFlight,
        Operation::CancelFlight,
        Operation::BookHotel,
        Operation::CancelHotel,
        Operation::SendItinerary,
    ];

    /// The operations of the order saga's services (inventory, payments, shipping).
    pub const ORDER: [Operation; 5] = [
        Operation::Reserve,
        Operation::Release,
        Operation::Charge,
        Operation::Refund,
        Operation::Ship,
    ];

    /// The operations the travel saga calls (a payment is a `charge`).
    pub const TRAVEL: [Operation; 6] = [
        Operation::BookFlight,
        Operation::CancelFlight,
        Operation::BookHotel,
        Operation::CancelHotel,
        Operation::Charge,
        Operation::SendItinerary,
    ];

    /// The snake-case name: `"reserve"`, `"release"`, `"charge"`, `"refund"`, `"ship"`,
    /// `"book_flight"`, `"cancel_flight"`, `"book_hotel"`, `"cancel_hotel"` or
    /// `"send_itinerary"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserve => "reserve",
            Self::Release => "release",
            Self::Charge => "charge",
            Self::Refund => "refund",
            Self::Ship => "ship",
            Self::BookFlight => "book_flight",
            Self::CancelFlight => "cancel_flight",
            Self::BookHotel => "book_hotel",
            Self::CancelHotel => "cancel_hotel",
            Self::SendItinerary => "send_itinerary",
        }
    }

    /// The service that exposes this operation.
    pub fn service(self) -> Service {
        match self {
            Self::Reserve | Self::Release => Service::Inventory,
            Self::Charge | Self::Refund => Service::Payments,
            Self::Ship => Service::Shipping,
            Self::BookFlight | Self::CancelFlight => Service::Flights,
            Self::BookHotel | Self::CancelHotel => Service::Hotels,
            Self::SendItinerary => Service::Mailer,
        }
    }

    /// Whether this operation undoes another one (`release`, `refund`, `cancel_flight`,
    /// `cancel_hotel`).
    ///
    /// Compensations get no random permanent faults: a realistic remote rarely refuses
    /// a refund. Tests can still script one.
    pub fn is_compensation(self) -> bool {
        matches!(
            self,
            Self::Release | Self::Refund | Self::CancelFlight | Self::CancelHotel
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AsRef<str> for Operation {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// The string did not name an [`Operation`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown operation {0:?} (expected one of reserve, release, charge, refund, ship, book_flight, cancel_flight, book_hotel, cancel_hotel, send_itinerary)"
)]
pub struct UnknownOperation(pub String);

impl FromStr for Operation {
    type Err = UnknownOperation;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Operation::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| UnknownOperation(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for op in Operation::ALL {
            assert_eq!(op.as_str().parse::<Operation>(), Ok(op));
        }
        assert!("teleport".parse::<Operation>().is_err());
        assert_eq!(Operation::Refund.service(), Service::Payments);
        assert!(Operation::Release.is_compensation());
        assert!(!Operation::Ship.is_compensation());
    }
}
