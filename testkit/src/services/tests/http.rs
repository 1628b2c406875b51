//! The loopback HTTP face: round trips, status mapping, hangs, shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::timeout;

use super::saga::{Apis, faulty_plans, run_orders};
use super::*;
use crate::services::{
    HttpServices, IDEMPOTENCY_KEY_HEADER, Operation, Scripted, ServerHandle, ServiceError,
    Services, serve,
};

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

async fn start(services: &Services) -> Result<(ServerHandle, HttpServices), std::io::Error> {
    let server = serve(services.clone(), LOOPBACK).await?;
    let client = HttpServices::new(server.base_url());
    Ok((server, client))
}

#[tokio::test]
async fn every_operation_round_trips_and_replays() -> TestResult {
    let services = Services::default();
    let (server, client) = start(&services).await?;
    assert_ne!(server.addr().port(), 0);
    let (inv, pay, ship) = (client.inventory(), client.payments(), client.shipping());

    for _ in 0..2 {
        let r = inv.reserve("o1/reserve", reserve_req("o1")).await?;
        assert_eq!((r.order_id.as_str(), r.qty), ("o1", 2));
        let released = inv
            .release("o1/release", release_req("o1", &r.reservation_id))
            .await?;
        assert_eq!(released.order_id, "o1");
        let c = pay.charge("o1/charge", charge_req("o1")).await?;
        assert_eq!(c.amount_cents, 4_200);
        let refund = pay
            .refund("o1/refund", refund_req("o1", &c.charge_id))
            .await?;
        assert_eq!(refund.charge_id, c.charge_id);
        let s = ship.ship("o2/ship", ship_req("o2")).await?;
        assert!(s.tracking_id.starts_with("trk-"));
    }

    let records = client.ledger_records().await?;
    assert_eq!(records, services.ledger().records());
    assert_eq!(records.len(), 5);
    for op in Operation::ORDER {
        let record = records
            .iter()
            .find(|r| r.operation == op)
            .ok_or("missing op")?;
        assert_eq!(record.replays, 1, "{op}");
    }
    let report = client.report().await?;
    assert_eq!(report, services.ledger().report());
    assert_eq!(report.replays, 5);
    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn transient_maps_to_503_and_permanent_to_422() -> TestResult {
    let services = Services::default();
    let (server, client) = start(&services).await?;
    services.script("charge", vec![Scripted::Transient]);
    services.script("ship", vec![Scripted::Permanent]);

    let err = client
        .payments()
        .charge("o1/charge", charge_req("o1"))
        .await;
    assert_eq!(
        err,
        Err(ServiceError::Transient("scripted transient charge".into()))
    );
    let err = client.shipping().ship("o1/ship", ship_req("o1")).await;
    assert_eq!(
        err,
        Err(ServiceError::Permanent(
            "address undeliverable (scripted)".into()
        ))
    );
    assert!(services.ledger().is_empty());

    // Raw statuses and bodies.
    services.script("reserve", vec![Scripted::Transient, Scripted::Permanent]);
    let http = reqwest::Client::new();
    let url = format!("{}/inventory/reserve", server.base_url());
    for (status, kind) in [(503, "transient"), (422, "permanent")] {
        let resp = http
            .post(&url)
            .header(IDEMPOTENCY_KEY_HEADER, "o1/reserve")
            .json(&reserve_req("o1"))
            .send()
            .await?;
        assert_eq!(resp.status().as_u16(), status);
        let body: serde_json::Value = resp.json().await?;
        assert_eq!(body["kind"], kind);
    }
    let faults = client.fault_counts().await?;
    assert_eq!(faults, services.fault_counts_by_service());
    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn missing_key_or_bad_body_is_400() -> TestResult {
    let services = Services::default();
    let (server, client) = start(&services).await?;
    let http = reqwest::Client::new();
    let url = format!("{}/payments/charge", server.base_url());

    let resp = http.post(&url).json(&charge_req("o1")).send().await?;
    assert_eq!(resp.status().as_u16(), 400);
    let body: ServiceError = resp.json().await?;
    assert!(matches!(body, ServiceError::Permanent(m) if m.contains("Idempotency-Key")));

    let resp = http
        .post(&url)
        .header(IDEMPOTENCY_KEY_HEADER, "k")
        .body("{not json")
        .send()
        .await?;
    assert_eq!(resp.status().as_u16(), 400);

    let err = client.payments().charge("", charge_req("o1")).await;
    assert!(matches!(err, Err(ServiceError::Permanent(_))), "{err:?}");
    assert!(services.ledger().is_empty());
    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn hung_request_applied_and_retry_gets_the_replay() -> TestResult {
    let services = Services::default();
    let (server, client) = start(&services).await?;
    services.script("reserve", vec![Scripted::Hang]);
    let inventory = client.inventory();

    let hung = timeout(
        HANG_CHECK,
        inventory.reserve("o1/reserve", reserve_req("o1")),
    )
    .await;
    assert!(hung.is_err(), "hung request answered: {hung:?}");
    let record = services
        .ledger()
        .get("o1/reserve")
        .ok_or("hang did not apply")?;
    assert_eq!(record.replays, 0);

    let retry = timeout(
        ANSWER_BOUND,
        inventory.reserve("o1/reserve", reserve_req("o1")),
    )
    .await??;
    assert_eq!(serde_json::to_value(&retry)?, record.response);
    let records = client.ledger_records().await?;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].replays, 1);
    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn shutdown_answers_hung_requests_then_connections_fail() -> TestResult {
    let services = Services::default();
    let (server, client) = start(&services).await?;
    services.script("charge", vec![Scripted::Hang]);
    let payments = client.payments();
    let hung = tokio::spawn(async move { payments.charge("o1/charge", charge_req("o1")).await });
    // Wait (boundedly) until the hung request reached the service.
    timeout(Duration::from_secs(5), async {
        while services.ledger().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;

    timeout(Duration::from_secs(5), server.shutdown()).await??;
    let answer = timeout(Duration::from_secs(5), hung).await??;
    // The hung call had applied its effect: its answer must not claim otherwise.
    assert!(
        matches!(&answer, Err(e) if e.may_have_applied()),
        "{answer:?}"
    );

    // A connection that cannot be made never carried the request: not applied, retryable.
    let err = client
        .payments()
        .charge("o1/charge", charge_req("o1"))
        .await;
    assert!(matches!(err, Err(ServiceError::Transient(_))), "{err:?}");
    assert!(err.as_ref().err().is_some_and(ServiceError::is_retryable));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faulty_services_over_http_stay_exactly_once_and_consistent() -> TestResult {
    let services = Services::new(faulty_plans(7));
    let (server, client) = start(&services).await?;
    let apis = Apis {
        inventory: client.inventory(),
        payments: client.payments(),
        shipping: client.shipping(),
    };
    let (orders, shipped) = run_orders(&apis, 30, Duration::from_millis(100)).await?;
    let report = services.ledger().check_orders(&orders);
    assert!(report.is_consistent(), "{report}");
    assert_eq!(client.report().await?, services.ledger().report());
    assert_eq!(report.applied.ship as usize, shipped);
    assert!(services.fault_counts().hang > 0);
    assert!(report.replays >= services.fault_counts().hang, "{report}");
    server.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_replies_apply_once_and_refusals_apply_nothing() -> TestResult {
    let services = Services::default();
    let (server, client) = start(&services).await?;
    services.script(
        "charge",
        vec![
            Scripted::ResetAfterApply,
            Scripted::BadGatewayAfterApply,
            Scripted::GatewayTimeoutAfterApply,
        ],
    );
    let payments = client.payments();
    // Three lost replies of one key: applied once, each answer says "outcome unknown".
    for _ in 0..3 {
        let err = payments.charge("o1/charge", charge_req("o1")).await;
        assert!(
            matches!(&err, Err(e @ ServiceError::Transport(_)) if e.may_have_applied() && e.is_retryable()),
            "{err:?}"
        );
    }
    assert_eq!(services.ledger().applied_count(Operation::Charge), 1);
    let replay = payments.charge("o1/charge", charge_req("o1")).await?;
    assert_eq!(
        services.ledger().get("o1/charge").map(|r| r.replays),
        Some(3)
    );
    assert_eq!(replay.order_id, "o1");

    services.script(
        "charge",
        vec![Scripted::RefuseNotApplied, Scripted::BusyNotApplied],
    );
    let conflict = payments.charge("o2/charge", charge_req("o2")).await;
    assert!(
        matches!(&conflict, Err(e @ ServiceError::Conflict(_)) if !e.may_have_applied() && !e.is_retryable()),
        "{conflict:?}"
    );
    let busy = payments.charge("o2/charge", charge_req("o2")).await;
    assert!(
        matches!(
            &busy,
            Err(ServiceError::Busy {
                retry_after_ms: Some(1000),
                ..
            })
        ),
        "{busy:?}"
    );
    assert!(
        services.ledger().get("o2/charge").is_none(),
        "refusals apply nothing"
    );
    server.shutdown().await?;
    Ok(())
}
