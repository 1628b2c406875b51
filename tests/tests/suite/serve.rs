//! The standalone server, `sagaflow serve`, and the engine it runs: an engine of published
//! workflows ([`EngineBuilder::with_published_workflows`]), with no workflow code, starts runs
//! that engines with the code then execute; token files authorise over HTTP; the real
//! process prints its address, answers with the file's tokens, stops on SIGTERM with exit 0,
//! and refuses to start without a token (exit 2). On both backends.
//!
//! [`EngineBuilder::with_published_workflows`]: sagaflow::EngineBuilder::with_published_workflows

use std::process::Stdio;
use std::time::Duration;

use crate::fixtures::answer;
use reqwest::StatusCode;
use sagaflow::admin::AdminConfig;
use sagaflow::{
    DeadlinePolicy, Engine, Error, OnDuplicate, RetryPolicy, RunState, StartOptions, StepContext,
    StepError, Workflow,
};
use sagaflow_testkit::{TestDb, backends, fast_builder};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::process::Command;

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

#[derive(Deserialize, schemars::JsonSchema)]
struct Order {
    order_id: String,
    qty: u32,
}

/// `order@1`: reserve (compensated) → charge (pivot, its own deadline) → ship (retriable).
fn order() -> Workflow {
    Workflow::builder("order", 1)
        .input::<Order>()
        .step("reserve", |ctx: StepContext| async move {
            let o: Order = ctx.input()?;
            Ok::<_, StepError>(format!("reserved {} x{}", o.order_id, o.qty))
        })
        .compensate(|_ctx: StepContext| async move { Ok::<_, StepError>(()) })
        .retry(RetryPolicy::default().with_max_failures(4))
        .step("charge", |_ctx: StepContext| async move {
            Ok::<_, StepError>("charged")
        })
        .after(["reserve"])
        .pivot()
        .deadline_policy(DeadlinePolicy::new(
            Duration::from_secs(7),
            Duration::from_secs(60),
        ))
        .step("ship", |_ctx: StepContext| async move {
            Ok::<_, StepError>("shipped")
        })
        .after(["charge"])
        .retriable()
        .build()
        .expect("valid")
}

/// Publishes `order@1` as an engine with its code does when it starts, and stops that engine.
async fn publish(db: &TestDb) {
    let engine = fast_builder(db)
        .with_workflow(order())
        .with_workers(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    engine.shutdown().await;
}

/// An engine with the workflow's code that runs steps.
async fn worker(db: &TestDb) -> Engine {
    fast_builder(db)
        .with_workflow(order())
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] worker start: {e}", db.backend))
}

