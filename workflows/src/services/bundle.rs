//! The three in-process services sharing one ledger.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::faults::{FaultCounts, FaultPlan, Faults, Scripted};
use super::inventory::{Inventory, InventoryApi};
use super::ledger::Ledger;
use super::operation::{Operation, Service};
use super::payments::{Payments, PaymentsApi};
use super::shipping::{Shipping, ShippingApi};

/// One [`FaultPlan`] per service. `Default` injects nothing anywhere.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServicePlans {
    /// Plan of the inventory service.
    pub inventory: FaultPlan,
    /// Plan of the payments service.
    pub payments: FaultPlan,
    /// Plan of the shipping service.
    pub shipping: FaultPlan,
}

impl ServicePlans {
    /// The same rates and latency for every service; seeds `plan.seed`, `+1`, `+2`
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
        }
    }
}

/// Inventory, payments and shipping, in-process, recording into one shared [`Ledger`].
///
/// Cheap to clone: clones share the ledger, fault injectors and scripts (so a test can
/// keep a clone for scripting and checking while another clone is being served).
#[derive(Debug, Clone)]
pub struct Services {
    ledger: Ledger,
    inventory: Arc<Inventory>,
    payments: Arc<Payments>,
    shipping: Arc<Shipping>,
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
