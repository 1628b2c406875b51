//! The in-process services: apply once, replay, faults.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::timeout;

use super::*;
use crate::services::{
    FaultCounts, FaultPlan, Operation, OrderStatus, Scripted, Service, ServiceError, ServicePlans,
    Services,
};

#[tokio::test]
async fn first_call_applies_and_repeat_key_replays() -> TestResult {
    let services = Services::default();
    let inventory = services.inventory();
    let first = inventory.reserve("o1/reserve", reserve_req("o1")).await?;
    let again = inventory.reserve("o1/reserve", reserve_req("o1")).await?;
    assert_eq!(first, again);
    assert_eq!(first.order_id, "o1");
    assert_eq!((first.sku.as_str(), first.qty), ("SKU-1", 2));

    let ledger = services.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger.applied_count(Operation::Reserve), 1);
    let record = ledger.get("o1/reserve").ok_or("no record")?;
    assert_eq!(record.replays, 1);
    assert_eq!(
        (record.service, record.operation),
        (Service::Inventory, Operation::Reserve)
    );
    assert_eq!(record.order_id, "o1");
    assert_eq!(record.response, serde_json::to_value(&first)?);
    Ok(())
}

#[tokio::test]
async fn every_operation_applies_once_per_key() -> TestResult {
    let services = Services::default();
    let (inv, pay, ship) = (
        services.inventory(),
        services.payments(),
        services.shipping(),
    );
    for _ in 0..3 {
        let r = inv.reserve("k-res", reserve_req("o1")).await?;
        inv.release("k-rel", release_req("o1", &r.reservation_id))
            .await?;
        let c = pay.charge("k-ch", charge_req("o1")).await?;
        assert_eq!(c.amount_cents, 4_200);
        let refund = pay.refund("k-ref", refund_req("o1", &c.charge_id)).await?;
        assert_eq!(refund.charge_id, c.charge_id);
        let s = ship.ship("k-ship", ship_req("o2")).await?;
        assert_eq!(s.order_id, "o2");
    }
    let ledger = services.ledger();
    for op in Operation::ORDER {
        assert_eq!(ledger.applied_count(op), 1, "{op}");
    }
    assert!(ledger.records().iter().all(|r| r.replays == 2));
    assert_eq!(ledger.total_replays(), 10);
    Ok(())
}

#[tokio::test]
async fn transient_failure_does_not_apply_and_a_retry_applies() -> TestResult {
    let services = Services::default();
    services.script("charge", vec![Scripted::Transient]);
    let payments = services.payments();

    let err = payments.charge("o1/charge", charge_req("o1")).await;
    assert!(matches!(&err, Err(ServiceError::Transient(_))), "{err:?}");
    assert!(err.as_ref().err().is_some_and(ServiceError::is_retryable));
    assert!(services.ledger().is_empty());

    let charge = payments.charge("o1/charge", charge_req("o1")).await?;
    let record = services.ledger().get("o1/charge").ok_or("not applied")?;
    assert_eq!(record.replays, 0);
    assert_eq!(record.response, serde_json::to_value(&charge)?);
    assert_eq!(
        services.fault_counts(),
        FaultCounts {
            transient: 1,
            ..FaultCounts::default()
        }
    );
    Ok(())
}

#[tokio::test]
async fn random_permanent_failure_is_deterministic_per_key() -> TestResult {
    let plans = ServicePlans {
        payments: FaultPlan {
            permanent: 0.5,
            ..FaultPlan::seeded(11)
        },
        ..ServicePlans::default()
    };
    let plans_again = plans.clone();
    let services = Services::new(plans);
    let payments = services.payments();
    let (mut declined, mut charged) = (None, None);
    for i in 0..64 {
        let order = format!("o{i}");
        let key = format!("{order}/charge");
        match payments.charge(&key, charge_req(&order)).await {
            Err(ServiceError::Permanent(msg)) => {
                assert_eq!(msg, "card declined");
                declined.get_or_insert((order, key));
            }
            Ok(_) => {
                charged.get_or_insert((order, key));
            }
            Err(other) => return Err(other.into()),
        }
    }
    let (order, key) = declined.ok_or("no key was declined")?;
    for _ in 0..5 {
        let again = payments.charge(&key, charge_req(&order)).await;
        assert!(
            matches!(again, Err(ServiceError::Permanent(_))),
            "{again:?}"
        );
    }
    assert!(services.ledger().get(&key).is_none());
    let (order, charged_key) = charged.ok_or("no key was charged")?;
    payments.charge(&charged_key, charge_req(&order)).await?;

    // Same seed, fresh services: the same first key is declined.
    let fresh = Services::new(plans_again);
    assert_eq!(declined_key_again(&fresh, 64).await?, key);
    Ok(())
}

