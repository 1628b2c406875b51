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
