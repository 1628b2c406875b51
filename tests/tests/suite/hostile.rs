//! Hostile callers against the admin API served on loopback (`with_admin`): what a caller
//! without a credential, or with a read-only one, can make the engine spend is bounded by
//! `AdminLimits`, and every refusal is a 429 with `Retry-After`, answered before the token
//! is compared or the database is touched.

use std::time::Duration;

use sagaflow::admin::{AdminConfig, AdminLimits, AdminToken, Role, RouteLimit};
use sagaflow::{Engine, EventWait, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};
use serde_json::{Value, json};

const OPS: &str = "hostile-ops-secret-0123456789";
const VIEW: &str = "hostile-view-secret-0123456789";

/// `gate@1`: waits for the event `go`, then completes.
fn gate() -> Workflow {
    Workflow::builder("gate", 1)
        .wait_for_event(
            "go",
            EventWait::named("go").within(Duration::from_secs(120)),
        )
        .step(
            "done",
            |ctx: StepContext| async move { ctx.dep::<Value>("go") },
        )
        .after(["go"])
        .build()
        .expect("valid")
}

/// `quick@1`: one step that completes at once.
fn quick() -> Workflow {
    Workflow::builder("quick", 1)
        .step("only", |_: StepContext| async { Ok::<_, StepError>(1) })
        .build()
        .expect("valid")
}

/// An engine serving its API on 127.0.0.1 with `limits` (peer addresses known).
async fn serve(db: &TestDb, limits: AdminLimits) -> (Engine, String) {
    let config = AdminConfig::new()
        .with_token(AdminToken::new("ops", OPS, Role::Operator).expect("token"))
        .with_token(AdminToken::new("viewer", VIEW, Role::ReadOnly).expect("token"))
        .with_limits(limits)
        .expect("valid limits");
    let engine = fast_builder(db)
        .with_workflow(gate())
        .with_workflow(quick())
        .with_admin("127.0.0.1:0".parse().expect("addr"), config)
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    let addr = engine.admin_addr().expect("listening");
    (engine, format!("http://{addr}"))
}

fn retry_after(r: &reqwest::Response) -> Option<u64> {
    r.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// Limits that would refuse every request are refused, naming the limit.
#[test]
fn hostile_limits_of_zero_are_refused_with_the_limit_named() {
    let zero = AdminLimits {
        actions: RouteLimit::new(4, 0, 10),
        ..AdminLimits::default()
    };
    let e = AdminConfig::new().with_limits(zero).expect_err("refused");
    assert!(e.to_string().contains("`actions`"), "{e}");
}

/// A flood of forged callbacks is cut by the callbacks' limits (429 with `Retry-After`)
/// while a run started beside it completes; the flood never reaches another class.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_forged_callbacks_are_limited_and_runs_go_through() {
    for db in backends().await {
        let b = db.backend;
        let limits = AdminLimits {
            callbacks: RouteLimit::new(2, 5, 5),
            ..AdminLimits::default()
        };
        let (engine, base) = serve(&db, limits).await;
        let http = reqwest::Client::new();
        let id = engine.start("quick", &()).await.expect("start");
        let flood = (0..60).map(|i| {
            let http = http.clone();
            let url = format!(
                "{base}/api/v1/callbacks/{}.{}.{}",
                sagaflow::Uuid::new_v4().simple(),
                format!("{i:02}").repeat(16),
                "ab".repeat(16)
            );
            async move {
                let r = http
                    .post(url)
                    .json(&json!({ "ok": 1 }))
                    .send()
                    .await
                    .expect("post");
                (r.status().as_u16(), retry_after(&r))
            }
        });
        let answers = futures_util::future::join_all(flood).await;
        let limited = answers.iter().filter(|(s, _)| *s == 429).count();
        let refused = answers.iter().filter(|(s, _)| *s == 404).count();
        assert_eq!(limited + refused, 60, "[{b}] {answers:?}");
        assert!(
            limited >= 40,
            "[{b}] only {limited} of 60 limited: {answers:?}"
        );
        assert!(
            answers
                .iter()
                .filter(|(s, _)| *s == 429)
                .all(|(_, after)| after.is_some_and(|a| a >= 1)),
            "[{b}] a 429 without Retry-After: {answers:?}"
        );
        // Reads are another class: not limited by the callbacks' flood.
        let r = http
            .get(format!("{base}/api/v1/runs/{id}"))
            .bearer_auth(VIEW)
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200, "[{b}]");
        assert_eq!(
            r.headers()
                .get("x-content-type-options")
                .and_then(|v| v.to_str().ok()),
            Some("nosniff"),
            "[{b}]"
        );
        expect_state(&engine, id, RunState::Completed, b).await;
        engine.shutdown().await;
    }
}

