//! The engine's metrics over a real loopback `GET /metrics`, on both backends: after a known
//! workload (runs completing, compensating, failing and retrying, one cancelled, one left in
//! error), the counters equal what the database holds, the histograms counted every event,
//! the queue gauges show a queue built on purpose, and the leader gauge is up. The route
//! needs a token. Every metric the Grafana dashboard queries exists.
//!
//! The suite's tests share one process and so one recorder: each test counts only the series
//! of a workflow named for it alone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::fixtures::{admin_tokens, serve_admin};
use reqwest::StatusCode;
use sagaflow::{
    Engine, HistoryKind, RetryPolicy, RunState, StartOptions, StepContext, StepError, Uuid,
    Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually_some, expect_state, fast_builder};
use serde::Deserialize;
use serde_json::json;

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

#[derive(Deserialize, schemars::JsonSchema)]
struct Plan {
    /// `ok`, `flaky` (b fails once, not applied), `ambiguous` (b fails once, outcome
    /// unknown), `refuse` (c refuses: the run compensates), `stuck` (c refuses and b's
    /// compensation keeps failing: the run stops in error).
    mode: String,
}

fn mode(ctx: &StepContext) -> String {
    ctx.input::<Plan>().map(|p| p.mode).unwrap_or_default()
}

/// `a → b → c`, each undone by a compensation, behaving as the run's input says.
fn metered(name: &str) -> Workflow {
    Workflow::builder(name, 1)
        .input::<Plan>()
        .default_retry(
            RetryPolicy::default()
                .with_max_failures(2)
                .with_backoff(Duration::from_millis(5), Duration::from_millis(20)),
        )
        .step(
            "a",
            |_ctx: StepContext| async move { Ok::<_, StepError>(1) },
        )
        .compensate(|_ctx: StepContext| async move { Ok::<_, StepError>(()) })
        .step("b", |ctx: StepContext| async move {
            match (mode(&ctx).as_str(), ctx.attempt()) {
                ("flaky", 1) => Err(StepError::retryable("flaky", "b failed").not_applied()),
                ("ambiguous", 1) => Err(StepError::retryable("reset", "b lost its reply")),
                _ => Ok::<_, StepError>(2),
            }
        })
        .after(["a"])
        .compensate(|ctx: StepContext| async move {
            if mode(&ctx) == "stuck" {
                return Err(StepError::retryable("down", "undo b failed").not_applied());
            }
            Ok::<_, StepError>(())
        })
        .step("c", |ctx: StepContext| async move {
            match mode(&ctx).as_str() {
                "refuse" | "stuck" => Err(StepError::refused("declined", "c refused")),
                _ => Ok::<_, StepError>(3),
            }
        })
        .after(["b"])
        .compensate(|_ctx: StepContext| async move { Ok::<_, StepError>(()) })
        .build()
        .expect("valid")
}

/// A workflow name of this test and backend alone.
fn unique(test: &str, db: &TestDb) -> String {
    let tag = Uuid::new_v4().simple().to_string();
    format!("{test}_{}_{}", db.backend, &tag[..8])
}

/// What the workload left behind.
struct Workload {
    engine: Engine,
    workflow: String,
    /// Every run of the workload that finished or stopped in error.
    ended: Vec<Uuid>,
    /// Runs scheduled an hour ahead and still waiting.
    scheduled: usize,
}

