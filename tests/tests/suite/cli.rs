//! The `sagaflow` command as an operator uses it: the real binary over a real database, on
//! both backends. An operator finds the runs in `error`, fixes one with an engine running and
//! one with none, and reads the effect and who did it in the run and its history; the exit
//! codes tell usage (2), not found (3), refused (4) and a schema that is not this release's
//! (5) apart; `migrate --dry-run` prints the SQL and changes nothing, `migrate` applies it;
//! the queue, definitions, alerts, purge and completions give sane output. Human output is
//! snapshotted (ids, times and ages filtered); `--json` output is parsed.
//!
//! Build the binary first: `cargo build --workspace --bins`.

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Database, DbBackend, Statement};
use sagaflow::{Engine, RetryPolicy, RunState, StepContext, StepError, Uuid, Workflow};
use sagaflow_testkit::{
    TestDb, backends, engine, eventually, expect_state, postgres_db, workspace_binary,
};
use serde_json::Value;

/// Runs `sagaflow` with `args` over `db`, with no database or operator from the
/// environment and only errors logged, and waits for it (at most 60 s).
pub(crate) async fn sagaflow(db: &str, args: &[&str]) -> Output {
    // The test cluster's `synchronous_commit=off` warning would mix into standard error.
    sagaflow_logging(db, args, "error").await
}

