//! Crashes are interruptions, not failures (real processes, SIGKILL, loopback HTTP).
//!
//! The suite binary re-runs itself as a child engine (the ignored test `child_engine`); the
//! order saga's services live in the parent behind loopback HTTP and record every effect by
//! idempotency key. Scenarios:
//!
//! 1. an engine SIGKILLed five times while running a step whose failure threshold is 2: the
//!    run still completes, the charge applied once, five interruptions and no failure;
//! 2. a step that crashes its process every time: past its interruption cap the run stops in
//!    `error` with a `poison_step` alert;
//! 3. SIGKILL of one of two instances (the leader, with default settings): its in-flight
//!    steps run again on the survivor within 5 s;
//! 4. a single instance restarted under the same id resumes its predecessor's work and takes
//!    back its leadership within 5 s, although its lease lasts 15 s.

use sagaflow::AlertKind;
use std::time::Duration;

use sagaflow::internals::SupervisorConfig;
use sagaflow::internals::store::Store;
use sagaflow::{RetryPolicy, RunState, StartOptions, StepContext, StepError, Workflow};
use sagaflow_testkit::services::{
    HttpServices, Operation, Scripted, ServerHandle, Service, Services, serve,
};
use sagaflow_testkit::{ChildTest, TestDb, backends, eventually, eventually_some};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use tokio::time::Instant;
use uuid::Uuid;

use crate::fixtures::{order_settings, submit_sample_orders};

/// The rescue bound promised for default settings (docs/operations.md).
const RESCUE_MAX: Duration = Duration::from_secs(5);

/// How a child engine is configured.
#[derive(Clone, Copy)]
enum Mode {
    /// The order saga; step deadline 60 s (only a death frees a step), threshold 2, fast
    /// heartbeats.
    Orders,
    /// The order saga with every default setting of the engine.
    Defaults,
    /// A workflow whose only step aborts the process; interruption cap 2.
    Poison,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Orders => "orders",
            Self::Defaults => "defaults",
            Self::Poison => "poison",
        }
    }
}

fn spawn_child(db: &TestDb, services_url: &str, id: &str, mode: Mode, submit: usize) -> ChildTest {
    ChildTest::spawn(
        "interruption::child_engine",
        &[
            ("SAGAFLOW_INT_CHILD", "1".into()),
            ("SAGAFLOW_INT_DB", db.url.clone()),
            ("SAGAFLOW_INT_SERVICES", services_url.into()),
            ("SAGAFLOW_INT_ID", id.into()),
            ("SAGAFLOW_INT_MODE", mode.as_str().into()),
            ("SAGAFLOW_INT_SUBMIT", submit.to_string()),
        ],
    )
}

