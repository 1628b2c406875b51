//! Tracing: a run keeps one W3C trace from its start to its last step, across a crash and on
//! another engine process, and carries it downstream in every step's `traceparent`.
//!
//! Runs are started on a client-only engine (one with `StartOptions::trace_parent`, one
//! through the REST intake with a `traceparent` header, one with neither). A child engine
//! process runs them until every run's second step hangs in the effect server, and is
//! SIGKILLed; a second child process finishes them. The effect server records the trace
//! headers of every call; the children print their logs, where each step's own event carries
//! its run's trace id.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sagaflow::internals::store::Store;
use sagaflow::internals::trace::TraceContext;
use sagaflow::{
    DeadlinePolicy, Engine, Error, RetryPolicy, RunState, StartOption, StartOptions, StepContext,
    Uuid, Workflow,
};
use sagaflow_testkit::effects::{Call, EffectClient, EffectServer};
use sagaflow_testkit::services::Scripted;
use sagaflow_testkit::{ChildTest, backends, eventually};
use serde_json::json;

use crate::fixtures::{admin_tokens, answer, serve_admin};

const WORKFLOW: &str = "traced";
const STEPS: [&str; 3] = ["a", "b", "c"];
const BY_OPTIONS: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const BY_HEADER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const OPS: &str = "trace-ops-secret";
const VIEW: &str = "trace-view-secret";
/// What each step logs from inside its body.
const STEP_EVENT: &str = "traced step body ran";

/// `a → b → c`, each one call of the effect operation of its name, from inside the step.
fn traced_workflow(effects: &str) -> Workflow {
    let client = EffectClient::new(effects);
    let mut b = Workflow::builder(WORKFLOW, 1)
        .default_retry(
            RetryPolicy::default()
                .with_max_failures(5)
                .with_backoff(Duration::from_millis(10), Duration::from_millis(50)),
        )
        .default_deadline(DeadlinePolicy::new(
            Duration::from_millis(1500),
            Duration::from_millis(6000),
        ));
    let mut previous: Option<&str> = None;
    for step in STEPS {
        b = b.step_using(
            step,
            client.clone(),
            move |client, ctx: StepContext| async move {
                tracing::info!(STEP_EVENT);
                client
                    .call_in(&ctx, step, &json!({ "run": ctx.run_id() }))
                    .await
            },
        );
        if let Some(p) = previous {
            b = b.after([p]);
        }
        previous = Some(step);
    }
    b.build().expect("traced workflow")
}

async fn effect_server() -> EffectServer {
    let mut b = EffectServer::builder();
    for step in STEPS {
        b = b.operation(step, |_| Ok(json!({ "done": true })));
    }
    b.start().await.expect("effect server")
}

fn spawn_child(db_url: &str, effects: &str, id: &str) -> ChildTest {
    ChildTest::spawn(
        "trace::child_engine",
        &[
            ("SAGAFLOW_TRACE_CHILD", "1".into()),
            ("SAGAFLOW_TRACE_DB", db_url.into()),
            ("SAGAFLOW_TRACE_EFFECTS", effects.into()),
            ("SAGAFLOW_TRACE_ID", id.into()),
        ],
    )
}

/// The trace id of a `traceparent`, checked to be valid.
fn trace_id_of(traceparent: &str) -> String {
    TraceContext::parse(traceparent, None)
        .unwrap_or_else(|e| panic!("{traceparent:?} is not a valid traceparent: {e}"))
        .trace_id()
}

