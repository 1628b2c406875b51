//! Following a run, on both backends: its history, then each new event and each step's
//! progress as they come, from another instance than the one running it, until it
//! finishes; resumed after a position with exactly the events after it (Rust stream and
//! server-sent events with `Last-Event-ID`); the command line's `follow`; the progress on the
//! console's run page.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use sagaflow::{Engine, HistoryEvent, RunState, RunUpdate, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, expect_state, fast_builder};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::fixtures::{admin_tokens, console_login, serve_admin};

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";
const WAIT: Duration = Duration::from_secs(30);

/// `import@1`: `load` reports `{"done": 1, "of": 2}` (until it is written), waits for a
/// permit from the test,
/// reports `{"done": 2, "of": 2}`, waits again, and returns; then `index` runs.
fn import(gate: &Arc<Semaphore>) -> Workflow {
    Workflow::builder("import", 1)
        .step_using("load", gate.clone(), |gate, ctx: StepContext| async move {
            for done in 1..=2 {
                // A report sooner than `PROGRESS_MIN_INTERVAL` after the last is skipped: the
                // step reports again until this one is written.
                while !ctx.progress(&json!({ "done": done, "of": 2 })).await? {
                    tokio::time::sleep(sagaflow::PROGRESS_MIN_INTERVAL / 4).await;
                }
                gate.acquire()
                    .await
                    .map_err(|e| StepError::retryable("gate", e.to_string()))?
                    .forget();
            }
            Ok::<_, StepError>("loaded")
        })
        .step("index", |_: StepContext| async {
            Ok::<_, StepError>("indexed")
        })
        .after(["load"])
        .build()
        .expect("import")
}

