//! Names of the simulated services and of the operations they expose.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One of the three simulated remote services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Service {
    /// Stock reservations.
    Inventory,
    /// Card charges and refunds.
    Payments,
    /// Parcel dispatch.
    Shipping,
}

impl Service {
    /// All services, in a stable order.
    pub const ALL: [Service; 3] = [Service::Inventory, Service::Payments, Service::Shipping];

    /// The lowercase name: `"inventory"`, `"payments"` or `"shipping"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inventory => "inventory",
            Self::Payments => "payments",
            Self::Shipping => "shipping",
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
}

impl Operation {
    /// All operations, in a stable order.
    pub const ALL: [Operation; 5] = [
        Operation::Reserve,
        Operation::Release,
        Operation::Charge,
        Operation::Refund,
        Operation::Ship,
    ];

    /// The lowercase name: `"reserve"`, `"release"`, `"charge"`, `"refund"` or `"ship"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserve => "reserve",
            Self::Release => "release",
            Self::Charge => "charge",
            Self::Refund => "refund",
            Self::Ship => "ship",
        }
    }

    /// The service that exposes this operation.
    pub fn service(self) -> Service {
        match self {
            Self::Reserve | Self::Release => Service::Inventory,
            Self::Charge | Self::Refund => Service::Payments,
            Self::Ship => Service::Shipping,
        }
    }

    /// Whether this operation undoes another one (`release`, `refund`).
    ///
    /// Compensations get no random permanent faults: a realistic remote rarely refuses
    /// a refund. Tests can still script one.
    pub fn is_compensation(self) -> bool {
        matches!(self, Self::Release | Self::Refund)
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
#[error("unknown operation {0:?} (expected reserve, release, charge, refund or ship)")]
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
