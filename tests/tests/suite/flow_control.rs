//! Flow control per remote resource, with two engine instances on one database and a
//! loopback service that records when each request arrived and left: concurrency never over
//! the limit at any instant (per resource and per key), a tenant's burst not starving
//! another tenant, a rate within 10 % of its limit, and an operator's override obeyed by
//! every instance.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sagaflow::{
    Engine, Resource, ResourceLimits, RetryPolicy, StartOptions, StepContext, StepError, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, fast_builder};
use uuid::Uuid;

/// One request the service got.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub(super) key: String,
    pub(super) tenant: String,
    pub(super) arrived: Instant,
    pub(super) left: Instant,
    /// Whether the service answered with success.
    pub(super) ok: bool,
}

/// A loopback service that takes `delay` per request and records each one; while `failing`
/// is set it answers 500.
#[derive(Clone)]
pub(super) struct Service {
    calls: Arc<Mutex<Vec<Call>>>,
    delay: Duration,
    pub(super) failing: Arc<AtomicBool>,
}

impl Service {
    pub(super) async fn serve(delay: Duration) -> (Self, String) {
        async fn call(
            State(s): State<Service>,
            headers: HeaderMap,
            body: String,
        ) -> (StatusCode, &'static str) {
            let arrived = Instant::now();
            let ok = !s.failing.load(Ordering::SeqCst);
            tokio::time::sleep(s.delay).await;
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            s.calls.lock().expect("calls").push(Call {
                key,
                tenant: body,
                arrived,
                left: Instant::now(),
                ok,
            });
            if ok {
                (StatusCode::OK, "ok")
            } else {
                (StatusCode::INTERNAL_SERVER_ERROR, "down")
            }
        }
        let s = Self {
            calls: Arc::default(),
            delay,
            failing: Arc::default(),
        };
        let app = Router::new()
            .route("/call", axum::routing::post(call))
            .with_state(s.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/call", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (s, url)
    }

    pub(super) fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls").clone()
    }

    /// The most requests in flight at one instant, among the calls `which` selects.
    pub(super) fn peak(&self, which: impl Fn(&Call) -> bool) -> usize {
        let mut edges: Vec<(Instant, i32)> = Vec::new();
        for c in self.calls().iter().filter(|c| which(c)) {
            edges.push((c.arrived, 1));
            edges.push((c.left, -1));
        }
        // A departure at the same instant as an arrival comes first.
        edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut peak) = (0i32, 0i32);
        for (_, d) in edges {
            now += d;
            peak = peak.max(now);
        }
        usize::try_from(peak).unwrap_or(0)
    }
}

/// A one-step saga calling the service under resource `partner`, its input the tenant.
pub(super) fn calling(url: &str) -> Workflow {
    let client = reqwest::Client::new();
    let url = url.to_owned();
    Workflow::builder("partner_call", 1)
        .flow_key("/tenant")
        .step("call", move |ctx: StepContext| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let input: serde_json::Value = ctx.input()?;
                let tenant = input["tenant"].as_str().unwrap_or_default().to_owned();
                client
                    .post(&url)
                    .header("idempotency-key", ctx.idempotency_key())
                    .body(tenant)
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status)
                    .map_err(|e| StepError::retryable("call", e.to_string()))?;
                Ok(())
            }
        })
        .resource("partner")
        // Quick retries: a failing service (the breaker's tests) keeps its runs alive.
        .retry(
            RetryPolicy::default()
                .with_max_failures(100)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(50)),
        )
        .build()
        .expect("workflow")
}

/// Two engine instances with the saga and the resource.
async fn two_engines(db: &TestDb, url: &str, resource: &Resource) -> (Engine, Engine) {
    let start = |id: &str| {
        fast_builder(db)
            .with_instance_id(id)
            .with_max_in_flight(16)
            .with_workflow(calling(url))
            .with_resource(resource.clone())
            .start()
    };
    let a = start("fc-a").await.expect("engine a");
    let b = start("fc-b").await.expect("engine b");
    (a, b)
}

/// Starts `n` runs of `tenant` at once (the engine commits them in a few batches): a test of
/// a rate must not measure how fast one start after another is accepted on a loaded machine
/// (one at a time, 61 starts on SQLite took longer than the 3 s the rate allows them).
pub(super) async fn start_runs(engine: &Engine, tenant: &str, n: usize) -> Vec<Uuid> {
    let input = serde_json::json!({ "tenant": tenant });
    futures_util::future::try_join_all((0..n).map(|_| engine.start("partner_call", &input)))
        .await
        .expect("start")
}

/// Waits until the service has seen `n` requests.
async fn until_calls(service: &Service, n: usize, what: &str) {
    eventually(Duration::from_secs(60), what, || async {
        service.calls().len() >= n
    })
    .await;
}

