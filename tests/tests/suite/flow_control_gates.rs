//! Flow control that holds a resource's steps back for a time, with two engine instances on
//! one database and the recording loopback service of the flow-control tests: time windows
//! (the database clock moved with a test clock, so no test waits for a night), batches with
//! a pause between them, and the circuit breaker with its alert.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use sagaflow::testing::TestClock;
use sagaflow::{AlertKind, BreakerState, Engine, Resource, ResourceView};
use sagaflow_testkit::{TestDb, backends, eventually, fast_builder};
use uuid::Uuid;

use super::flow_control::{Service, calling, start_runs};

/// Saturday 2026-11-28 12:00 in Moscow.
const SATURDAY_NOON_MOSCOW_MS: i64 = 1_795_856_400_000;
/// Monday 2026-11-30 00:00 in Moscow.
const MONDAY_MIDNIGHT_MOSCOW_MS: i64 = 1_795_986_000_000;

/// Moves the clock so that the database's time reads `at_ms` now (the database runs on this
/// machine, on its clock).
fn set_db_time(clock: &TestClock, at_ms: i64) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    clock.set_offset_ms(at_ms - i64::try_from(now).expect("ms"));
}

/// Two engine instances with the saga and the resource, on one test clock.
async fn two_engines(
    db: &TestDb,
    url: &str,
    resource: &Resource,
    clock: &TestClock,
) -> (Engine, Engine) {
    let start = |id: &str| {
        fast_builder(db)
            .with_instance_id(id)
            .with_max_in_flight(16)
            .with_backlog_interval(Duration::from_millis(100))
            .with_workflow(calling(url))
            .with_resource(resource.clone())
            .with_test_clock(clock.clone())
            .start()
    };
    let a = start("fc-a").await.expect("engine a");
    let b = start("fc-b").await.expect("engine b");
    (a, b)
}

/// Resource `partner` as the engine reads it.
pub(super) async fn partner(engine: &Engine) -> ResourceView {
    engine
        .resources()
        .await
        .expect("resources")
        .into_iter()
        .find(|r| r.name == "partner")
        .expect("the resource is stored")
}

async fn wait_all(engine: &Engine, ids: &[Uuid], b: &str) {
    for id in ids {
        engine
            .wait(*id, Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("[{b}] run {id}: {e}"));
    }
}

