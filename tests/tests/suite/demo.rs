//! The demo stops with the reason, and a non-zero exit, when its SQLite file is deleted
//! under it (the engine's `fatal_error`); serves its API with `--serve`; and with
//! `--webhook` delivers every alert to a webhook, even when it is killed midway and run
//! again on the same database.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement};
use sagaflow_testkit::{backends, eventually, workspace_binary};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::fixtures::{Receiver, check_signed_and_consistent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_demo_exits_non_zero_when_its_database_file_is_deleted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("demo.db");
    // Slow calls keep the demo busy long enough to pull the file from under it.
    let mut child = Command::new(sagaflow_testkit::workspace_binary("sagaflow-demo"))
        .args(["--orders", "400", "--latency-ms", "200", "--quiet-logs"])
        .arg("--database-url")
        .arg(format!("sqlite://{}?mode=rwc", file.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the demo");
    // The engine is up once the file is in WAL mode (its write-ahead log exists).
    let wal = dir.path().join("demo.db-wal");
    sagaflow_testkit::eventually(Duration::from_secs(30), "the demo's engine started", || {
        let wal = wal.clone();
        async move { wal.exists() }
    })
    .await;
    std::fs::remove_file(&file).expect("delete the database file");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the demo stops within 20 s")
        .expect("exit status");
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).await.expect("stderr");
    }
    assert!(
        !status.success(),
        "the demo exited with {status}; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("database lost") && stderr.contains("deleted"),
        "the reason is printed:\n{stderr}"
    );
}

/// `--serve` with a one-character `SAGAFLOW_ADMIN_TOKEN` is refused, naming the variable and
/// never showing the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_refuses_to_serve_with_a_short_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("demo.db");
    let out = Command::new(sagaflow_testkit::workspace_binary("sagaflow-demo"))
        .args(["--orders", "1", "--latency-ms", "0", "--quiet-logs"])
        .args(["--serve", "127.0.0.1:0"])
        .arg("--database-url")
        .arg(format!("sqlite://{}?mode=rwc", file.display()))
        .env("SAGAFLOW_ADMIN_TOKEN", "Q")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the demo exits within 120 s")
        .expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("SAGAFLOW_ADMIN_TOKEN has 1 characters, fewer than the 16 required"),
        "{stderr}"
    );
    assert!(!stdout.contains("listening on"), "{stdout}");
}