async fn declined_key_again(
    services: &Services,
    n: usize,
) -> Result<String, Box<dyn std::error::Error>> {
    for i in 0..n {
        let order = format!("o{i}");
        let key = format!("{order}/charge");
        if let Err(ServiceError::Permanent(_)) =
            services.payments().charge(&key, charge_req(&order)).await
        {
            return Ok(key);
        }
    }
    Err("no key declined".into())
}

#[tokio::test]
async fn compensations_only_fail_permanently_when_scripted() -> TestResult {
    let services = Services::new(ServicePlans::uniform(FaultPlan {
        permanent: 1.0,
        ..FaultPlan::seeded(3)
    }));
    let err = services
        .payments()
        .charge("o1/charge", charge_req("o1"))
        .await;
    assert!(matches!(err, Err(ServiceError::Permanent(_))));
    services
        .payments()
        .refund("o1/refund", refund_req("o1", "ch-x"))
        .await?;
    services
        .inventory()
        .release("o1/release", release_req("o1", "rsv-x"))
        .await?;

    services.script(Operation::Release, vec![Scripted::Permanent]);
    let err = services
        .inventory()
        .release("o2/release", release_req("o2", "rsv-y"))
        .await;
    assert!(matches!(err, Err(ServiceError::Permanent(_))), "{err:?}");
    // Scripted permanent is for one call only.
    services
        .inventory()
        .release("o2/release", release_req("o2", "rsv-y"))
        .await?;
    Ok(())
}

#[tokio::test]
async fn scripted_outcomes_are_consumed_in_order() -> TestResult {
    let services = Services::default();
    services.script(
        "reserve",
        vec![
            Scripted::Transient,
            Scripted::Permanent,
            Scripted::Ok,
            Scripted::Transient,
        ],
    );
    let inventory = services.inventory();
    let key = "o1/reserve";
    let r1 = inventory.reserve(key, reserve_req("o1")).await;
    assert!(matches!(r1, Err(ServiceError::Transient(_))), "{r1:?}");
    let r2 = inventory.reserve(key, reserve_req("o1")).await;
    assert!(matches!(r2, Err(ServiceError::Permanent(_))), "{r2:?}");
    assert!(services.ledger().is_empty());
    let r3 = inventory.reserve(key, reserve_req("o1")).await?;
    let r4 = inventory.reserve(key, reserve_req("o1")).await;
    assert!(matches!(r4, Err(ServiceError::Transient(_))), "{r4:?}");
    let r5 = inventory.reserve(key, reserve_req("o1")).await?;
    assert_eq!(r3, r5);
    assert_eq!(services.ledger().get(key).ok_or("missing")?.replays, 1);
    assert_eq!(
        services
            .faults(Service::Inventory)
            .scripted_left(Operation::Reserve),
        0
    );
    assert_eq!(
        services.fault_counts(),
        FaultCounts {
            transient: 2,
            permanent: 1,
            ..FaultCounts::default()
        }
    );
    Ok(())
}

#[tokio::test]
async fn hang_applies_the_effect_and_a_retry_replays_it() -> TestResult {
    let services = Services::default();
    services.script("ship", vec![Scripted::Hang]);
    let shipping = services.shipping();

    let hung = timeout(HANG_CHECK, shipping.ship("o1/ship", ship_req("o1"))).await;
    assert!(hung.is_err(), "hung call answered: {hung:?}");
    let record = services
        .ledger()
        .get("o1/ship")
        .ok_or("hang did not apply")?;
    assert_eq!(record.replays, 0);

    let retry = timeout(ANSWER_BOUND, shipping.ship("o1/ship", ship_req("o1"))).await??;
    assert_eq!(serde_json::to_value(&retry)?, record.response);
    assert_eq!(services.ledger().get("o1/ship").ok_or("gone")?.replays, 1);
    assert_eq!(services.ledger().applied_count(Operation::Ship), 1);
    assert_eq!(
        services.fault_counts_by_service()[&Service::Shipping].hang,
        1
    );
    Ok(())
}

