//! Alerts and run notifications delivered through the outbox to a real webhook on loopback:
//! at least once, signed, each delivery of a notice with the same dedupe id — through
//! failing answers, and through an engine SIGKILLed while a delivery was in flight.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use sagaflow::{
    AlertKind, DeliveryPolicy, DeliveryState, Engine, NoticeTopic, OnFailure, RunState,
    StartOptions, StepContext, StepError, WebhookSink, Workflow,
};
use sagaflow_testkit::{ChildTest, TestDb, backends, eventually, eventually_some, fast_builder};
use uuid::Uuid;

use crate::fixtures::{Received, Receiver, check_signed_and_consistent};

const SECRET: &str = "a-webhook-secret-of-some-length";

fn sink(url: &str) -> WebhookSink {
    WebhookSink::new("ops-hook", url, SECRET)
        .expect("sink")
        .with_policy(DeliveryPolicy::new(
            20,
            Duration::from_millis(50),
            Duration::from_millis(200),
        ))
}

/// Pauses on a declined charge (a `run_paused` alert per run).
fn declining() -> Workflow {
    Workflow::builder("hooked_pause", 1)
        .on_failure(OnFailure::Pause)
        .step("reserve", |_: StepContext| async {
            Ok::<_, StepError>("r")
        })
        .compensate(|_: StepContext| async { Ok::<_, StepError>(()) })
        .step("charge", |_: StepContext| async {
            Err::<(), _>(StepError::refused("card_declined", "the card was declined"))
        })
        .after(["reserve"])
        .build()
        .expect("valid")
}

/// Completes at once; its finishes are notified.
fn notifying() -> Workflow {
    Workflow::builder("hooked_ok", 1)
        .notify_on_finish(true)
        .step("only", |_: StepContext| async { Ok::<_, StepError>(7) })
        .build()
        .expect("valid")
}