/// Every request was for a distinct idempotency key: no step was called twice.
pub(super) fn each_once(service: &Service, b: &str) {
    let calls = service.calls();
    let mut keys: Vec<&str> = calls.iter().map(|c| c.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), calls.len(), "[{b}] a step was called twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_concurrency_stays_within_the_limit_across_two_instances() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::from_millis(40)).await;
        let partner = Resource::new("partner").max_in_flight(3);
        let (one, two) = two_engines(&db, &url, &partner).await;
        let mut ids = start_runs(&one, "t", 20).await;
        ids.extend(start_runs(&two, "t", 20).await);
        until_calls(&service, 40, "every run to call the service").await;
        for id in &ids {
            one.wait(*id, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("[{b}] run {id}: {e}"));
        }
        let peak = service.peak(|_| true);
        assert!(
            peak <= 3,
            "[{b}] {peak} requests in flight at once, over the limit of 3"
        );
        assert!(peak >= 2, "[{b}] the limit was never used: peak {peak}");
        each_once(&service, b);
        // Both instances claimed: the limit held between them, not within one.
        let resources = one.resources().await.expect("resources");
        let r = resources
            .iter()
            .find(|r| r.name == "partner")
            .expect("stored");
        assert_eq!(r.limits.max_in_flight, Some(3), "[{b}]");
        assert_eq!((r.in_flight, r.waiting), (0, 0), "[{b}] all done");
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_a_tenants_burst_does_not_starve_another_tenant() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::from_millis(10)).await;
        // Three at a time in all, three per tenant: the limit per key alone would let the
        // busy tenant take every slot; the fair share serves the quiet one first.
        let partner = Resource::new("partner")
            .max_in_flight(3)
            .max_in_flight_per_key(3);
        let (one, two) = two_engines(&db, &url, &partner).await;
        let busy = 1000;
        start_runs(&one, "busy", busy).await;
        until_calls(&service, 10, "the busy tenant to be served").await;
        let quiet = start_runs(&two, "quiet", 1).await[0];
        // From when the run is stored: the busy tenant's calls while the start was on its
        // way are not the claim's doing.
        let submitted = Instant::now();
        eventually(
            Duration::from_secs(30),
            "the quiet tenant's call",
            || async { service.calls().iter().any(|c| c.tenant == "quiet") },
        )
        .await;
        let calls = service.calls();
        let served = calls
            .iter()
            .find(|c| c.tenant == "quiet")
            .expect("quiet call")
            .arrived;
        // Requests of the busy tenant that started after the quiet run was stored and before
        // it: those claimed already (three at most) and a claim round's worth.
        let ahead = calls
            .iter()
            .filter(|c| c.tenant == "busy" && c.arrived > submitted && c.arrived < served)
            .count();
        assert!(
            ahead <= 9,
            "[{b}] {ahead} requests of the busy tenant went ahead of the quiet one"
        );
        let queued = busy - calls.iter().filter(|c| c.tenant == "busy").count();
        assert!(
            queued > 100,
            "[{b}] the busy tenant's queue had nearly drained ({queued} left): the test proves nothing"
        );
        one.wait(quiet, Duration::from_secs(30))
            .await
            .expect("quiet run");
        assert!(service.peak(|_| true) <= 3, "[{b}] over the limit");
        assert!(
            service.peak(|c| c.tenant == "busy") <= 3,
            "[{b}] over the limit per key"
        );
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_a_key_never_has_more_in_flight_than_its_limit() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::from_millis(30)).await;
        let partner = Resource::new("partner")
            .max_in_flight(6)
            .max_in_flight_per_key(2);
        let (one, two) = two_engines(&db, &url, &partner).await;
        let mut ids = Vec::new();
        for tenant in ["a", "b"] {
            ids.extend(start_runs(&one, tenant, 10).await);
        }
        // Tenant c's runs are given tenant a's flow key at start: the key given wins over
        // the input's, and the two share a's limit.
        for _ in 0..10 {
            let input = serde_json::json!({ "tenant": "c" });
            let opts = StartOptions::default().flow_key("a");
            ids.push(
                one.start_with("partner_call", &input, opts)
                    .await
                    .expect("start")
                    .id,
            );
        }
        for id in &ids {
            two.wait(*id, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("[{b}] run {id}: {e}"));
        }
        let peak_a = service.peak(|c| c.tenant == "a" || c.tenant == "c");
        let peak_b = service.peak(|c| c.tenant == "b");
        assert!(
            peak_a <= 2 && peak_b <= 2,
            "[{b}] over 2 per key: a {peak_a}, b {peak_b}"
        );
        let peak = service.peak(|_| true);
        assert!(
            (3..=4).contains(&peak),
            "[{b}] two keys of 2 each should fill most of 4 slots: peak {peak}"
        );
        each_once(&service, b);
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_the_rate_stays_within_ten_percent_of_its_limit() {
    let _turn = crate::fixtures::timing_turn().await;
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::ZERO).await;
        let partner = Resource::new("partner").rate(20, Duration::from_secs(1));
        let (one, two) = two_engines(&db, &url, &partner).await;
        let n = 61;
        let mut ids = start_runs(&one, "t", n / 2).await;
        ids.extend(start_runs(&two, "t", n - n / 2).await);
        until_calls(&service, n, "every run to call the service").await;
        let mut arrivals: Vec<Instant> = service.calls().iter().map(|c| c.arrived).collect();
        arrivals.sort();
        let span = arrivals[n - 1] - arrivals[0];
        #[allow(clippy::cast_precision_loss)] // 60 intervals
        let rate = (n - 1) as f64 / span.as_secs_f64();
        assert!(
            (18.0..=22.0).contains(&rate),
            "[{b}] {rate:.2} requests a second, not within 10 % of 20"
        );
        each_once(&service, b);
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_an_operators_override_is_obeyed_by_every_instance() {
    for db in backends().await {
        let b = db.backend;
        let (service, url) = Service::serve(Duration::from_millis(40)).await;
        let partner = Resource::new("partner").max_in_flight(1);
        let (one, two) = two_engines(&db, &url, &partner).await;
        let set = one
            .operator()
            .on_behalf_of("alice", "the partner raised our quota")
            .set_resource_limits(
                "partner",
                Some(ResourceLimits {
                    max_in_flight: Some(4),
                    ..ResourceLimits::default()
                }),
            )
            .await
            .expect("override");
        assert!(set, "[{b}] the resource is known");
        // Runs submitted to the other instance, which claims them under the override.
        let ids = start_runs(&two, "t", 24).await;
        for id in &ids {
            two.wait(*id, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("[{b}] run {id}: {e}"));
        }
        let peak = service.peak(|_| true);
        assert!(
            (2..=4).contains(&peak),
            "[{b}] peak {peak}: the override of 4 was not what the claims obeyed"
        );
        let r = two.resources().await.expect("resources");
        let r = r.iter().find(|r| r.name == "partner").expect("partner");
        assert_eq!(r.override_by.as_deref(), Some("alice"), "[{b}]");
        assert_eq!(
            r.defaults.max_in_flight,
            Some(1),
            "[{b}] the code's defaults stay"
        );
        // Cleared, the code's limit applies again.
        let cleared = one
            .operator()
            .on_behalf_of("alice", "quota back to normal")
            .set_resource_limits("partner", None)
            .await
            .expect("clear");
        assert!(cleared, "[{b}]");
        let r = one.resources().await.expect("resources");
        assert_eq!(r[0].limits.max_in_flight, Some(1), "[{b}]");
        assert_eq!(r[0].override_by, None, "[{b}]");
        // Invalid limits are refused and change nothing.
        let refused = one
            .operator()
            .set_resource_limits(
                "partner",
                Some(ResourceLimits {
                    max_in_flight: Some(0),
                    ..ResourceLimits::default()
                }),
            )
            .await;
        assert!(refused.is_err(), "[{b}] a zero limit is refused");
        let unknown = one
            .operator()
            .set_resource_limits("nobody", None)
            .await
            .expect("unknown");
        assert!(!unknown, "[{b}] an unknown resource is reported");
        one.shutdown().await;
        two.shutdown().await;
    }
}

#[tokio::test]
async fn flow_control_undeclared_or_misnamed_resources_are_refused_at_start() {
    let db = sagaflow_testkit::sqlite_db();
    let err = fast_builder(&db)
        .with_workflow(calling("http://127.0.0.1:9/call"))
        .start()
        .await
        .expect_err("an undeclared resource");
    let msg = err.to_string();
    assert!(
        msg.contains("`partner`") && msg.contains("not declared"),
        "the error names the resource: {msg}"
    );
    let err = Workflow::builder("w", 1)
        .step("s", |_ctx: StepContext| async { Ok(()) })
        .resource("has space")
        .build()
        .expect_err("a bad resource name");
    assert!(err.to_string().contains("has space"), "{err}");
    let err = fast_builder(&db)
        .with_workflow(calling("http://127.0.0.1:9/call"))
        .with_resource(Resource::new("partner").rate(0, Duration::from_secs(1)))
        .start()
        .await
        .expect_err("a zero rate");
    assert!(err.to_string().contains("partner"), "{err}");
}
