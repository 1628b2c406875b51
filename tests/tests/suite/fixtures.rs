//! Workflows, rigs and the loopback webhook receiver shared by the scenarios.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use sagaflow::webhook::{DELIVERY_HEADER, SIGNATURE_HEADER, TOPIC_HEADER, verify_signature};
use sagaflow::{
    DeadlinePolicy, Engine, NoticeBody, RetryPolicy, StartOptions, StepContext, StepError, Workflow,
};
use sagaflow_testkit::TestDb;
use sagaflow_testkit::services::Services;
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, OrderSettings, order_saga};
use uuid::Uuid;

/// Order saga settings for tests: short deadline, quick backoff.
pub(crate) fn order_settings(deadline_ms: u64, max_failures: u32) -> OrderSettings {
    OrderSettings {
        version: 1,
        retry: RetryPolicy::default()
            .with_max_failures(max_failures)
            .with_backoff(Duration::from_millis(10), Duration::from_millis(50)),
        deadline: DeadlinePolicy::new(
            Duration::from_millis(deadline_ms),
            Duration::from_millis(deadline_ms * 4),
        ),
    }
}

/// An engine running the order saga over fresh in-process services.
pub(crate) struct OrderRig {
    pub(crate) services: Services,
    pub(crate) engine: Engine,
}

pub(crate) async fn order_rig(db: &TestDb, deadline_ms: u64, max_failures: u32) -> OrderRig {
    let services = Services::default();
    let wf = order_saga(
        OrderApis::from(&services),
        order_settings(deadline_ms, max_failures),
    )
    .expect("order saga");
    let engine = sagaflow_testkit::engine(db, vec![wf]).await;
    OrderRig { services, engine }
}

pub(crate) async fn submit_order(engine: &Engine, n: usize) -> (Uuid, Order) {
    let order = Order::sample(n);
    let started = engine
        .start_with(
            ORDER_WORKFLOW,
            &order,
            StartOptions::keyed(order.order_id.clone()),
        )
        .await
        .expect("start order");
    (started.id, order)
}

/// Starts order sagas for `Order::sample(0..count)`, keyed by order id.
pub(crate) async fn submit_sample_orders(engine: &Engine, count: usize) {
    for n in 0..count {
        submit_order(engine, n).await;
    }
}

/// A shared, ordered log that test steps append to.
#[derive(Clone, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub(crate) fn push(&self, s: impl Into<String>) {
        self.0.lock().expect("log").push(s.into());
    }
    pub(crate) fn entries(&self) -> Vec<String> {
        self.0.lock().expect("log").clone()
    }
    pub(crate) fn count(&self, prefix: &str) -> usize {
        self.entries()
            .iter()
            .filter(|e| e.starts_with(prefix))
            .count()
    }
}