/// [`sagaflow`], logging at `level` to standard error.
async fn sagaflow_logging(db: &str, args: &[&str], level: &str) -> Output {
    let mut cmd = assert_cmd::Command::new(workspace_binary("sagaflow"));
    cmd.args(args)
        .arg("--database-url")
        .arg(db)
        .env_remove("SAGAFLOW_DATABASE_URL")
        .env_remove("DATABASE_URL")
        .env_remove("SAGAFLOW_READ_REPLICA_URL")
        .env_remove("SAGAFLOW_OPERATOR")
        .env("RUST_LOG", level)
        .timeout(Duration::from_secs(60));
    tokio::task::spawn_blocking(move || cmd.output().expect("sagaflow runs"))
        .await
        .expect("joined")
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the exit code, showing both streams when it differs.
pub(crate) fn code(o: &Output, expected: i32, what: &str) {
    assert_eq!(
        o.status.code(),
        Some(expected),
        "{what}: stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
}

/// Runs a command that must succeed with `--json`, and parses its output.
pub(crate) async fn json(db: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let o = sagaflow(db, &all).await;
    code(&o, 0, &args.join(" "));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", stdout(&o)))
}

/// Runs a command that must succeed, and gives its standard output.
async fn human(db: &str, args: &[&str]) -> String {
    let o = sagaflow(db, args).await;
    code(&o, 0, &args.join(" "));
    assert!(
        stderr(&o).is_empty(),
        "{args:?} wrote to stderr: {}",
        stderr(&o)
    );
    stdout(&o)
}

/// Snapshots human output with what changes from run to run filtered out: ids, times, ages,
/// instance ids, and column padding (which follows the widths of those).
fn snapshot(name: &str, text: &str) {
    insta::with_settings!({
        filters => vec![
            (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "[id]"),
            (r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "[time]"),
            (r"\b\d+[smhd]\b", "[age]"),
            (r"--after \S+", "--after [cursor]"),
            (r"(?m)(published by )?\S+-[0-9a-f]{32}\b", "[instance]"),
            (r" {2,}", "  "),
            (r"(?m) +$", ""),
        ],
        prepend_module_to_snapshot => false,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

/// `notify@1`: `charge` (the pivot), then `email`, which fails for good until `fixed`: the
/// run stops in `error` after the pivot, with an open alert.
fn notify(fixed: Arc<AtomicBool>) -> Workflow {
    Workflow::builder("notify", 1)
        .step("charge", |_ctx: StepContext| async {
            Ok::<_, StepError>("ch-1")
        })
        .pivot()
        .step("email", move |_ctx: StepContext| {
            let ok = fixed.load(Ordering::SeqCst);
            async move {
                if ok {
                    Ok("sent")
                } else {
                    Err(StepError::terminal_unknown(
                        "bad_address",
                        "mailbox does not exist",
                    ))
                }
            }
        })
        .after(["charge"])
        .retriable()
        .retry(RetryPolicy::default().with_max_failures(2))
        .build()
        .expect("valid")
}

/// Starts a `notify` run keyed `key` and waits until it stops in `error`.
async fn failed_run(engine: &Engine, key: &str, b: &str) -> Uuid {
    let id = engine
        .start_with("notify", &(), sagaflow::StartOptions::keyed(key))
        .await
        .expect("start")
        .id;
    expect_state(engine, id, RunState::Error, b).await;
    id
}

fn ids(list: &Value) -> Vec<String> {
    list["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_the_failed_runs_fixes_them_and_sees_who_did_it() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        let fixed = Arc::new(AtomicBool::new(false));
        let eng = engine(&db, vec![notify(fixed.clone())]).await;
        let first = failed_run(&eng, "n-1", b).await;
        let second = failed_run(&eng, "n-2", b).await;

        // Find them.
        let stuck = json(
            url,
            &["runs", "list", "--state", "error", "--state", "paused"],
        )
        .await;
        assert_eq!(
            ids(&stuck),
            vec![second.to_string(), first.to_string()],
            "[{b}] newest first"
        );
        assert_eq!(stuck["runs"][0]["error"]["code"], "bad_address", "[{b}]");
        let none = json(url, &["runs", "list", "--state", "completed"]).await;
        assert!(ids(&none).is_empty(), "[{b}] {none}");
        let page = json(url, &["runs", "list", "--limit", "1"]).await;
        let cursor = page["next"].as_str().expect("a next page").to_owned();
        let rest = json(url, &["runs", "list", "--limit", "1", "--after", &cursor]).await;
        assert_eq!(ids(&rest), vec![first.to_string()], "[{b}]");
        snapshot(
            "runs_list_stuck",
            &human(
                url,
                &["runs", "list", "--state", "error", "--state", "paused"],
            )
            .await,
        );

        // Refused: `charge` did not fail (4); no such step (3); no such run (3); no reason (2).
        let o = sagaflow(
            url,
            &[
                "retry",
                &first.to_string(),
                "--step",
                "charge",
                "--reason",
                "try",
                "--as",
                "alice",
            ],
        )
        .await;
        code(&o, 4, "retry of a step that did not fail");
        assert!(
            stderr(&o).starts_with("sagaflow: cannot retry"),
            "[{b}] {}",
            stderr(&o)
        );
        assert_eq!(stderr(&o).lines().count(), 1, "[{b}] one line");
        let o = sagaflow(
            url,
            &[
                "retry",
                &first.to_string(),
                "--step",
                "nope",
                "--reason",
                "try",
            ],
        )
        .await;
        code(&o, 3, "retry of an unknown step");
        let unknown = Uuid::now_v7().to_string();
        let o = sagaflow(url, &["resume", &unknown, "--reason", "try"]).await;
        code(&o, 3, "an unknown run");
        assert!(stderr(&o).contains("not found"), "[{b}] {}", stderr(&o));
        let o = sagaflow(url, &["retry", &first.to_string()]).await;
        code(&o, 2, "no --reason");
        assert!(stderr(&o).contains("--reason"), "[{b}] {}", stderr(&o));
        let o = sagaflow(url, &["resume", &first.to_string(), "--reason", "  "]).await;
        code(&o, 2, "an empty reason");

        // Fix the first with an engine running: retry its only failed step.
        fixed.store(true, Ordering::SeqCst);
        let retried = json(
            url,
            &[
                "retry",
                &first.to_string(),
                "--reason",
                "mailbox fixed",
                "--as",
                "alice",
            ],
        )
        .await;
        assert_eq!(retried["action"], "retry", "[{b}] {retried}");
        assert_eq!(retried["step"], "email", "[{b}] {retried}");
        assert_eq!(retried["state"], "running", "[{b}] {retried}");
        assert_eq!(retried["actor"], "cli:alice", "[{b}] {retried}");
        expect_state(&eng, first, RunState::Completed, b).await;
        // The action resolved the run's alert, recording who and why.
        let alerts = json(
            url,
            &["alerts", "list", "--all", "--run", &first.to_string()],
        )
        .await;
        assert_eq!(
            (
                alerts["alerts"][0]["resolved_by"].as_str(),
                alerts["alerts"][0]["resolution"].as_str()
            ),
            (Some("cli:alice"), Some("retry: mailbox fixed")),
            "[{b}] {alerts}"
        );

        // And the second with no engine running: resume it; it waits for an engine.
        eng.shutdown().await;
        let out = human(
            url,
            &[
                "resume",
                &second.to_string(),
                "--reason",
                "mailbox fixed too",
                "--as",
                "bob",
            ],
        )
        .await;
        assert_eq!(
            out.trim(),
            format!("run {second}: resume recorded as cli:bob; the run is now running"),
            "[{b}]"
        );
        let shown = json(url, &["runs", "show", &second.to_string()]).await;
        assert_eq!(shown["run"]["state"], "running", "[{b}] {shown}");
        let email = shown["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .find(|s| s["name"] == "email")
            .expect("email");
        assert_eq!(email["state"], "ready", "[{b}] {email}");
        snapshot(
            "runs_show_resumed",
            &human(url, &["runs", "show", &second.to_string()]).await,
        );

        // The history says who did what, and why.
        let history = json(url, &["history", &first.to_string()]).await;
        let events = history["history"].as_array().expect("history");
        let retry = events
            .iter()
            .find(|e| e["kind"] == "operator_retry")
            .unwrap_or_else(|| panic!("[{b}] no retry in {history}"));
        assert_eq!(retry["actor"], "cli:alice", "[{b}] {retry}");
        assert!(
            retry["detail"].to_string().contains("mailbox fixed"),
            "[{b}] {retry}"
        );
        let text = human(url, &["history", &second.to_string()]).await;
        assert!(
            text.lines()
                .any(|l| l.contains("operator_resume") && l.contains("cli:bob")),
            "[{b}] {text}"
        );

        // An engine with the code finishes what the operator resumed.
        let eng = engine(&db, vec![notify(fixed.clone())]).await;
        expect_state(&eng, second, RunState::Completed, b).await;
        eng.shutdown().await;
        let done = json(url, &["runs", "list", "--state", "completed"]).await;
        assert_eq!(ids(&done).len(), 2, "[{b}] {done}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_queue_definitions_purge_and_completions() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        let fixed = Arc::new(AtomicBool::new(false));
        let eng = engine(&db, vec![notify(fixed.clone())]).await;
        let failed = failed_run(&eng, "n-1", b).await;
        fixed.store(true, Ordering::SeqCst);
        let done = eng
            .start_with("notify", &(), sagaflow::StartOptions::keyed("n-2"))
            .await
            .expect("start")
            .id;
        expect_state(&eng, done, RunState::Completed, b).await;
        // The failed run's alert, delivered to the log; a sink that gave up on it.
        let notice = sagaflow_testkit::eventually_some(
            Duration::from_secs(15),
            "the alert's delivery",
            || async {
                eng.deliveries(None, 20)
                    .await
                    .ok()?
                    .into_iter()
                    .find(|d| d.run_id == Some(failed))
                    .map(|d| d.notice_id)
            },
        )
        .await;
        eng.store()
            .delivery_record(&sagaflow::internals::store::DeliveryTry {
                notice,
                sink: "gone-hook",
                attempt: 2,
                result: sagaflow::internals::store::DeliveryResult::Dead {
                    error: "refused".into(),
                },
                others: &[],
            })
            .await
            .expect("record");
        eng.shutdown().await;

        // The dead letter, sent again once; a second time there is none.
        let dead = json(url, &["alerts", "deliveries", "--dead"]).await;
        assert_eq!(dead["deliveries"][0]["sink"], "gone-hook", "[{b}] {dead}");
        assert_eq!(dead["deliveries"][0]["notice_id"], notice, "[{b}] {dead}");
        let n = notice.to_string();
        let again = [
            "alerts",
            "redeliver",
            n.as_str(),
            "--reason",
            "hook fixed",
            "--as",
            "alice",
        ];
        code(&sagaflow(url, &again).await, 0, "redeliver");
        code(&sagaflow(url, &again).await, 3, "redeliver twice");
        let dead = json(url, &["alerts", "deliveries", "--dead"]).await;
        assert_eq!(
            dead["deliveries"].as_array().map(Vec::len),
            Some(0),
            "[{b}] {dead}"
        );

        // The queue: one run in error, one finished, of `notify`.
        let queue = json(url, &["queue"]).await;
        assert_eq!(queue["ready"], 0, "[{b}] {queue}");
        assert!(
            queue["active"]
                .as_array()
                .expect("active")
                .iter()
                .any(|a| a["workflow"] == "notify" && a["state"] == "error" && a["runs"] == 1),
            "[{b}] {queue}"
        );
        snapshot("queue", &human(url, &["queue"]).await);

        // The definitions engines published.
        let defs = json(url, &["definitions"]).await;
        assert_eq!(defs["definitions"][0]["key"], "notify@1", "[{b}] {defs}");
        assert_eq!(
            defs["definitions"][0]["description"]["steps"]
                .as_array()
                .map(Vec::len),
            Some(2),
            "[{b}] {defs}"
        );
        snapshot("definitions", &human(url, &["definitions"]).await);

        // Alerts: the failed run's is open; acknowledged, it is gone from the open list.
        let open = json(url, &["alerts", "list"]).await;
        let alert = open["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .find(|a| a["run_id"] == failed.to_string())
            .unwrap_or_else(|| panic!("[{b}] no alert of the failed run: {open}"))
            .clone();
        let alert_id = alert["id"].as_i64().expect("id").to_string();
        let listed = human(url, &["alerts", "list", "--run", &failed.to_string()]).await;
        assert!(
            listed.contains("run_error") && listed.contains("open"),
            "[{b}] {listed}"
        );
        let o = sagaflow(url, &["alerts", "ack", &alert_id]).await;
        code(&o, 2, "ack without a reason");
        let ack = json(
            url,
            &[
                "alerts",
                "ack",
                &alert_id,
                "--reason",
                "known outage",
                "--as",
                "carol",
            ],
        )
        .await;
        assert_eq!(ack["resolved"], true, "[{b}] {ack}");
        assert_eq!(ack["actor"], "cli:carol", "[{b}] {ack}");
        let o = sagaflow(url, &["alerts", "ack", &alert_id, "--reason", "again"]).await;
        code(&o, 3, "ack of an alert no longer open");
        let open = json(url, &["alerts", "list", "--run", &failed.to_string()]).await;
        assert_eq!(open["alerts"], Value::Array(vec![]), "[{b}] {open}");
        let all = json(url, &["alerts", "list", "--all"]).await;
        let acked = all["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .find(|a| a["id"] == alert["id"])
            .unwrap_or_else(|| panic!("[{b}] the acknowledged alert: {all}"));
        assert!(!acked["resolved_at"].is_null(), "[{b}] {acked}");
        // Who acknowledged it and why are stored with it.
        assert_eq!(
            (acked["resolved_by"].as_str(), acked["resolution"].as_str()),
            (Some("cli:carol"), Some("known outage")),
            "[{b}] {acked}"
        );
        let listed = human(url, &["alerts", "list", "--all"]).await;
        let row = listed
            .lines()
            .find(|l| l.starts_with(&alert_id))
            .unwrap_or_else(|| panic!("[{b}] {listed}"));
        assert!(
            listed
                .lines()
                .next()
                .is_some_and(|h| h.contains("RESOLVED BY")),
            "[{b}] {listed}"
        );
        assert!(
            row.contains("resolved") && row.contains("cli:carol") && row.ends_with("known outage"),
            "[{b}] {row}"
        );

        // Purge: only finished runs past the age go; a dry run deletes nothing.
        let none = json(url, &["purge", "--older-than", "1h"]).await;
        assert_eq!(none["runs"], 0, "[{b}] {none}");
        let probe = Engine::builder()
            .with_database_url(url)
            .with_published_workflows()
            .start()
            .await
            .expect("client");
        eventually(
            Duration::from_secs(10),
            "the finished run is 5 ms old",
            || {
                let probe = probe.clone();
                async move { probe.finished_count(Duration::from_millis(5)).await.ok() == Some(1) }
            },
        )
        .await;
        probe.shutdown().await;
        let dry = json(url, &["purge", "--older-than", "5ms", "--dry-run"]).await;
        assert_eq!(
            (dry["dry_run"].clone(), dry["runs"].clone()),
            (true.into(), 1.into()),
            "[{b}]"
        );
        let o = sagaflow(url, &["runs", "show", &done.to_string()]).await;
        code(&o, 0, "a dry run deletes nothing");
        let out = human(url, &["purge", "--older-than", "5ms"]).await;
        assert!(out.starts_with("deleted 1 finished run(s)"), "[{b}] {out}");
        let o = sagaflow(url, &["runs", "show", &done.to_string()]).await;
        code(&o, 3, "the purged run");
        let o = sagaflow(url, &["runs", "show", &failed.to_string()]).await;
        code(&o, 0, "an unfinished run stays");
        let o = sagaflow(url, &["purge", "--older-than", "soon"]).await;
        code(&o, 2, "an unreadable age");

        // Completions.
        let script = human(url, &["completions", "bash"]).await;
        assert!(
            script.contains("_sagaflow()") && script.contains("mark-compensated"),
            "[{b}] {}",
            &script[..script.len().min(300)]
        );
    }
}

/// The tables of a database, by name.
async fn tables(url: &str) -> Vec<String> {
    let conn = Database::connect(url).await.expect("connect");
    let backend = conn.get_database_backend();
    let sql = match backend {
        DbBackend::Sqlite => {
            "SELECT name AS t FROM sqlite_master WHERE type = 'table' ORDER BY name"
        }
        _ => {
            "SELECT table_name::text AS t FROM information_schema.tables \
             WHERE table_schema = current_schema() ORDER BY table_name"
        }
    };
    let rows = conn
        .query_all_raw(Statement::from_string(backend, sql))
        .await
        .expect("tables");
    let names = rows
        .iter()
        .map(|r| r.try_get::<String>("", "t").expect("name"))
        .collect();
    let _ = conn.close().await;
    names
}

/// A database that no engine migrated: an empty SQLite file, a fresh PostgreSQL database.
async fn unmigrated() -> Vec<(TestDb, String)> {
    let sqlite = sagaflow_testkit::sqlite_db();
    let path = sqlite
        .url
        .trim_start_matches("sqlite://")
        .trim_end_matches("?mode=rwc")
        .to_owned();
    std::fs::write(&path, b"").expect("an empty file");
    let mut v = vec![(sqlite, path)];
    if let Some(pg) = postgres_db().await {
        let url = pg.url.clone();
        v.push((pg, url));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_migrate_changes_the_schema_and_dry_run_shows_its_sql() {
    for (db, url) in unmigrated().await {
        let b = db.backend;
        let url = url.as_str();

        // Every other command refuses, with exit 5, and creates nothing.
        for args in [
            &["runs", "list"][..],
            &["queue"],
            &["purge", "--older-than", "1d"],
        ] {
            let o = sagaflow(url, args).await;
            code(&o, 5, &format!("[{b}] {args:?} on an unmigrated database"));
            let e = stderr(&o);
            assert!(
                e.contains("sagaflow migrate") && e.contains("m0001_initial"),
                "[{b}] {e}"
            );
            assert_eq!(e.lines().count(), 1, "[{b}] one line: {e}");
        }
        assert_eq!(
            tables(&db.url).await,
            Vec::<String>::new(),
            "[{b}] nothing created"
        );

        // The dry run prints the SQL, and changes nothing.
        let sql = human(url, &["migrate", "--dry-run"]).await;
        assert!(
            sql.starts_with("-- m0001_initial\n"),
            "[{b}] {}",
            &sql[..sql.len().min(200)]
        );
        assert!(
            sql.contains("CREATE TABLE IF NOT EXISTS sagaflow_runs"),
            "[{b}]"
        );
        assert!(sql.contains("dry run: nothing was changed"), "[{b}]");
        let plan = json(url, &["migrate", "--dry-run"]).await;
        let pending = plan["pending"].as_array().expect("pending");
        assert_eq!(pending[0]["name"], "m0001_initial", "[{b}] {plan}");
        for m in pending {
            // The history partitions (m0024) are PostgreSQL's alone.
            let nothing = m["statements"].as_array().expect("sql").is_empty();
            let pg_only = m["name"] == "m0024_history_partitions";
            assert_eq!(
                nothing,
                b == "sqlite" && pg_only,
                "[{b}] every migration executes something on an empty database: {m}"
            );
        }
        assert_eq!(
            tables(&db.url).await,
            Vec::<String>::new(),
            "[{b}] still nothing"
        );

        // `migrate` applies them; then the other commands work, and nothing is pending.
        let out = human(url, &["migrate"]).await;
        assert!(out.starts_with("applied m0001_initial\n"), "[{b}] {out}");
        assert!(
            tables(&db.url).await.contains(&"sagaflow_runs".to_owned()),
            "[{b}]"
        );
        assert_eq!(
            human(url, &["runs", "list"]).await.trim(),
            "no runs",
            "[{b}]"
        );
        let again = json(url, &["migrate"]).await;
        assert_eq!(again["applied"], Value::Array(vec![]), "[{b}] {again}");
        let plan = json(url, &["migrate", "--dry-run"]).await;
        assert_eq!(plan["pending"], Value::Array(vec![]), "[{b}] {plan}");
    }

    // A path to no file: refused as a usage error, and no file is created.
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("none.db");
    let o = sagaflow(missing.to_str().expect("path"), &["runs", "list"]).await;
    code(&o, 2, "a path to no file");
    assert!(stderr(&o).contains("creates none"), "{}", stderr(&o));
    assert!(!missing.exists(), "no file created");
    // An unreachable database: exit 1, without the password.
    let o = sagaflow("postgres://ops:hunter2@127.0.0.1:1/none", &["runs", "list"]).await;
    code(&o, 1, "an unreachable database");
    assert!(!stderr(&o).contains("hunter2"), "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_extend_and_cancel_a_run_no_engine_runs() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        // Published, then stopped: the run waits, `running` with its first step due, and no
        // engine to run it.
        let eng = engine(&db, vec![notify(Arc::new(AtomicBool::new(true)))]).await;
        eng.shutdown().await;
        let client = Engine::builder()
            .with_database_url(url)
            .with_published_workflows()
            .start()
            .await
            .expect("client");
        let id = client
            .start("notify", &())
            .await
            .expect("start")
            .to_string();
        client.shutdown().await;

        let paused = json(url, &["pause", &id, "--reason", "hold", "--as", "dora"]).await;
        assert_eq!(paused["state"], "paused", "[{b}] {paused}");
        let o = sagaflow(url, &["extend", &id, "--by", "30m", "--reason", "slow"]).await;
        code(&o, 4, "extend with no attempt in flight");
        let o = sagaflow(url, &["extend", &id, "--by", "0s", "--reason", "slow"]).await;
        code(&o, 2, "a zero extension");
        // The dry run first: what the cancel would undo, from the published graph (this
        // command has no workflow code), and nothing written.
        let preview = json(url, &["cancel", &id, "--dry-run"]).await;
        assert_eq!(
            (&preview["undo"], &preview["run_state"]),
            (&serde_json::json!("cancel"), &serde_json::json!("paused")),
            "[{b}] {preview}"
        );
        assert_eq!(preview["outcome"], "compensated", "[{b}] {preview}");
        let text = human(url, &["compensate", &id, "--dry-run"]).await;
        assert!(
            text.contains("compensate would") && text.contains("nothing was written"),
            "[{b}] {text}"
        );
        let shown = json(url, &["runs", "show", &id]).await;
        assert_eq!(shown["run"]["state"], "paused", "[{b}] {shown}");
        let o = sagaflow(url, &["cancel", &id]).await;
        code(&o, 2, "a cancel without a reason");
        let cancelled = json(
            url,
            &["cancel", &id, "--reason", "customer left", "--as", "dora"],
        )
        .await;
        assert_eq!(cancelled["action"], "cancel", "[{b}] {cancelled}");
        let shown = json(url, &["runs", "show", &id]).await;
        assert_eq!(shown["run"]["state"], cancelled["state"], "[{b}] {shown}");
        let kinds: Vec<&str> = shown["history"]
            .as_array()
            .expect("history")
            .iter()
            .filter(|e| e["actor"] == "cli:dora")
            .filter_map(|e| e["kind"].as_str())
            .filter(|k| k.starts_with("operator_"))
            .collect();
        assert_eq!(
            kinds,
            ["operator_pause", "operator_cancel"],
            "[{b}] {shown}"
        );
        let o = sagaflow(url, &["resume", &id, "--reason", "again"]).await;
        code(&o, 4, "a cancelled run cannot be resumed");
    }
}

/// Runs one statement with `run` as `$1` on the database, and asserts it changed one row.
async fn edit(db: &TestDb, sql: &str, run: Uuid) {
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    let done = conn
        .execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            sql,
            [run.into()],
        ))
        .await
        .unwrap_or_else(|e| panic!("[{}] {sql}: {e}", db.backend));
    assert_eq!(done.rows_affected(), 1, "[{}] {sql}", db.backend);
    let _ = conn.close().await;
}

/// A client engine (no workers) over `db` with the published workflows: it starts runs that
/// no engine runs.
async fn client(db: &TestDb) -> Engine {
    Engine::builder()
        .with_database_url(&db.url)
        .with_published_workflows()
        .start()
        .await
        .expect("client")
}

/// The operator events of a run by `actor`, from `runs show --json`: (kind, reason).
fn operator_events(shown: &Value, actor: &str) -> Vec<(String, String)> {
    shown["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter(|e| e["actor"] == actor)
        .filter_map(|e| {
            let kind = e["kind"].as_str()?;
            kind.starts_with("operator_").then(|| {
                (
                    kind.to_owned(),
                    e["detail"]["reason"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
        })
        .collect()
}

/// `undo@1`: `reserve`, whose compensation fails for good until `fixed`, then `charge`,
/// which always fails for good: a run compensates, and stops in `error` with the
/// compensation of `reserve` failed.
fn undo(fixed: Arc<AtomicBool>) -> Workflow {
    Workflow::builder("undo", 1)
        .step("reserve", |_ctx: StepContext| async {
            Ok::<_, StepError>("r-1")
        })
        .compensate(move |_ctx: StepContext| {
            let ok = fixed.load(Ordering::SeqCst);
            async move {
                if ok {
                    Ok(())
                } else {
                    Err(StepError::terminal_unknown(
                        "stock_locked",
                        "the stock is locked",
                    ))
                }
            }
        })
        .step("charge", |_ctx: StepContext| async {
            Err::<(), _>(StepError::terminal_unknown("card_declined", "declined"))
        })
        .after(["reserve"])
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensate_and_mark_compensated_record_who_and_why() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        let fixed = Arc::new(AtomicBool::new(false));
        let eng = engine(&db, vec![undo(fixed.clone())]).await;
        let stuck = eng.start("undo", &()).await.expect("start");
        expect_state(&eng, stuck, RunState::Error, b).await;
        let id = stuck.to_string();
        let id = id.as_str();

        // Refused: `charge` has no failed compensation (4); no such step (3).
        let mark = |step| {
            [
                "mark-compensated",
                id,
                "--step",
                step,
                "--reason",
                "undone by hand",
                "--as",
                "erin",
            ]
        };
        let o = sagaflow(url, &mark("charge")).await;
        code(
            &o,
            4,
            "mark-compensated of a step whose compensation did not fail",
        );
        assert!(
            stderr(&o).contains("has no failed compensation"),
            "[{b}] {}",
            stderr(&o)
        );
        code(&sagaflow(url, &mark("nope")).await, 3, "an unknown step");

        // The stock was released by hand: recorded, and the run compensates the rest.
        let marked = json(url, &mark("reserve")).await;
        assert_eq!(
            (
                marked["action"].as_str(),
                marked["step"].as_str(),
                marked["actor"].as_str()
            ),
            (Some("mark_compensated"), Some("reserve"), Some("cli:erin")),
            "[{b}] {marked}"
        );
        expect_state(&eng, stuck, RunState::Compensated, b).await;
        let shown = json(url, &["runs", "show", id]).await;
        assert_eq!(shown["run"]["state"], "compensated", "[{b}] {shown}");
        assert_eq!(
            operator_events(&shown, "cli:erin"),
            [(
                "operator_mark_compensated".to_owned(),
                "undone by hand".to_owned()
            )],
            "[{b}] {shown}"
        );
        let event = shown["history"]
            .as_array()
            .expect("history")
            .iter()
            .find(|e| e["kind"] == "operator_mark_compensated")
            .expect("the event");
        assert_eq!(event["detail"]["step"], "reserve", "[{b}] {event}");
        assert_eq!(
            (
                shown["alerts"][0]["resolved_by"].as_str(),
                shown["alerts"][0]["resolution"].as_str()
            ),
            (Some("cli:erin"), Some("mark_compensated: undone by hand")),
            "[{b}] {shown}"
        );

        // A run no engine runs is compensated on request; an engine finishes it.
        eng.shutdown().await;
        let c = client(&db).await;
        let waiting = c.start("undo", &()).await.expect("start");
        c.shutdown().await;
        let w = waiting.to_string();
        let compensating = json(
            url,
            &[
                "compensate",
                &w,
                "--reason",
                "customer withdrew",
                "--as",
                "erin",
            ],
        )
        .await;
        assert_eq!(
            (
                compensating["action"].as_str(),
                compensating["state"].as_str(),
                compensating.get("step")
            ),
            (Some("compensate"), Some("compensating"), None),
            "[{b}] {compensating}"
        );
        let shown = json(url, &["runs", "show", &w]).await;
        assert_eq!(shown["run"]["state"], "compensating", "[{b}] {shown}");
        assert_eq!(
            operator_events(&shown, "cli:erin"),
            [(
                "operator_compensate".to_owned(),
                "customer withdrew".to_owned()
            )],
            "[{b}] {shown}"
        );
        fixed.store(true, Ordering::SeqCst);
        let eng = engine(&db, vec![undo(fixed.clone())]).await;
        expect_state(&eng, waiting, RunState::Compensated, b).await;
        eng.shutdown().await;
        // A compensated run cannot be compensated again (4), with the engine's reason.
        let o = sagaflow(url, &["compensate", &w, "--reason", "again"]).await;
        code(&o, 4, "compensate of a compensated run");
        assert!(
            stderr(&o).contains("already compensated"),
            "[{b}] {}",
            stderr(&o)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_takes_back_a_run_set_aside_for_a_damaged_row() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        // Published, then stopped: the run waits, its first step due; its `email` row is damaged.
        let eng = engine(&db, vec![notify(Arc::new(AtomicBool::new(true)))]).await;
        eng.shutdown().await;
        let c = client(&db).await;
        let run = c.start("notify", &()).await.expect("start");
        c.shutdown().await;
        let id = run.to_string();

        // Not set aside: refused (4).
        let o = sagaflow(url, &["release", &id, "--reason", "early", "--as", "frank"]).await;
        code(&o, 4, "release of a run not set aside");
        assert!(
            stderr(&o).starts_with("sagaflow: cannot release") && stderr(&o).contains("not error"),
            "[{b}] {}",
            stderr(&o)
        );
        edit(
            &db,
            "UPDATE sagaflow_steps SET state = 'bogus' WHERE run_id = $1 AND name = 'email'",
            run,
        )
        .await;

        // An engine meets the damaged row and sets the run aside.
        let eng = engine(&db, vec![notify(Arc::new(AtomicBool::new(true)))]).await;
        let aside = expect_state(&eng, run, RunState::Error, b).await;
        assert_eq!(
            aside.error.as_ref().map(|e| e["code"].clone()),
            Some("corrupt_row".into()),
            "[{b}] {aside:?}"
        );
        eng.shutdown().await;

        // Released before the repair: the damage is named, and nothing changes (1).
        let o = sagaflow(url, &["release", &id, "--reason", "early", "--as", "frank"]).await;
        code(&o, 1, "release of a run whose row is still damaged");
        assert!(
            stderr(&o).contains("sagaflow_steps") && stderr(&o).contains("`bogus`"),
            "[{b}] {}",
            stderr(&o)
        );

        // Repaired, then released: recorded with who and why; an engine completes it.
        edit(
            &db,
            "UPDATE sagaflow_steps SET state = 'not_started' WHERE run_id = $1 AND name = 'email'",
            run,
        )
        .await;
        let released = json(
            url,
            &["release", &id, "--reason", "row repaired", "--as", "frank"],
        )
        .await;
        assert_eq!(
            (
                released["action"].as_str(),
                released["state"].as_str(),
                released["actor"].as_str()
            ),
            (Some("release"), Some("running"), Some("cli:frank")),
            "[{b}] {released}"
        );
        let shown = json(url, &["runs", "show", &id]).await;
        assert_eq!(shown["run"]["state"], "running", "[{b}] {shown}");
        assert_eq!(
            operator_events(&shown, "cli:frank"),
            [("operator_release".to_owned(), "row repaired".to_owned())],
            "[{b}] {shown}"
        );
        let alert = shown["alerts"]
            .as_array()
            .expect("alerts")
            .iter()
            .find(|a| a["kind"] == "corrupt_row")
            .unwrap_or_else(|| panic!("[{b}] no corrupt_row alert: {shown}"));
        assert_eq!(
            (alert["resolved_by"].as_str(), alert["resolution"].as_str()),
            (Some("cli:frank"), Some("release: row repaired")),
            "[{b}] {alert}"
        );
        let eng = engine(&db, vec![notify(Arc::new(AtomicBool::new(true)))]).await;
        expect_state(&eng, run, RunState::Completed, b).await;
        eng.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_shows_each_workflow_s_steps() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        let eng = engine(
            &db,
            vec![
                notify(Arc::new(AtomicBool::new(true))),
                undo(Arc::default()),
            ],
        )
        .await;
        eng.shutdown().await;
        // No engine runs them: `notify` has a step due now and one due in an hour.
        let c = client(&db).await;
        c.start("notify", &()).await.expect("start");
        c.start_with(
            "notify",
            &(),
            sagaflow::StartOptions::default().start_after(Duration::from_secs(3600)),
        )
        .await
        .expect("start later");
        c.shutdown().await;

        let queue = json(url, &["queue"]).await;
        assert_eq!(
            (queue["ready"].as_i64(), queue["scheduled"].as_i64()),
            (Some(1), Some(1)),
            "[{b}] {queue}"
        );
        let queues = queue["queues"].as_array().expect("queues");
        assert_eq!(queues.len(), 1, "[{b}] only notify has steps: {queue}");
        let notify_queue = &queues[0];
        assert_eq!(
            (
                notify_queue["workflow"].as_str(),
                notify_queue["ready"].as_i64(),
                notify_queue["scheduled"].as_i64(),
                notify_queue["running"].as_i64()
            ),
            (Some("notify"), Some(1), Some(1), Some(0)),
            "[{b}] {queue}"
        );
        assert!(
            notify_queue["oldest_ready_ms"]
                .as_i64()
                .is_some_and(|ms| ms >= 0),
            "[{b}] {queue}"
        );
        snapshot("queue_per_workflow", &human(url, &["queue"]).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_row_that_does_not_decode_is_left_out_and_named() {
    for db in backends().await {
        let b = db.backend;
        let url = db.url.as_str();
        let eng = engine(&db, vec![notify(Arc::new(AtomicBool::new(true)))]).await;
        eng.shutdown().await;
        // Three notices with a dead delivery each: one sound, one whose topic and one whose
        // delivery state this version does not know.
        let conn = Database::connect(url).await.expect("connect");
        let backend = conn.get_database_backend();
        for (dedupe, topic, state) in [
            ("n-sound", "alert", "dead"),
            ("n-topic", "from_the_future", "dead"),
            ("n-state", "alert", "bogus"),
        ] {
            for sql in [
                format!(
                    "INSERT INTO sagaflow_outbox (dedupe_id, topic, body, created_at) \
                     VALUES ('{dedupe}', '{topic}', '{{}}', 1)"
                ),
                format!(
                    "INSERT INTO sagaflow_deliveries (outbox_id, sink, state, attempts, next_at, updated_at) \
                     SELECT id, 'hook', '{state}', 3, 0, 1 FROM sagaflow_outbox WHERE dedupe_id = '{dedupe}'"
                ),
            ] {
                conn.execute_raw(Statement::from_string(backend, sql.clone()))
                    .await
                    .unwrap_or_else(|e| panic!("[{b}] {sql}: {e}"));
            }
        }
        let _ = conn.close().await;

        // The listing keeps the sound row and leaves the damaged ones out.
        let c = client(&db).await;
        let listed: Vec<String> = c
            .deliveries(None, 50)
            .await
            .expect("deliveries")
            .into_iter()
            .map(|d| d.dedupe_id)
            .collect();
        assert_eq!(listed, ["n-sound"], "[{b}]");
        // The leader's page leaves out the notice whose delivery does not decode (read as
        // pending, it would be sent again at every pass) and the one of an unknown topic.
        let pending: Vec<String> = c
            .store()
            .outbox_pending(100)
            .await
            .expect("pending")
            .notices
            .into_iter()
            .map(|p| p.notice.dedupe_id)
            .collect();
        assert_eq!(pending, ["n-sound"], "[{b}]");
        c.shutdown().await;

        // The command lists the sound one, and names each damaged row in its log.
        let o = sagaflow_logging(url, &["alerts", "deliveries", "--json"], "warn").await;
        code(&o, 0, "deliveries with damaged rows");
        let answer: Value = serde_json::from_slice(&o.stdout).expect("JSON");
        assert_eq!(
            answer["deliveries"].as_array().map(Vec::len),
            Some(1),
            "[{b}] {answer}"
        );
        assert_eq!(answer["deliveries"][0]["dedupe_id"], "n-sound", "[{b}]");
        let log = stderr(&o);
        assert!(
            log.contains("sagaflow_outbox") && log.contains("`from_the_future`"),
            "[{b}] {log}"
        );
        assert!(
            log.contains("sagaflow_deliveries")
                && log.contains("sink `hook`")
                && log.contains("`bogus`"),
            "[{b}] {log}"
        );
    }
}
