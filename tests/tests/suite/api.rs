//! The HTTP API over a real loopback socket, on both backends: tokens and roles, starting a
//! run (created, existing for its business key, refused input, unknown workflow, oversized,
//! not JSON) and reading it back.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::fixtures::{admin_tokens, answer, serve_admin};
use reqwest::StatusCode;
use sagaflow::admin::{AdminConfig, AdminToken, Role};
use sagaflow::{Engine, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, fast_builder};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

#[derive(Deserialize, schemars::JsonSchema)]
struct Order {
    order_id: String,
}

/// `gated@1`: one step that finishes once the test opens its gate.
fn gated(gate: Arc<Semaphore>) -> Workflow {
    Workflow::builder("gated", 1)
        .step_using("wait", gate, |gate, _ctx: StepContext| async move {
            let _pass = gate
                .acquire()
                .await
                .map_err(|_| StepError::refused("gate", "closed"))?;
            Ok::<_, StepError>(())
        })
        .build()
        .expect("valid")
}

fn order() -> Workflow {
    Workflow::builder("order", 1)
        .input::<Order>()
        .step("reserve", |ctx: StepContext| async move {
            let o: Order = ctx.input()?;
            Ok::<_, StepError>(format!("reserved {}", o.order_id))
        })
        .build()
        .expect("valid")
}

/// An engine and its API on 127.0.0.1 (an ephemeral port), with an operator and a read-only
/// token and a 4 KiB body limit.
async fn serve(db: &TestDb) -> (Engine, SocketAddr, tokio::task::JoinHandle<()>) {
    serve_with(db, Arc::new(Semaphore::new(0))).await
}

async fn serve_with(
    db: &TestDb,
    gate: Arc<Semaphore>,
) -> (Engine, SocketAddr, tokio::task::JoinHandle<()>) {
    let engine = fast_builder(db)
        .with_workflow(order())
        .with_workflow(gated(gate))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    let config = admin_tokens(OPS, VIEW).with_body_limit(4 * 1024);
    let (addr, server) = serve_admin(&engine, config).await;
    (engine, addr, server)
}

