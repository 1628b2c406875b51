//! Reads from a replica (opt-in, `with_read_replica`): two private clusters, the second a
//! streaming standby of the first. While the standby is frozen (the primary's WAL sender
//! stopped), a run starts, runs and completes on the primary: decisions and writes never
//! wait for the replica, and a run just started is found by `Engine::run`. The listing,
//! the counts and the console come from the frozen replica (without the new run) and say how
//! far behind it is; a run page and a follower of a run the replica does not have yet fall
//! back to the primary or wait; once the replica catches up, every read agrees.

use std::time::Duration;

use futures_util::StreamExt as _;
use nix::sys::signal::Signal;
use sagaflow::{
    Engine, HistoryKind, RunQuery, RunState, RunUpdate, StepContext, StepError, Workflow,
};
use sagaflow_testkit::eventually;

use crate::fixtures::{admin_tokens, console_login, postgres_wanted, serve_admin};
use crate::primary_failover::{Pair, pair, wal_sender};

const OPS: &str = "ops-replica-secret-0123456789";
const VIEW: &str = "view-replica-secret-0123456789";

fn workflow() -> Workflow {
    Workflow::builder("replicated", 1)
        .step("a", |_ctx: StepContext| async { Ok::<_, StepError>(1) })
        .step("b", |_ctx: StepContext| async { Ok::<_, StepError>(2) })
        .after(["a"])
        .build()
        .expect("workflow")
}

