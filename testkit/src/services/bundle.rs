//! The in-process services sharing one ledger.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::fault_plan::{FaultCounts, FaultPlan, Scripted};
use super::faults::Faults;
use super::inventory::{Inventory, InventoryApi};
use super::ledger::Ledger;
use super::operation::{Operation, Service};
use super::payments::{Payments, PaymentsApi};
use super::shipping::{Shipping, ShippingApi};
use super::travel::{BookingApi, Bookings, Mailer, MailerApi};

/// One [`FaultPlan`] per service. `Default` injects nothing anywhere.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServicePlans {
    /// Plan of the inventory service.
    pub inventory: FaultPlan,
    /// Plan of the payments service.
    pub payments: FaultPlan,
    /// Plan of the shipping service.
    pub shipping: FaultPlan,
    /// Plan of the flights service.
    #[serde(default)]
    pub flights: FaultPlan,
    /// Plan of the hotels service.
    #[serde(default)]
    pub hotels: FaultPlan,
    /// Plan of the itinerary mailer.
    #[serde(default)]
    pub mailer: FaultPlan,
}

impl ServicePlans {
    /// The same rates and latency for every service; seeds `plan.seed`, `+1`, `+2`, …
    /// so the services do not fail in lockstep.
    pub fn uniform(plan: FaultPlan) -> Self {
        let with_seed = |offset: u64| FaultPlan {
            seed: plan.seed.wrapping_add(offset),
            ..plan.clone()
        };
        Self {
            inventory: with_seed(0),
            payments: with_seed(1),
            shipping: with_seed(2),
            flights: with_seed(3),
            hotels: with_seed(4),
            mailer: with_seed(5),
        }
    }
}

/// Every simulated service, in-process, recording into one shared [`Ledger`]: inventory,
/// payments and shipping for the order saga; flights, hotels, payments and the mailer for
/// the travel saga.
///
/// Cheap to clone: clones share the ledger, fault injectors and scripts (so a test can
/// keep a clone for scripting and checking while another clone is being served).
#[derive(Debug, Clone)]
pub struct Services {
    ledger: Ledger,
    inventory: Arc<Inventory>,
    payments: Arc<Payments>,
    shipping: Arc<Shipping>,
    flights: Arc<Bookings>,
    hotels: Arc<Bookings>,
    mailer: Arc<Mailer>,
}

impl Default for Services {
    fn default() -> Self {
        Self::new(ServicePlans::default())
    }
}

impl Services {
    /// Fresh services with an empty ledger, injecting faults per `plans`.
    pub fn new(plans: ServicePlans) -> Self {
        let ledger = Ledger::new();
        Self {
            inventory: Arc::new(Inventory::new(ledger.clone(), plans.inventory)),
            payments: Arc::new(Payments::new(ledger.clone(), plans.payments)),
            shipping: Arc::new(Shipping::new(ledger.clone(), plans.shipping)),
            flights: Arc::new(Bookings::flights(ledger.clone(), plans.flights)),
            hotels: Arc::new(Bookings::hotels(ledger.clone(), plans.hotels)),
            mailer: Arc::new(Mailer::new(ledger.clone(), plans.mailer)),
            ledger,
        }
    }

    /// The inventory service.
    pub fn inventory(&self) -> Arc<dyn InventoryApi> {
        self.inventory.clone()
    }

    /// The payments service.
    pub fn payments(&self) -> Arc<dyn PaymentsApi> {
        self.payments.clone()
    }

    /// The shipping service.
    pub fn shipping(&self) -> Arc<dyn ShippingApi> {
        self.shipping.clone()
    }

    /// The flights service.
    pub fn flights(&self) -> Arc<dyn BookingApi> {
        self.flights.clone()
    }

    /// The hotels service.
    pub fn hotels(&self) -> Arc<dyn BookingApi> {
        self.hotels.clone()
    }

    /// The itinerary mailer.
    pub fn mailer(&self) -> Arc<dyn MailerApi> {
        self.mailer.clone()
    }

    /// The shared ledger.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The fault injector of one service.
    pub fn faults(&self, service: Service) -> &Faults {
        match service {
            Service::Inventory => self.inventory.faults(),
            Service::Payments => self.payments.faults(),
            Service::Shipping => self.shipping.faults(),
            Service::Flights => &self.flights.remote.faults,
            Service::Hotels => &self.hotels.remote.faults,
            Service::Mailer => &self.mailer.remote.faults,
        }
    }

    /// Queue scripted outcomes for operation `op` (`"reserve"`, `"charge"`, ... or an
    /// [`Operation`]) on whichever service exposes it. See [`Faults::script`].
    ///
    /// # Panics
    /// If `op` names no operation.
    pub fn script(&self, op: impl AsRef<str>, outcomes: Vec<Scripted>) {
        let name = op.as_ref();
        match name.parse::<Operation>() {
            Ok(op) => self.faults(op.service()).script(op, outcomes),
            Err(e) => panic!("{e}"),
        }
    }

    /// Faults injected so far by each service.
    pub fn fault_counts_by_service(&self) -> BTreeMap<Service, FaultCounts> {
        Service::ALL
            .into_iter()
            .map(|s| (s, self.faults(s).counts()))
            .collect()
    }

    /// Faults injected so far, all services together.
    pub fn fault_counts(&self) -> FaultCounts {
        Service::ALL
            .into_iter()
            .map(|s| self.faults(s).counts())
            .fold(FaultCounts::default(), |a, b| a + b)
    }
}