/// The value of `field=` in a log line of the fmt subscriber.
fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    line[at..].split([' ', '}', ':']).next()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_start_to_last_step_across_an_engine_restart_trace() {
    for db in backends().await {
        let b = db.backend;
        let effects = effect_server().await;
        let url = effects.base_url();
        // Every run's first call of `b` applies and then never answers.
        effects.script("b", [Scripted::Hang; 3]).expect("script");

        // Three runs, started on a client-only engine.
        let client = Engine::builder()
            .with_database_url(db.url.clone())
            .with_workflow(traced_workflow(&url))
            .with_workers(false)
            .start()
            .await
            .expect("client engine");
        let by_options = client
            .start_with(
                WORKFLOW,
                &json!({}),
                StartOptions::default()
                    .trace_parent(BY_OPTIONS)
                    .trace_state("vendor=opaque"),
            )
            .await
            .expect("start with a trace parent")
            .id;
        let (addr, api) = serve_admin(&client, admin_tokens(OPS, VIEW)).await;
        let (status, body) = answer(
            reqwest::Client::new()
                .post(format!("http://{addr}/api/v1/workflows/{WORKFLOW}/runs"))
                .bearer_auth(OPS)
                .header("traceparent", BY_HEADER)
                .json(&json!({ "input": {} })),
        )
        .await;
        assert_eq!(status, reqwest::StatusCode::CREATED, "[{b}] {body}");
        let by_header: Uuid = body["id"].as_str().expect("id").parse().expect("uuid");
        let fresh = client.start(WORKFLOW, &json!({})).await.expect("start");
        api.abort();
        client.shutdown().await;

        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        let stored = store
            .run_get(fresh)
            .await
            .expect("read")
            .and_then(|r| r.trace_parent)
            .expect("a run started without a context gets one");
        let fresh_trace = trace_id_of(&stored);
        let expected: HashMap<Uuid, String> = [
            (by_options, trace_id_of(BY_OPTIONS)),
            (by_header, trace_id_of(BY_HEADER)),
            (fresh, fresh_trace.clone()),
        ]
        .into();
        let traces: HashSet<&String> = expected.values().collect();
        assert_eq!(traces.len(), 3, "[{b}] every run has its own trace");

        let mut first = spawn_child(&db.url, &url, "trace-first");
        eventually(
            Duration::from_secs(60),
            "every run's step b applied (and hung) in the first child",
            || async { effects.ledger().applied("b") == 3 },
        )
        .await;
        first.child.kill().await.expect("SIGKILL the first child");

        let mut second = spawn_child(&db.url, &url, "trace-second");
        eventually(
            Duration::from_secs(90),
            "the second process to finish every run",
            || async {
                store
                    .run_count_by_state()
                    .await
                    .is_ok_and(|c| c.iter().any(|(s, n)| s == RunState::Completed && n == 3))
            },
        )
        .await;
        second.child.kill().await.expect("stop the second child");

        // Every call the effect server received carries its run's trace id, each attempt
        // its own span id.
        let calls = effects.calls();
        for (run, trace) in &expected {
            let of_run: Vec<&Call> = calls
                .iter()
                .filter(|c| c.key.starts_with(&run.to_string()))
                .collect();
            let steps: HashSet<&str> = of_run.iter().map(|c| c.operation.as_str()).collect();
            assert_eq!(steps, STEPS.into(), "[{b}] {run}: {of_run:?}");
            assert!(
                of_run.iter().filter(|c| c.operation == "b").count() >= 2,
                "[{b}] {run}: b is called again after the crash: {of_run:?}"
            );
            let mut spans = HashSet::new();
            for c in &of_run {
                let parent = c.traceparent.as_deref().expect("a traceparent");
                assert_eq!(&trace_id_of(parent), trace, "[{b}] {run}: {c:?}");
                assert!(spans.insert(parent[36..52].to_owned()), "[{b}] {c:?}");
            }
            let state = (*run == by_options).then_some("vendor=opaque");
            assert!(
                of_run.iter().all(|c| c.tracestate.as_deref() == state),
                "[{b}] {of_run:?}"
            );
        }
        // No span id of an attempt is the parent id given at start.
        let parents: HashSet<&str> = calls
            .iter()
            .filter_map(|c| c.traceparent.as_deref())
            .map(|p| &p[36..52])
            .collect();
        assert!(!parents.contains(&BY_OPTIONS[36..52]) && !parents.contains(&BY_HEADER[36..52]));

        // The steps' own log events carry their run's id and trace id (both children).
        let lines: Vec<String> = first
            .lines()
            .into_iter()
            .chain(second.lines())
            .filter(|l| l.contains(STEP_EVENT))
            .collect();
        assert!(lines.len() >= 9, "[{b}] {lines:#?}");
        for line in &lines {
            let run: Uuid = field(line, "run_id")
                .and_then(|r| r.parse().ok())
                .unwrap_or_else(|| panic!("[{b}] no run_id: {line}"));
            assert_eq!(
                field(line, "trace_id"),
                expected.get(&run).map(String::as_str),
                "[{b}] {line}"
            );
        }
        effects.shutdown().await.expect("effects shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_trace_parent_is_refused_at_start_and_ignored_over_rest_trace() {
    for db in backends().await {
        let b = db.backend;
        let effects = effect_server().await;
        let engine =
            sagaflow_testkit::engine(&db, vec![traced_workflow(&effects.base_url())]).await;
        let input = json!({});
        let start = |opts: StartOptions| engine.start_with(WORKFLOW, &input, opts);
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        ] {
            match start(StartOptions::default().trace_parent(bad)).await {
                Err(Error::InvalidStartOption {
                    option: StartOption::TraceParent,
                    reason,
                }) => assert!(!reason.is_empty()),
                other => panic!("[{b}] {bad:?}: {other:?}"),
            }
        }
        match start(
            StartOptions::default()
                .trace_parent(BY_OPTIONS)
                .trace_state("no value"),
        )
        .await
        {
            Err(Error::InvalidStartOption {
                option: StartOption::TraceState,
                ..
            }) => {}
            other => panic!("[{b}] {other:?}"),
        }
        let store = Store::connect(&db.url, Some(1)).await.expect("connect");
        let counts = store.run_count_by_state().await.expect("counts");
        assert!(
            counts.iter().all(|(_, n)| n == 0),
            "[{b}] nothing started: {counts:?}"
        );

        // Over REST a malformed header is ignored (W3C): the run starts a trace of its own.
        let (addr, api) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let (status, body) = answer(
            reqwest::Client::new()
                .post(format!("http://{addr}/api/v1/workflows/{WORKFLOW}/runs"))
                .bearer_auth(OPS)
                .header("traceparent", "00-not-a-trace-01")
                .json(&json!({ "input": {} })),
        )
        .await;
        assert_eq!(status, reqwest::StatusCode::CREATED, "[{b}] {body}");
        let id: Uuid = body["id"].as_str().expect("id").parse().expect("uuid");
        sagaflow_testkit::expect_state(&engine, id, RunState::Completed, b).await;
        let traces: HashSet<String> = effects
            .calls()
            .iter()
            .map(|c| trace_id_of(c.traceparent.as_deref().expect("a traceparent")))
            .collect();
        assert_eq!(traces.len(), 1, "[{b}] one trace for the run: {traces:?}");
        api.abort();
        engine.shutdown().await;
        effects.shutdown().await.expect("effects shutdown");
    }
}

/// The child engine. Ignored in normal runs; the restart test starts it in a subprocess,
/// printing its logs (with span fields) on stdout for the parent to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs only as the trace test's child process"]
async fn child_engine() {
    if std::env::var("SAGAFLOW_TRACE_CHILD").as_deref() != Ok("1") {
        return;
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .try_init();
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let _engine = Engine::builder()
        .with_database_url(var("SAGAFLOW_TRACE_DB"))
        .with_instance_id(var("SAGAFLOW_TRACE_ID"))
        .with_workflow(traced_workflow(&var("SAGAFLOW_TRACE_EFFECTS")))
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(100))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400))
        .start()
        .await
        .expect("child engine");
    // Runs until the parent kills it; bounded so an orphan cannot live forever.
    tokio::time::sleep(Duration::from_secs(180)).await;
}