/// The stored alerts of `engine` are each among the notices the receiver accepted, and the
/// outbox has nothing left to deliver.
async fn every_alert_arrived(engine: &Engine, r: &Receiver, kinds: &[AlertKind]) -> bool {
    let alerts = engine.open_alerts().await.expect("alerts");
    let accepted = r.accepted();
    let ids: Vec<i64> = accepted
        .iter()
        .filter_map(|n| n.alert.as_ref().map(|a| a.id))
        .collect();
    let relevant: Vec<_> = alerts.iter().filter(|a| kinds.contains(&a.kind)).collect();
    !relevant.is_empty() && relevant.iter().all(|a| ids.contains(&a.id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_receives_every_alert_and_notification_through_failing_answers() {
    for db in backends().await {
        let b = db.backend;
        let receiver = Receiver::default();
        receiver.fail_first.store(4, Ordering::SeqCst);
        let url = receiver.serve().await;
        let engine = fast_builder(&db)
            .with_workflow(declining())
            .with_workflow(notifying())
            .with_notice_sink(sink(&url))
            .with_delivery_interval(Duration::from_millis(100))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let mut paused = Vec::new();
        for i in 0..3 {
            let s = engine
                .start_with("hooked_pause", &i, StartOptions::default())
                .await
                .expect("start");
            paused.push(s.id);
        }
        let mut done = Vec::new();
        for i in 0..2 {
            done.push(engine.start("hooked_ok", &i).await.expect("start"));
        }
        // One run of the notifying workflow asks for no notification.
        let quiet = engine
            .start_with("hooked_ok", &9, StartOptions::default().notify(false))
            .await
            .expect("start")
            .id;
        for id in paused.iter().chain(&done).chain([&quiet]) {
            let want = if paused.contains(id) {
                RunState::Paused
            } else {
                RunState::Completed
            };
            eventually(Duration::from_secs(20), "runs to settle", || async {
                engine
                    .run(*id)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.state == want)
            })
            .await;
        }
        eventually(
            Duration::from_secs(30),
            "every notice to arrive",
            || async {
                let finished: Vec<Uuid> = receiver
                    .accepted()
                    .iter()
                    .filter_map(|n| n.run.as_ref().map(|r| r.id))
                    .collect();
                every_alert_arrived(&engine, &receiver, &[AlertKind::RunPaused]).await
                    && done.iter().all(|id| finished.contains(id))
            },
        )
        .await;
        let accepted = receiver.accepted();
        assert!(
            accepted
                .iter()
                .all(|n| n.run.as_ref().is_none_or(|r| r.id != quiet)),
            "[{b}] a run that asked for no notification was notified"
        );
        let finished = accepted
            .iter()
            .find_map(|n| n.run.clone().filter(|r| r.id == done[0]))
            .expect("notice");
        assert_eq!(
            (finished.state, finished.workflow.as_str()),
            (RunState::Completed, "hooked_ok"),
            "[{b}]"
        );
        assert_eq!(finished.output.expect("output")["only"], 7, "[{b}]");
        assert!(
            receiver.got().iter().filter(|g| !g.accepted).count() == 4,
            "[{b}] the first four answers failed"
        );
        check_signed_and_consistent(&receiver, SECRET, b);
        // The failed ones were tried again: every delivery is recorded delivered.
        let store = engine.store();
        eventually(Duration::from_secs(10), "the outbox to be done", || async {
            store
                .delivery_list(None, 100)
                .await
                .expect("deliveries")
                .iter()
                .filter(|d| d.sink == "ops-hook")
                .all(|d| d.state == DeliveryState::Delivered)
                && store
                    .outbox_pending(10)
                    .await
                    .expect("pending")
                    .notices
                    .is_empty()
        })
        .await;
        let counts = engine.delivery_counts("ops-hook").await.expect("counts");
        assert_eq!(
            (counts.delivered, counts.pending, counts.dead),
            (5, 0, 0),
            "[{b}] three alerts and two finishes delivered"
        );
        let notices = store.delivery_list(None, 100).await.expect("deliveries");
        let topics: Vec<NoticeTopic> = notices
            .iter()
            .filter(|d| d.sink == "ops-hook")
            .map(|d| d.topic)
            .collect();
        assert_eq!(
            (
                topics.iter().filter(|t| **t == NoticeTopic::Alert).count(),
                topics
                    .iter()
                    .filter(|t| **t == NoticeTopic::RunFinished)
                    .count()
            ),
            (3, 2),
            "[{b}] {notices:?}"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_webhook_dead_letters_raises_one_alert_and_redelivers_on_demand() {
    for db in backends().await {
        let b = db.backend;
        let receiver = Receiver::default();
        receiver.fail_first.store(usize::MAX, Ordering::SeqCst);
        let url = receiver.serve().await;
        let engine = fast_builder(&db)
            .with_workflow(declining())
            .with_notice_sink(
                WebhookSink::new("ops-hook", &url, SECRET)
                    .expect("sink")
                    .with_policy(DeliveryPolicy::new(
                        2,
                        Duration::from_millis(20),
                        Duration::from_millis(40),
                    )),
            )
            .with_delivery_interval(Duration::from_millis(50))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let run = engine.start("hooked_pause", &1).await.expect("start");
        let store = engine.store().clone();
        let dead = eventually_dead(&store).await;
        assert_eq!(dead.attempts, 2, "[{b}] {dead:?}");
        let counts = engine.delivery_counts("ops-hook").await.expect("counts");
        assert!(
            counts.dead >= 1 && counts.delivered == 0,
            "[{b}] {counts:?}"
        );
        assert!(
            dead.last_error
                .as_deref()
                .is_some_and(|e| e.contains("503")),
            "[{b}] {dead:?}"
        );
        // One dead-letter alert for the sink, however many notices die.
        eventually(Duration::from_secs(10), "the dead-letter alert", || async {
            dead_letter_alerts(&engine).await == 1
        })
        .await;
        // The receiver is fixed; the notice is sent again on demand and arrives.
        receiver.fail_first.store(0, Ordering::SeqCst);
        assert!(
            store
                .delivery_redeliver(dead.notice_id)
                .await
                .expect("redeliver"),
            "[{b}]"
        );
        eventually(
            Duration::from_secs(10),
            "the redelivered notice",
            || async {
                receiver
                    .accepted()
                    .iter()
                    .any(|n| n.alert.as_ref().is_some_and(|a| a.run_id == Some(run)))
            },
        )
        .await;
        // A sink that delivers again resolves its dead-letter alert.
        eventually(
            Duration::from_secs(10),
            "the dead-letter alert to resolve",
            || async {
                !engine
                    .open_alerts()
                    .await
                    .expect("alerts")
                    .iter()
                    .any(|a| a.kind == AlertKind::DeliveryDeadLettered)
            },
        )
        .await;
        engine.shutdown().await;
    }
}

/// The open dead-letter alerts (one per sink whose notices died).
async fn dead_letter_alerts(engine: &Engine) -> usize {
    engine
        .open_alerts()
        .await
        .expect("alerts")
        .iter()
        .filter(|a| a.kind == AlertKind::DeliveryDeadLettered)
        .count()
}

async fn eventually_dead(store: &sagaflow::internals::store::Store) -> sagaflow::Delivery {
    eventually_some(
        Duration::from_secs(15),
        "a dead-lettered delivery",
        || async {
            store
                .delivery_list(Some(DeliveryState::Dead), 10)
                .await
                .expect("deliveries")
                .into_iter()
                .find(|d| d.topic == NoticeTopic::Alert)
        },
    )
    .await
}

/// An engine process is SIGKILLed while its delivery of an alert is in flight (the receiver
/// got the request and never answered); a second engine takes over and delivers every alert,
/// the interrupted one again under the same dedupe id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_survive_an_engine_killed_between_commit_and_delivery() {
    for db in backends().await {
        let b = db.backend;
        let receiver = Receiver::default();
        receiver.hang.store(true, Ordering::SeqCst);
        let url = receiver.serve().await;
        let child = ChildTest::spawn(
            "webhook::child_engine",
            &[
                ("SAGAFLOW_WEBHOOK_CHILD", "1".into()),
                ("SAGAFLOW_WEBHOOK_DB", db.url.clone()),
                ("SAGAFLOW_WEBHOOK_URL", url.clone()),
            ],
        );
        eventually(
            Duration::from_secs(30),
            "the child to start its runs",
            || async { child.printed("STARTED") },
        )
        .await;
        eventually(Duration::from_secs(30), "a delivery in flight", || async {
            !receiver.got().is_empty()
        })
        .await;
        let pid = child.child.id().expect("running");
        nix::sys::signal::kill(
            Pid::from_raw(i32::try_from(pid).expect("pid")),
            Signal::SIGKILL,
        )
        .expect("kill");
        let (status, _) = child.finish(Duration::from_secs(10)).await;
        assert!(!status.success(), "[{b}] the child was killed");
        let in_flight = receiver.got()[0].dedupe.clone();
        receiver.hang.store(false, Ordering::SeqCst);
        // No leader delivers now: a client-only engine counts every stored alert pending for
        // the sink (the one in flight at the kill and any never tried).
        let client = fast_builder(&db)
            .with_workflow(declining())
            .with_workers(false)
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] client: {e}"));
        let stored = client.all_alerts().await.expect("alerts").len() as u64;
        let counts = client.delivery_counts("ops-hook").await.expect("counts");
        assert!(stored >= 1, "[{b}] the alert in flight is stored");
        assert_eq!(
            (counts.delivered, counts.pending, counts.dead),
            (0, stored, 0),
            "[{b}] {counts:?}"
        );
        client.shutdown().await;

        let engine = successor(&db, &url).await;
        // The runs the child did not get to are paused by the successor: three alerts in all.
        eventually(Duration::from_secs(30), "every alert to arrive", || async {
            let paused = engine
                .open_alerts()
                .await
                .expect("alerts")
                .iter()
                .filter(|a| a.kind == AlertKind::RunPaused)
                .count();
            paused == 3 && every_alert_arrived(&engine, &receiver, &[AlertKind::RunPaused]).await
        })
        .await;
        let alerts = engine.open_alerts().await.expect("alerts");
        assert_eq!(
            alerts
                .iter()
                .filter(|a| a.kind == AlertKind::RunPaused)
                .count(),
            3,
            "[{b}]"
        );
        let again: Vec<Received> = receiver
            .got()
            .into_iter()
            .filter(|g| g.dedupe == in_flight)
            .collect();
        assert!(
            again.len() >= 2 && again.iter().any(|g| g.accepted),
            "[{b}] the interrupted delivery was made again under its dedupe id: {again:?}"
        );
        check_signed_and_consistent(&receiver, SECRET, b);
        engine.shutdown().await;
    }
}

async fn successor(db: &TestDb, url: &str) -> Engine {
    fast_builder(db)
        .with_instance_id("successor")
        .with_workflow(declining())
        .with_notice_sink(sink(url))
        .with_delivery_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

/// The child engine of the kill test: starts three runs that pause, prints `STARTED`, and
/// delivers their alerts to a receiver that never answers, until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as the webhook test's child process"]
async fn child_engine() {
    if std::env::var("SAGAFLOW_WEBHOOK_CHILD").as_deref() != Ok("1") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let url = var("SAGAFLOW_WEBHOOK_URL");
    let engine = Engine::builder()
        .with_database_url(var("SAGAFLOW_WEBHOOK_DB"))
        .with_instance_id("doomed")
        .with_workflow(declining())
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(100))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400))
        .with_notice_sink(
            sink(&url).with_policy(
                DeliveryPolicy::new(20, Duration::from_millis(50), Duration::from_millis(200))
                    .with_timeout(Duration::from_secs(3600)),
            ),
        )
        .with_delivery_interval(Duration::from_millis(100))
        .start()
        .await
        .expect("child engine");
    for i in 0..3 {
        engine.start("hooked_pause", &i).await.expect("start");
    }
    println!("\nSTARTED");
    std::future::pending::<()>().await;
}

/// A workflow's queue past its backlog threshold raises one `backlog_growing` alert, and the
/// alert resolves itself once the queue drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_backlog_raises_one_alert_and_resolves_it_when_the_queue_drains() {
    for db in backends().await {
        let b = db.backend;
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let wf = Workflow::builder("backlogged", 1)
            .backlog_alert(sagaflow::BacklogAlert::ready_over(2))
            .step_using("slow", gate.clone(), |g, _: StepContext| async move {
                let _permit = g
                    .acquire()
                    .await
                    .map_err(|_| StepError::terminal_unknown("closed", "gate closed"))?;
                Ok::<_, StepError>(())
            })
            .build()
            .expect("valid");
        let engine = fast_builder(&db)
            .with_workflow(wf)
            .with_max_in_flight(1)
            .with_backlog_interval(Duration::from_millis(100))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let mut runs = Vec::new();
        for i in 0..5 {
            runs.push(engine.start("backlogged", &i).await.expect("start"));
        }
        let backlog = |engine: &Engine| {
            let engine = engine.clone();
            async move {
                engine
                    .open_alerts()
                    .await
                    .expect("alerts")
                    .into_iter()
                    .filter(|a| a.kind == AlertKind::BacklogGrowing)
                    .collect::<Vec<_>>()
            }
        };
        eventually(Duration::from_secs(15), "the backlog alert", || async {
            backlog(&engine).await.len() == 1
        })
        .await;
        let alert = backlog(&engine).await.remove(0);
        assert!(
            alert.reason.contains("`backlogged`") && alert.reason.contains("threshold of 2"),
            "[{b}] {}",
            alert.reason
        );
        gate.add_permits(100);
        for id in runs {
            engine
                .wait(id, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("[{b}] {e}"));
        }
        eventually(
            Duration::from_secs(15),
            "the backlog alert to resolve",
            || async { backlog(&engine).await.is_empty() },
        )
        .await;
        engine.shutdown().await;
    }
}

