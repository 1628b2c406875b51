//! `sagaflow::http::HttpAgent` against a real loopback HTTP server that records every
//! request: the idempotency key is stable across attempts, the trace context arrives, and
//! each kind of answer becomes the step outcome the guide's table gives (a 503 with
//! `Retry-After` defers, a 500 is unknown, a 422 is refused, a hung server times out by the
//! attempt's deadline).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use sagaflow::http::{HttpAgent, status_error};
use sagaflow::{
    DeadlinePolicy, HistoryEvent, HistoryKind, RetryPolicy, RunState, StartOptions, StepContext,
    StepError, Workflow,
};
use sagaflow_testkit::{backends, engine, expect_state};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::fixtures::Log;

const TOKEN: &str = "a-payments-token";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One request the server got.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    key: Option<String>,
    traceparent: Option<String>,
    tracestate: Option<String>,
    authorization: Option<String>,
    body: String,
    at: Instant,
}

/// How the server answers one request.
#[derive(Debug, Clone)]
enum Reply {
    Status(u16, Vec<(&'static str, String)>, String),
    Hang,
}

impl Reply {
    fn status(code: u16) -> Self {
        Self::Status(code, Vec::new(), String::new())
    }

    fn header(self, name: &'static str, value: &str) -> Self {
        match self {
            Self::Status(code, mut headers, body) => {
                headers.push((name, value.to_owned()));
                Self::Status(code, headers, body)
            }
            Self::Hang => Self::Hang,
        }
    }

    fn body(self, body: &str) -> Self {
        match self {
            Self::Status(code, headers, _) => Self::Status(code, headers, body.to_owned()),
            Self::Hang => Self::Hang,
        }
    }
}

/// A loopback JSON API: records every request; answers from a script per `METHOD /path`
/// prefix, then as a well-behaved service (a new id for a POST, 204 for a DELETE).
#[derive(Clone, Default)]
struct Remote {
    seen: Arc<Mutex<Vec<Seen>>>,
    scripts: Arc<Mutex<HashMap<String, VecDeque<Reply>>>>,
}

impl Remote {
    async fn serve(&self) -> String {
        async fn handle(
            State(r): State<Remote>,
            method: Method,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> Response {
            let header = |k: &str| {
                headers
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let path = uri.path().to_owned();
            let n = {
                let mut seen = r.seen.lock().expect("seen");
                seen.push(Seen {
                    method: method.to_string(),
                    path: path.clone(),
                    key: header("idempotency-key"),
                    traceparent: header("traceparent"),
                    tracestate: header("tracestate"),
                    authorization: header("authorization"),
                    body: String::from_utf8_lossy(&body).into_owned(),
                    at: Instant::now(),
                });
                seen.len()
            };
            let scripted = {
                let mut scripts = r.scripts.lock().expect("scripts");
                scripts
                    .iter_mut()
                    .find(|(k, _)| format!("{method} {path}").starts_with(k.as_str()))
                    .and_then(|(_, q)| q.pop_front())
            };
            match scripted {
                Some(Reply::Hang) => {
                    std::future::pending::<()>().await;
                    StatusCode::OK.into_response()
                }
                Some(Reply::Status(code, extra, body)) => {
                    let mut response = (
                        StatusCode::from_u16(code).expect("status"),
                        [("content-type", "application/json")],
                        body,
                    )
                        .into_response();
                    for (k, v) in extra {
                        response
                            .headers_mut()
                            .insert(k, v.parse().expect("header value"));
                    }
                    response
                }
                None if method == Method::DELETE => StatusCode::NO_CONTENT.into_response(),
                None => axum::Json(serde_json::json!({ "id": format!("{}-{n}", &path[1..]) }))
                    .into_response(),
            }
        }
        let app = Router::new().fallback(handle).with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}")
    }

    fn script(&self, prefix: &str, replies: Vec<Reply>) {
        self.scripts
            .lock()
            .expect("scripts")
            .insert(prefix.to_owned(), replies.into());
    }

    fn seen(&self, prefix: &str) -> Vec<Seen> {
        self.seen
            .lock()
            .expect("seen")
            .iter()
            .filter(|s| format!("{} {}", s.method, s.path).starts_with(prefix))
            .cloned()
            .collect()
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Created {
    id: String,
}

/// `reserve → charge`, each a call through `agent`, each with a compensation that undoes
/// it (the charge's, without an output, by the forward key). `log` gets `charge:<ms>` with
/// how long each charge call took.
fn shop(
    agent: &HttpAgent,
    name: &str,
    max_failures: u32,
    deadline: Duration,
    log: &Log,
) -> Workflow {
    let timed = log.clone();
    Workflow::builder(name, 1)
        .default_retry(
            RetryPolicy::default()
                .with_max_failures(max_failures)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(20)),
        )
        .default_deadline(DeadlinePolicy::new(deadline, deadline))
        .step_using("reserve", agent.clone(), |api, ctx| async move {
            let r: Created = api
                .post(&ctx, "/reservations", &serde_json::json!({ "sku": "A-1" }))
                .await?;
            Ok(r.id)
        })
        .compensate_using(agent.clone(), |api, ctx| async move {
            let id: String = ctx.output()?;
            api.delete::<()>(&ctx, &format!("/reservations/{id}")).await
        })
        .step_using("charge", agent.clone(), move |api, ctx| {
            let log = timed.clone();
            async move {
                let started = Instant::now();
                let charge = api
                    .post::<_, Created>(&ctx, "/charges", &serde_json::json!({ "cents": 1200 }))
                    .await;
                log.push(format!("charge:{}", started.elapsed().as_millis()));
                Ok(charge?.id)
            }
        })
        .after(["reserve"])
        .compensate_using(agent.clone(), |api, ctx| async move {
            match ctx.output::<String>() {
                Ok(id) => api.delete::<()>(&ctx, &format!("/charges/{id}")).await,
                // Maybe applied, no output: undo whatever the forward key applied.
                Err(_) => {
                    let path = format!("/charges/by-key/{}", ctx.forward_idempotency_key());
                    api.delete::<()>(&ctx, &path).await
                }
            }
        })
        .build()
        .expect("workflow")
}

async fn remote_and_agent() -> (Remote, HttpAgent) {
    let remote = Remote::default();
    let url = remote.serve().await;
    let agent = HttpAgent::builder("shop-api", &url)
        .with_bearer_token(TOKEN)
        .build()
        .expect("agent");
    (remote, agent)
}

fn of<'a>(history: &'a [HistoryEvent], step: &str, kind: &HistoryKind) -> Vec<&'a HistoryEvent> {
    history
        .iter()
        .filter(|h| h.step.as_deref() == Some(step) && &h.kind == kind)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_sends_one_key_across_retries_with_the_trace_context_and_token() {
    for db in backends().await {
        let (remote, agent) = remote_and_agent().await;
        remote.script("POST /charges", vec![Reply::status(502)]);
        let log = Log::default();
        let engine = engine(
            &db,
            vec![shop(&agent, "shop_key", 3, Duration::from_secs(5), &log)],
        )
        .await;
        let started = engine
            .start_with(
                "shop_key",
                &(),
                StartOptions::default()
                    .trace_parent(format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
                    .trace_state("shop=1"),
            )
            .await
            .expect("start");
        let run = expect_state(&engine, started.id, RunState::Completed, db.backend).await;
        assert_eq!(run.output.expect("output")["charge"], "charges-3");

        let charges = remote.seen("POST /charges");
        assert_eq!(charges.len(), 2, "[{}] a 502, then success", db.backend);
        let key = format!("{}:charge", started.id);
        for c in &charges {
            assert_eq!(
                c.key.as_deref(),
                Some(key.as_str()),
                "[{}] the same key",
                db.backend
            );
            let parent = c.traceparent.as_deref().expect("traceparent");
            assert!(
                parent.starts_with(&format!("00-{TRACE_ID}-")) && parent.ends_with("-01"),
                "[{}] the run's trace: {parent}",
                db.backend
            );
            assert_eq!(c.tracestate.as_deref(), Some("shop=1"));
            assert_eq!(
                c.authorization.as_deref(),
                Some(format!("Bearer {TOKEN}").as_str())
            );
            assert_eq!(c.body, r#"{"cents":1200}"#);
        }
        assert_ne!(
            charges[0].traceparent, charges[1].traceparent,
            "[{}] each attempt is a span of its own",
            db.backend
        );
        let reserve = remote.seen("POST /reservations");
        assert_eq!(reserve.len(), 1);
        assert_eq!(reserve[0].key, Some(format!("{}:reserve", started.id)));

        let history = engine.history(started.id).await.expect("history");
        let retries = of(&history, "charge", &HistoryKind::Retry);
        assert_eq!(retries.len(), 1, "[{}]", db.backend);
        let detail = retries[0].detail.as_ref().expect("detail");
        assert_eq!(detail["code"], "remote_error");
        assert_eq!(
            detail["outcome"], "unknown",
            "[{}] a 502 may have acted",
            db.backend
        );
        assert_eq!(detail["details"]["status"], 502);
        assert_eq!(detail["details"]["remote"], "shop-api");
        assert!(
            !detail.to_string().contains(TOKEN),
            "[{}] the token is never stored",
            db.backend
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_defers_on_a_503_with_retry_after_without_spending_an_attempt() {
    for db in backends().await {
        let (remote, agent) = remote_and_agent().await;
        remote.script(
            "POST /charges",
            vec![Reply::status(503).header("retry-after", "1")],
        );
        let log = Log::default();
        // A threshold of one failure: the run completes only if the 503 counted none.
        let engine = engine(
            &db,
            vec![shop(&agent, "shop_busy", 1, Duration::from_secs(5), &log)],
        )
        .await;
        let id = engine.start("shop_busy", &()).await.expect("start");
        let run = expect_state(&engine, id, RunState::Completed, db.backend).await;
        assert_eq!(run.failed_attempts, 0, "[{}]", db.backend);

        let charges = remote.seen("POST /charges");
        assert_eq!(charges.len(), 2, "[{}]", db.backend);
        assert_eq!(charges[0].key, charges[1].key);
        let gap = charges[1].at - charges[0].at;
        assert!(
            gap >= Duration::from_millis(950),
            "[{}] called again after {gap:?}, before the second Retry-After asked for",
            db.backend
        );
        let history = engine.history(id).await.expect("history");
        let deferred = of(&history, "charge", &HistoryKind::Deferred);
        assert_eq!(deferred.len(), 1, "[{}]", db.backend);
        let detail = deferred[0].detail.as_ref().expect("detail");
        assert_eq!(detail["retry_after_ms"], 1000);
        assert_eq!(detail["outcome"], "not_applied");
        assert_eq!(detail["details"]["status"], 503);
        assert!(of(&history, "charge", &HistoryKind::Retry).is_empty());
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_reads_a_500_as_an_unknown_outcome_so_the_step_is_compensated() {
    for db in backends().await {
        let (remote, agent) = remote_and_agent().await;
        remote.script("POST /charges", vec![Reply::status(500)]);
        let log = Log::default();
        let engine = engine(
            &db,
            vec![shop(&agent, "shop_500", 1, Duration::from_secs(5), &log)],
        )
        .await;
        let id = engine.start("shop_500", &()).await.expect("start");
        expect_state(&engine, id, RunState::Compensated, db.backend).await;

        let history = engine.history(id).await.expect("history");
        let failed = of(&history, "charge", &HistoryKind::Failed);
        assert_eq!(failed.len(), 1, "[{}]", db.backend);
        let detail = failed[0].detail.as_ref().expect("detail");
        assert_eq!(detail["outcome"], "unknown", "[{}] {detail}", db.backend);
        assert_eq!(detail["details"]["status"], 500);
        // The charge may have happened: its compensation undoes it by the forward key, and
        // the reservation is released.
        let undo = remote.seen("DELETE /charges/by-key/");
        assert_eq!(undo.len(), 1, "[{}] the charge is compensated", db.backend);
        assert_eq!(undo[0].path, format!("/charges/by-key/{id}:charge"));
        assert_eq!(undo[0].key, Some(format!("{id}:charge:compensate")));
        assert_eq!(remote.seen("DELETE /reservations/").len(), 1);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_reads_a_422_as_refused_so_only_the_earlier_steps_are_compensated() {
    for db in backends().await {
        let (remote, agent) = remote_and_agent().await;
        remote.script(
            "POST /charges",
            vec![Reply::status(422).body(r#"{"title":"Invalid","detail":"card declined"}"#)],
        );
        let log = Log::default();
        let engine = engine(
            &db,
            vec![shop(&agent, "shop_422", 5, Duration::from_secs(5), &log)],
        )
        .await;
        let id = engine.start("shop_422", &()).await.expect("start");
        expect_state(&engine, id, RunState::Compensated, db.backend).await;

        assert_eq!(
            remote.seen("POST /charges").len(),
            1,
            "[{}] terminal: not tried again",
            db.backend
        );
        let history = engine.history(id).await.expect("history");
        let failed = of(&history, "charge", &HistoryKind::Failed);
        assert_eq!(failed.len(), 1, "[{}]", db.backend);
        let detail = failed[0].detail.as_ref().expect("detail");
        assert_eq!(detail["code"], "refused");
        assert_eq!(detail["outcome"], "not_applied");
        assert_eq!(detail["retryable"], false);
        assert_eq!(detail["details"]["reason"], "card declined");
        assert!(
            remote.seen("DELETE /charges").is_empty(),
            "[{}] nothing to undo for a refused charge",
            db.backend
        );
        assert_eq!(remote.seen("DELETE /reservations/").len(), 1);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_gives_up_on_a_hung_server_by_the_attempt_deadline() {
    for db in backends().await {
        let (remote, agent) = remote_and_agent().await;
        remote.script("POST /charges", vec![Reply::Hang]);
        let log = Log::default();
        let deadline = Duration::from_millis(800);
        let engine = engine(&db, vec![shop(&agent, "shop_hung", 3, deadline, &log)]).await;
        let id = engine.start("shop_hung", &()).await.expect("start");
        expect_state(&engine, id, RunState::Completed, db.backend).await;

        let charges = remote.seen("POST /charges");
        assert_eq!(charges.len(), 2, "[{}]", db.backend);
        assert_eq!(charges[0].key, charges[1].key);
        // The first call gave up on its own, before the deadline, keeping the margin.
        let first: u128 = log
            .entries()
            .iter()
            .find_map(|e| e.strip_prefix("charge:"))
            .expect("timed")
            .parse()
            .expect("ms");
        assert!(
            first < deadline.as_millis() && first >= 500,
            "[{}] the hung call returned after {first} ms",
            db.backend
        );
        let history = engine.history(id).await.expect("history");
        let retries = of(&history, "charge", &HistoryKind::Retry);
        assert_eq!(retries.len(), 1, "[{}]", db.backend);
        assert!(
            !retries[0].actor.starts_with("supervisor:"),
            "[{}] the step answered, not the supervisor: {}",
            db.backend,
            retries[0].actor
        );
        let detail = retries[0].detail.as_ref().expect("detail");
        assert_eq!(detail["code"], "timeout", "[{}] {detail}", db.backend);
        assert_eq!(detail["outcome"], "unknown", "[{}] it was sent", db.backend);
        assert!(of(&history, "charge", &HistoryKind::Timeout).is_empty());
        engine.shutdown().await;
    }
}

/// A step context for calling the agent outside an engine, with `left` before its deadline.
fn context(left: Duration) -> StepContext {
    StepContext::new(
        Uuid::new_v4(),
        "call",
        1,
        "run:call",
        Instant::now() + left,
        CancellationToken::new(),
        Arc::new(serde_json::Value::Null),
        Arc::new(BTreeMap::new()),
        None,
    )
}

fn outcome(e: &StepError) -> (&str, bool, sagaflow::Outcome) {
    (e.code.as_str(), e.retryable, e.outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_maps_transport_failures_and_odd_answers() {
    use sagaflow::Outcome::{Applied, NotApplied, Unknown};
    let (remote, agent) = remote_and_agent().await;
    let ctx = context(Duration::from_secs(5));

    // No connection at all: nothing was sent.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let nowhere = HttpAgent::new("nowhere", &format!("http://127.0.0.1:{port}")).expect("agent");
    let e = nowhere
        .get::<serde_json::Value>(&ctx, "/x")
        .await
        .expect_err("refused");
    assert_eq!(outcome(&e), ("connect", true, NotApplied), "{e:?}");
    assert!(e.message.starts_with("nowhere: "), "{}", e.message);

    // Sent, then the connection was cut before an answer: it may have acted.
    let cutter = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let cut_at = cutter.local_addr().expect("addr");
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut socket, _)) = cutter.accept().await {
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            drop(socket);
        }
    });
    let cut = HttpAgent::new("cut", &format!("http://{cut_at}")).expect("agent");
    let e = cut
        .post::<_, serde_json::Value>(&ctx, "/x", &1)
        .await
        .expect_err("reset");
    assert_eq!(outcome(&e), ("transport", true, Unknown), "{e:?}");

    // A 2xx that does not decode: it acted, and a replay would answer the same.
    remote.script("GET /bad", vec![Reply::status(200).body("<html>ok</html>")]);
    let e = agent
        .get::<Created>(&ctx, "/bad")
        .await
        .expect_err("bad body");
    assert_eq!(outcome(&e), ("bad_reply", false, Applied), "{e:?}");

    // An empty 2xx reads as null.
    remote.script("DELETE /empty", vec![Reply::status(204)]);
    agent
        .delete::<()>(&ctx, "/empty")
        .await
        .expect("empty body");

    // A 409: with an idempotency key, the first request may still be running.
    remote.script("PUT /busy", vec![Reply::status(409)]);
    let e = agent
        .put::<_, serde_json::Value>(&ctx, "/busy", &1)
        .await
        .expect_err("409");
    assert_eq!(outcome(&e), ("conflict", true, Unknown), "{e:?}");

    // A 429 whose Retry-After is a date: a deferral of about that long.
    let at = std::time::SystemTime::now() + Duration::from_secs(30);
    remote.script(
        "GET /later",
        vec![Reply::status(429).header("retry-after", &httpdate::fmt_http_date(at))],
    );
    let e = agent
        .get::<serde_json::Value>(&ctx, "/later")
        .await
        .expect_err("429");
    assert!(e.is_deferral(), "{e:?}");
    let delay = e.retry_after().expect("delay");
    assert!(
        delay <= Duration::from_secs(30) && delay >= Duration::from_secs(27),
        "{delay:?}"
    );
    // Without one, an ordinary retryable failure that applied nothing.
    remote.script("GET /later", vec![Reply::status(429)]);
    let e = agent
        .get::<serde_json::Value>(&ctx, "/later")
        .await
        .expect_err("429");
    assert_eq!(outcome(&e), ("busy", true, NotApplied), "{e:?}");
    assert!(!e.is_deferral());

    // A hung server: the call returns before the context's deadline, outcome unknown.
    remote.script("GET /hang", vec![Reply::Hang]);
    let short = context(Duration::from_millis(400));
    let started = Instant::now();
    let e = agent
        .get::<serde_json::Value>(&short, "/hang")
        .await
        .expect_err("timeout");
    assert_eq!(outcome(&e), ("timeout", true, Unknown), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );

    // No time left: not sent at all.
    let before = remote.seen("GET /late").len();
    let e = agent
        .get::<serde_json::Value>(&context(Duration::from_millis(50)), "/late")
        .await
        .expect_err("no time");
    assert_eq!(outcome(&e), ("deadline", true, NotApplied), "{e:?}");
    assert_eq!(remote.seen("GET /late").len(), before, "nothing sent");

    // The mapping is public for answers read with `send_raw`.
    let raw = agent
        .send_raw(&ctx, agent.request(sagaflow::http::Method::GET, "/raw"))
        .await
        .expect("answered");
    assert!(status_error(raw.status(), raw.headers()).is_none());
}

/// A value taken from a remote goes into a path as one encoded segment: `../` and `?` in it
/// reach no other endpoint. A dot segment written into a path is sent encoded twice, not resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_agent_paths_keep_hostile_values_inside_one_segment() {
    use sagaflow::http::path;
    let (remote, agent) = remote_and_agent().await;
    let ctx = context(Duration::from_secs(5));
    let hostile = "../admin/users?all=1#x";
    agent
        .delete::<()>(&ctx, &path(["charges", hostile]))
        .await
        .expect("delete");
    let seen = remote.seen("DELETE ");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/charges/..%2Fadmin%2Fusers%3Fall%3D1%23x");
    // A path interpolated without `path`: its dot segments are not resolved either.
    for raw in [
        "/charges/../admin",
        "/charges/%2e%2E/admin",
        "charges/./../admin",
    ] {
        agent.delete::<()>(&ctx, raw).await.expect("delete");
    }
    let paths: Vec<String> = remote
        .seen("DELETE ")
        .iter()
        .map(|s| s.path.clone())
        .collect();
    assert!(
        paths.iter().all(|p| p.starts_with("/charges/")) && !paths.contains(&"/admin".to_owned()),
        "{paths:?}"
    );
    assert_eq!(
        paths[1..],
        [
            "/charges/%252E%252E/admin",
            "/charges/%252e%252E/admin",
            "/charges/%252E/%252E%252E/admin"
        ]
    );
}