/// Runs the workload on an engine of its own and waits for every run to end.
async fn workload(db: &TestDb, test: &str) -> Workload {
    let b = db.backend;
    let workflow = unique(test, db);
    let engine = fast_builder(db)
        .with_workflow(metered(&workflow))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
    let plan = [
        ("ok", RunState::Completed),
        ("ok", RunState::Completed),
        ("flaky", RunState::Completed),
        ("ambiguous", RunState::Completed),
        ("refuse", RunState::Compensated),
        ("refuse", RunState::Compensated),
        ("stuck", RunState::Error),
    ];
    let mut runs = Vec::new();
    for (m, end) in plan {
        let id = engine
            .start(&workflow, &json!({ "mode": m }))
            .await
            .unwrap_or_else(|e| panic!("[{b}] start a run: {e}"));
        runs.push((id, end));
    }
    // Two runs wait an hour; one of them is cancelled.
    let later = || StartOptions::default().start_after(Duration::from_secs(3600));
    let waiting = engine
        .start_with(&workflow, &json!({ "mode": "ok" }), later())
        .await
        .expect("scheduled run");
    let cancelled = engine
        .start_with(&workflow, &json!({ "mode": "ok" }), later())
        .await
        .expect("scheduled run");
    engine
        .operator()
        .cancel(cancelled.id)
        .await
        .unwrap_or_else(|e| panic!("[{b}] cancel: {e}"));
    runs.push((cancelled.id, RunState::Compensated));
    let mut ended = Vec::new();
    for (id, end) in runs {
        if end == RunState::Error {
            eventually_some(Duration::from_secs(30), "the stuck run in error", || {
                let engine = engine.clone();
                async move {
                    let run = engine.run(id).await.ok().flatten()?;
                    (run.state == RunState::Error).then_some(())
                }
            })
            .await;
        } else {
            expect_state(&engine, id, end, b).await;
        }
        ended.push(id);
    }
    assert_ne!(waiting.id, cancelled.id);
    Workload {
        engine,
        workflow,
        ended,
        scheduled: 1,
    }
}

