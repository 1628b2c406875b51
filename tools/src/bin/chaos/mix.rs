//! The mixed workload beside the order saga: three workflows defined here (not in the
//! workflows crate, so that they can be bent to what the chaos needs), all talking to the same
//! loopback services as the orders, every effect under the step's idempotency key, every
//! effect recorded in the ledger under the item's id (`pair-00012`, `flow-00012`), so the
//! ledger's order checks judge them like orders: a completed item reserved, charged and
//! shipped once; a compensated one net-zero.
//!
//! ```text
//! chaos_pair (parallel roots, immediate refusals):
//!   reserve ─┐
//!            ├─▶ ship (pivot)
//!   charge  ─┘
//!
//! chaos_flow v1 (timers, events, child runs), migrated automatically to v2 while it runs:
//!   reserve ─▶ approval (event `approve`, 3 s, compensate on timeout) ─▶ cool (timer)
//!           ─▶ payment (child run of chaos_child: charge) ─▶ ship (pivot)
//!   v2 adds `audit` (a local step after `reserve`, no effect).
//! ```
//!
//! A third of the pairs has one root refused for good at once, as a remote's 4xx answers
//! before applying anything (`ServiceError::Permanent`, decided by the item, not by chance,
//! so the checks know which runs must not complete): the other root, running or done, must
//! be compensated. A quarter of the flows never gets its event, so its wait times out and
//! the run compensates, undoing the reservation.

use std::sync::Arc;
use std::time::Duration;

use sagaflow::migration::Migration;
use sagaflow::{EventWait, OnTimeout, StepContext, StepError, Workflow};
use sagaflow_testkit::services::{
    Charge, ChargeRequest, HttpServices, InventoryApi, PaymentsApi, RefundRequest, ReleaseRequest,
    Reservation, ReserveRequest, ServiceError, ShipRequest, ShippingApi,
};
use sagaflow_workflows::remote_step::forward_output;
use serde::{Deserialize, Serialize};

use super::worker;

/// The parallel-roots workflow.
pub(crate) const PAIR_WORKFLOW: &str = "chaos_pair";
/// The long-lived workflow (event, timer, child run), in two versions.
pub(crate) const FLOW_WORKFLOW: &str = "chaos_flow";
/// The child run a flow starts.
pub(crate) const CHILD_WORKFLOW: &str = "chaos_child";
/// The event a flow waits for.
pub(crate) const APPROVE: &str = "approve";
/// How long a flow waits for its event before it compensates.
pub(crate) const EVENT_WAIT: Duration = Duration::from_secs(3);
/// A flow's durable timer.
pub(crate) const COOL: Duration = Duration::from_millis(300);
/// One pair in this many has a root refused for good.
const REFUSE_EVERY: usize = 3;
/// One flow in this many never gets its event.
const WITHHOLD_EVERY: usize = 4;

/// The kind of a submitted run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// The order saga (workflows crate).
    Order,
    /// [`PAIR_WORKFLOW`].
    Pair,
    /// [`FLOW_WORKFLOW`].
    Flow,
}

impl Kind {
    /// The workflow it starts.
    pub(crate) fn workflow(self) -> &'static str {
        match self {
            Self::Order => sagaflow_workflows::order::ORDER_WORKFLOW,
            Self::Pair => PAIR_WORKFLOW,
            Self::Flow => FLOW_WORKFLOW,
        }
    }
}

/// The input of the three workflows: what the ledger needs, and the item's fate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Item {
    /// The item's id: its business key and the ledger's order id of its effects.
    pub(crate) id: String,
    pub(crate) sku: String,
    pub(crate) qty: u32,
    pub(crate) amount_cents: u64,
    pub(crate) address: String,
    /// The root refused for good (pairs only).
    #[serde(default)]
    pub(crate) refuse: Option<String>,
}

impl Item {
    fn sample(prefix: &str, n: usize) -> Self {
        Self {
            id: format!("{prefix}-{n:05}"),
            sku: format!("SKU-{}", n % 7),
            qty: u32::try_from(n % 3 + 1).unwrap_or(1),
            amount_cents: 1999 + (n as u64 % 5) * 500,
            address: format!("{} Chaos Lane", n % 100 + 1),
            refuse: None,
        }
    }

    /// Pair number `n`: every third has one root refused, alternately `reserve` and `charge`.
    pub(crate) fn pair(n: usize) -> Self {
        let mut it = Self::sample("pair", n);
        if n.is_multiple_of(REFUSE_EVERY) {
            let root = if (n / REFUSE_EVERY).is_multiple_of(2) {
                "reserve"
            } else {
                "charge"
            };
            it.refuse = Some(root.to_owned());
        }
        it
    }

    /// Flow number `n`.
    pub(crate) fn flow(n: usize) -> Self {
        Self::sample("flow", n)
    }

    /// Whether flow number `n` gets its event.
    pub(crate) fn flow_gets_event(n: usize) -> bool {
        n % WITHHOLD_EVERY != WITHHOLD_EVERY - 1
    }

    fn reserve_request(&self) -> ReserveRequest {
        ReserveRequest {
            order_id: self.id.clone(),
            sku: self.sku.clone(),
            qty: self.qty,
        }
    }

    fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            order_id: self.id.clone(),
            amount_cents: self.amount_cents,
        }
    }

    /// The refusal of `root`, as the remote's 4xx would answer it (nothing applied), if
    /// this item's `root` is refused.
    fn refusal(&self, root: &str) -> Result<(), StepError> {
        match &self.refuse {
            Some(r) if r == root => Err(ServiceError::Permanent(format!(
                "{root} of {} refused for good",
                self.id
            ))
            .into()),
            _ => Ok(()),
        }
    }
}