/// A step body that logs `name:<attempt>:<key>` and then behaves as `behave(attempt)` says.
pub(crate) fn logged<F>(
    log: &Log,
    name: &'static str,
    behave: F,
) -> impl Fn(
    StepContext,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<serde_json::Value, StepError>> + Send>,
> + Send
+ Sync
+ 'static
where
    F: Fn(u32) -> Behave + Send + Sync + 'static,
{
    let log = log.clone();
    let behave = Arc::new(behave);
    move |ctx: StepContext| {
        let log = log.clone();
        let behave = behave.clone();
        Box::pin(async move {
            log.push(format!(
                "{name}:{}:{}",
                ctx.attempt(),
                ctx.idempotency_key()
            ));
            match behave(ctx.attempt()) {
                Behave::Ok(v) => Ok(v),
                Behave::Retryable => {
                    Err(StepError::retryable("flaky", format!("{name} failed")).not_applied())
                }
                Behave::Ambiguous => Err(StepError::retryable(
                    "reset",
                    format!("{name} lost its reply"),
                )),
                Behave::Terminal => Err(StepError::refused("declined", format!("{name} refused"))),
                Behave::Hang => {
                    std::future::pending::<()>().await;
                    Ok(serde_json::Value::Null)
                }
                Behave::Panic => panic!("{name} blew up"),
            }
        })
    }
}

/// What a logged step does on an attempt.
pub(crate) enum Behave {
    Ok(serde_json::Value),
    /// A retryable failure that definitely did not apply.
    Retryable,
    /// A retryable failure whose effect may have applied (outcome unknown).
    #[allow(dead_code)]
    Ambiguous,
    Terminal,
    Hang,
    Panic,
}

/// A [`chain`] whose run ends in `error`: `b` completes, `c` refuses, and `b`'s compensation
/// fails at each of its 3 attempts (the threshold).
pub(crate) fn failing_undo(log: &Log, name: &str) -> Workflow {
    chain(
        log,
        name,
        2000,
        3,
        |_| Behave::Ok(2.into()),
        |_| Behave::Terminal,
        |_| Behave::Retryable,
    )
}

/// `a → b → c`, each with a logged compensation; deadline and threshold as given.
pub(crate) fn chain(
    log: &Log,
    name: &str,
    deadline_ms: u64,
    max_failures: u32,
    b: impl Fn(u32) -> Behave + Send + Sync + 'static,
    c: impl Fn(u32) -> Behave + Send + Sync + 'static,
    undo_b: impl Fn(u32) -> Behave + Send + Sync + 'static,
) -> Workflow {
    Workflow::builder(name, 1)
        .default_retry(
            RetryPolicy::default()
                .with_max_failures(max_failures)
                .with_backoff(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .default_deadline(DeadlinePolicy::new(
            Duration::from_millis(deadline_ms),
            Duration::from_millis(deadline_ms * 4),
        ))
        .step("a", logged(log, "a", |_| Behave::Ok(1.into())))
        .compensate(logged(log, "undo_a", |_| {
            Behave::Ok(serde_json::Value::Null)
        }))
        .step("b", logged(log, "b", b))
        .after(["a"])
        .compensate(logged(log, "undo_b", undo_b))
        .step("c", logged(log, "c", c))
        .after(["b"])
        .compensate(logged(log, "undo_c", |_| {
            Behave::Ok(serde_json::Value::Null)
        }))
        .build()
        .expect("chain")
}

/// Sends an HTTP request; its status and its body as JSON (`null` when it is not JSON).
pub(crate) async fn answer(r: reqwest::RequestBuilder) -> (reqwest::StatusCode, serde_json::Value) {
    let r = r.send().await.expect("request");
    let status = r.status();
    let body = r
        .json::<serde_json::Value>()
        .await
        .unwrap_or(serde_json::Value::Null);
    (status, body)
}

/// The admin configuration of the HTTP tests: an operator token `ops` and a read-only token
/// `viewer` with these secrets.
pub(crate) fn admin_tokens(ops: &str, view: &str) -> sagaflow::admin::AdminConfig {
    use sagaflow::admin::{AdminConfig, AdminToken, Role};
    AdminConfig::new()
        .with_token(AdminToken::new("ops", ops, Role::Operator).expect("token"))
        .with_token(AdminToken::new("viewer", view, Role::ReadOnly).expect("token"))
}

/// Serves `engine`'s console and API with `config` on 127.0.0.1 (an ephemeral port).
pub(crate) async fn serve_admin(
    engine: &Engine,
    config: sagaflow::admin::AdminConfig,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let app = engine.admin_router(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    (addr, server)
}

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// The `Sagaflow-Delivery` header: the notice's dedupe id.
    pub(crate) dedupe: String,
    pub(crate) topic: String,
    pub(crate) signature: String,
    pub(crate) body: String,
    /// Whether it was answered 2xx.
    pub(crate) accepted: bool,
}

/// A loopback webhook receiver: records every request; answers 503 to the first `fail_first`
/// ones, and never answers while `hang` is set.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    pub(crate) fail_first: Arc<AtomicUsize>,
    pub(crate) hang: Arc<AtomicBool>,
}

impl Receiver {
    /// Serves on 127.0.0.1 (an ephemeral port); returns the hook's URL.
    pub(crate) async fn serve(&self) -> String {
        async fn hook(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
            let header = |k: &str| {
                headers
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned()
            };
            let fail = r
                .fail_first
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            let hang = r.hang.load(Ordering::SeqCst);
            r.got.lock().expect("receiver").push(Received {
                dedupe: header(DELIVERY_HEADER),
                topic: header(TOPIC_HEADER),
                signature: header(SIGNATURE_HEADER),
                body: String::from_utf8_lossy(&body).into_owned(),
                accepted: !fail && !hang,
            });
            if hang {
                std::future::pending::<()>().await;
            }
            if fail {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::NO_CONTENT
            }
        }
        let app = Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/hook")
    }

    /// Every request so far, in arrival order.
    pub(crate) fn got(&self) -> Vec<Received> {
        self.got.lock().expect("receiver").clone()
    }

    /// The notices answered 2xx.
    pub(crate) fn accepted(&self) -> Vec<NoticeBody> {
        self.got()
            .iter()
            .filter(|r| r.accepted)
            .map(|r| serde_json::from_str(&r.body).expect("a notice body"))
            .collect()
    }
}

/// Every request's signature verifies with `secret` (and not with another), and every
/// delivery of one dedupe id carries the same body.
pub(crate) fn check_signed_and_consistent(r: &Receiver, secret: &str, b: &str) {
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs(),
    )
    .expect("secs");
    let got = r.got();
    for g in &got {
        verify_signature(
            secret,
            &g.signature,
            g.body.as_bytes(),
            now,
            Duration::from_secs(600),
        )
        .unwrap_or_else(|e| panic!("[{b}] {e}: {g:?}"));
        assert!(
            verify_signature(
                "another-secret-entirely",
                &g.signature,
                g.body.as_bytes(),
                now,
                Duration::from_secs(600)
            )
            .is_err(),
            "[{b}] a wrong secret verifies"
        );
        let body: NoticeBody = serde_json::from_str(&g.body).expect("body");
        assert_eq!(
            body.dedupe_id, g.dedupe,
            "[{b}] header and body dedupe ids differ"
        );
        assert_eq!(body.topic.as_ref(), g.topic, "[{b}]");
        for other in got.iter().filter(|o| o.dedupe == g.dedupe) {
            assert_eq!(other.body, g.body, "[{b}] one dedupe id, two bodies");
        }
    }
}

/// Taken by the tests that measure time (a rate) and by the tests that start a browser,
/// which takes the machine's cores for seconds: they take turns, so that a browser's start
/// never slows a measured rate down. Every other test runs beside them as usual.
static TIMING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for the turn of a test that measures time or starts a browser (see [`TIMING`]).
pub(crate) async fn timing_turn() -> tokio::sync::MutexGuard<'static, ()> {
    TIMING.lock().await
}