async fn services() -> (Services, ServerHandle) {
    let services = Services::default();
    let server = serve(services.clone(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    (services, server)
}

fn hangs(services: &Services) -> u64 {
    services.faults(Service::Payments).counts().hang
}

async fn run_of(store: &Store, order: &Order) -> Uuid {
    eventually_some(Duration::from_secs(30), "the order's run", || async {
        store
            .run_by_key(ORDER_WORKFLOW, &order.order_id)
            .await
            .ok()
            .flatten()
            .map(|r| r.run.id)
    })
    .await
}

async fn await_state(store: &Store, id: Uuid, state: RunState, within: Duration) {
    let what = format!("run {id} to be {state}");
    eventually(within, &what, || async {
        store
            .run_get(id)
            .await
            .ok()
            .flatten()
            .is_some_and(|r| r.state == state)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_five_sigkills_mid_step_do_not_fail_a_step_with_threshold_two() {
    const KILLS: u64 = 5;
    for db in backends().await {
        let (services, server) = services().await;
        services.script("charge", vec![Scripted::Hang; KILLS as usize]);
        let url = server.base_url();
        let mut child = spawn_child(&db, &url, "int-0", Mode::Orders, 1);
        for k in 1..=KILLS {
            let what = format!("charge attempt {k} to hang in a child");
            eventually(Duration::from_secs(30), &what, || async {
                hangs(&services) >= k
            })
            .await;
            // SIGKILL: no shutdown, no release, no answer.
            child.child.kill().await.expect("SIGKILL");
            // Every other restart comes back under the same id (released at its start); the
            // others under a new id (released by the supervisor once the dead one is stale).
            let id = if k % 2 == 0 {
                format!("int-{}", k - 1)
            } else {
                format!("int-{k}")
            };
            child = spawn_child(&db, &url, &id, Mode::Orders, 0);
        }
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        let order = Order::sample(0);
        let id = run_of(&store, &order).await;
        await_state(&store, id, RunState::Completed, Duration::from_secs(60)).await;
        child.child.kill().await.expect("stop the last child");

        let history = store.run_history(id).await.expect("history");
        let charge: Vec<&str> = history
            .iter()
            .filter(|h| h.step.as_deref() == Some("charge_card"))
            .map(|h| h.kind.as_ref())
            .collect();
        let count = |e: &str| charge.iter().filter(|x| **x == e).count();
        assert_eq!(
            count("interrupted"),
            KILLS as usize,
            "[{}] {charge:?}",
            db.backend
        );
        assert_eq!(
            (count("timeout"), count("retry"), count("failed")),
            (0, 0, 0),
            "[{}] a crash is not a failure: {charge:?}",
            db.backend
        );
        let record = services
            .ledger()
            .get(&format!("{id}:charge_card"))
            .expect("charged");
        assert!(
            record.replays >= 5,
            "[{}] every retry reused the key",
            db.backend
        );
        assert_eq!(services.ledger().applied_count(Operation::Charge), 1);
        let report = services
            .ledger()
            .check_orders(std::slice::from_ref(&order.order_id));
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        server.shutdown().await.expect("server shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_a_step_that_crashes_its_process_every_time_is_poison() {
    for db in backends().await {
        let (_services, server) = services().await;
        let url = server.base_url();
        let store_url = db.url.clone();
        let mut child = spawn_child(&db, &url, "poison-0", Mode::Poison, 1);
        let mut crashes = 0;
        let store = loop {
            // Each child claims the step and dies with it; the next one (same id) releases
            // it at start, as an interruption.
            let status = tokio::time::timeout(Duration::from_secs(30), child.child.wait())
                .await
                .expect("the child to crash")
                .expect("wait");
            assert!(!status.success(), "the step aborts its process");
            crashes += 1;
            child = spawn_child(&db, &url, "poison-0", Mode::Poison, 0);
            if crashes == 3 {
                break Store::connect(&store_url, Some(2)).await.expect("connect");
            }
        };
        let id = eventually_some(Duration::from_secs(30), "a poison_step alert", || async {
            store
                .alert_list(None, true)
                .await
                .ok()?
                .into_iter()
                .find(|a| a.kind == AlertKind::PoisonStep)
                .and_then(|a| a.run_id)
        })
        .await;
        child.child.kill().await.expect("stop the last child");
        let alerts = store.alert_list(Some(id), true).await.expect("alerts");
        let alert = alerts
            .iter()
            .find(|a| a.kind == AlertKind::PoisonStep)
            .expect("poison_step alert");
        assert_eq!(alert.step.as_deref(), Some("boom"), "[{}]", db.backend);
        let steps = store.run_steps(id).await.expect("steps");
        assert_eq!(
            (steps[0].interruptions, steps[0].failure_count),
            (3, 0),
            "[{}] three interruptions, no failure",
            db.backend
        );
        assert_eq!(
            store.run_get(id).await.expect("run").map(|r| r.state),
            Some(RunState::Error),
            "[{}] stopped for an operator, not compensated",
            db.backend
        );
        server.shutdown().await.expect("server shutdown");
    }
}

/// Waits until every order's charge was called again under its key (a replay in the
/// ledger: the first call of each hung in the dead instance) and returns how long it took.
async fn until_replayed(services: &Services, orders: &[Order], since: Instant) -> Duration {
    eventually(
        Duration::from_secs(30),
        "the hung charges to run again",
        || async {
            orders.iter().all(|o| {
                services
                    .ledger()
                    .records_for_order(&o.order_id)
                    .iter()
                    .any(|r| r.operation == Operation::Charge && r.replays >= 1)
            })
        },
    )
    .await;
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_rescue_after_sigkill_of_one_of_two_instances_is_within_5s() {
    const HUNG: usize = 3;
    for db in backends().await {
        let (services, server) = services().await;
        services.script("charge", vec![Scripted::Hang; HUNG]);
        let url = server.base_url();
        // The victim starts first: it leads, and it holds the hung charges.
        let mut victim = spawn_child(&db, &url, "victim", Mode::Defaults, HUNG);
        eventually(
            Duration::from_secs(30),
            "every charge to hang in the victim",
            || async { hangs(&services) >= HUNG as u64 },
        )
        .await;
        let mut survivor = spawn_child(&db, &url, "survivor", Mode::Defaults, 0);
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        eventually_some(
            Duration::from_secs(30),
            "the survivor to heartbeat",
            || async {
                let instances = store.instance_list().await.ok()?;
                instances
                    .iter()
                    .any(|i| i.id == "survivor" && i.silent_ms < 1000)
                    .then_some(())
            },
        )
        .await;
        let lease = SupervisorConfig::new("-").lease_name;
        eventually_some(Duration::from_secs(30), "the victim to lead", || async {
            let f = store.leader_current(&lease).await.ok()??;
            (f.holder == "victim").then_some(())
        })
        .await;
        let killed = Instant::now();
        victim.child.kill().await.expect("SIGKILL the victim");
        let orders: Vec<Order> = (0..HUNG).map(Order::sample).collect();
        let took = until_replayed(&services, &orders, killed).await;
        eprintln!(
            "[{}] rescue after SIGKILL of the leading instance: {took:?} (bound {RESCUE_MAX:?})",
            db.backend
        );
        assert!(took <= RESCUE_MAX, "[{}] rescue took {took:?}", db.backend);
        for o in &orders {
            let id = run_of(&store, o).await;
            await_state(&store, id, RunState::Completed, Duration::from_secs(30)).await;
        }
        survivor.child.kill().await.expect("stop the survivor");
        server.shutdown().await.expect("server shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruption_restart_under_the_same_id_resumes_and_leads_within_5s() {
    const HUNG: usize = 2;
    for db in backends().await {
        let (services, server) = services().await;
        services.script("charge", vec![Scripted::Hang; HUNG]);
        let url = server.base_url();
        let mut first = spawn_child(&db, &url, "solo", Mode::Defaults, HUNG);
        eventually(Duration::from_secs(30), "the charges to hang", || async {
            hangs(&services) >= HUNG as u64
        })
        .await;
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        let lease = SupervisorConfig::new("-").lease_name;
        let before = eventually_some(Duration::from_secs(30), "the instance to lead", || async {
            store.leader_current(&lease).await.ok().flatten()
        })
        .await;
        assert_eq!(before.holder, "solo");

        let killed = Instant::now();
        first.child.kill().await.expect("SIGKILL");
        let mut second = spawn_child(&db, &url, "solo", Mode::Defaults, 0);
        let orders: Vec<Order> = (0..HUNG).map(Order::sample).collect();
        let took = until_replayed(&services, &orders, killed).await;
        eprintln!("[{}] same-id restart resumed after {took:?}", db.backend);
        assert!(
            took <= RESCUE_MAX,
            "[{}] resumed after {took:?}",
            db.backend
        );
        eventually(
            RESCUE_MAX,
            "the restarted instance to lead again",
            || async {
                store
                    .leader_current(&lease)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|f| f.holder == "solo" && f.term > before.term)
            },
        )
        .await;
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "[{}] did not wait out its own 15 s lease",
            db.backend
        );
        second.child.kill().await.expect("stop");
        server.shutdown().await.expect("server shutdown");
    }
}

/// A workflow whose only step kills its own process.
fn poison() -> Workflow {
    Workflow::builder("poison", 1)
        .default_retry(RetryPolicy::default().with_max_interruptions(2))
        .step("boom", |_ctx: StepContext| async move {
            std::process::abort();
            #[allow(unreachable_code)]
            Ok::<_, StepError>(())
        })
        .build()
        .expect("valid")
}

/// The child engine. Ignored in normal runs; the tests above start it in a subprocess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as a child process of the interruption tests"]
async fn child_engine() {
    if std::env::var("SAGAFLOW_INT_CHILD").as_deref() != Ok("1") {
        return;
    }
    // `RUST_LOG` shows the child's log on the test's stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let http = HttpServices::new(var("SAGAFLOW_INT_SERVICES"));
    let mode = var("SAGAFLOW_INT_MODE");
    let mut builder = sagaflow::Engine::builder()
        .with_database_url(var("SAGAFLOW_INT_DB"))
        .with_instance_id(var("SAGAFLOW_INT_ID"));
    builder = match mode.as_str() {
        "poison" => builder.with_workflow(poison()),
        "orders" => builder
            .with_workflow(
                order_saga(OrderApis::from(&http), order_settings(60_000, 2)).expect("saga"),
            )
            .with_poll_interval(Duration::from_millis(50))
            .with_sweep_interval(Duration::from_millis(100))
            .with_heartbeat(Duration::from_millis(100), Duration::from_millis(600)),
        _ => builder.with_workflow(
            order_saga(OrderApis::from(&http), order_settings(60_000, 2)).expect("saga"),
        ),
    };
    let engine = builder.start().await.expect("child engine");
    let submit: usize = var("SAGAFLOW_INT_SUBMIT").parse().expect("count");
    if mode == "poison" {
        for n in 0..submit {
            engine
                .start_with("poison", &(), StartOptions::keyed(format!("p-{n}")))
                .await
                .expect("submit");
        }
    } else {
        submit_sample_orders(&engine, submit).await;
    }
    // Runs until the parent kills it; bounded so an orphan cannot live forever.
    tokio::time::sleep(Duration::from_secs(180)).await;
}