/// The secret of a Slack-, Discord- or Teams-style webhook, which sits in the URL's path.
const PATH_SECRET: &str = "XyZpathSecret0123456789";

/// Serves on 127.0.0.1 a router answering every request with `answer`; returns the address
/// and a count of the requests.
async fn answering(
    answer: fn() -> axum::response::Response,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { answer() }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, hits)
}

/// A webhook whose secret is in its URL's path fails: the secret is in no delivery error,
/// no alert, no `Debug` and no API answer. A webhook that redirects is not followed: the
/// signed notice never reaches where the redirect points, and the notice is dead-lettered
/// with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_secret_in_the_path_leaks_nowhere_and_redirects_are_not_followed() {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    for db in backends().await {
        let b = db.backend;
        let (failing, failing_hits) =
            answering(|| StatusCode::SERVICE_UNAVAILABLE.into_response()).await;
        let receiver = Receiver::default();
        let target = receiver.serve().await;
        // The redirect's target is the receiver: fixed per test, so a static answer will do.
        static TARGET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let _ = TARGET.set(target.clone());
        let (redirecting, _) = answering(|| {
            let to = TARGET.get().cloned().unwrap_or_default();
            (
                StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, to)],
            )
                .into_response()
        })
        .await;
        let policy = DeliveryPolicy::new(2, Duration::from_millis(20), Duration::from_millis(40));
        let slack = WebhookSink::new(
            "slack",
            &format!("http://{failing}/services/T01/B02/{PATH_SECRET}"),
            SECRET,
        )
        .expect("sink")
        .with_policy(policy);
        assert!(!format!("{slack:?}").contains(PATH_SECRET), "{slack:?}");
        let moved = WebhookSink::new("moved", &format!("http://{redirecting}/hook"), SECRET)
            .expect("sink")
            .with_policy(policy);
        let engine = fast_builder(&db)
            .with_workflow(declining())
            .with_notice_sink(slack)
            .with_notice_sink(moved)
            .with_delivery_interval(Duration::from_millis(50))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        engine.start("hooked_pause", &1).await.expect("start");
        let store = engine.store().clone();
        let dead = eventually_some(Duration::from_secs(15), "both sinks dead", || async {
            let dead = store
                .delivery_list(Some(DeliveryState::Dead), 50)
                .await
                .expect("deliveries");
            let sinks: std::collections::BTreeSet<_> =
                dead.iter().map(|d| d.sink.clone()).collect();
            (sinks.len() == 2).then_some(dead)
        })
        .await;
        assert!(failing_hits.load(Ordering::SeqCst) >= 1, "[{b}]");
        for d in &dead {
            let e = d.last_error.as_deref().unwrap_or_default();
            assert!(!e.contains(PATH_SECRET), "[{b}] {d:?}");
            if d.sink == "moved" {
                assert!(e.contains("307") && e.contains("redirect"), "[{b}] {d:?}");
            }
        }
        // Redirects are not followed: the receiver they point to got nothing.
        assert!(receiver.got().is_empty(), "[{b}] {:?}", receiver.got());
        // The dead-letter alerts (which other sinks would carry on) hold no secret either.
        eventually(
            Duration::from_secs(10),
            "the dead-letter alerts",
            || async { dead_letter_alerts(&engine).await == 2 },
        )
        .await;
        let alerts = format!("{:?}", engine.open_alerts().await.expect("alerts"));
        assert!(!alerts.contains(PATH_SECRET), "[{b}] {alerts}");
        // Nor does what a read-only token reads.
        let (addr, server) = crate::fixtures::serve_admin(
            &engine,
            crate::fixtures::admin_tokens("ops-token-0123456789", "viewer-token-0123456789"),
        )
        .await;
        let client = reqwest::Client::new();
        for route in ["/api/v1/deliveries", "/api/v1/alerts"] {
            let text = client
                .get(format!("http://{addr}{route}"))
                .bearer_auth("viewer-token-0123456789")
                .send()
                .await
                .expect("request")
                .text()
                .await
                .expect("body");
            assert!(text.contains("slack"), "[{b}] {route}: {text}");
            assert!(!text.contains(PATH_SECRET), "[{b}] {route}: {text}");
        }
        server.abort();
        engine.shutdown().await;
    }
}