/// `GET /metrics` with `token`: status and body.
async fn scrape(addr: std::net::SocketAddr, token: Option<&str>) -> (StatusCode, String) {
    let mut request = reqwest::Client::new().get(format!("http://{addr}/metrics"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    (status, response.text().await.expect("body"))
}

/// The samples of a scrape, as (name, labels) → value, for one workflow's series and the
/// series without a workflow label. Histograms give `_count` and `_sum`.
fn samples(text: &str, workflow: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    use prometheus_parse::{Scrape, Value};
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = Scrape::parse(lines).expect("the Prometheus text format");
    let mut out = BTreeMap::new();
    for s in scrape.samples {
        let labels: BTreeMap<String, String> = s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if labels.get("workflow").is_some_and(|w| w != workflow) {
            continue;
        }
        let mut put = |name: String, v: f64| {
            *out.entry((name, labels.clone())).or_insert(0.0) += v;
        };
        match s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => put(s.metric, v),
            Value::Histogram(h) => {
                // The parser may hand one histogram over more than once: its `+Inf` bucket
                // is its count.
                let count = h.iter().map(|b| b.count).fold(0.0, f64::max);
                let slot = out
                    .entry((format!("{}_count", s.metric), labels.clone()))
                    .or_insert(0.0);
                *slot = slot.max(count);
            }
            Value::Summary(_) => {}
        }
    }
    out
}

/// The sum of the samples named `name` whose labels include `with`.
fn total(
    samples: &BTreeMap<(String, BTreeMap<String, String>), f64>,
    name: &str,
    with: &[(&str, &str)],
) -> f64 {
    samples
        .iter()
        .filter(|((n, labels), _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).is_some_and(|l| l == v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// Runs per final label and attempts per outcome, read from the database.
async fn database_counts(
    w: &Workload,
) -> (BTreeMap<&'static str, f64>, BTreeMap<&'static str, f64>) {
    let mut runs: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut attempts: BTreeMap<&'static str, f64> = BTreeMap::new();
    for &id in &w.ended {
        let run = w.engine.run(id).await.expect("read").expect("run");
        let label = match run.state {
            RunState::Completed => "completed",
            RunState::Compensated
                if run.error.as_ref().is_some_and(|e| e["code"] == "cancelled") =>
            {
                "cancelled"
            }
            RunState::Compensated => "compensated",
            RunState::Error => "errored",
            other => panic!("run {id} did not end: {other}"),
        };
        *runs.entry(label).or_default() += 1.0;
        for h in w.engine.history(id).await.expect("history") {
            if h.step.is_none() || h.attempt.is_none() {
                continue;
            }
            let outcome = match h.kind {
                HistoryKind::Completed => "succeeded",
                HistoryKind::Interrupted => "interrupted",
                HistoryKind::Retry
                | HistoryKind::Failed
                | HistoryKind::Timeout
                | HistoryKind::SetAside => {
                    if h.detail
                        .as_ref()
                        .is_some_and(|d| d["outcome"] == "not_applied")
                    {
                        "failed_not_applied"
                    } else {
                        "failed_unknown"
                    }
                }
                _ => continue,
            };
            *attempts.entry(outcome).or_default() += 1.0;
        }
    }
    (runs, attempts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_equal_the_database_and_the_gauges_show_the_queue() {
    sagaflow::metrics::install_prometheus().expect("the recorder");
    for db in backends().await {
        let b = db.backend;
        let w = workload(&db, "metered").await;
        let (addr, server) = serve_admin(&w.engine, admin_tokens(OPS, VIEW)).await;
        // The supervisor leads: the leader gauge is up (other engines of this process may
        // lead too, each over its own database).
        eventually_some(Duration::from_secs(10), "the engine to lead", || {
            let engine = w.engine.clone();
            async move { engine.supervisor()?.is_leader().then_some(()) }
        })
        .await;
        // The gauge follows the flag as the leader's term begins: scrape until it shows.
        let (text, m) = eventually_some(Duration::from_secs(10), "the leader gauge", || async {
            let (status, text) = scrape(addr, Some(VIEW)).await;
            assert_eq!(status, StatusCode::OK, "[{b}] {text}");
            let m = samples(&text, &w.workflow);
            (total(&m, "sagaflow_leader", &[]) >= 1.0).then_some((text, m))
        })
        .await;
        let wf = w.workflow.as_str();
        let (runs, attempts) = database_counts(&w).await;

        // Counters: runs per final state and attempts per outcome, as stored.
        assert_eq!(
            total(&m, "sagaflow_runs_started_total", &[("workflow", wf)]),
            9.0,
            "[{b}] seven runs and two scheduled ones"
        );
        for state in ["completed", "compensated", "cancelled"] {
            assert_eq!(
                total(
                    &m,
                    "sagaflow_runs_finished_total",
                    &[("workflow", wf), ("state", state)]
                ),
                runs.get(state).copied().unwrap_or(0.0),
                "[{b}] runs {state}: database {runs:?}"
            );
        }
        assert_eq!(runs.get("completed").copied(), Some(4.0), "[{b}] {runs:?}");
        assert_eq!(runs.get("cancelled").copied(), Some(1.0), "[{b}] {runs:?}");
        assert_eq!(
            total(&m, "sagaflow_runs_errored_total", &[("workflow", wf)]),
            runs.get("errored").copied().unwrap_or(0.0),
            "[{b}] {runs:?}"
        );
        assert_eq!(runs.get("errored").copied(), Some(1.0), "[{b}] {runs:?}");
        let mut attempts_total = 0.0;
        for outcome in [
            "succeeded",
            "failed_not_applied",
            "failed_unknown",
            "interrupted",
        ] {
            let counted = total(
                &m,
                "sagaflow_step_attempts_total",
                &[("workflow", wf), ("outcome", outcome)],
            );
            assert_eq!(
                counted,
                attempts.get(outcome).copied().unwrap_or(0.0),
                "[{b}] attempts {outcome}: database {attempts:?}"
            );
            attempts_total += counted;
        }
        assert!(
            attempts
                .get("failed_not_applied")
                .is_some_and(|n| *n >= 3.0)
                && attempts.get("failed_unknown").is_some_and(|n| *n >= 1.0),
            "[{b}] the workload failed attempts both ways: {attempts:?}"
        );
        // Per step too: b's attempts include its retries.
        assert!(
            total(
                &m,
                "sagaflow_step_attempts_total",
                &[("workflow", wf), ("step", "b")]
            ) >= 9.0,
            "[{b}]"
        );

        // Histograms counted every event.
        assert_eq!(
            total(
                &m,
                "sagaflow_step_attempt_duration_seconds_count",
                &[("workflow", wf)]
            ),
            attempts_total,
            "[{b}] every attempt was answered by an agent"
        );
        assert_eq!(
            total(
                &m,
                "sagaflow_step_claim_latency_seconds_count",
                &[("workflow", wf)]
            ),
            attempts_total,
            "[{b}] every attempt was claimed once"
        );
        assert_eq!(
            total(
                &m,
                "sagaflow_run_start_latency_seconds_count",
                &[("workflow", wf)]
            ),
            7.0,
            "[{b}] the seven runs started; the scheduled ones did not"
        );
        assert_eq!(
            total(
                &m,
                "sagaflow_run_duration_seconds_count",
                &[("workflow", wf)]
            ),
            6.0 + 1.0,
            "[{b}] six runs finished, and the cancelled one"
        );

        // Gauges: the run scheduled an hour ahead is queued for later; nothing is due or
        // running.
        // The gauges are the process's: an engine of another test that refreshes its own
        // queues sets the workflows it does not have to 0 until this engine's next refresh,
        // so scrape until this engine's figure shows (each scrape refreshes it).
        #[allow(clippy::cast_precision_loss)]
        let scheduled = w.scheduled as f64;
        let queue = eventually_some(Duration::from_secs(10), "the scheduled gauge", || async {
            let (_, text) = scrape(addr, Some(VIEW)).await;
            let q = samples(&text, &w.workflow);
            (total(&q, "sagaflow_steps_scheduled", &[("workflow", wf)]) == scheduled).then_some(q)
        })
        .await;
        for gauge in [
            "sagaflow_steps_ready",
            "sagaflow_steps_running",
            "sagaflow_oldest_ready_age_seconds",
        ] {
            assert_eq!(
                total(&queue, gauge, &[("workflow", wf)]),
                0.0,
                "[{b}] {gauge}"
            );
        }
        assert!(total(&m, "sagaflow_leader", &[]) >= 1.0, "[{b}] {text}");
        assert!(
            m.keys().any(|(n, _)| n == "sagaflow_steps_in_flight"),
            "[{b}] the in-flight gauge"
        );
        assert!(
            total(&m, "sagaflow_alerts_total", &[("kind", "run_error")]) >= 1.0,
            "[{b}] the stuck run raised an alert"
        );
        server.abort();
        w.engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token() {
    sagaflow::metrics::install_prometheus().expect("the recorder");
    for db in backends().await {
        let b = db.backend;
        let engine = fast_builder(&db)
            .with_workflow(metered(&unique("guarded", &db)))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let (status, body) = scrape(addr, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}] {body}");
        assert!(
            !body.contains("sagaflow_"),
            "[{b}] no metrics without a token"
        );
        let (status, _) = scrape(addr, Some("not-a-token")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}]");
        let (status, body) = scrape(addr, Some(OPS)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] an operator token reads too");
        assert!(
            body.contains("# TYPE sagaflow_leader gauge"),
            "[{b}] {body}"
        );
        server.abort();
        engine.shutdown().await;
    }
}

/// The metric names a PromQL expression of the dashboard uses.
fn dashboard_metrics() -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/grafana/sagaflow-dashboard.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard file");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 10, "the dashboard's queries: {exprs:?}");
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(at) = rest.find("sagaflow_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

/// Every `expr` and `query` string of the dashboard (panels' targets, template variables).
fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if s.contains("sagaflow_") => {
                        out.push(s.clone());
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect_exprs(i, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_dashboard_is_exported() {
    sagaflow::metrics::install_prometheus().expect("the recorder");
    let names = dashboard_metrics();
    for db in backends().await {
        let b = db.backend;
        let w = workload(&db, "dashboard").await;
        let (addr, server) = serve_admin(&w.engine, admin_tokens(OPS, VIEW)).await;
        let (status, text) = scrape(addr, Some(VIEW)).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        let exported: BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        for name in &names {
            assert!(
                exported.contains(name.as_str()),
                "[{b}] the dashboard queries {name}, which is not exported"
            );
        }
        server.abort();
        w.engine.shutdown().await;
    }
}