/// Asserts that a request is refused with `status` and the error `code`.
async fn expect_refusal(r: reqwest::RequestBuilder, status: StatusCode, code: &str, backend: &str) {
    let (got, body) = answer(r).await;
    assert_eq!(
        (got, body["error"]["code"].as_str()),
        (status, Some(code)),
        "[{backend}] {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_valid_token_only_health_answers() {
    for db in backends().await {
        let b = db.backend;
        let (engine, addr, server) = serve(&db).await;
        let http = reqwest::Client::new();
        let url = |p: &str| format!("http://{addr}{p}");

        let (status, body) = answer(http.get(url("/healthz"))).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (StatusCode::OK, Some("running")),
            "[{b}]"
        );

        for (path, token) in [
            ("/api/v1/definitions", None),
            ("/api/v1/definitions", Some("wrong")),
            ("/api/v1/definitions", Some(&OPS[..OPS.len() - 1])),
            ("/api/v1/runs/00000000-0000-0000-0000-000000000000", None),
            ("/api/v1/no-such-route", None),
        ] {
            let mut req = http.get(url(path));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let (status, body) = answer(req).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}] {path} {token:?}");
            assert_eq!(body["error"]["code"], "unauthorized", "[{b}]");
            assert!(!body.to_string().contains("secret"), "[{b}] {body}");
        }
        let (status, body) = answer(
            http.post(url("/api/v1/workflows/order/runs"))
                .json(&json!({ "input": { "order_id": "o-1" } })),
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}] {body}");

        // A read-only token reads but does not start. Reads from the primary carry no lag.
        let plain = http
            .get(url("/api/v1/definitions"))
            .bearer_auth(VIEW)
            .send()
            .await
            .expect("get");
        assert!(
            plain
                .headers()
                .get(sagaflow::admin::REPLICA_LAG_HEADER)
                .is_none(),
            "[{b}] no replica, no lag header"
        );
        let (status, body) = answer(http.get(url("/api/v1/definitions")).bearer_auth(VIEW)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");
        let order = body["definitions"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["key"] == "order@1"))
            .unwrap_or_else(|| panic!("[{b}] no order@1 in {body}"));
        let schema = &order["description"]["input_schema"];
        assert_eq!(
            schema["properties"]["order_id"]["type"], "string",
            "[{b}] {body}"
        );
        let (status, body) = answer(
            http.post(url("/api/v1/workflows/order/runs"))
                .bearer_auth(VIEW)
                .json(&json!({ "input": { "order_id": "o-1" } })),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {body}");

        engine.shutdown().await;
        server.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_starts_a_run_with_one_call_and_reads_it_back() {
    for db in backends().await {
        let b = db.backend;
        let (engine, addr, server) = serve(&db).await;
        let http = reqwest::Client::new();
        let start = |body: reqwest::Body, workflow: &str, content_type: &str| {
            http.post(format!("http://{addr}/api/v1/workflows/{workflow}/runs"))
                .bearer_auth(OPS)
                .header("content-type", content_type)
                .body(body)
        };
        let order = |key: &str| {
            reqwest::Body::from(
                json!({ "input": { "order_id": key }, "business_key": key }).to_string(),
            )
        };

        let (status, created) = answer(start(order("o-7"), "order", "application/json")).await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {created}");
        assert_eq!(
            (created["created"].as_bool(), created["state"].as_str()),
            (Some(true), Some("running")),
            "[{b}] {created}"
        );
        let id = created["id"].as_str().expect("id").to_owned();

        // The same business key again: the existing run, and a status that says so.
        let (status, again) = answer(start(order("o-7"), "order", "application/json")).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {again}");
        assert_eq!(
            (again["id"].as_str(), again["created"].as_bool()),
            (Some(id.as_str()), Some(false)),
            "[{b}]"
        );

        // An input the schema refuses says where, as a JSON Pointer.
        let (status, body) = answer(start(
            json!({ "input": { "order_id": 17 } }).to_string().into(),
            "order",
            "application/json",
        ))
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {body}");
        assert_eq!(
            body["error"]["fields"],
            json!([{ "pointer": "/order_id", "message": "expected string, found number" }]),
            "[{b}] {body}"
        );
        let (_, body) = answer(start(
            json!({ "input": {} }).to_string().into(),
            "order",
            "application/json",
        ))
        .await;
        assert_eq!(
            body["error"]["fields"][0]["message"], "missing field `order_id`",
            "[{b}] {body}"
        );

        // Refused before anything is stored.
        let cases: [(reqwest::Body, &str, &str, StatusCode, &str); 5] = [
            (
                json!({ "input": { "qty": 1 } }).to_string().into(),
                "order",
                "application/json",
                StatusCode::BAD_REQUEST,
                "invalid_input",
            ),
            (
                order("o-8"),
                "no_such_workflow",
                "application/json",
                StatusCode::NOT_FOUND,
                "workflow_not_found",
            ),
            (
                order("o-9"),
                "order",
                "text/plain",
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
            ),
            (
                "{\"input\": ".into(),
                "order",
                "application/json",
                StatusCode::BAD_REQUEST,
                "invalid_json",
            ),
            (
                json!({ "input": { "order_id": "x".repeat(8 * 1024) } })
                    .to_string()
                    .into(),
                "order",
                "application/json",
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
            ),
        ];
        for (body, workflow, content_type, expected, code) in cases {
            let (status, err) = answer(start(body, workflow, content_type)).await;
            assert_eq!(
                (status, err["error"]["code"].as_str()),
                (expected, Some(code)),
                "[{b}] {err}"
            );
        }

        // Followed to the end, then read back with its steps and history.
        let run_id = id.parse().expect("uuid");
        engine
            .wait(run_id, std::time::Duration::from_secs(30))
            .await
            .expect("completes");
        let (status, run) = answer(
            http.get(format!("http://{addr}/api/v1/runs/{id}"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {run}");
        assert_eq!(run["run"]["state"], "completed", "[{b}] {run}");
        assert!(
            run["history"].as_array().is_some_and(|h| !h.is_empty()),
            "[{b}] {run}"
        );

        expect_refusal(
            http.get(format!(
                "http://{addr}/api/v1/runs/{}",
                uuid::Uuid::now_v7()
            ))
            .bearer_auth(VIEW),
            StatusCode::NOT_FOUND,
            "run_not_found",
            b,
        )
        .await;
        let (status, _) = answer(
            http.get(format!("http://{addr}/api/v1/runs/not-a-uuid"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}]");

        engine.shutdown().await;
        server.abort();
    }
}

/// A start later and a priority over HTTP: 201 with `start_at` and `priority`, read back on
/// the run; refusals point at the body field with `error.fields`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_at_a_time_with_a_priority_and_the_refusals_point_at_the_field() {
    for db in backends().await {
        let b = db.backend;
        let (engine, addr, server) = serve(&db).await;
        let http = reqwest::Client::new();
        let start = |body: Value| {
            http.post(format!("http://{addr}/api/v1/workflows/order/runs"))
                .bearer_auth(OPS)
                .json(&body)
        };
        let input = json!({ "order_id": "o-1" });

        let (status, created) = answer(start(json!({
            "input": input,
            "start_at": "2099-01-01T00:00:00+02:00",
            "priority": 7,
        })))
        .await;
        // More than a year ahead: refused, pointing at the field.
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {created}");
        assert_eq!(created["error"]["code"], "invalid_body", "[{b}] {created}");
        assert_eq!(
            created["error"]["fields"][0]["pointer"], "/start_at",
            "[{b}] {created}"
        );

        // A day ahead, on the test's clock, as RFC 3339 with an offset.
        let day_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis()
            + 86_400_000;
        let day = sagaflow::Timestamp::from_timestamp_millis(i64::try_from(day_ms).expect("ms"))
            .expect("an instant");
        let in_a_day = day.to_rfc3339();
        let (status, created) = answer(start(json!({
            "input": input,
            "start_at": in_a_day,
            "priority": -3,
        })))
        .await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {created}");
        let id = created["id"].as_str().expect("id");
        let (_, run) = answer(
            http.get(format!("http://{addr}/api/v1/runs/{id}"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(
            (&run["run"]["priority"], &run["run"]["state"]),
            (&json!(-3), &json!("pending")),
            "[{b}] {run}"
        );
        assert_eq!(run["run"]["start_at"], json!(day), "[{b}] {run}");

        let (status, created) = answer(start(json!({
            "input": input,
            "start_after_ms": 3_600_000,
        })))
        .await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {created}");
        let stats = engine.stats().await.expect("stats");
        assert_eq!(stats.scheduled, 2, "[{b}] {stats:?}");

        for (body, pointers) in [
            (
                json!({ "input": input, "start_at": "tomorrow" }),
                vec!["/start_at"],
            ),
            (json!({ "input": input, "start_at": 17 }), vec!["/start_at"]),
            (
                json!({ "input": input, "start_after_ms": -1 }),
                vec!["/start_after_ms"],
            ),
            (
                json!({ "input": input, "start_after_ms": 400 * 86_400_000_u64 }),
                vec!["/start_after_ms"],
            ),
            (
                json!({ "input": input, "start_at": in_a_day, "start_after_ms": 5 }),
                vec!["/start_at", "/start_after_ms"],
            ),
            (
                json!({ "input": input, "priority": 1_001 }),
                vec!["/priority"],
            ),
            (
                json!({ "input": input, "priority": 1.5 }),
                vec!["/priority"],
            ),
            (
                json!({ "input": input, "priority": "high" }),
                vec!["/priority"],
            ),
            (
                json!({ "input": input, "priority": 4_000_000_000_u64 }),
                vec!["/priority"],
            ),
        ] {
            let (status, err) = answer(start(body.clone())).await;
            assert_eq!(
                (status, err["error"]["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some("invalid_body")),
                "[{b}] {body}: {err}"
            );
            let got: Vec<&str> = err["error"]["fields"]
                .as_array()
                .map(|f| f.iter().filter_map(|f| f["pointer"].as_str()).collect())
                .unwrap_or_default();
            assert_eq!(got, pointers, "[{b}] {body}: {err}");
        }
        // An unknown field is still refused.
        expect_refusal(
            start(json!({ "input": input, "start_in": 5 })),
            StatusCode::BAD_REQUEST,
            "invalid_body",
            b,
        )
        .await;
        let stats = engine.stats().await.expect("stats");
        assert_eq!(stats.scheduled, 2, "[{b}] nothing more stored: {stats:?}");

        engine.shutdown().await;
        server.abort();
    }
}

/// Reads server-sent `state` events until `until` says stop or the stream ends (bounded).
async fn read_states(
    resp: &mut reqwest::Response,
    buf: &mut String,
    states: &mut Vec<String>,
    until: impl Fn(&[String]) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
                let v: Value = serde_json::from_str(data).expect("event data");
                states.push(v["state"].as_str().expect("state").to_owned());
            }
        }
        if until(states) {
            return true;
        }
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(Ok(None)) => return false,
            Ok(Err(e)) => panic!("event stream failed: {e}"),
            Err(_) => panic!("no event within 30 s; got {states:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitter_follows_its_run_to_the_end_over_server_sent_events() {
    for db in backends().await {
        let b = db.backend;
        let gate = Arc::new(Semaphore::new(0));
        let (engine, addr, server) = serve_with(&db, gate.clone()).await;
        let http = reqwest::Client::new();
        let (status, created) = answer(
            http.post(format!("http://{addr}/api/v1/workflows/gated/runs"))
                .bearer_auth(OPS)
                .json(&json!({ "input": null })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {created}");
        let id = created["id"].as_str().expect("id").to_owned();

        let mut resp = http
            .get(format!("http://{addr}/api/v1/runs/{id}/events"))
            .bearer_auth(VIEW)
            .send()
            .await
            .expect("events");
        assert_eq!(resp.status(), StatusCode::OK, "[{b}]");
        let content_type = resp.headers()["content-type"].to_str().unwrap_or_default();
        assert!(
            content_type.starts_with("text/event-stream"),
            "[{b}] {content_type}"
        );

        // The state it is in now, then, once the step may finish, each change to the end.
        let (mut buf, mut states) = (String::new(), Vec::new());
        assert!(
            read_states(&mut resp, &mut buf, &mut states, |s| !s.is_empty()).await,
            "[{b}] {states:?}"
        );
        // Its step waits at the gate: the run has not moved on.
        assert_eq!(states, ["running"], "[{b}]");
        gate.add_permits(1);
        let more = read_states(&mut resp, &mut buf, &mut states, |_| false).await;
        assert!(!more, "[{b}] the stream ends with the run");
        assert_eq!(
            states.last().map(String::as_str),
            Some("completed"),
            "[{b}] {states:?}"
        );
        assert!(
            states.windows(2).all(|w| w[0] != w[1]),
            "[{b}] a state repeated: {states:?}"
        );

        expect_refusal(
            http.get(format!(
                "http://{addr}/api/v1/runs/{}/events",
                uuid::Uuid::now_v7()
            ))
            .bearer_auth(VIEW),
            StatusCode::NOT_FOUND,
            "run_not_found",
            b,
        )
        .await;

        engine.shutdown().await;
        server.abort();
    }
}

/// `refund@1`: `charge` (undone by a refund that fails while `broken`) → `ship`, which is
/// refused: the run compensates, the refund fails, and the run stops in `error`.
fn refund(broken: Arc<AtomicBool>) -> Workflow {
    Workflow::builder("refund", 1)
        .default_retry(sagaflow::RetryPolicy::default().with_max_failures(1))
        .step("charge", |_: StepContext| async {
            Ok::<_, StepError>("charged")
        })
        .compensate_using(broken, |broken, _: StepContext| async move {
            if broken.load(Ordering::SeqCst) {
                Err(StepError::terminal_unknown(
                    "refunds_down",
                    "the refund service is down",
                ))
            } else {
                Ok(())
            }
        })
        .step("ship", |_: StepContext| async {
            Err::<(), _>(StepError::refused("no_stock", "nothing to ship"))
        })
        .after(["charge"])
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_fixes_an_error_run_over_http_and_the_reason_is_in_its_history() {
    for db in backends().await {
        let b = db.backend;
        let broken = Arc::new(AtomicBool::new(true));
        let engine = fast_builder(&db)
            .with_workflow(refund(broken.clone()))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let http = reqwest::Client::new();

        let id = engine.start("refund", &json!(null)).await.expect("start");
        let run = engine
            .wait(id, Duration::from_secs(30))
            .await
            .expect("stops");
        assert_eq!(run.state, sagaflow::RunState::Error, "[{b}]");

        let act = |action: &str, token: &str, body: Value| {
            http.post(format!("http://{addr}/api/v1/runs/{id}/actions/{action}"))
                .bearer_auth(token)
                .json(&body)
        };
        let refused: [(&str, &str, Value, StatusCode, &str); 5] = [
            (
                "retry",
                VIEW,
                json!({ "step": "charge", "reason": "r" }),
                StatusCode::FORBIDDEN,
                "forbidden",
            ),
            (
                "retry",
                OPS,
                json!({ "step": "charge" }),
                StatusCode::BAD_REQUEST,
                "reason_required",
            ),
            (
                "retry",
                OPS,
                json!({ "reason": "refunds are back" }),
                StatusCode::BAD_REQUEST,
                "step_required",
            ),
            (
                "explode",
                OPS,
                json!({ "reason": "r" }),
                StatusCode::NOT_FOUND,
                "unknown_action",
            ),
            (
                "retry",
                OPS,
                json!({ "step": "ship", "reason": "r" }),
                StatusCode::CONFLICT,
                "action_not_allowed",
            ),
        ];
        for (action, token, body, expected, code) in refused {
            let (status, err) = answer(act(action, token, body)).await;
            assert_eq!(
                (status, err["error"]["code"].as_str()),
                (expected, Some(code)),
                "[{b}] {action} {err}"
            );
        }

        // The run_error alert is open; an operator acknowledges it.
        let (status, list) = answer(
            http.get(format!("http://{addr}/api/v1/alerts"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {list}");
        let alert = list["alerts"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["run_id"] == json!(id)))
            .unwrap_or_else(|| panic!("[{b}] no open alert for the run in {list}"));
        assert_eq!(alert["kind"], "run_error", "[{b}] {alert}");
        let resolve = |token: &str, body: Value| {
            http.post(format!(
                "http://{addr}/api/v1/alerts/{}/resolve",
                alert["id"]
            ))
            .bearer_auth(token)
            .json(&body)
        };
        // A reason is required, as for the actions on runs; a read-only token is refused.
        for (token, body, expected, code) in [
            (OPS, json!({}), StatusCode::BAD_REQUEST, "reason_required"),
            (
                OPS,
                json!({ "reason": "  " }),
                StatusCode::BAD_REQUEST,
                "reason_required",
            ),
            (
                OPS,
                json!({ "reason": "r", "why": "x" }),
                StatusCode::BAD_REQUEST,
                "invalid_body",
            ),
            (
                VIEW,
                json!({ "reason": "r" }),
                StatusCode::FORBIDDEN,
                "forbidden",
            ),
        ] {
            let (status, err) = answer(resolve(token, body.clone())).await;
            assert_eq!(
                (status, err["error"]["code"].as_str()),
                (expected, Some(code)),
                "[{b}] {body} {err}"
            );
        }
        let (status, resolved) = answer(resolve(
            OPS,
            json!({ "reason": "  refunds <b>tracked</b> elsewhere " }),
        ))
        .await;
        assert_eq!(
            (
                status,
                resolved["resolved"].as_bool(),
                resolved["actor"].as_str(),
                resolved["reason"].as_str()
            ),
            (
                StatusCode::OK,
                Some(true),
                Some("api:ops"),
                Some("refunds <b>tracked</b> elsewhere")
            ),
            "[{b}] {resolved}"
        );

        // The cause is fixed; the operator retries the refund, saying why.
        broken.store(false, Ordering::SeqCst);
        let (status, done) = answer(act(
            "retry",
            OPS,
            json!({ "step": "charge", "reason": "refund service restored <script>x</script>" }),
        ))
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {done}");
        let run = engine
            .wait(id, Duration::from_secs(30))
            .await
            .expect("finishes");
        assert_eq!(run.state, sagaflow::RunState::Compensated, "[{b}]");

        let history = engine.history(id).await.expect("history");
        let audited = history
            .iter()
            .find(|e| e.actor == "api:ops" && e.detail.is_some())
            .unwrap_or_else(|| panic!("[{b}] no event by api:ops in {history:#?}"));
        let detail = audited.detail.as_ref().expect("detail");
        assert_eq!(
            detail["reason"], "refund service restored <script>x</script>",
            "[{b}]"
        );
        assert_eq!(detail["step"], "charge", "[{b}]");

        // No alert of the run is open any more; resolving one again is 404.
        let (status, list) = answer(
            http.get(format!("http://{addr}/api/v1/alerts"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {list}");
        assert!(
            list["alerts"]
                .as_array()
                .is_some_and(|a| a.iter().all(|a| a["run_id"] != json!(id))),
            "[{b}] the retried run's alert is still open: {list}"
        );
        let alerts = engine.run_alerts(id).await.expect("run alerts");
        let raised = alerts
            .first()
            .unwrap_or_else(|| panic!("[{b}] no alert was raised"));
        assert_eq!(raised.kind, sagaflow::AlertKind::RunError, "[{b}]");
        // Who resolved it and why are stored with it; the later action resolved nothing more.
        assert_eq!(
            (raised.resolved_by.as_deref(), raised.resolution.as_deref()),
            (Some("api:ops"), Some("refunds <b>tracked</b> elsewhere")),
            "[{b}] {raised:?}"
        );
        expect_refusal(
            http.post(format!("http://{addr}/api/v1/alerts/{}/resolve", raised.id))
                .bearer_auth(OPS)
                .json(&json!({ "reason": "again" })),
            StatusCode::NOT_FOUND,
            "alert_not_open",
            b,
        )
        .await;

        // A finished run takes no action: 409 with why.
        let (status, err) = answer(act("resume", OPS, json!({ "reason": "again" }))).await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("action_not_allowed")),
            "[{b}] {err}"
        );

        engine.shutdown().await;
        server.abort();
    }
}

/// The engine serves the API on an address of its own until it shuts down; an address beyond
/// this machine without a token fails the start, naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_serves_its_api_on_loopback_and_refuses_an_open_address_without_a_token() {
    for db in backends().await {
        let b = db.backend;
        let refused = fast_builder(&db)
            .with_workflow(order())
            .with_admin("0.0.0.0:0".parse().expect("addr"), AdminConfig::new())
            .start()
            .await
            .map(|_| ())
            .expect_err("an open address without a token");
        assert!(
            refused.to_string().contains("without a token"),
            "[{b}] {refused}"
        );

        let engine = fast_builder(&db)
            .with_workflow(order())
            .with_workflow(gated(Arc::new(Semaphore::new(0))))
            .with_admin(
                "127.0.0.1:0".parse().expect("addr"),
                AdminConfig::new()
                    .with_token(AdminToken::new("ops", OPS, Role::Operator).expect("token")),
            )
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let addr = engine.admin_addr().expect("listening");
        assert!(addr.ip().is_loopback() && addr.port() != 0, "[{b}] {addr}");
        let http = reqwest::Client::new();
        let (status, _) = answer(http.get(format!("http://{addr}/healthz"))).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        let (status, body) = answer(
            http.get(format!("http://{addr}/api/v1/definitions"))
                .bearer_auth(OPS),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");

        // A follower of an unfinished run does not hold the shutdown up: its stream ends.
        let started = engine
            .start("gated", &json!(null))
            .await
            .expect("a run that waits");
        let mut follower = http
            .get(format!("http://{addr}/api/v1/runs/{started}/events"))
            .bearer_auth(OPS)
            .send()
            .await
            .expect("events");
        let (mut buf, mut states) = (String::new(), Vec::new());
        assert!(read_states(&mut follower, &mut buf, &mut states, |s| !s.is_empty()).await);
        tokio::time::timeout(Duration::from_secs(10), engine.shutdown())
            .await
            .unwrap_or_else(|_| panic!("[{b}] shutdown waited for an event follower"));
        assert!(
            !read_states(&mut follower, &mut buf, &mut states, |_| false).await,
            "[{b}] the stream ended"
        );
        let after = http.get(format!("http://{addr}/healthz")).send().await;
        assert!(
            after.is_err(),
            "[{b}] still answering after shutdown: {after:?}"
        );
    }
}

/// The overview: a run waiting in its step is running and active, a finished one counts in
/// the last minute's throughput.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_the_queue_the_active_runs_and_recent_throughput() {
    for db in backends().await {
        let b = db.backend;
        let gate = Arc::new(Semaphore::new(0));
        let (engine, addr, server) = serve_with(&db, gate.clone()).await;
        let done = engine
            .start("order", &json!({ "order_id": "o-1" }))
            .await
            .expect("start");
        engine
            .wait(done, Duration::from_secs(30))
            .await
            .expect("completes");
        let waiting = engine.start("gated", &json!(null)).await.expect("start");
        let http = reqwest::Client::new();
        let read = || async {
            answer(
                http.get(format!("http://{addr}/api/v1/stats"))
                    .bearer_auth(VIEW),
            )
            .await
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let stats = loop {
            let (status, stats) = read().await;
            assert_eq!(status, StatusCode::OK, "[{b}] {stats}");
            if stats["running"] == 1 {
                break stats;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "[{b}] never running: {stats}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            (stats["ready"].as_i64(), stats["scheduled"].as_i64()),
            (Some(0), Some(0)),
            "[{b}] {stats}"
        );
        assert_eq!(stats["finished_last"]["m1"], 1, "[{b}] {stats}");
        assert_eq!(stats["finished_last"]["m15"], 1, "[{b}] {stats}");
        let active = stats["active"].as_array().expect("active");
        assert_eq!(active.len(), 1, "[{b}] {stats}");
        assert_eq!(
            (active[0]["workflow"].as_str(), active[0]["runs"].as_i64()),
            (Some("gated"), Some(1)),
            "[{b}] {stats}"
        );

        gate.add_permits(1);
        engine
            .wait(waiting, Duration::from_secs(30))
            .await
            .expect("completes");
        let (_, stats) = read().await;
        assert_eq!(
            (
                stats["running"].as_i64(),
                stats["finished_last"]["m1"].as_i64()
            ),
            (Some(0), Some(2)),
            "[{b}] {stats}"
        );
        assert!(
            stats["active"].as_array().is_some_and(Vec::is_empty),
            "[{b}] {stats}"
        );
        let finished = |stats: &Value| -> Vec<(String, String, i64)> {
            stats["finished"]
                .as_array()
                .expect("finished")
                .iter()
                .map(|f| {
                    (
                        f["workflow"].as_str().unwrap_or_default().to_owned(),
                        f["state"].as_str().unwrap_or_default().to_owned(),
                        f["runs"].as_i64().unwrap_or_default(),
                    )
                })
                .collect()
        };
        assert_eq!(
            finished(&stats),
            [
                ("gated".into(), "completed".into(), 1),
                ("order".into(), "completed".into(), 1)
            ],
            "[{b}] finished runs per workflow and state, counted as they finished: {stats}"
        );
        // The retention sweep takes what it deletes off the totals.
        sagaflow_testkit::eventually(Duration::from_secs(20), "the runs to be purged", || async {
            let purged = engine
                .store()
                .run_purge_finished(0, 1)
                .await
                .expect("purge");
            purged == 0 && engine.run(done).await.ok().flatten().is_none()
        })
        .await;
        let (_, stats) = read().await;
        assert_eq!(finished(&stats), [], "[{b}] {stats}");

        engine.shutdown().await;
        server.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_with_filters_sorts_and_a_cursor() {
    for db in backends().await {
        let b = db.backend;
        let (engine, addr, server) = serve(&db).await;
        let http = reqwest::Client::new();
        let url = |p: &str| format!("http://{addr}{p}");
        let mut ids = Vec::new();
        for i in 0..3 {
            let (status, body) = answer(
                http.post(url("/api/v1/workflows/order/runs"))
                    .bearer_auth(OPS)
                    .json(&json!({ "input": { "order_id": format!("o-{i}") }, "business_key": format!("o-{i}") })),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "[{b}] {body}");
            ids.push(body["id"].as_str().expect("id").to_owned());
        }

        expect_refusal(
            http.get(url("/api/v1/runs")),
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            b,
        )
        .await;

        // Pages of two, newest first, read with the read-only token.
        let (status, first) = answer(
            http.get(url("/api/v1/runs?limit=2&workflow=order"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {first}");
        let listed: Vec<&str> = first["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .map(|r| r["id"].as_str().expect("id"))
            .collect();
        assert_eq!(
            listed,
            vec![ids[2].as_str(), ids[1].as_str()],
            "[{b}] {first}"
        );
        let next = first["next"].as_str().expect("a next page");
        let (status, second) = answer(
            http.get(url(&format!(
                "/api/v1/runs?limit=2&workflow=order&cursor={next}"
            )))
            .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {second}");
        assert_eq!(second["runs"][0]["id"], ids[0].as_str(), "[{b}] {second}");
        assert!(second["next"].is_null(), "[{b}] {second}");

        // Filters and the other order.
        let (_, by_key) = answer(
            http.get(url("/api/v1/runs?business_key=o-1&sort=attempts"))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(
            by_key["runs"].as_array().map(Vec::len),
            Some(1),
            "[{b}] {by_key}"
        );
        assert_eq!(by_key["runs"][0]["failed_attempts"], 0, "[{b}] {by_key}");
        let (_, none) = answer(http.get(url("/api/v1/runs?state=error")).bearer_auth(VIEW)).await;
        assert_eq!(none["runs"], json!([]), "[{b}] {none}");

        // What the list refuses, with 400 and why.
        for bad in [
            "/api/v1/runs?state=lost",
            "/api/v1/runs?sort=name",
            "/api/v1/runs?limit=-1",
            // Limits the document states are kept, not silently cut.
            "/api/v1/runs?limit=501",
            "/api/v1/runs?limit=0",
            "/api/v1/waiting?limit=1001",
            "/api/v1/deliveries?limit=501",
            "/api/v1/runs?cursor=c.1.nope",
            "/api/v1/runs?colour=red",
        ] {
            expect_refusal(
                http.get(url(bad)).bearer_auth(VIEW),
                StatusCode::BAD_REQUEST,
                "invalid_query",
                b,
            )
            .await;
        }
        // Refusals axum makes before a handler runs are the same JSON envelope: a path
        // parameter that does not parse, and a method the route does not serve (with its
        // `Allow` header kept).
        expect_refusal(
            http.post(url("/api/v1/migrations/order/1/99999999999/apply"))
                .bearer_auth(OPS)
                .json(&json!({ "reason": "r" })),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            b,
        )
        .await;
        let wrong = http
            .delete(url("/api/v1/runs"))
            .bearer_auth(OPS)
            .send()
            .await
            .expect("send");
        assert_eq!(wrong.status(), StatusCode::METHOD_NOT_ALLOWED, "[{b}]");
        assert!(
            wrong.headers().contains_key("allow"),
            "[{b}] {:?}",
            wrong.headers()
        );
        let body: Value = wrong.json().await.expect("a JSON body");
        assert_eq!(body["error"]["code"], "method_not_allowed", "[{b}] {body}");
        // Cancelling a run that already completed: 409 with why.
        let done: sagaflow::Uuid = ids[0].parse().expect("uuid");
        sagaflow_testkit::expect_state(&engine, done, sagaflow::RunState::Completed, b).await;
        expect_refusal(
            http.post(url(&format!("/api/v1/runs/{done}/actions/cancel")))
                .bearer_auth(OPS)
                .json(&json!({ "reason": "too late" })),
            StatusCode::CONFLICT,
            "action_not_allowed",
            b,
        )
        .await;
        let (_, attempts_page) = answer(
            http.get(url("/api/v1/runs?sort=attempts&limit=1"))
                .bearer_auth(VIEW),
        )
        .await;
        let attempts_cursor = attempts_page["next"].as_str().expect("next").to_owned();
        expect_refusal(
            http.get(url(&format!("/api/v1/runs?cursor={attempts_cursor}")))
                .bearer_auth(VIEW),
            StatusCode::BAD_REQUEST,
            "invalid_query",
            b,
        )
        .await;
        engine.shutdown().await;
        server.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_pause_extend_and_resume_runs_one_by_one_or_by_filter() {
    for db in backends().await {
        let b = db.backend;
        let gate = Arc::new(Semaphore::new(0));
        let (engine, addr, server) = serve_with(&db, gate.clone()).await;
        let http = reqwest::Client::new();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(engine.start("gated", &json!(null)).await.expect("start"));
        }
        for id in &ids {
            sagaflow_testkit::eventually(Duration::from_secs(20), "the step to run", || async {
                let steps = engine.steps(*id).await.expect("steps");
                steps
                    .iter()
                    .all(|s| s.state == sagaflow::StepState::Running)
            })
            .await;
        }
        let one = |action: &str, body: Value| {
            http.post(format!(
                "http://{addr}/api/v1/runs/{}/actions/{action}",
                ids[0]
            ))
            .bearer_auth(OPS)
            .json(&body)
        };
        let many = |action: &str, filters: &str, token: &str| {
            http.post(format!(
                "http://{addr}/api/v1/runs/actions/{action}?{filters}"
            ))
            .bearer_auth(token)
            .json(&json!({ "reason": "payment provider maintenance" }))
        };

        // extend: by how much is required; then the deadline in flight moves.
        expect_refusal(
            one("extend", json!({ "reason": "slow bank" })),
            StatusCode::BAD_REQUEST,
            "extension_required",
            b,
        )
        .await;
        let (status, body) = answer(one(
            "extend",
            json!({ "reason": "slow bank", "by_seconds": 120 }),
        ))
        .await;
        assert_eq!(
            (status, body["state"].as_str()),
            (StatusCode::OK, Some("running")),
            "[{b}] {body}"
        );

        // Bulk: a filter is required, an operator token too; one page of the filtered runs.
        expect_refusal(
            many("pause", "", OPS),
            StatusCode::BAD_REQUEST,
            "filter_required",
            b,
        )
        .await;
        expect_refusal(
            many("pause", "workflow=gated", VIEW),
            StatusCode::FORBIDDEN,
            "forbidden",
            b,
        )
        .await;
        let (status, body) = answer(many("pause", "workflow=gated&limit=2", OPS)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");
        assert_eq!(
            (body["done"].as_u64(), body["refused"].as_u64()),
            (Some(2), Some(0)),
            "[{b}] {body}"
        );
        assert!(body["next"].is_string(), "[{b}] more runs match: {body}");
        let results = body["results"].as_array().expect("results");
        assert!(
            results.iter().all(|r| r["state"] == "paused"),
            "[{b}] {body}"
        );
        let next = body["next"].as_str().expect("a cursor").to_owned();
        let (_, body) = answer(many("pause", &format!("workflow=gated&cursor={next}"), OPS)).await;
        assert_eq!(
            body["done"].as_u64(),
            Some(1),
            "[{b}] the third run: {body}"
        );
        assert!(body["next"].is_null(), "[{b}] the last page: {body}");

        // A run already paused is refused with the reason, run by run.
        let (status, body) = answer(many("pause", "workflow=gated", OPS)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");
        assert_eq!(
            (body["done"].as_u64(), body["refused"].as_u64()),
            (Some(0), Some(3)),
            "[{b}] {body}"
        );
        let first = &body["results"][0];
        assert_eq!(
            (
                first["ok"].as_bool(),
                first["status"].as_u64(),
                first["error"]["code"].as_str()
            ),
            (Some(false), Some(409), Some("action_not_allowed")),
            "[{b}] {body}"
        );
        expect_refusal(
            one("pause", json!({ "reason": "again" })),
            StatusCode::CONFLICT,
            "action_not_allowed",
            b,
        )
        .await;

        // Each run's history has the pause with the operator and the reason.
        for id in &ids {
            let history = engine.history(*id).await.expect("history");
            let pause = history
                .iter()
                .find(|h| h.kind == sagaflow::HistoryKind::OperatorPause)
                .unwrap_or_else(|| panic!("[{b}] the pause of {id}"));
            assert_eq!(pause.actor, "api:ops", "[{b}]");
            assert_eq!(
                pause.detail.as_ref().and_then(|d| d["reason"].as_str()),
                Some("payment provider maintenance"),
                "[{b}]"
            );
        }

        let (_, body) = answer(many("resume", "workflow=gated&state=paused", OPS)).await;
        assert_eq!(body["done"].as_u64(), Some(3), "[{b}] {body}");
        gate.add_permits(3);
        for id in &ids {
            let run = engine
                .wait(*id, Duration::from_secs(30))
                .await
                .expect("ends");
            assert_eq!(run.state, sagaflow::RunState::Completed, "[{b}]");
        }
        server.abort();
        engine.shutdown().await;
    }
}
