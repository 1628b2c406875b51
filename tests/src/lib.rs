//! Test harness of sagaflow's integration suite (not a public API).
//!
//! A scenario runs against each backend returned by [`backends`]: a fresh SQLite file, and a
//! fresh PostgreSQL database on the server named by `SAGAFLOW_PG_URL` (a few scenarios need
//! one backend only and use [`sqlite_db`] or [`postgres_db`]). When
//! `SAGAFLOW_REQUIRE_PG=1` or `CI=true`, a missing or unreachable PostgreSQL fails the test
//! instead of skipping it.

use std::future::Future;
use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Database};
use sagaflow::{Engine, EngineBuilder, RunRow, RunState, Workflow};
use uuid::Uuid;

/// A database for one scenario.
#[derive(Debug)]
pub struct TestDb {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Connection URL.
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

fn pg_required() -> bool {
    std::env::var("SAGAFLOW_REQUIRE_PG").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A fresh SQLite file in a temporary directory.
///
/// # Panics
/// When no temporary directory can be created.
pub fn sqlite_db() -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("sagaflow.db").display()
    );
    TestDb {
        backend: "sqlite",
        url,
        _dir: Some(dir),
    }
}

/// A fresh PostgreSQL database, or `None` when PostgreSQL is not configured (and not
/// required).
///
/// # Panics
/// When PostgreSQL is required but not configured or unreachable.
pub async fn postgres_db() -> Option<TestDb> {
    let Ok(admin) = std::env::var("SAGAFLOW_PG_URL") else {
        assert!(
            !pg_required(),
            "SAGAFLOW_PG_URL is not set but PostgreSQL is required (CI / SAGAFLOW_REQUIRE_PG)"
        );
        eprintln!(
            "note: SAGAFLOW_PG_URL not set; skipping the PostgreSQL variant (run scripts/test.sh)"
        );
        return None;
    };
    let name = format!("sagaflow_t_{}", Uuid::new_v4().simple());
    let conn = match Database::connect(admin.as_str()).await {
        Ok(c) => c,
        Err(e) => panic!("PostgreSQL at SAGAFLOW_PG_URL is unreachable: {e}"),
    };
    conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create test database");
    let _ = conn.close().await;
    let (base, _) = admin
        .rsplit_once('/')
        .expect("SAGAFLOW_PG_URL must end with /<database>");
    Some(TestDb {
        backend: "postgres",
        url: format!("{base}/{name}"),
        _dir: None,
    })
}

/// SQLite, then PostgreSQL when available.
pub async fn backends() -> Vec<TestDb> {
    let mut v = vec![sqlite_db()];
    v.extend(postgres_db().await);
    v
}

/// Turns on test logging once (`RUST_LOG` decides what is shown).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// An engine builder with short intervals for tests.
pub fn fast_builder(db: &TestDb) -> EngineBuilder {
    Engine::builder()
        .with_database_url(db.url.clone())
        .with_pool_size(8)
        .with_poll_interval(Duration::from_millis(50))
        .with_error_pause(Duration::from_millis(100))
        .with_sweep_interval(Duration::from_millis(100))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400))
}

/// Starts an engine with fast settings and the given workflows.
///
/// # Panics
/// When the engine does not start.
pub async fn engine(db: &TestDb, workflows: Vec<Workflow>) -> Engine {
    init_logging();
    let mut b = fast_builder(db);
    for wf in workflows {
        b = b.with_workflow(wf);
    }
    b.start()
        .await
        .unwrap_or_else(|e| panic!("[{}] engine start: {e}", db.backend))
}

/// Waits until `check` is true, polling every 20 ms, at most `timeout`.
///
/// # Panics
/// When the condition does not hold in time.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_some(timeout, what, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await;
}

/// Waits until `probe` yields a value and returns it, polling every 20 ms, at most
/// `timeout`.
///
/// # Panics
/// When no value comes in time.
pub async fn eventually_some<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a run to reach a terminal state and asserts which.
///
/// # Panics
/// On timeout or another terminal state.
pub async fn expect_state(engine: &Engine, id: Uuid, state: RunState, backend: &str) -> RunRow {
    let run = engine
        .wait(id, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("[{backend}] waiting for run {id}: {e}"));
    if run.state != state {
        let history = engine.history(id).await.unwrap_or_default();
        let lines: Vec<String> = history
            .iter()
            .map(|h| {
                format!(
                    "  {} {} {:?} {:?}->{:?} attempt={:?} by {} {}",
                    h.at,
                    h.event,
                    h.step,
                    h.from_state,
                    h.to_state,
                    h.attempt,
                    h.actor,
                    h.detail.as_deref().unwrap_or("")
                )
            })
            .collect();
        panic!(
            "[{backend}] run {id} ended {} instead of {state} (error: {:?}); history:\n{}",
            run.state,
            run.error,
            lines.join("\n")
        );
    }
    run
}

/// A binary of the workspace (`sagaflow-demo`, `sagaflow-chaos`, …) built for this test
/// profile: `cargo test` does not build the binaries of other packages, so build them first
/// (`cargo build --workspace --bins`, as `scripts/test.sh` does).
///
/// # Panics
/// When the binary is missing.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/suite-<hash> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} not found: build it first with `cargo build --workspace --bins` (add `--release` \
         when testing with --release)",
        bin.display()
    );
    bin
}

/// This test binary re-run as a child process: it runs one ignored test (`test`, its full
/// path) with the given environment, its stdout collected line by line and its stderr
/// passed through. The crash, failover and first-start scenarios drive child engines this
/// way (real processes, real SIGKILL).
#[derive(Debug)]
pub struct ChildTest {
    /// The process.
    pub child: tokio::process::Child,
    /// Its stdin, to drive it.
    pub stdin: tokio::process::ChildStdin,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl ChildTest {
    /// Starts the child. It is killed when dropped.
    ///
    /// # Panics
    /// When the process cannot be started.
    pub fn spawn(test: &str, env: &[(&str, String)]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child process");
        let stdin = child.stdin.take().expect("child stdin");
        let stdout = child.stdout.take().expect("child stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(line);
            }
        });
        Self {
            child,
            stdin,
            lines,
            reader,
        }
    }

    /// Everything it printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether it printed a line starting with `prefix`.
    pub fn printed(&self, prefix: &str) -> bool {
        self.lines().iter().any(|l| l.starts_with(prefix))
    }

    /// Writes one line to its stdin.
    ///
    /// # Panics
    /// When the child's stdin is closed.
    pub async fn send(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to child");
        self.stdin.flush().await.expect("flush child stdin");
    }

    /// Waits for it to exit (at most `timeout`) and for the end of its stdout; returns its
    /// status and everything it printed.
    ///
    /// # Panics
    /// On timeout.
    pub async fn finish(mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("child did not exit within {timeout:?}"))
            .expect("child status");
        tokio::time::timeout(Duration::from_secs(10), &mut self.reader)
            .await
            .expect("the child closes its stdout")
            .expect("stdout reader");
        (status, self.lines().join("\n"))
    }
}