async fn listed(engine: &Engine) -> Vec<uuid::Uuid> {
    engine
        .list_runs(&RunQuery::new())
        .await
        .expect("list")
        .runs
        .iter()
        .map(|r| r.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn display_reads_come_from_the_replica_and_decisions_never_wait_for_it() {
    if !postgres_wanted("the read replica scenario") {
        return;
    }
    let pair = pair(false).await;
    sagaflow_testkit::init_logging();
    let engine = Engine::builder()
        .with_database_url(Pair::db_url(&pair.primary))
        .with_read_replica(Pair::db_url(&pair.standby))
        .with_workflow(workflow())
        .with_poll_interval(Duration::from_millis(50))
        .start()
        .await
        .expect("engine with a read replica");
    let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
    let cookie = console_login(addr, VIEW).await;
    let http = crate::console::http();
    let get = |path: String| {
        let (http, cookie) = (http.clone(), cookie.clone());
        async move {
            let r = http
                .get(format!("http://{addr}{path}"))
                .header("cookie", cookie)
                .bearer_auth(VIEW)
                .send()
                .await
                .expect("get");
            (r.status(), r.text().await.expect("body"))
        }
    };

    // Caught up: the replica lists the first run, and is not behind.
    let first = engine.start("replicated", &()).await.expect("start");
    engine
        .wait(first, Duration::from_secs(20))
        .await
        .expect("wait");
    eventually(
        Duration::from_secs(20),
        "the replica lists the first run",
        || async { listed(&engine).await.contains(&first) },
    )
    .await;
    eventually(Duration::from_secs(20), "no lag once caught up", || async {
        engine.replica_lag().await.expect("lag") == Some(Duration::ZERO)
    })
    .await;

    // Frozen: the primary sends the standby nothing more.
    let sender = wal_sender(&pair.primary.url).await;
    nix::sys::signal::kill(sender, Signal::SIGSTOP).expect("SIGSTOP the WAL sender");
    let second = engine
        .start("replicated", &())
        .await
        .expect("start while frozen");
    // Read your writes: the run is on the primary at once, and it runs to the end there.
    assert!(engine.run(second).await.expect("run").is_some());
    let done = engine
        .wait(second, Duration::from_secs(20))
        .await
        .expect("the run completes while the replica is frozen");
    assert_eq!(done.state, RunState::Completed);
    // The display reads are the replica's: without the new run.
    let runs = listed(&engine).await;
    assert!(runs.contains(&first) && !runs.contains(&second), "{runs:?}");
    let counts = engine.run_counts().await.expect("counts");
    assert_eq!(counts.get(RunState::Completed), 1, "{counts:?}");
    let lag = engine.replica_lag().await.expect("lag").expect("a replica");
    assert!(lag > Duration::ZERO, "the replica is behind, lag {lag:?}");
    // The API's reads say so too (the figure is read at most once a second for all).
    let api_lag = || {
        let http = http.clone();
        async move {
            let listed_by_api = http
                .get(format!("http://{addr}/api/v1/runs"))
                .bearer_auth(VIEW)
                .send()
                .await
                .expect("get");
            listed_by_api
                .headers()
                .get(sagaflow::admin::REPLICA_LAG_HEADER)
                .map(|v| {
                    v.to_str()
                        .expect("ascii")
                        .parse::<u64>()
                        .expect("milliseconds")
                })
        }
    };
    eventually(
        Duration::from_secs(20),
        "the list's answer carries the lag",
        || async { api_lag().await.is_some_and(|ms| ms > 0) },
    )
    .await;
    // So are the command line's, given the replica; without it, they read the primary.
    let (primary_url, standby_url) = (Pair::db_url(&pair.primary), Pair::db_url(&pair.standby));
    let replica_args = [
        "runs",
        "list",
        "--json",
        "--read-replica",
        standby_url.as_str(),
    ];
    let from_replica = crate::cli::sagaflow(&primary_url, &replica_args).await;
    let out = crate::cli::stdout(&from_replica);
    assert!(
        from_replica.status.success(),
        "{}",
        crate::cli::stderr(&from_replica)
    );
    assert!(
        out.contains(&first.to_string()) && !out.contains(&second.to_string()),
        "{out}"
    );
    let from_primary = crate::cli::sagaflow(&primary_url, &["runs", "list", "--json"]).await;
    assert!(
        crate::cli::stdout(&from_primary).contains(&second.to_string()),
        "{}",
        crate::cli::stderr(&from_primary)
    );
    let (status, page) = get("/console/runs".into()).await;
    assert!(status.is_success(), "{status}");
    assert!(page.contains("Read from a replica"), "the lag is shown");
    assert!(!page.contains(&second.to_string()));
    // A run page of a run the replica does not have is read from the primary.
    let (status, body) = get(format!("/api/v1/runs/{second}")).await;
    assert!(status.is_success(), "{status}: {body}");
    assert!(body.contains("\"completed\""), "{body}");
    let (status, page) = get(format!("/console/runs/{second}")).await;
    assert!(status.is_success(), "{status}");
    assert!(page.contains(&second.to_string()));
    // A follower of that run finds it and waits for the replica.
    let follower = tokio::spawn({
        let engine = engine.clone();
        async move {
            let updates = engine.follow(second, None).await.expect("follow");
            tokio::time::timeout(Duration::from_secs(30), updates.collect::<Vec<_>>())
                .await
                .expect("the follower ends once the replica has the run")
        }
    });

    // Caught up again: every read agrees.
    nix::sys::signal::kill(sender, Signal::SIGCONT).expect("SIGCONT the WAL sender");
    eventually(
        Duration::from_secs(20),
        "the replica lists the second run",
        || async { listed(&engine).await.contains(&second) },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "no lag once caught up again",
        || async { engine.replica_lag().await.expect("lag") == Some(Duration::ZERO) },
    )
    .await;
    let updates = follower.await.expect("follower");
    let completed = updates
        .iter()
        .filter(|u| {
            matches!(u, Ok(RunUpdate::Event { event, .. }) if event.kind == HistoryKind::Completed)
        })
        .count();
    assert_eq!(
        completed, 2,
        "both steps' completions followed: {updates:?}"
    );
    // The console's figure is read at most once a second for all its pages.
    eventually(
        Duration::from_secs(20),
        "the console says caught up",
        || async move {
            let (_, page) = get("/console/runs".into()).await;
            page.contains("Read from a replica 0 ms behind")
        },
    )
    .await;

    server.abort();
    engine.shutdown().await;
    drop(pair);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_is_sqlite_or_a_list_is_refused_by_name() {
    for (url, says) in [
        ("sqlite://replica.db?mode=rwc", "PostgreSQL"),
        ("postgres://u@a:5432,b:5432/db", "one server"),
    ] {
        let e = Engine::builder()
            .with_database_url(sagaflow_testkit::sqlite_db().url)
            .with_read_replica(url)
            .with_workflow(workflow())
            .start()
            .await
            .expect_err(url);
        assert!(
            matches!(e, sagaflow::Error::Config(_)) && e.to_string().contains(says),
            "{url}: {e}"
        );
    }
}