/// A sink that takes the first notice it is given and then hangs on every other one, telling
/// the test when it has started hanging.
#[derive(Default)]
struct Hang {
    first: std::sync::Mutex<Option<i64>>,
    hanging: tokio::sync::Notify,
}

struct FirstThenHang(Arc<Hang>);

#[sagaflow::async_trait]
impl sagaflow::NoticeSink for FirstThenHang {
    fn name(&self) -> &str {
        "first-then-hang"
    }

    fn policy(&self) -> DeliveryPolicy {
        DeliveryPolicy::default().with_timeout(Duration::from_secs(600))
    }

    async fn deliver(&self, notice: &sagaflow::Notice) -> Result<(), sagaflow::DeliveryError> {
        let first = *self.0.first.lock().expect("lock").get_or_insert(notice.id);
        if first == notice.id {
            return Ok(());
        }
        self.0.hanging.notify_one();
        std::future::pending().await
    }
}

/// A notice its only sink delivered is done in the same write, not at the end of the pass: a
/// pass stopped after it (here it hangs on the next notice, and the engine is then shut down
/// in the middle of it) leaves no delivered notice open, and the undelivered one stays
/// pending for the next leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_notice_is_done_even_when_its_pass_never_ends() {
    use sagaflow::internals::store::{NewAlert, Store};
    for db in backends().await {
        let b = db.backend;
        // Two notices in the outbox before any engine runs, so one pass reads both.
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        for n in 1..=2 {
            let alert = NewAlert {
                run_id: None,
                step: None,
                kind: AlertKind::RunError,
                reason: format!("notice {n}"),
                attempts: 0,
                actions: vec!["resolve_alert".into()],
                open_key: None,
            };
            store.alert_insert(&alert).await.expect("alert");
        }
        let hang = Arc::new(Hang::default());
        let engine = fast_builder(&db)
            .with_workflow(notifying())
            .with_notice_sink(FirstThenHang(hang.clone()))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        tokio::time::timeout(Duration::from_secs(20), hang.hanging.notified())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the sink was never given the second notice"));
        let first = hang.first.lock().expect("lock").expect("the first notice");
        // The pass hangs from now on: only the write that recorded the delivery (this sink's
        // or the log sink's, whichever finished last) can have finished the notice.
        eventually(
            Duration::from_secs(10),
            &format!("[{b}] the delivered notice to be done while its pass hangs"),
            || async {
                let page = store.outbox_pending(10).await.expect("pending");
                page.notices.iter().all(|p| p.notice.id != first)
            },
        )
        .await;
        engine.shutdown().await;
        let counts = store
            .delivery_counts("first-then-hang", |_| true)
            .await
            .expect("counts");
        let pending: Vec<i64> = store
            .outbox_pending(10)
            .await
            .expect("pending")
            .notices
            .iter()
            .map(|p| p.notice.id)
            .collect();
        assert_eq!(counts.delivered, 1, "[{b}] {counts:?}");
        assert!(
            counts.pending >= 1 && !pending.is_empty() && !pending.contains(&first),
            "[{b}] the undelivered notice is left for the next leader, the delivered one is not: \
             {counts:?}, pending {pending:?}"
        );
    }
}

