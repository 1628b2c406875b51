//! The demo stops with the reason, and a non-zero exit, when its SQLite file is deleted
//! under it (the engine's `fatal_error`).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

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
