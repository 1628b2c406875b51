//! Ambiguous outcomes over real loopback HTTP: a remote that applied an effect and lost its
//! reply (a reset connection, a 502, a 504) leaves the step *maybe applied*, so when the saga
//! unwinds that step is compensated; a remote that refused without applying (409) is not.
//! The services record every effect by idempotency key, so the ledger proves what happened.

use sagaflow::AlertKind;
use sagaflow::HistoryKind;
use sagaflow::{Engine, RunState, StartOptions};
use sagaflow_testkit::services::{
    HttpServices, Operation, Scripted, ServerHandle, Services, serve,
};
use sagaflow_testkit::{TestDb, backends, expect_state};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use uuid::Uuid;

use crate::fixtures::order_settings;

/// The failure threshold of every step in these tests.
const THRESHOLD: u32 = 2;

struct Rig {
    services: Services,
    server: ServerHandle,
    engine: Engine,
}

async fn rig(db: &TestDb) -> Rig {
    let services = Services::default();
    let server = serve(services.clone(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    let http = HttpServices::new(server.base_url());
    let wf = order_saga(OrderApis::from(&http), order_settings(2_000, THRESHOLD)).expect("saga");
    let engine = sagaflow_testkit::engine(db, vec![wf]).await;
    Rig {
        services,
        server,
        engine,
    }
}

impl Rig {
    async fn order(&self, n: usize) -> (Uuid, Order) {
        let order = Order::sample(n);
        let started = self
            .engine
            .start_with(
                ORDER_WORKFLOW,
                &order,
                StartOptions::keyed(order.order_id.clone()),
            )
            .await
            .expect("start");
        (started.id, order)
    }

    fn applied(&self, order: &Order, op: Operation) -> usize {
        self.services
            .ledger()
            .records_for_order(&order.order_id)
            .iter()
            .filter(|r| r.operation == op)
            .count()
    }

    /// Net consistency: no key applied twice, and every applied forward effect of a
    /// compensated order undone.
    fn assert_consistent(&self, order: &Order, backend: &str) {
        let report = self
            .services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert!(
            report.violations.is_empty(),
            "[{backend}] {:?}",
            report.violations
        );
    }

    async fn stop(self) {
        self.engine.shutdown().await;
        self.server.shutdown().await.expect("server shutdown");
    }
}

/// The lost-reply faults of each forward step, until its failure threshold is passed.
fn lose_every_reply(fault: Scripted) -> Vec<Scripted> {
    vec![fault; THRESHOLD as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_reserve_that_applied_and_lost_its_replies_is_released() {
    for db in backends().await {
        let rig = rig(&db).await;
        rig.services
            .script("reserve", lose_every_reply(Scripted::ResetAfterApply));
        let (id, order) = rig.order(1).await;
        expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        assert_eq!(
            rig.applied(&order, Operation::Reserve),
            1,
            "[{}]",
            db.backend
        );
        assert_eq!(
            rig.applied(&order, Operation::Release),
            1,
            "[{}] the reservation the saga never heard of is released",
            db.backend
        );
        assert_eq!(rig.applied(&order, Operation::Charge), 0);
        rig.assert_consistent(&order, db.backend);
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_charge_behind_bad_gateways_is_refunded_exactly_once() {
    for db in backends().await {
        let rig = rig(&db).await;
        rig.services
            .script("charge", lose_every_reply(Scripted::BadGatewayAfterApply));
        let (id, order) = rig.order(2).await;
        expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        assert_eq!(
            (
                rig.applied(&order, Operation::Charge),
                rig.applied(&order, Operation::Refund),
                rig.applied(&order, Operation::Release),
            ),
            (1, 1, 1),
            "[{}] charged once, refunded once, released once",
            db.backend
        );
        rig.assert_consistent(&order, db.backend);
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_pivot_behind_gateway_timeouts_stops_for_an_operator() {
    for db in backends().await {
        let rig = rig(&db).await;
        rig.services
            .script("ship", lose_every_reply(Scripted::GatewayTimeoutAfterApply));
        let (id, order) = rig.order(3).await;
        expect_state(&rig.engine, id, RunState::Error, db.backend).await;
        let alerts = rig.engine.run_alerts(id).await.expect("alerts");
        assert!(
            alerts.iter().any(
                |a| a.kind == AlertKind::RunError && a.reason.contains("may have taken effect")
            ),
            "[{}] {alerts:?}",
            db.backend
        );
        assert_eq!(
            (
                rig.applied(&order, Operation::Refund),
                rig.applied(&order, Operation::Release),
            ),
            (0, 0),
            "[{}] a parcel that may have left is not refunded behind the operator's back",
            db.backend
        );
        // The operator retries the pivot under its key: the shipment is replayed, not
        // repeated, and the order completes.
        rig.engine
            .operator()
            .retry(id, "ship")
            .await
            .expect("retry ship");
        expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        assert_eq!(rig.applied(&order, Operation::Ship), 1, "[{}]", db.backend);
        rig.assert_consistent(&order, db.backend);
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_outcomes_do_not_touch_a_charge_refused_without_applying() {
    for db in backends().await {
        let rig = rig(&db).await;
        rig.services
            .script("charge", vec![Scripted::RefuseNotApplied]);
        let (id, order) = rig.order(4).await;
        expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        assert_eq!(
            rig.applied(&order, Operation::Release),
            1,
            "[{}]",
            db.backend
        );
        assert_eq!(
            (
                rig.applied(&order, Operation::Charge),
                rig.applied(&order, Operation::Refund),
            ),
            (0, 0),
            "[{}] no charge, and no refund call",
            db.backend
        );
        let charge_calls = rig
            .services
            .ledger()
            .get(&format!("{id}:charge_card"))
            .map_or(0, |r| r.replays);
        assert_eq!(
            charge_calls, 0,
            "[{}] the compensation did not run",
            db.backend
        );
        rig.assert_consistent(&order, db.backend);
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_then_refused_is_still_compensated_once() {
    for db in backends().await {
        let rig = rig(&db).await;
        // The first charge applies and its reply is lost; the retry (same key) is refused.
        // One attempt's outcome was unknown, so the step stays maybe applied.
        rig.services.script(
            "charge",
            vec![Scripted::BadGatewayAfterApply, Scripted::RefuseNotApplied],
        );
        let (id, order) = rig.order(5).await;
        expect_state(&rig.engine, id, RunState::Compensated, db.backend).await;
        assert_eq!(
            (
                rig.applied(&order, Operation::Charge),
                rig.applied(&order, Operation::Refund),
            ),
            (1, 1),
            "[{}] the charge that did happen is refunded exactly once",
            db.backend
        );
        rig.assert_consistent(&order, db.backend);
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_busy_remote_is_retried_without_marking_the_step() {
    for db in backends().await {
        let rig = rig(&db).await;
        rig.services
            .script("charge", vec![Scripted::BusyNotApplied]);
        let (id, order) = rig.order(6).await;
        expect_state(&rig.engine, id, RunState::Completed, db.backend).await;
        let history = rig.engine.history(id).await.expect("history");
        let retry = history
            .iter()
            .find(|h| h.kind == HistoryKind::Retry && h.step.as_deref() == Some("charge_card"))
            .expect("a retry of the charge");
        let detail = retry.detail.clone().unwrap_or_default();
        assert_eq!(
            detail["outcome"], "not_applied",
            "[{}] {detail}",
            db.backend
        );
        assert_eq!(detail["details"]["retry_after_ms"], 1000);
        assert_eq!(rig.applied(&order, Operation::Charge), 1);
        rig.assert_consistent(&order, db.backend);
        rig.stop().await;
    }
}