/// Logs in to the console served at `addr` with `token`; returns the session's `Cookie`.
pub(crate) async fn console_login(addr: std::net::SocketAddr, token: &str) -> String {
    let r = crate::console::http()
        .post(format!("http://{addr}/console/login"))
        .form(&[("token", token)])
        .send()
        .await
        .expect("login");
    let set = r.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_owned();
    set.split(';').next().expect("pair").to_owned()
}

/// Waits (30 s at most) until run `id` has exactly one step parked.
pub(crate) async fn parked(engine: &Engine, id: Uuid) {
    sagaflow_testkit::eventually(Duration::from_secs(30), "a step waiting", || async {
        engine
            .waiting_steps(Some(id), 10)
            .await
            .is_ok_and(|w| w.len() == 1)
    })
    .await;
}

/// Whether a scenario that makes its own PostgreSQL clusters can run: PostgreSQL is
/// installed (`SAGAFLOW_PG_URL` is set). Fails under CI or `SAGAFLOW_REQUIRE_PG=1` when
/// it is missing; otherwise says what is skipped.
pub(crate) fn postgres_wanted(what: &str) -> bool {
    if std::env::var("SAGAFLOW_PG_URL").is_ok() {
        return true;
    }
    let required = std::env::var("SAGAFLOW_REQUIRE_PG").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !required,
        "PostgreSQL is required but SAGAFLOW_PG_URL is not set"
    );
    eprintln!("note: SAGAFLOW_PG_URL not set; skipping {what}");
    false
}
