//! The canonical order saga (SAS-7): reserve stock → charge the card → ship.
//!
//! `reserve_stock` and `charge_card` are compensatable (release, refund). `ship` is the pivot:
//! once a parcel left, nothing is undone; if shipping fails for good, the charge is refunded
//! and the stock released, in that order. A compensation of a step whose outcome is unknown
//! (it timed out, so it may have applied) replays the forward call under the forward step's
//! idempotency key to learn what to undo. Every remote call carries the step's idempotency
//! key, so a retried or re-run step never applies its effect twice.

use std::sync::Arc;
use std::time::Duration;

use sagaflow::{DeadlinePolicy, RetryPolicy, Workflow};
use serde::{Deserialize, Serialize};

use crate::remote_step::{forward_output, step_error};
use sagaflow_testkit::services::{Charge, Shipment};
use sagaflow_testkit::services::{
    ChargeRequest, HttpServices, InventoryApi, PaymentsApi, RefundRequest, ReleaseRequest,
    Reservation, ReserveRequest, Services, ShipRequest, ShippingApi,
};

/// The workflow's name.
pub const ORDER_WORKFLOW: &str = "order";

/// An order, the saga's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Order {
    /// Business id of the order (also the run's business key).
    pub order_id: String,
    /// Stock keeping unit.
    pub sku: String,
    /// Quantity.
    pub qty: u32,
    /// Amount to charge, in cents.
    pub amount_cents: u64,
    /// Where to ship.
    pub address: String,
}

impl Order {
    /// A sample order with the given number.
    pub fn sample(n: usize) -> Self {
        Self {
            order_id: format!("order-{n:05}"),
            sku: format!("SKU-{}", n % 7),
            qty: u32::try_from(n % 3 + 1).unwrap_or(1),
            amount_cents: 1999 + (n as u64 % 5) * 500,
            address: format!("{} Saga Street", n % 100 + 1),
        }
    }

    /// The stock reservation `reserve_stock` asks for.
    fn reserve_request(self) -> ReserveRequest {
        ReserveRequest {
            order_id: self.order_id,
            sku: self.sku,
            qty: self.qty,
        }
    }

    /// The charge `charge_card` asks for.
    fn charge_request(self) -> ChargeRequest {
        ChargeRequest {
            order_id: self.order_id,
            amount_cents: self.amount_cents,
        }
    }
}

/// The remote services the saga talks to.
#[derive(Debug, Clone)]
pub struct OrderApis {
    /// Inventory.
    pub inventory: Arc<dyn InventoryApi>,
    /// Payments.
    pub payments: Arc<dyn PaymentsApi>,
    /// Shipping.
    pub shipping: Arc<dyn ShippingApi>,
}

impl From<&Services> for OrderApis {
    fn from(s: &Services) -> Self {
        Self {
            inventory: s.inventory(),
            payments: s.payments(),
            shipping: s.shipping(),
        }
    }
}

impl From<&HttpServices> for OrderApis {
    fn from(s: &HttpServices) -> Self {
        Self {
            inventory: s.inventory(),
            payments: s.payments(),
            shipping: s.shipping(),
        }
    }
}

/// Tunables of the saga (defaults suit the demo; tests shorten the deadline).
#[derive(Debug, Clone, Copy)]
pub struct OrderSettings {
    /// Version registered.
    pub version: i32,
    /// Retry policy of every step.
    pub retry: RetryPolicy,
    /// Deadline policy of every step.
    pub deadline: DeadlinePolicy,
}

impl Default for OrderSettings {
    fn default() -> Self {
        Self {
            version: 1,
            retry: RetryPolicy::default()
                .with_max_failures(4)
                .with_backoff(Duration::from_millis(20), Duration::from_millis(500)),
            deadline: DeadlinePolicy::new(Duration::from_secs(2), Duration::from_secs(8)),
        }
    }
}

/// Builds the order saga over `apis`.
///
/// # Errors
/// Never for these settings unless they are inconsistent (e.g. a zero deadline):
/// [`sagaflow::Error::InvalidDefinition`].
pub fn order_saga(apis: OrderApis, settings: OrderSettings) -> sagaflow::Result<Workflow> {
    let OrderApis {
        inventory,
        payments,
        shipping,
    } = apis;
    Workflow::builder(ORDER_WORKFLOW, settings.version)
        .input::<Order>()
        .default_retry(settings.retry)
        .default_deadline(settings.deadline)
        .step_using("reserve_stock", inventory.clone(), |inv, ctx| async move {
            let o: Order = ctx.input()?;
            inv.reserve(ctx.idempotency_key(), o.reserve_request())
                .await
                .map_err(step_error)
        })
        .compensate_using(inventory, |inv, ctx| async move {
            let req = ctx.input::<Order>()?.reserve_request();
            let replay = |key: String| {
                let inv = inv.clone();
                async move { inv.reserve(&key, req).await }
            };
            let Some(r) = forward_output::<Reservation, _, _>(&ctx, replay).await? else {
                return Ok(None);
            };
            let req = ReleaseRequest {
                order_id: r.order_id,
                reservation_id: r.reservation_id,
            };
            inv.release(ctx.idempotency_key(), req)
                .await
                .map(Some)
                .map_err(step_error)
        })
        .step_using("charge_card", payments.clone(), |pay, ctx| async move {
            let o: Order = ctx.input()?;
            let _reserved: Reservation = ctx.dep("reserve_stock")?;
            pay.charge(ctx.idempotency_key(), o.charge_request())
                .await
                .map_err(step_error)
        })
        .after(["reserve_stock"])
        .compensate_using(payments, |pay, ctx| async move {
            let req = ctx.input::<Order>()?.charge_request();
            let replay = |key: String| {
                let pay = pay.clone();
                async move { pay.charge(&key, req).await }
            };
            let Some(c) = forward_output::<Charge, _, _>(&ctx, replay).await? else {
                return Ok(None);
            };
            let req = RefundRequest {
                order_id: c.order_id,
                charge_id: c.charge_id,
            };
            pay.refund(ctx.idempotency_key(), req)
                .await
                .map(Some)
                .map_err(step_error)
        })
        .step_using("ship", shipping, |ship, ctx| async move {
            let o: Order = ctx.input()?;
            let _charged: Charge = ctx.dep("charge_card")?;
            let req = ShipRequest {
                order_id: o.order_id,
                address: o.address,
            };
            let s: Shipment = ship
                .ship(ctx.idempotency_key(), req)
                .await
                .map_err(step_error)?;
            Ok(s)
        })
        .after(["charge_card"])
        .pivot()
        .build()
}