/// The remote services, over loopback HTTP.
#[derive(Debug, Clone)]
pub(crate) struct Apis {
    inventory: Arc<dyn InventoryApi>,
    payments: Arc<dyn PaymentsApi>,
    shipping: Arc<dyn ShippingApi>,
}

impl From<&HttpServices> for Apis {
    fn from(s: &HttpServices) -> Self {
        Self {
            inventory: s.inventory(),
            payments: s.payments(),
            shipping: s.shipping(),
        }
    }
}

async fn reserve(inv: Arc<dyn InventoryApi>, ctx: StepContext) -> Result<Reservation, StepError> {
    let it: Item = ctx.input()?;
    it.refusal("reserve")?;
    Ok(inv
        .reserve(ctx.idempotency_key(), it.reserve_request())
        .await?)
}

async fn release(
    inv: Arc<dyn InventoryApi>,
    ctx: StepContext,
) -> Result<Option<serde_json::Value>, StepError> {
    let it: Item = ctx.input()?;
    if it.refusal("reserve").is_err() {
        return Ok(None);
    }
    let req = it.reserve_request();
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
    let released = inv.release(ctx.idempotency_key(), req).await?;
    Ok(Some(serde_json::to_value(released).unwrap_or_default()))
}

async fn charge(pay: Arc<dyn PaymentsApi>, ctx: StepContext) -> Result<Charge, StepError> {
    let it: Item = ctx.input()?;
    it.refusal("charge")?;
    Ok(pay
        .charge(ctx.idempotency_key(), it.charge_request())
        .await?)
}

async fn refund(
    pay: Arc<dyn PaymentsApi>,
    ctx: StepContext,
) -> Result<Option<serde_json::Value>, StepError> {
    let it: Item = ctx.input()?;
    if it.refusal("charge").is_err() {
        return Ok(None);
    }
    let req = it.charge_request();
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
    let refunded = pay.refund(ctx.idempotency_key(), req).await?;
    Ok(Some(serde_json::to_value(refunded).unwrap_or_default()))
}

async fn ship(
    ship: Arc<dyn ShippingApi>,
    ctx: StepContext,
) -> Result<serde_json::Value, StepError> {
    let it: Item = ctx.input()?;
    let req = ShipRequest {
        order_id: it.id,
        address: it.address,
    };
    let s = ship.ship(ctx.idempotency_key(), req).await?;
    Ok(serde_json::to_value(s).unwrap_or_default())
}

/// The parallel-roots workflow.
pub(crate) fn pair_saga(apis: &Apis) -> sagaflow::Result<Workflow> {
    let s = worker::order_settings();
    Workflow::builder(PAIR_WORKFLOW, 1)
        .default_retry(s.retry)
        .default_deadline(s.deadline)
        .step_using("reserve", apis.inventory.clone(), reserve)
        .compensate_using(apis.inventory.clone(), release)
        .step_using("charge", apis.payments.clone(), charge)
        .compensate_using(apis.payments.clone(), refund)
        .step_using("ship", apis.shipping.clone(), ship)
        .after(["reserve", "charge"])
        .pivot()
        .build()
}

/// The long-lived workflow, version 1 or 2 (which adds the local step `audit`).
pub(crate) fn flow_saga(apis: &Apis, version: i32) -> sagaflow::Result<Workflow> {
    let s = worker::order_settings();
    let mut b = Workflow::builder(FLOW_WORKFLOW, version)
        .default_retry(s.retry)
        .default_deadline(s.deadline)
        .step_using("reserve", apis.inventory.clone(), reserve)
        .compensate_using(apis.inventory.clone(), release);
    if version >= 2 {
        b = b
            .step("audit", |ctx: StepContext| async move {
                Ok::<_, StepError>(serde_json::json!({ "audited": ctx.run_id() }))
            })
            .after(["reserve"]);
    }
    b.wait_for_event(
        "approval",
        EventWait::named(APPROVE)
            .within(EVENT_WAIT)
            .on_timeout(OnTimeout::Compensate),
    )
    .after(["reserve"])
    .timer("cool", COOL)
    .after(["approval"])
    .child("payment", CHILD_WORKFLOW, |ctx| {
        ctx.input::<serde_json::Value>()
    })
    .after(["cool"])
    .step_using("ship", apis.shipping.clone(), ship)
    .after(["payment"])
    .pivot()
    .build()
}

/// The child run of a flow: it charges the card (refunded when the parent compensates).
pub(crate) fn child_saga(apis: &Apis) -> sagaflow::Result<Workflow> {
    let s = worker::order_settings();
    Workflow::builder(CHILD_WORKFLOW, 1)
        .default_retry(s.retry)
        .default_deadline(s.deadline)
        .step_using("charge", apis.payments.clone(), charge)
        .compensate_using(apis.payments.clone(), refund)
        .build()
}

/// The automatic migration of the flows from version 1 to 2.
pub(crate) fn flow_migration() -> Migration {
    Migration::new(FLOW_WORKFLOW, 1, 2).automatic()
}

/// Every workflow of the mixed workload, as the engine processes register them (the
/// coordinator's client registers version 1 of the flow only, so runs start on it).
pub(crate) fn workflows(apis: &Apis, flow_versions: &[i32]) -> sagaflow::Result<Vec<Workflow>> {
    let mut wfs = vec![pair_saga(apis)?, child_saga(apis)?];
    for v in flow_versions {
        wfs.push(flow_saga(apis, *v)?);
    }
    Ok(wfs)
}