/// Holds for `span` and returns the service's call count then: the claim loops poll every
/// 50 ms, so a span of 500 ms gives each instance ten chances to send what it should not.
async fn calls_after(service: &Service, span: Duration) -> usize {
    tokio::time::sleep(span).await;
    service.calls().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_nothing_is_sent_outside_a_time_window_and_all_waiting_runs_when_it_opens() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::ZERO).await;
        let clock = TestClock::new();
        set_db_time(&clock, SATURDAY_NOON_MOSCOW_MS);
        let night = Resource::new("partner").windows("Europe/Moscow", ["MON-FRI 00:00-06:00"]);
        let (one, two) = two_engines(&db, &url, &night, &clock).await;
        let mut ids = start_runs(&one, "t", 10).await;
        ids.extend(start_runs(&two, "t", 10).await);
        eventually(
            Duration::from_secs(10),
            "the steps to wait for the window",
            || async { partner(&one).await.waiting == 20 },
        )
        .await;
        assert_eq!(
            calls_after(&service, Duration::from_millis(500)).await,
            0,
            "[{b}] a call went out on a Saturday"
        );
        // Sunday, two seconds before midnight in Moscow: still closed. The window then opens
        // by itself, and everything waiting runs. (Time moves in small steps here: a jump
        // into the window would find the instances' heartbeats hours old, as a real clock
        // jump would, and their first claims re-queued as interrupted.)
        let moved = Instant::now();
        set_db_time(&clock, MONDAY_MIDNIGHT_MOSCOW_MS - 2_000);
        wait_all(&two, &ids, b).await;
        let calls = service.calls();
        assert_eq!(calls.len(), 20, "[{b}] one call per run");
        let first = calls.iter().map(|c| c.arrived).min().expect("calls");
        assert!(
            first >= moved + Duration::from_millis(1_900),
            "[{b}] a call arrived {:?} after the clock read Sunday 23:59:58 in Moscow",
            first - moved
        );
        let r = partner(&one).await;
        assert_eq!((r.waiting, r.in_flight), (0, 0), "[{b}]");
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_batches_start_together_with_a_pause_between_them() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::ZERO).await;
        let pause = Duration::from_millis(600);
        let batched = Resource::new("partner").batch(5, pause);
        let (one, two) = two_engines(&db, &url, &batched, &TestClock::new()).await;
        let mut ids = start_runs(&one, "t", 8).await;
        ids.extend(start_runs(&two, "t", 7).await);
        wait_all(&one, &ids, b).await;
        let mut arrivals: Vec<Instant> = service.calls().iter().map(|c| c.arrived).collect();
        arrivals.sort();
        assert_eq!(arrivals.len(), 15, "[{b}] one call per run");
        for next in [5, 10] {
            let gap = arrivals[next] - arrivals[next - 1];
            // The pause runs from the claim of a batch's last step, a moment before its call
            // arrives.
            assert!(
                gap >= pause - Duration::from_millis(150),
                "[{b}] only {gap:?} between the batches ending at call {next}"
            );
        }
        for batch in arrivals.chunks(5) {
            let span = batch[4] - batch[0];
            assert!(
                span < Duration::from_millis(400),
                "[{b}] a batch was spread over {span:?}: its calls did not start together"
            );
        }
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_a_breaker_opens_on_failures_lets_one_probe_through_and_closes_on_success() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::from_millis(20)).await;
        service.failing.store(true, Ordering::SeqCst);
        let guarded = Resource::new("partner").breaker(sagaflow::Breaker {
            consecutive_failures: Some(3),
            failure_percent: None,
            min_calls: 10,
            window_ms: 60_000,
            cool_down_ms: 1_500,
            alert_after_ms: 1_000,
        });
        let (one, two) = two_engines(&db, &url, &guarded, &TestClock::new()).await;
        let mut ids = start_runs(&one, "t", 5).await;
        ids.extend(start_runs(&two, "t", 5).await);
        eventually(Duration::from_secs(20), "the breaker to open", || async {
            partner(&one).await.breaker.state == BreakerState::Open
        })
        .await;
        // Open: no call goes out (those in flight when it opened may still end) until the
        // cool-down ends.
        let opened = Instant::now();
        let opened_after = calls_after(&service, Duration::from_millis(100)).await;
        assert!(opened_after >= 3, "[{b}] opened after {opened_after} calls");
        let probe = |n: usize| {
            let service = service.clone();
            async move {
                eventually(Duration::from_secs(10), "a probe", || async {
                    service.calls().len() > n
                })
                .await;
                let mut calls = service.calls();
                calls.sort_by_key(|c| c.arrived);
                calls[n].arrived
            }
        };
        let first_probe = probe(opened_after).await;
        assert!(
            first_probe >= opened + Duration::from_millis(1_000),
            "[{b}] a call went out {:?} after the breaker opened, within its cool-down",
            first_probe - opened
        );
        // Open longer than its alert threshold: an alert.
        eventually(Duration::from_secs(10), "the breaker alert", || async {
            one.open_alerts()
                .await
                .expect("alerts")
                .iter()
                .any(|a| a.kind == AlertKind::BreakerOpen && a.reason.contains("`partner`"))
        })
        .await;
        // The service is still down: the probe failed and opened the breaker again, and
        // nothing else went out with it.
        eventually(
            Duration::from_secs(10),
            "the breaker to open again",
            || async { partner(&one).await.breaker.state == BreakerState::Open },
        )
        .await;
        assert_eq!(
            calls_after(&service, Duration::from_millis(300)).await,
            opened_after + 1,
            "[{b}] more than one probe went out"
        );
        // The service recovers; after the next cool-down the probe succeeds, the breaker
        // closes, and every run completes.
        service.failing.store(false, Ordering::SeqCst);
        let probed = Instant::now();
        wait_all(&two, &ids, b).await;
        let mut after: Vec<_> = service
            .calls()
            .into_iter()
            .filter(|c| c.arrived >= probed)
            .collect();
        after.sort_by_key(|c| c.arrived);
        assert!(after[0].ok, "[{b}] the probe succeeded");
        assert!(
            after.len() < 2 || after[1].arrived >= after[0].left,
            "[{b}] a second call went out while the probe was in flight"
        );
        let r = partner(&one).await;
        assert_eq!(r.breaker.state, BreakerState::Closed, "[{b}]");
        assert_eq!(r.breaker.opened_at_ms, None, "[{b}]");
        eventually(
            Duration::from_secs(10),
            "the breaker alert to resolve",
            || async {
                !one.open_alerts()
                    .await
                    .expect("alerts")
                    .iter()
                    .any(|a| a.kind == AlertKind::BreakerOpen)
            },
        )
        .await;
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_an_operator_can_put_a_breaker_on_a_resource_and_take_it_off() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::from_millis(5)).await;
        service.failing.store(true, Ordering::SeqCst);
        let plain = Resource::new("partner").max_in_flight(2);
        let (one, two) = two_engines(&db, &url, &plain, &TestClock::new()).await;
        let limits = sagaflow::ResourceLimits {
            max_in_flight: Some(2),
            breaker: Some(sagaflow::Breaker {
                consecutive_failures: Some(3),
                failure_percent: None,
                min_calls: 10,
                window_ms: 60_000,
                cool_down_ms: 600_000,
                alert_after_ms: 300_000,
            }),
            ..sagaflow::ResourceLimits::default()
        };
        let set = one
            .operator()
            .on_behalf_of("alice", "the partner is flapping")
            .set_resource_limits("partner", Some(limits))
            .await
            .expect("override");
        assert!(set, "[{b}]");
        let ids = start_runs(&two, "t", 4).await;
        // The override's breaker counts the failures the other instance sees, and opens.
        eventually(Duration::from_secs(20), "the breaker to open", || async {
            partner(&one).await.breaker.state == BreakerState::Open
        })
        .await;
        let calls = calls_after(&service, Duration::from_millis(100)).await;
        assert_eq!(
            calls_after(&service, Duration::from_millis(400)).await,
            calls,
            "[{b}] a call went out through the open breaker"
        );
        // Taken off, the breaker no longer holds the steps back and reads as closed.
        service.failing.store(false, Ordering::SeqCst);
        one.operator()
            .on_behalf_of("alice", "the partner is stable")
            .set_resource_limits("partner", None)
            .await
            .expect("clear");
        wait_all(&one, &ids, b).await;
        let r = partner(&two).await;
        assert_eq!(
            (r.limits.breaker, r.breaker.state),
            (None, BreakerState::Closed),
            "[{b}]"
        );
        one.shutdown().await;
        two.shutdown().await;
    }
}