#[tokio::test]
async fn a_call_cancelled_during_latency_has_already_applied() -> TestResult {
    let services = Services::new(ServicePlans::uniform(FaultPlan {
        latency: Duration::from_secs(5),
        ..FaultPlan::default()
    }));
    let cut = timeout(
        Duration::from_millis(50),
        services.payments().charge("k", charge_req("o1")),
    )
    .await;
    assert!(cut.is_err());
    assert_eq!(services.ledger().get("k").ok_or("not applied")?.replays, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_with_one_key_apply_once() -> TestResult {
    let services = Services::default();
    let payments = services.payments();
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let payments = Arc::clone(&payments);
            tokio::spawn(async move { payments.charge("o1/charge", charge_req("o1")).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await??);
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]));
    let record = services.ledger().get("o1/charge").ok_or("missing")?;
    assert_eq!((services.ledger().len(), record.replays), (1, 31));
    Ok(())
}

#[tokio::test]
async fn reusing_a_key_with_another_request_is_refused() -> TestResult {
    let services = Services::default();
    services.payments().charge("k", charge_req("o1")).await?;
    let other = ChargeRequest {
        amount_cents: 1,
        ..charge_req("o1")
    };
    let err = services.payments().charge("k", other).await;
    assert!(matches!(err, Err(ServiceError::Permanent(_))), "{err:?}");
    let err = services.shipping().ship("", ship_req("o1")).await;
    assert!(matches!(err, Err(ServiceError::Permanent(_))), "{err:?}");
    assert_eq!(services.ledger().len(), 1);
    Ok(())
}

#[tokio::test]
async fn report_flags_double_charge_and_dangling_reservation() -> TestResult {
    let services = Services::default();
    let (inv, pay, ship) = (
        services.inventory(),
        services.payments(),
        services.shipping(),
    );

    // o1: charged under two keys (an engine with unstable keys), then shipped.
    inv.reserve("o1/reserve", reserve_req("o1")).await?;
    pay.charge("o1/charge#1", charge_req("o1")).await?;
    pay.charge("o1/charge#2", charge_req("o1")).await?;
    ship.ship("o1/ship", ship_req("o1")).await?;
    // o2: reserved, then abandoned.
    inv.reserve("o2/reserve", reserve_req("o2")).await?;
    // o3: the happy path.
    inv.reserve("o3/reserve", reserve_req("o3")).await?;
    pay.charge("o3/charge", charge_req("o3")).await?;
    ship.ship("o3/ship", ship_req("o3")).await?;
    // o4: compensated after payment.
    let r = inv.reserve("o4/reserve", reserve_req("o4")).await?;
    let c = pay.charge("o4/charge", charge_req("o4")).await?;
    pay.refund("o4/refund", refund_req("o4", &c.charge_id))
        .await?;
    inv.release("o4/release", release_req("o4", &r.reservation_id))
        .await?;

    let report = services.ledger().report();
    assert_eq!(report.violations.len(), 2, "{report}");
    assert!(
        report.violations[0].contains("order \"o1\": charge applied 2 times"),
        "{report}"
    );
    assert_eq!(
        report.violations[1],
        "order \"o2\": stock reserved but neither shipped nor released"
    );
    assert_eq!(report.orders["o1"], OrderStatus::Inconsistent);
    assert_eq!(report.orders["o2"], OrderStatus::Inconsistent);
    assert_eq!(report.orders["o3"], OrderStatus::Shipped);
    assert_eq!(report.orders["o4"], OrderStatus::Compensated);
    assert_eq!(report.applied.charge, 4);

    let subset = services
        .ledger()
        .check_orders(&["o3".into(), "o4".into(), "o5".into()]);
    assert!(subset.is_consistent(), "{subset}");
    assert_eq!(subset.orders["o5"], OrderStatus::Untouched);
    Ok(())
}