/// A sink that refuses for good while `refusing` is set, and records what it accepted.
#[derive(Default)]
struct Refuser {
    refusing: std::sync::atomic::AtomicBool,
    accepted: std::sync::Mutex<Vec<i64>>,
}

struct Refusing(Arc<Refuser>);

#[sagaflow::async_trait]
impl sagaflow::NoticeSink for Refusing {
    fn name(&self) -> &str {
        "refuser"
    }

    async fn deliver(&self, notice: &sagaflow::Notice) -> Result<(), sagaflow::DeliveryError> {
        if self.0.refusing.load(Ordering::SeqCst) {
            return Err(sagaflow::DeliveryError::permanent("not now"));
        }
        self.0.accepted.lock().expect("lock").push(notice.id);
        Ok(())
    }
}

/// A sink that holds its first delivery until the test lets it go, then takes everything.
#[derive(Default)]
struct Gate {
    holding: tokio::sync::Notify,
    release: tokio::sync::Notify,
    calls: std::sync::atomic::AtomicUsize,
}

struct Gated(Arc<Gate>);

#[sagaflow::async_trait]
impl sagaflow::NoticeSink for Gated {
    fn name(&self) -> &str {
        "gate"
    }

    fn policy(&self) -> DeliveryPolicy {
        DeliveryPolicy::default().with_timeout(Duration::from_secs(600))
    }

