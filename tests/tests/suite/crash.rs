//! Crash recovery with real processes (SAS-5, SAS-3, SAS-10).
//!
//! The suite binary re-runs itself as a child engine (the ignored test `child_engine`); the
//! remote services live in the parent behind loopback HTTP and record every effect by
//! idempotency key. The first child is SIGKILLed while its charge calls hang after applying
//! their effect; a second child process must finish every run with no effect applied twice.

use std::time::Duration;

use sagaflow::RunState;
use sagaflow::internals::store::Store;
use sagaflow_testkit::services::{HttpServices, Operation, Scripted, Services, serve};
use sagaflow_testkit::{ChildTest, backends, eventually};
use sagaflow_workflows::order::{Order, OrderApis, order_saga};

use crate::fixtures::{order_settings, submit_sample_orders};

const ORDERS: usize = 3;
const DEADLINE_MS: u64 = 1500;

fn spawn_child(db_url: &str, services_url: &str, submit: usize, id: &str) -> ChildTest {
    ChildTest::spawn(
        "crash::child_engine",
        &[
            ("SAGAFLOW_CRASH_CHILD", "1".into()),
            ("SAGAFLOW_CRASH_DB", db_url.into()),
            ("SAGAFLOW_CRASH_SERVICES", services_url.into()),
            ("SAGAFLOW_CRASH_SUBMIT", submit.to_string()),
            ("SAGAFLOW_CRASH_ID", id.into()),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_engine_mid_step_is_recovered_by_a_new_process_without_double_effects() {
    for db in backends().await {
        let services = Services::default();
        services.script("charge", vec![Scripted::Hang; ORDERS]);
        let server = serve(services.clone(), "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("serve");
        let url = server.base_url();

        let mut first = spawn_child(&db.url, &url, ORDERS, "crash-first");
        eventually(
            Duration::from_secs(60),
            "every charge applied (and hung) in the first child",
            || async { services.ledger().applied_count(Operation::Charge) == ORDERS },
        )
        .await;
        // SIGKILL: no shutdown hook, no lease release, no result written.
        first.child.kill().await.expect("SIGKILL the first child");

        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        let counts = store.run_count_by_state().await.expect("counts");
        assert!(
            counts
                .iter()
                .any(|(s, n)| s == RunState::Running && n == ORDERS as u64),
            "[{}] {counts:?}",
            db.backend
        );

        let mut second = spawn_child(&db.url, &url, 0, "crash-second");
        eventually(
            Duration::from_secs(90),
            "the second process to finish every run",
            || async {
                store.run_count_by_state().await.is_ok_and(|c| {
                    c.iter()
                        .any(|(s, n)| s == RunState::Completed && n == ORDERS as u64)
                })
            },
        )
        .await;
        second.child.kill().await.expect("stop the second child");

        let orders: Vec<String> = (0..ORDERS).map(|n| Order::sample(n).order_id).collect();
        let report = services.ledger().check_orders(&orders);
        assert!(
            report.violations.is_empty(),
            "[{}] {:?}",
            db.backend,
            report.violations
        );
        assert_eq!(
            (
                report.applied.reserve,
                report.applied.charge,
                report.applied.ship
            ),
            (3, 3, 3)
        );
        for o in &orders {
            let charge = services
                .ledger()
                .records_for_order(o)
                .into_iter()
                .find(|r| r.operation == Operation::Charge)
                .expect("charged");
            assert!(
                charge.replays >= 1,
                "[{}] the retry after the crash reused the key",
                db.backend
            );
        }
        server.shutdown().await.expect("server shutdown");
    }
}

/// The child engine. Ignored in normal runs; the crash test starts it in a subprocess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as the crash test's child process"]
async fn child_engine() {
    if std::env::var("SAGAFLOW_CRASH_CHILD").as_deref() != Ok("1") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let http = HttpServices::new(var("SAGAFLOW_CRASH_SERVICES"));
    let wf = order_saga(OrderApis::from(&http), order_settings(DEADLINE_MS, 5)).expect("saga");
    let engine = sagaflow::Engine::builder()
        .with_database_url(var("SAGAFLOW_CRASH_DB"))
        .with_instance_id(var("SAGAFLOW_CRASH_ID"))
        .with_workflow(wf)
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(100))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400))
        .start()
        .await
        .expect("child engine");
    let submit: usize = var("SAGAFLOW_CRASH_SUBMIT").parse().expect("count");
    submit_sample_orders(&engine, submit).await;
    // Runs until the parent kills it; bounded so an orphan cannot live forever.
    tokio::time::sleep(Duration::from_secs(180)).await;
}