/// `--serve`: after its runs the demo keeps its engine up and serves the HTTP API with the
/// token it prints; the published saga and the runs answer over HTTP, and SIGTERM stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_its_api_with_the_printed_token_after_its_runs() {
    use tokio::io::AsyncBufReadExt;

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("demo.db");
    let mut child = Command::new(sagaflow_testkit::workspace_binary("sagaflow-demo"))
        .args(["--orders", "8", "--latency-ms", "0", "--quiet-logs"])
        .args(["--serve", "127.0.0.1:0"])
        .arg("--database-url")
        .arg(format!("sqlite://{}?mode=rwc", file.display()))
        .env_remove("SAGAFLOW_ADMIN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the demo");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (mut url, mut token, mut console) = (None, None, None);
    let read = async {
        while let Some(line) = lines.next_line().await.expect("stdout line") {
            if let Some(rest) = line.trim().strip_prefix("listening on ") {
                url = rest.split_whitespace().next().map(str::to_owned);
            }
            if let Some(rest) = line.trim().strip_prefix("token") {
                token = Some(rest.trim().to_owned());
            }
            if let Some(rest) = line.trim().strip_prefix("console") {
                console = rest.split_whitespace().next().map(str::to_owned);
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .expect("the demo serves within 120 s");
    let url = url.expect("the address is printed");
    let token = token.expect("the token is printed");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(console.as_deref(), Some(format!("{url}/console/").as_str()));

    let http = reqwest::Client::new();
    let login = http
        .get(format!("{url}/console/login"))
        .send()
        .await
        .expect("request");
    assert_eq!(login.status(), reqwest::StatusCode::OK);
    let unauthorized = http
        .get(format!("{url}/api/v1/definitions"))
        .send()
        .await
        .expect("request");
    assert_eq!(unauthorized.status(), reqwest::StatusCode::UNAUTHORIZED);
    let defs: serde_json::Value = http
        .get(format!("{url}/api/v1/definitions"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("json");
    let keys: Vec<&str> = defs["definitions"]
        .as_array()
        .expect("definitions")
        .iter()
        .filter_map(|d| d["key"].as_str())
        .collect();
    assert_eq!(keys, ["order@1"], "{defs}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id().expect("pid")).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the demo stops within 20 s of SIGTERM")
        .expect("exit status");
    assert!(status.code().is_some(), "it exits, not killed: {status}");
}

/// The webhook's signing secret in the webhook tests.
const HOOK_SECRET: &str = "demo-webhook-secret-0123456789";

/// The demo on `db_url` with `--webhook hook`: slow calls on two lanes keep its 30 runs busy
/// for seconds, 30% of forward calls are refused (a refund among them, refused on purpose,
/// raises a `run_error` alert), and `--no-operator` leaves the alerts open.
fn hooked_demo(db_url: &str, hook: &str) -> Command {
    let mut cmd = Command::new(workspace_binary("sagaflow-demo"));
    cmd.args(["--orders", "30", "--latency-ms", "60", "--concurrency", "2"])
        .args(["--permanent", "0.3", "--no-operator", "--quiet-logs"])
        .args(["--database-url", db_url, "--webhook", hook])
        .env_remove("DATABASE_URL")
        .env_remove("SAGAFLOW_WEBHOOK_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// One number a query answers (`SELECT COUNT(*) AS n …`).
async fn count(conn: &DatabaseConnection, sql: &str) -> i64 {
    conn.query_one_raw(Statement::from_string(conn.get_database_backend(), sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .expect("a row")
        .try_get::<i64>("", "n")
        .expect("n")
}

/// A demo SIGKILLed once its first alert reached the webhook (answered 503) and before its
/// runs finished, then run again on the same database until it exits: the second demo
/// resumes the runs and delivers the alerts the first left in the outbox. Every stored alert
/// reaches the webhook, every request is signed with the secret, a notice delivered twice
/// carries one `Sagaflow-Delivery` id, and nothing is left pending or dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_delivers_every_alert_to_its_webhook_through_a_kill_and_a_rerun() {
    for db in backends().await {
        let b = db.backend;
        let receiver = Receiver::default();
        receiver.fail_first.store(3, Ordering::SeqCst);
        let hook = receiver.serve().await;

        // The first demo reads the secret from the default variable.
        let first = hooked_demo(&db.url, &hook)
            .env("SAGAFLOW_WEBHOOK_SECRET", HOOK_SECRET)
            .spawn()
            .expect("start the demo");
        eventually(
            Duration::from_secs(30),
            "the first demo's first alert at the webhook",
            || async { !receiver.got().is_empty() },
        )
        .await;
        let pid = i32::try_from(first.id().expect("running")).expect("pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("SIGKILL");
        let killed = tokio::time::timeout(Duration::from_secs(10), first.wait_with_output())
            .await
            .expect("the killed demo is reaped")
            .expect("output");
        assert!(!killed.status.success(), "[{b}] {:?}", killed.status);
        assert!(
            receiver.accepted().is_empty(),
            "[{b}] the first alert was still undelivered at the kill"
        );
        let conn = Database::connect(db.url.as_str()).await.expect("connect");
        let unfinished = count(
            &conn,
            "SELECT COUNT(*) AS n FROM sagaflow_runs \
             WHERE state NOT IN ('completed', 'compensated', 'error', 'paused')",
        )
        .await;
        assert!(
            unfinished > 0,
            "[{b}] the demo was killed before its runs finished"
        );

        // The second names another variable for the same secret.
        let second = hooked_demo(&db.url, &hook)
            .args(["--webhook-secret-env", "DEMO_HOOK_SECRET"])
            .env("DEMO_HOOK_SECRET", HOOK_SECRET)
            .spawn()
            .expect("start the demo again");
        let again = tokio::time::timeout(Duration::from_secs(60), second.wait_with_output())
            .await
            .expect("the second demo exits within 60 s")
            .expect("output");
        let stdout = String::from_utf8_lossy(&again.stdout);
        let stderr = String::from_utf8_lossy(&again.stderr);
        assert!(
            again.status.success(),
            "[{b}] {:?}\n{stdout}\n{stderr}",
            again.status
        );
        assert!(
            stdout.contains("Earlier runs") && stdout.contains("0 pending · 0 dead"),
            "[{b}] the summary tells of the earlier runs and the webhook:\n{stdout}"
        );
        for out in [&killed.stdout, &killed.stderr, &again.stdout, &again.stderr] {
            assert!(
                !String::from_utf8_lossy(out).contains(HOOK_SECRET),
                "[{b}] the secret was printed"
            );
        }

        // Every stored alert arrived, accepted at least once.
        let rows = conn
            .query_all_raw(Statement::from_string(
                conn.get_database_backend(),
                "SELECT id FROM sagaflow_alerts",
            ))
            .await
            .expect("alerts");
        let stored: HashSet<i64> = rows
            .iter()
            .map(|r| r.try_get::<i64>("", "id").expect("id"))
            .collect();
        assert!(!stored.is_empty(), "[{b}] the demo raised alerts");
        let accepted: HashSet<i64> = receiver
            .accepted()
            .iter()
            .filter_map(|n| n.alert.as_ref().map(|a| a.id))
            .collect();
        assert!(
            stored.is_subset(&accepted),
            "[{b}] stored alerts {stored:?}, accepted at the webhook {accepted:?}"
        );
        // Signed; a notice's deliveries share one dedupe id; the first one's too, across
        // the kill.
        check_signed_and_consistent(&receiver, HOOK_SECRET, b);
        let got = receiver.got();
        let mut ids: HashMap<i64, HashSet<String>> = HashMap::new();
        for g in &got {
            let body: sagaflow::NoticeBody = serde_json::from_str(&g.body).expect("body");
            let alert = body.alert.expect("alert notices only");
            ids.entry(alert.id).or_default().insert(g.dedupe.clone());
        }
        assert!(
            ids.values().all(|d| d.len() == 1),
            "[{b}] one dedupe id per alert: {ids:?}"
        );
        let interrupted = &got[0].dedupe;
        assert!(
            got.iter()
                .filter(|g| &g.dedupe == interrupted)
                .any(|g| g.accepted),
            "[{b}] the alert refused before the kill was delivered after it"
        );
        // Nothing left to deliver, nothing given up.
        let open = count(
            &conn,
            "SELECT COUNT(*) AS n FROM sagaflow_outbox WHERE done_at IS NULL",
        )
        .await;
        let undelivered = count(
            &conn,
            "SELECT COUNT(*) AS n FROM sagaflow_deliveries \
             WHERE sink = 'webhook' AND state <> 'delivered'",
        )
        .await;
        assert_eq!((open, undelivered), (0, 0), "[{b}]");
        let _ = conn.close().await;
    }
}

/// `--webhook` without a secret, or with one too short, is refused before anything runs,
/// with a non-zero exit and a message that names the variable and never holds the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_demo_refuses_a_webhook_without_a_usable_secret() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = format!("sqlite://{}?mode=rwc", dir.path().join("demo.db").display());
    let run = |secret: Option<&str>| {
        let mut cmd = hooked_demo(&db, "http://127.0.0.1:9/hook");
        if let Some(s) = secret {
            cmd.env("SAGAFLOW_WEBHOOK_SECRET", s);
        }
        async move {
            tokio::time::timeout(Duration::from_secs(20), cmd.output())
                .await
                .expect("the demo answers within 20 s")
                .expect("output")
        }
    };
    let missing = run(None).await;
    let err = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(missing.status.code(), Some(2), "{err}");
    assert!(
        err.contains("needs a signing secret") && err.contains("SAGAFLOW_WEBHOOK_SECRET"),
        "{err}"
    );
    let short = run(Some("tiny-secret")).await;
    let err = String::from_utf8_lossy(&short.stderr);
    assert_eq!(short.status.code(), Some(2), "{err}");
    assert!(
        err.contains("16 characters") && !err.contains("tiny-secret"),
        "{err}"
    );
    assert!(
        !dir.path().join("demo.db").exists(),
        "nothing ran: no database was created"
    );
}