/// Reads updates until one satisfies `until` (30 s at most); returns them all.
async fn read_until<S>(
    updates: &mut S,
    what: &str,
    until: impl Fn(&RunUpdate) -> bool,
) -> Vec<RunUpdate>
where
    S: futures_util::Stream<Item = sagaflow::Result<RunUpdate>> + Unpin,
{
    let mut seen = Vec::new();
    tokio::time::timeout(WAIT, async {
        while let Some(u) = updates.next().await {
            let u = u.expect("an update");
            let stop = until(&u);
            seen.push(u);
            if stop {
                return;
            }
        }
        panic!("the stream ended before {what}: {seen:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("waiting for {what}"));
    seen
}

fn progress_of(u: &RunUpdate) -> Option<Value> {
    match u {
        RunUpdate::Progress { step, progress } if step == "load" => Some(progress.clone()),
        _ => None,
    }
}

fn events(updates: &[RunUpdate]) -> Vec<(String, HistoryEvent)> {
    updates
        .iter()
        .filter_map(|u| match u {
            RunUpdate::Event { position, event } => Some((position.clone(), event.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_on_another_instance_sees_history_and_progress_and_resumes_after_a_position() {
    for db in backends().await {
        let b = db.backend;
        let gate = Arc::new(Semaphore::new(0));
        let worker = fast_builder(&db)
            .with_workflow(import(&gate))
            .start()
            .await
            .expect("worker");
        // Another instance, which runs nothing: what it sees, it read from the database.
        let watcher = fast_builder(&db)
            .with_workflow(import(&gate))
            .with_workers(false)
            .start()
            .await
            .expect("watcher");
        let id = worker.start("import", &json!(null)).await.expect("start");
        let mut updates = Box::pin(watcher.follow(id, None).await.expect("follow"));

        let mut all = read_until(&mut updates, "the first progress", |u| {
            progress_of(u) == Some(json!({ "done": 1, "of": 2 }))
        })
        .await;
        // The console's run page shows it too.
        let (addr, server) = serve_admin(&watcher, admin_tokens(OPS, VIEW)).await;
        let cookie = console_login(addr, VIEW).await;
        let page = crate::console::http()
            .get(format!("http://{addr}/console/runs/{id}"))
            .header("cookie", cookie)
            .send()
            .await
            .expect("run page")
            .text()
            .await
            .expect("body");
        assert!(
            page.contains("td class=\"progress\"><code>{&quot;done&quot;:1,&quot;of&quot;:2}"),
            "[{b}] the run page shows the progress"
        );
        gate.add_permits(1);
        all.extend(
            read_until(&mut updates, "the second progress", |u| {
                progress_of(u) == Some(json!({ "done": 2, "of": 2 }))
            })
            .await,
        );
        gate.add_permits(1);
        // The stream ends once the run has completed and every event was sent.
        let rest: Vec<RunUpdate> = tokio::time::timeout(WAIT, updates.by_ref().collect::<Vec<_>>())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the stream did not end"))
            .into_iter()
            .map(|u| u.expect("an update"))
            .collect();
        all.extend(rest);
        let run = expect_state(&worker, id, RunState::Completed, b).await;
        assert_eq!(run.output.expect("output")["load"], "loaded", "[{b}]");

        // The events are the run's history, in order, each once.
        let followed = events(&all);
        let history = watcher.history(id).await.expect("history");
        assert_eq!(
            followed.iter().map(|(_, e)| e.clone()).collect::<Vec<_>>(),
            history,
            "[{b}] every event of the history, in order"
        );
        let progress: Vec<Value> = all.iter().filter_map(progress_of).collect();
        assert_eq!(
            progress,
            [json!({ "done": 1, "of": 2 }), json!({ "done": 2, "of": 2 })],
            "[{b}] each report once"
        );

        // Resumed after the third event: exactly the events after it.
        let (third, _) = followed[2].clone();
        let resumed: Vec<RunUpdate> = watcher
            .follow(id, Some(&third))
            .await
            .expect("follow again")
            .map(|u| u.expect("an update"))
            .collect()
            .await;
        assert_eq!(
            events(&resumed),
            followed[3..].to_vec(),
            "[{b}] resumed after {third}"
        );

        // Over HTTP, with `Last-Event-ID` as a reconnecting `EventSource` sends it.
        let text = reqwest::Client::new()
            .get(format!("http://{addr}/api/v1/runs/{id}/follow"))
            .bearer_auth(VIEW)
            .header("last-event-id", &third)
            .send()
            .await
            .expect("follow over http")
            .text()
            .await
            .expect("the stream ends");
        let ids: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("id: ").or_else(|| l.strip_prefix("id:")))
            .collect();
        let expected: Vec<&str> = followed[3..].iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(ids, expected, "[{b}] {text}");
        assert!(text.contains("event: history"), "[{b}] {text}");
        let bad = reqwest::Client::new()
            .get(format!("http://{addr}/api/v1/runs/{id}/follow?after=x"))
            .bearer_auth(VIEW)
            .send()
            .await
            .expect("refused");
        assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST, "[{b}]");

        // The command line prints the same history and ends.
        let o = crate::cli::sagaflow(&db.url, &["follow", &id.to_string()]).await;
        crate::cli::code(&o, 0, "follow");
        let out = crate::cli::stdout(&o);
        assert_eq!(out.lines().count(), followed.len(), "[{b}] {out}");
        assert!(
            out.contains("submitted") && out.contains("-> completed"),
            "[{b}] {out}"
        );

        server.abort();
        watcher.shutdown().await;
        worker.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn following_an_unknown_run_or_position_is_refused() {
    let db: TestDb = sagaflow_testkit::sqlite_db();
    let gate = Arc::new(Semaphore::new(0));
    let engine: Engine = fast_builder(&db)
        .with_workflow(import(&gate))
        .start()
        .await
        .expect("engine");
    let missing = engine.follow(Uuid::now_v7(), None).await.map(|_| ());
    assert!(
        matches!(missing, Err(sagaflow::Error::RunNotFound(_))),
        "{missing:?}"
    );
    let id = engine.start("import", &json!(null)).await.expect("start");
    let bad = engine.follow(id, Some("nine")).await.map(|_| ());
    assert!(
        matches!(bad, Err(sagaflow::Error::InvalidQuery(_))),
        "{bad:?}"
    );
    gate.add_permits(2);
    expect_state(&engine, id, RunState::Completed, "sqlite").await;
    engine.shutdown().await;
}