/// Forged callbacks take nothing a claim needs: while a unit of work of the engine holds what
/// every claim needs (SQLite: the one writer connection; PostgreSQL: the only connection of a
/// pool of two, the other being the wake-up listener's), a flood of forged callbacks is
/// refused at once with 404, each by its MAC (on PostgreSQL a read of the API waits for the
/// connection meanwhile); once the unit lets go, the runs started during the flood complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_forged_callbacks_need_no_database_while_a_unit_of_work_holds_it() {
    use sagaflow::testing::interleave::{PauseHook, Point, Unit};
    for db in backends().await {
        let b = db.backend;
        let hook = std::sync::Arc::new(PauseHook::new());
        let limits = AdminLimits {
            callbacks: RouteLimit::new(64, 100_000, 100_000),
            ..AdminLimits::default()
        };
        let config = AdminConfig::new()
            .with_token(AdminToken::new("viewer", VIEW, Role::ReadOnly).expect("token"))
            .with_limits(limits)
            .expect("valid limits");
        let engine = fast_builder(&db)
            .with_pool_size(2)
            .with_workflow(gate())
            .with_workflow(quick())
            .with_pause_hook(hook.clone())
            .with_admin("127.0.0.1:0".parse().expect("addr"), config)
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let base = format!("http://{}", engine.admin_addr().expect("listening"));
        let gated = engine.start("gate", &()).await.expect("start");
        eventually(Duration::from_secs(30), "the gate parked", || async {
            engine
                .waiting_steps(Some(gated), 10)
                .await
                .is_ok_and(|w| w.len() == 1)
        })
        .await;
        // The event's delivery holds the connection, its transaction open, before its commit.
        let held = hook.hold(Unit::Deliver, Point::BeforeCommit);
        let sender = {
            let engine = engine.clone();
            tokio::spawn(async move { engine.send_event(gated, "go", &json!({ "ok": 1 })).await })
        };
        tokio::time::timeout(Duration::from_secs(30), held.reached())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the delivery never reached its commit"));
        let http = reqwest::Client::new();
        if b == "postgres" {
            // The control: a read needs a connection, and waits while the unit holds the
            // only one. (SQLite reads on reader connections that never wait for the writer:
            // there the flood shows it does not need the writer a claim needs.)
            let read = tokio::time::timeout(
                Duration::from_millis(500),
                http.get(format!("{base}/api/v1/runs/{gated}"))
                    .bearer_auth(VIEW)
                    .send(),
            )
            .await;
            assert!(
                read.is_err(),
                "[{b}] a read answered with the connection held: {read:?}"
            );
        }
        let flood = (0..256).map(|i| {
            let http = http.clone();
            let token = format!("{}.{i:032x}.{}", gated.simple(), "ab".repeat(16));
            let url = format!("{base}/api/v1/callbacks");
            async move {
                let r = http
                    .post(url)
                    .header("Sagaflow-Callback-Token", token)
                    .json(&json!({ "ok": 1 }))
                    .send()
                    .await
                    .expect("post");
                r.status().as_u16()
            }
        });
        let answers = tokio::time::timeout(
            Duration::from_secs(30),
            futures_util::future::join_all(flood),
        )
        .await
        .unwrap_or_else(|_| panic!("[{b}] forged callbacks waited for the database"));
        assert!(
            answers.iter().all(|s| *s == 404),
            "[{b}] every forged callback refused by its MAC: {answers:?}"
        );
        // Runs started now are claimed once the unit lets go.
        let quick: Vec<_> = {
            let engine = engine.clone();
            let starts = tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..5 {
                    ids.push(engine.start("quick", &()).await.expect("start"));
                }
                ids
            });
            held.release();
            starts.await.expect("starts")
        };
        sender
            .await
            .expect("sender")
            .unwrap_or_else(|e| panic!("[{b}] the held event: {e}"));
        expect_state(&engine, gated, RunState::Completed, b).await;
        for id in quick {
            expect_state(&engine, id, RunState::Completed, b).await;
        }
        engine.shutdown().await;
    }
}

