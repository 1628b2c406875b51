//! A short chaos run (SAS-10, AT-8): the `sagaflow-chaos` binary with 2 engine processes,
//! 1000 order sagas, the default fault rates (10% transient, 2% hangs, 2% lost replies, 1%
//! terminal), and 8 SIGKILLs of engine processes spread over the run by its progress (one
//! each time another ninth of the orders ended, however fast the machine), on the PostgreSQL
//! test server. The server is shared with other tests, so it is never restarted here
//! (`--no-pg-restart`); the full command, with the restart and 25 kills, is described in
//! docs/operations.md ("Chaos runs").
//!
//! The binary belongs to another package, so Cargo does not hand us its path
//! (`CARGO_BIN_EXE_*` exists only for bins of the same package); it is looked up next to
//! this test binary, in `target/<profile>/`.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_loses_nothing_and_applies_every_effect_once() {
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    let bin = sagaflow_testkit::workspace_binary("sagaflow-chaos");
    let child = Command::new(&bin)
        .args([
            "--database-url",
            &db.url,
            "--processes",
            "2",
            "--orders",
            "1000",
            "--transient",
            "0.10",
            "--hang",
            "0.02",
            "--lose-reply",
            "0.02",
            "--permanent",
            "0.01",
            "--kills",
            "8",
            "--no-pg-restart",
            "--timeout-secs",
            "45",
        ])
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    // The command bounds itself (45 s plus shutdown); this is the backstop.
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the chaos run did not end within 60 s")
        .expect("chaos run output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    // Shown with --nocapture.
    println!("{stdout}");
    assert!(
        out.status.success(),
        "sagaflow-chaos exited with {}\n{report}",
        out.status
    );
    for line in [
        "[ok]   every run terminal: 1000/1000",
        "[ok]   no lost runs: 1000 accepted, 1000 rows found, 1000 runs in the database",
        "[ok]   exactly once:",
        "[ok]   fenced results:",
        "[ok]   net consistency:",
        "[ok]   alerts:",
        "[ok]   chaos as planned:",
        "result: PASS",
    ] {
        assert!(stdout.contains(line), "missing `{line}`\n{report}");
    }
    assert!(!stdout.contains("[FAIL]"), "{report}");
    // The chaos actually happened: every planned SIGKILL, and the rescue times were measured.
    let kills: u64 = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("chaos       kills "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no kill count in the summary\n{report}"));
    assert!(
        kills >= 8,
        "only {kills} engine processes were killed\n{report}"
    );
    assert!(stdout.contains("rescue      after SIGKILL:"), "{report}");
}