    async fn deliver(&self, _: &sagaflow::Notice) -> Result<(), sagaflow::DeliveryError> {
        if self.0.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.0.holding.notify_one();
            self.0.release.notified().await;
        }
        Ok(())
    }
}

/// An operator sends a dead-lettered notice again while the delivery pass that dead-lettered
/// it is still running (another sink holds it). The pass, ending with every sink finished as
/// it saw them, must not mark the notice done over the operator's redelivery: the notice
/// reaches the sink that refused it, once that sink takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_during_the_pass_that_dead_lettered_the_notice_is_not_lost() {
    use sagaflow::internals::store::{NewAlert, Store};
    for db in backends().await {
        let b = db.backend;
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        let alert = NewAlert {
            run_id: None,
            step: None,
            kind: AlertKind::RunError,
            reason: "a notice to send again".into(),
            attempts: 0,
            actions: vec!["resolve_alert".into()],
            open_key: None,
        };
        store.alert_insert(&alert).await.expect("alert");
        let refuser = Arc::new(Refuser::default());
        refuser.refusing.store(true, Ordering::SeqCst);
        let gate = Arc::new(Gate::default());
        let engine = fast_builder(&db)
            .with_workflow(notifying())
            .without_log_sink()
            .with_notice_sink(Refusing(refuser.clone()))
            .with_notice_sink(Gated(gate.clone()))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        tokio::time::timeout(Duration::from_secs(20), gate.holding.notified())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the gate was never given the notice"));
        let dead = eventually_dead(&store).await;
        // The operator sends it again, and the refusing receiver is fixed; then the pass,
        // held until now, ends.
        assert!(
            store
                .delivery_redeliver(dead.notice_id)
                .await
                .expect("redeliver"),
            "[{b}] nothing was dead"
        );
        refuser.refusing.store(false, Ordering::SeqCst);
        gate.release.notify_one();
        eventually(
            Duration::from_secs(15),
            &format!(
                "[{b}] the notice {} sent again to reach the fixed receiver",
                dead.notice_id
            ),
            || async {
                refuser
                    .accepted
                    .lock()
                    .expect("lock")
                    .contains(&dead.notice_id)
            },
        )
        .await;
        engine.shutdown().await;
    }
}