/// A client that failed to authenticate too often is answered 429 until its window ends,
/// even with a valid token (which is not compared); the console's login counts too, a console
/// tab whose session ended does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_a_guessing_client_is_throttled_before_its_token_is_compared() {
    for db in backends().await {
        let b = db.backend;
        let limits = AdminLimits {
            failures_per_client: 3,
            ..AdminLimits::default()
        };
        let (engine, base) = serve(&db, limits).await;
        let http = reqwest::Client::new();
        let defs = format!("{base}/api/v1/definitions");
        // A console tab whose session ended asks on (its event stream, its live fragments):
        // 401s that guess nothing, and spend none of the budget.
        let ended = format!("sagaflow_session={}", "ab".repeat(32));
        for _ in 0..10 {
            let r = http
                .get(format!("{base}/console/events"))
                .header("cookie", &ended)
                .send()
                .await
                .expect("get");
            assert_eq!(r.status(), 401, "[{b}]");
        }
        let r = http.get(&defs).bearer_auth(VIEW).send().await.expect("get");
        assert_eq!(r.status(), 200, "[{b}] a logged-out tab spent the budget");
        for guess in ["guess-one-0123456789", "guess-two-0123456789"] {
            let r = http
                .get(&defs)
                .bearer_auth(guess)
                .send()
                .await
                .expect("get");
            assert_eq!(r.status(), 401, "[{b}]");
        }
        let r = http
            .post(format!("{base}/console/login"))
            .form(&[("token", "guess-three-0123456789")])
            .send()
            .await
            .expect("login");
        assert_eq!(r.status(), 401, "[{b}] a refused login");
        // Three failures: blocked, the right token included.
        let r = http.get(&defs).bearer_auth(OPS).send().await.expect("get");
        assert_eq!(r.status(), 429, "[{b}]");
        assert!(
            retry_after(&r).is_some_and(|s| (1..=60).contains(&s)),
            "[{b}]"
        );
        let body: Value = r.json().await.expect("json");
        assert_eq!(body["error"]["code"], "too_many_requests", "[{b}] {body}");
        // Health stays answered.
        let r = http
            .get(format!("{base}/healthz"))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 200, "[{b}]");
        engine.shutdown().await;
    }
}

/// A token follows at most `streams_per_token` event streams at once, and the server at
/// most `streams_total`; a stream's place is freed when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_event_streams_are_capped_per_token_and_in_total() {
    for db in backends().await {
        let b = db.backend;
        let limits = AdminLimits {
            streams_per_token: 2,
            streams_total: 3,
            ..AdminLimits::default()
        };
        let (engine, base) = serve(&db, limits).await;
        let http = reqwest::Client::new();
        let mut runs = Vec::new();
        for _ in 0..4 {
            runs.push(engine.start("gate", &()).await.expect("start"));
        }
        let follow = |run: sagaflow::Uuid, token: &'static str| {
            http.get(format!("{base}/api/v1/runs/{run}/events"))
                .bearer_auth(token)
                .send()
        };
        let first = follow(runs[0], VIEW).await.expect("stream");
        let second = follow(runs[1], VIEW).await.expect("stream");
        assert_eq!(
            (first.status().as_u16(), second.status().as_u16()),
            (200, 200),
            "[{b}]"
        );
        let third = follow(runs[2], VIEW).await.expect("stream");
        assert_eq!(third.status(), 429, "[{b}] a third stream of the token");
        let ops = follow(runs[2], OPS).await.expect("stream");
        assert_eq!(ops.status(), 200, "[{b}] another token's first stream");
        let over = follow(runs[3], OPS).await.expect("stream");
        assert_eq!(over.status(), 429, "[{b}] a fourth stream in total");
        // The first run completes: its stream ends and frees its place.
        engine
            .send_event(runs[0], "go", &json!({ "ok": true }))
            .await
            .expect("event");
        expect_state(&engine, runs[0], RunState::Completed, b).await;
        let text = first.text().await.expect("the stream ends");
        assert!(text.contains("completed"), "[{b}] {text}");
        eventually(Duration::from_secs(10), "a freed place", || async {
            follow(runs[3], VIEW).await.is_ok_and(|r| r.status() == 200)
        })
        .await;
        drop((second, ops));
        engine.shutdown().await;
    }
}