/// What a step row holds at intake, without the run's id.
async fn intake_rows(engine: &Engine, id: sagaflow::Uuid) -> Vec<Value> {
    let rows = engine.store().run_steps(id).await.expect("steps");
    rows.iter()
        .map(|s| {
            json!({
                "name": s.name,
                "state": format!("{:?}", s.state),
                "max_failures": s.max_failures,
                "max_interruptions": s.max_interruptions,
                "deadline_ms": s.deadline_ms,
                "key": s.idempotency_key.replace(&id.to_string(), "RUN"),
                "available": s.available_at.is_some(),
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_code_starts_runs_that_engines_with_the_code_execute() {
    for db in backends().await {
        let b = db.backend;
        publish(&db).await;
        let published = fast_builder(&db)
            .with_published_workflows()
            .with_max_input_bytes(256)
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] published start: {e}"));
        assert!(
            published.supervisor().is_none(),
            "[{b}] it takes no part in supervision"
        );

        let started = published
            .start_with(
                "order",
                &json!({"order_id": "o-1", "qty": 2}),
                StartOptions::keyed("o-1"),
            )
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        assert!(started.created, "[{b}]");
        let again = published
            .start_with(
                "order",
                &json!({"order_id": "o-1", "qty": 2}),
                StartOptions::keyed("o-1"),
            )
            .await
            .expect("same key");
        assert_eq!((again.id, again.created), (started.id, false), "[{b}]");
        let dup = published
            .start_with(
                "order",
                &json!({"order_id": "o-1", "qty": 2}),
                StartOptions::keyed("o-1").on_duplicate(OnDuplicate::Reject),
            )
            .await;
        assert!(
            matches!(dup, Err(Error::DuplicateKey { .. })),
            "[{b}] {dup:?}"
        );
        for bad in [json!({"order_id": "o-2"}), json!({"order_id": 2, "qty": 1})] {
            let e = published.start("order", &bad).await.expect_err("refused");
            assert!(matches!(e, Error::InvalidInput { .. }), "[{b}] {bad}: {e}");
        }
        let big = json!({"order_id": "x".repeat(400), "qty": 1});
        let e = published.start("order", &big).await.expect_err("too large");
        assert!(matches!(e, Error::PayloadTooLarge { .. }), "[{b}] {e}");
        let e = published
            .start("nope", &json!({}))
            .await
            .expect_err("unknown");
        assert!(matches!(e, Error::WorkflowNotFound(_)), "[{b}] {e}");

        // The same rows as an engine with the code writes.
        let with_code = fast_builder(&db)
            .with_workflow(order())
            .with_workers(false)
            .start()
            .await
            .expect("client with code");
        let reference = with_code
            .start("order", &json!({"order_id": "o-2", "qty": 1}))
            .await
            .expect("start with code");
        assert_eq!(
            intake_rows(&published, started.id).await,
            intake_rows(&published, reference).await,
            "[{b}]"
        );
        with_code.shutdown().await;

        // An engine with the code executes both.
        let worker = worker(&db).await;
        for id in [started.id, reference] {
            let run = worker
                .wait(id, Duration::from_secs(30))
                .await
                .unwrap_or_else(|e| panic!("[{b}] wait: {e}"));
            assert_eq!(run.state, RunState::Completed, "[{b}]");
        }
        worker.shutdown().await;

        // A version published later is the one a start uses, without a restart.
        let v2 = Workflow::builder("order", 2)
            .step("reserve", |_ctx: StepContext| async move {
                Ok::<_, StepError>(())
            })
            .build()
            .expect("valid");
        fast_builder(&db)
            .with_workflow(v2)
            .with_workers(false)
            .start()
            .await
            .expect("publish order@2")
            .shutdown()
            .await;
        let id = published
            .start("order", &json!({"anything": true}))
            .await
            .unwrap_or_else(|e| panic!("[{b}] start of order@2: {e}"));
        let run = published.run(id).await.expect("read").expect("run");
        assert_eq!(run.version, 2, "[{b}]");
        published.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_of_published_workflows_registers_none_of_its_own() {
    let db = sagaflow_testkit::sqlite_db();
    let e = fast_builder(&db)
        .with_published_workflows()
        .with_workflow(order())
        .start()
        .await
        .expect_err("refused");
    assert!(matches!(e, Error::Config(_)), "{e}");
    let rebuilt = Workflow::from_description(&order().describe()).expect("rebuilt");
    let e = fast_builder(&db)
        .with_workflow(rebuilt)
        .start()
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("no code"), "{e}");
}

/// A token file with an operator and a read-only token, readable by its owner only.
fn token_file(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("tokens");
    std::fs::write(
        &file,
        format!("# test tokens\nops operator {OPS}\nviewer read-only {VIEW}\n"),
    )
    .expect("write tokens");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_authorises_by_role_over_http() {
    for db in backends().await {
        let b = db.backend;
        publish(&db).await;
        let dir = tempfile::tempdir().expect("dir");
        let config = AdminConfig::from_token_file(token_file(dir.path())).expect("tokens");
        let engine = fast_builder(&db)
            .with_published_workflows()
            .with_admin("127.0.0.1:0".parse().expect("addr"), config)
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let addr = engine.admin_addr().expect("listening");
        let http = reqwest::Client::new();
        let start = |token: &str| {
            http.post(format!("http://{addr}/api/v1/workflows/order/runs"))
                .bearer_auth(token)
                .json(&json!({"input": {"order_id": "o-9", "qty": 1}}))
        };
        let (status, body) = answer(start(VIEW)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {body}");
        let (status, body) = answer(start(OPS)).await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {body}");
        let (status, body) = answer(start("not-a-token-at-all")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}] {body}");
        engine.shutdown().await;
    }
}

/// The `sagaflow` binary, serving `url` with `tokens`, its stdout read line by line.
fn spawn_server(url: &str, tokens: &std::path::Path) -> tokio::process::Child {
    Command::new(sagaflow_testkit::workspace_binary("sagaflow"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", url])
        .arg("--token-file")
        .arg(tokens)
        .env_remove("SAGAFLOW_ADMIN_TOKEN")
        .env_remove("SAGAFLOW_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sagaflow serve")
}

async fn stderr_of(child: &mut tokio::process::Child) -> String {
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr).await;
    }
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_server_serves_a_database_and_starts_runs_without_code() {
    for db in backends().await {
        let b = db.backend;
        publish(&db).await;
        let dir = tempfile::tempdir().expect("dir");
        let tokens = token_file(dir.path());
        // An SQLite database is given by its path, as an operator would.
        let url = match db.url.strip_prefix("sqlite://") {
            Some(rest) => rest.split('?').next().unwrap_or(rest).to_owned(),
            None => db.url.clone(),
        };
        let mut child = spawn_server(&url, &tokens);
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let read = async {
            while let Some(line) = lines.next_line().await.expect("stdout line") {
                if let Some(rest) = line.trim().strip_prefix("sagaflow serve: listening on ") {
                    return Some(rest.trim().to_owned());
                }
            }
            None
        };
        let base = match tokio::time::timeout(Duration::from_secs(60), read).await {
            Ok(Some(base)) => base,
            other => panic!(
                "[{b}] no address printed ({other:?}); stderr:\n{}",
                stderr_of(&mut child).await
            ),
        };
        assert!(base.starts_with("http://127.0.0.1:"), "[{b}] {base}");
        assert!(!base.contains(OPS) && !base.contains(VIEW), "[{b}]");

        let http = reqwest::Client::new();
        let url = |p: &str| format!("{base}{p}");
        let (status, _) = answer(http.get(url("/healthz"))).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        let (status, _) = answer(http.get(url("/api/v1/definitions"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}]");
        let (status, defs) = answer(http.get(url("/api/v1/definitions")).bearer_auth(VIEW)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {defs}");
        let keys: Vec<&str> = defs["definitions"]
            .as_array()
            .expect("definitions")
            .iter()
            .filter_map(|d| d["key"].as_str())
            .collect();
        assert_eq!(keys, ["order@1"], "[{b}] {defs}");

        let start = |token: &str, input: Value| {
            http.post(url("/api/v1/workflows/order/runs"))
                .bearer_auth(token)
                .json(&json!({"input": input, "business_key": "o-42"}))
        };
        let good = json!({"order_id": "o-42", "qty": 3});
        let (status, body) = answer(start(VIEW, good.clone())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {body}");
        let (status, body) = answer(start(OPS, json!({"order_id": "o-42"}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {body}");
        let (status, created) = answer(start(OPS, good.clone())).await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {created}");
        let id: sagaflow::Uuid = created["id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("[{b}] no id in {created}"));
        let (status, again) = answer(start(OPS, good)).await;
        assert_eq!(
            (status, again["id"].as_str()),
            (StatusCode::OK, created["id"].as_str()),
            "[{b}] {again}"
        );

        // The run waits for an engine with the code, which executes it.
        let worker = worker(&db).await;
        let run = worker
            .wait(id, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("[{b}] wait: {e}"));
        assert_eq!(run.state, RunState::Completed, "[{b}]");
        worker.shutdown().await;
        let (status, body) = answer(
            http.get(url(&format!("/api/v1/runs/{id}")))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");

        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("it stops within 20 s of SIGTERM")
            .expect("exit status");
        let stderr = stderr_of(&mut child).await;
        assert_eq!(status.code(), Some(0), "[{b}] {status}; stderr:\n{stderr}");
        assert!(
            !stderr.contains(OPS) && !stderr.contains(VIEW),
            "[{b}] a secret in stderr:\n{stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_server_refuses_to_start_without_a_token() {
    let db = sagaflow_testkit::sqlite_db();
    let dir = tempfile::tempdir().expect("dir");
    let short = dir.path().join("short");
    std::fs::write(&short, "ops operator too-short\n").expect("write");
    // A token file other users may write: any of them could add a token.
    let shared = dir.path().join("shared");
    std::fs::write(&shared, "ops operator too-short-but-long-enough\n").expect("write");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    }
    for (tokens, env, says) in [
        (None, None, "SAGAFLOW_ADMIN_TOKEN"),
        (Some(short.as_path()), None, "fewer than the 16"),
        (Some(shared.as_path()), None, "chmod 600"),
        (
            None,
            Some("too-short"),
            "SAGAFLOW_ADMIN_TOKEN has 9 characters",
        ),
        (None, Some("x"), "SAGAFLOW_ADMIN_TOKEN has 1 characters"),
    ] {
        let mut cmd = Command::new(sagaflow_testkit::workspace_binary("sagaflow"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
        ])
        .env_remove("SAGAFLOW_ADMIN_TOKEN")
        .env_remove("SAGAFLOW_ADMIN_TOKEN_FILE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        if let Some(file) = tokens {
            cmd.arg("--token-file").arg(file);
        }
        if let Some(secret) = env {
            cmd.env("SAGAFLOW_ADMIN_TOKEN", secret);
        }
        let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
            .await
            .expect("it exits within 20 s")
            .expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{tokens:?}: {stderr}");
        assert!(stderr.contains(says), "{tokens:?}: {stderr}");
        if tokens.is_none() && env.is_none() {
            assert!(stderr.contains("--token-file"), "{stderr}");
        }
        assert!(!stderr.contains("too-short"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standalone_server_refuses_a_database_of_a_newer_release() {
    use sagaflow::sea_orm::ConnectionTrait;
    for db in backends().await {
        let b = db.backend;
        let engine = fast_builder(&db)
            .with_workflow(order())
            .with_workers(false)
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        engine
            .connection()
            .execute_unprepared(
                "INSERT INTO sagaflow_migrations (version, applied_at) \
                 VALUES ('m9999_from_a_newer_release', 0)",
            )
            .await
            .unwrap_or_else(|e| panic!("[{b}] record a newer migration: {e}"));
        engine.shutdown().await;
        let dir = tempfile::tempdir().expect("dir");
        let tokens = token_file(dir.path());
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            spawn_server(&db.url, &tokens).wait_with_output(),
        )
        .await
        .expect("it exits within 30 s")
        .expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "[{b}] {stderr}");
        assert!(
            stderr.contains("m9999_from_a_newer_release"),
            "[{b}] the unknown migration is named: {stderr}"
        );
        assert!(stderr.contains("a newer release"), "[{b}] {stderr}");
    }
}
