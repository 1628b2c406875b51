//! A short chaos run (SAS-10, AT-8): the `sagaflow-chaos` binary with 2 engine processes and
//! 1000 runs of a mixed workload: 600 order sagas, 200 pairs (two parallel roots, a third of
//! them with one root refused for good at once) and 200 flows (an event wait, a timer, a child
//! run; started on version 1 and migrated automatically to version 2 while they run; a
//! quarter never get their event and time out), with the default fault rates (10% transient,
//! 2% hangs, 2% lost replies, 1% terminal), 8 SIGKILLs of engine processes spread over the
//! run by its progress (one each time another ninth of the runs ended, however fast the
//! machine), 3 SIGSTOPs of an engine process for 1 to 3 s (late heartbeats), 2 SIGSTOPs of the
//! supervisor leader past its lease, 20 operators' cancels and 3 bulk cancels of 5 runs,
//! and a 3 s retention window (finished runs purged while the chaos goes on), on the
//! PostgreSQL test server; the verdict includes the history checker's. The server is shared
//! with other tests, so it is never restarted here (`--no-pg-restart`); the full command,
//! with the restart and 300 kills, is described in docs/operations.md ("Chaos runs").
//!
//! The command writes its verdict as JSON (`--report-json`); the test reads it back as the
//! typed `InvariantReport` of `sagaflow-tools` and asserts on it, not on the printed text.
//!
//! The binary belongs to another package, so Cargo does not hand us its path
//! (`CARGO_BIN_EXE_*` exists only for bins of the same package); it is looked up next to
//! this test binary, in `target/<profile>/`.

use std::process::Stdio;
use std::time::Duration;

use sagaflow_tools::invariants::{Finding, InvariantKind, InvariantReport, Outcome};
use tokio::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_loses_nothing_and_applies_every_effect_once() {
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    let bin = sagaflow_testkit::workspace_binary("sagaflow-chaos");
    let dir = tempfile::tempdir().expect("temp dir");
    let report_path = dir.path().join("report.json");
    let child = Command::new(&bin)
        .args([
            "--database-url",
            &db.url,
            "--processes",
            "2",
            "--orders",
            "600",
            "--pairs",
            "200",
            "--flows",
            "200",
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
            "--pauses",
            "3",
            "--leader-pauses",
            "2",
            "--cancels",
            "20",
            "--bulk-cancels",
            "3",
            "--bulk-size",
            "5",
            "--retention-ms",
            "3000",
            "--no-pg-restart",
            "--timeout-secs",
            // Alone it ends in about 40 s; beside the rest of the suite on 2 cores, rescues
            // after the kills take longer.
            "120",
        ])
        .arg("--report-json")
        .arg(&report_path)
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    // The command bounds itself (120 s plus shutdown); this is the backstop.
    let out = tokio::time::timeout(Duration::from_secs(150), child.wait_with_output())
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
    let verdict = InvariantReport::read_json(&report_path)
        .unwrap_or_else(|e| panic!("no readable verdict: {e}\n{report}"));
    assert_eq!(verdict.outcome(), Outcome::Pass, "{report}");
    let kinds: Vec<InvariantKind> = verdict.invariants.iter().map(|i| i.kind()).collect();
    assert_eq!(
        kinds,
        InvariantKind::ALL,
        "every invariant checked, in order"
    );
    for invariant in &verdict.invariants {
        assert!(
            invariant.passed && invariant.details.is_empty(),
            "{:?} failed: {:?}\n{report}",
            invariant.kind(),
            invariant.details
        );
    }
    let terminal = verdict
        .get(InvariantKind::EveryRunTerminal)
        .map(|i| &i.finding);
    let Some(&Finding::EveryRunTerminal {
        runs,
        completed,
        compensated,
        error,
        children_unfinished,
    }) = terminal
    else {
        panic!("no terminal-run count\n{report}");
    };
    assert_eq!(
        (runs, completed + compensated + error, children_unfinished),
        (1000, 1000, 0),
        "{report}"
    );
    let lost = verdict.get(InvariantKind::NoLostRuns).map(|i| &i.finding);
    let Some(&Finding::NoLostRuns {
        accepted,
        rows_found,
        purged,
        rows_total,
    }) = lost
    else {
        panic!("no lost-run count\n{report}");
    };
    // Every run is in the database or was seen finished before retention purged it.
    assert_eq!(
        (
            accepted,
            rows_found + purged,
            i64::try_from(rows_found).ok()
        ),
        (1000, 1000, Some(rows_total)),
        "{report}"
    );
    // The chaos actually happened: every planned SIGKILL, and each kill's rescue was timed
    // (or found the process idle).
    let chaos = verdict.chaos;
    assert!(
        chaos.kills >= 8,
        "only {} engine processes were killed\n{report}",
        chaos.kills
    );
    assert_eq!(
        chaos.rescues_measured as u64 + chaos.idle_kills,
        chaos.kills,
        "{report}"
    );
    assert_eq!(chaos.pauses, 3, "every planned SIGSTOP\n{report}");
    assert_eq!(
        chaos.leader_pauses, 2,
        "every planned SIGSTOP of the leader\n{report}"
    );
    assert!(chaos.cancels >= 1, "no run was cancelled\n{report}");
    assert_eq!(chaos.bulk_cancels, 3, "every planned bulk cancel\n{report}");
    assert!(
        chaos.bulk_cancelled >= 1,
        "no bulk cancel cancelled a run\n{report}"
    );
    // The mixed workload ran, each feature at least once.
    assert_eq!(
        (chaos.orders, chaos.pairs, chaos.flows),
        (600, 200, 200),
        "{report}"
    );
    assert_eq!(
        chaos.refused_pairs, 67,
        "every third pair refused\n{report}"
    );
    assert_eq!(
        chaos.events_withheld, 50,
        "every fourth flow without its event\n{report}"
    );
    assert!(chaos.children >= 1, "no child run\n{report}");
    assert!(
        chaos.migrated >= 1,
        "no flow migrated to version 2\n{report}"
    );
    assert!(chaos.events_sent >= 1, "no event sent\n{report}");
    assert!(
        chaos.wait_timeouts >= 1,
        "no event wait timed out\n{report}"
    );
    // A leader paused past its lease is replaced; the new leader's first retention pass
    // purges the runs finished more than 3 s before.
    assert!(chaos.purged >= 1, "retention purged nothing\n{report}");
}
