//! A minimal saga driver (retry on transient / timeout, compensate on permanent) run
//! against randomly faulty services: the ledger must come out exactly-once and
//! net-consistent.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::*;
use crate::services::{
    FaultPlan, InventoryApi, OrderStatus, PaymentsApi, ServiceError, ServicePlans, Services,
    ShippingApi,
};

/// The three APIs a saga step may call.
#[derive(Debug, Clone)]
pub(super) struct Apis {
    pub(super) inventory: Arc<dyn InventoryApi>,
    pub(super) payments: Arc<dyn PaymentsApi>,
    pub(super) shipping: Arc<dyn ShippingApi>,
}

/// Retry one step under a stable key until it answers or fails permanently.
async fn step<T, F, Fut>(deadline: Duration, mut call: F) -> Result<T, ServiceError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ServiceError>>,
{
    for _ in 0..200 {
        match timeout(deadline, call()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(err)) if !err.is_retryable() => return Err(err),
            Ok(Err(_)) | Err(_) => {}
        }
    }
    Err(ServiceError::Transient(
        "step gave up after 200 attempts".into(),
    ))
}

/// Reserve, charge, ship; on a permanent failure compensate what was done.
/// Returns whether the order shipped. Compensations must eventually succeed.
pub(super) async fn run_order(
    apis: Apis,
    order: String,
    deadline: Duration,
) -> Result<bool, ServiceError> {
    let key = |step: &str| format!("{order}/{step}");
    let (reserve_key, release_key) = (key("reserve"), key("release"));
    let (charge_key, refund_key, ship_key) = (key("charge"), key("refund"), key("ship"));
    let reservation = match step(deadline, || {
        apis.inventory.reserve(&reserve_key, reserve_req(&order))
    })
    .await
    {
        Ok(r) => r,
        Err(ServiceError::Permanent(_)) => return Ok(false),
        Err(e) => return Err(e),
    };
    let release = || async {
        step(deadline, || {
            apis.inventory.release(
                &release_key,
                release_req(&order, &reservation.reservation_id),
            )
        })
        .await
        .map(|_| false)
    };
    let charge = match step(deadline, || {
        apis.payments.charge(&charge_key, charge_req(&order))
    })
    .await
    {
        Ok(c) => c,
        Err(ServiceError::Permanent(_)) => return release().await,
        Err(e) => return Err(e),
    };
    match step(deadline, || apis.shipping.ship(&ship_key, ship_req(&order))).await {
        Ok(_) => Ok(true),
        Err(ServiceError::Permanent(_)) => {
            step(deadline, || {
                apis.payments
                    .refund(&refund_key, refund_req(&order, &charge.charge_id))
            })
            .await?;
            release().await
        }
        Err(e) => Err(e),
    }
}

/// Run `n` orders concurrently; returns (order ids, how many shipped).
pub(super) async fn run_orders(
    apis: &Apis,
    n: usize,
    deadline: Duration,
) -> Result<(Vec<String>, usize), ServiceError> {
    let orders: Vec<String> = (0..n).map(|i| format!("order-{i:03}")).collect();
    let tasks: Vec<_> = orders
        .iter()
        .map(|order| tokio::spawn(run_order(apis.clone(), order.clone(), deadline)))
        .collect();
    let mut shipped = 0;
    for task in tasks {
        let done = task
            .await
            .map_err(|e| ServiceError::Transient(format!("order task failed: {e}")))??;
        shipped += usize::from(done);
    }
    Ok((orders, shipped))
}

/// Fault rates that exercise every path.
pub(super) fn faulty_plans(seed: u64) -> ServicePlans {
    ServicePlans::uniform(FaultPlan {
        transient: 0.2,
        hang: 0.15,
        permanent: 0.1,
        ..FaultPlan::seeded(seed)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faulty_services_stay_exactly_once_and_consistent() -> TestResult {
    let services = Services::new(faulty_plans(2024));
    let apis = Apis {
        inventory: services.inventory(),
        payments: services.payments(),
        shipping: services.shipping(),
    };
    let (orders, shipped) = run_orders(&apis, 60, Duration::from_millis(30)).await?;

    let report = services.ledger().check_orders(&orders);
    assert!(report.is_consistent(), "{report}");
    assert_eq!(report.count(OrderStatus::Shipped), shipped);
    assert_eq!(report.applied.ship as usize, shipped);
    assert!(shipped > 0 && shipped < orders.len(), "{report}");
    // `report()` covers the touched orders only; the effects are the same.
    let all = services.ledger().report();
    assert_eq!((all.applied, all.replays), (report.applied, report.replays));
    assert_eq!(
        all.orders.len() + report.count(OrderStatus::Untouched),
        orders.len()
    );
    let faults = services.fault_counts();
    assert!(
        faults.transient > 0 && faults.hang > 0 && faults.permanent > 0,
        "{faults:?}"
    );
    // Every hang applied an effect whose answer was lost; the retry got it as a replay.
    assert!(report.replays >= faults.hang, "{report} {faults:?}");
    Ok(())
}
