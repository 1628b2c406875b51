//! Starting a run later and claiming by priority, on both backends: a run scheduled ahead
//! waits (counted as scheduled, never claimed) while others run; one scheduled in the past or
//! without a start runs at once; a start after a short delay is claimed no sooner, by the
//! database's clock; among queued runs the one of higher priority runs first; out-of-range
//! options are refused before anything is stored.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow::{
    Engine, Error, HistoryKind, PRIORITY_MAX, RunState, START_AHEAD_MAX, StartOption, StartOptions,
    StepContext, StepError, StepState, Timestamp, Uuid, Workflow,
};
use sagaflow_testkit::{backends, expect_state, fast_builder};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Tag {
    tag: String,
}

/// `pair@1`: `first`, then `second`, each appending the run's tag to `log` as it runs.
fn pair(log: &Arc<Mutex<Vec<String>>>) -> Workflow {
    let record = |log: Arc<Mutex<Vec<String>>>| {
        move |ctx: StepContext| {
            let log = log.clone();
            async move {
                let t: Tag = ctx.input()?;
                log.lock().expect("log").push(t.tag);
                Ok::<_, StepError>(())
            }
        }
    };
    Workflow::builder("pair", 1)
        .input::<Tag>()
        .step("first", record(log.clone()))
        .step("second", record(log.clone()))
        .after(["first"])
        .build()
        .expect("valid")
}

/// `one@1`: a single step that appends the run's tag to `log`.
fn one(log: &Arc<Mutex<Vec<String>>>) -> Workflow {
    let log = log.clone();
    Workflow::builder("one", 1)
        .input::<Tag>()
        .step("only", move |ctx: StepContext| {
            let log = log.clone();
            async move {
                let t: Tag = ctx.input()?;
                log.lock().expect("log").push(t.tag);
                Ok::<_, StepError>(())
            }
        })
        .build()
        .expect("valid")
}

fn tag(t: &str) -> Tag {
    Tag { tag: t.to_owned() }
}

/// The priority stored on each step row of a run.
async fn step_priorities(engine: &Engine, run: Uuid) -> Vec<i32> {
    let conn = engine.connection();
    let backend = conn.get_database_backend();
    let rows = conn
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            match backend {
                sagaflow::sea_orm::DbBackend::Postgres => {
                    "SELECT priority FROM sagaflow_steps WHERE run_id = $1 ORDER BY id"
                }
                _ => "SELECT priority FROM sagaflow_steps WHERE run_id = ? ORDER BY id",
            },
            [run.into()],
        ))
        .await
        .expect("step rows");
    rows.iter()
        .map(|r| r.try_get::<i32>("", "priority").expect("priority"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_scheduled_an_hour_ahead_waits_while_runs_without_a_start_or_past_due_run() {
    for db in backends().await {
        let b = db.backend;
        let log = Arc::new(Mutex::new(Vec::new()));
        let engine = sagaflow_testkit::engine(&db, vec![pair(&log)]).await;
        let hour = Duration::from_secs(3600);

        let later = engine
            .start_with(
                "pair",
                &tag("later"),
                StartOptions::keyed("k-later")
                    .start_after(hour)
                    .priority(PRIORITY_MAX),
            )
            .await
            .expect("start later");
        let at: Timestamp =
            Timestamp::from_timestamp_millis(chrono_ms(std::time::SystemTime::now() + hour) + 250)
                .expect("an instant");
        let at_instant = engine
            .start_with("pair", &tag("at"), StartOptions::default().start_at(at))
            .await
            .expect("start at an instant");
        let now = engine.start("pair", &tag("now")).await.expect("start now");
        let past = engine
            .start_with(
                "pair",
                &tag("past"),
                StartOptions::default()
                    .start_at(Timestamp::from_timestamp_millis(1_000).expect("1970")),
            )
            .await
            .expect("start in the past");
        expect_state(&engine, now, RunState::Completed, b).await;
        expect_state(&engine, past.id, RunState::Completed, b).await;

        // The runs started later were never claimed, though the highest priority: the
        // others completed past them.
        let stats = engine.stats().await.expect("stats");
        assert_eq!((stats.scheduled, stats.ready), (2, 0), "[{b}] {stats:?}");
        for id in [later.id, at_instant.id] {
            let run = engine.run(id).await.expect("read").expect("run");
            assert_eq!(run.state, RunState::Pending, "[{b}]");
            let steps = engine.steps(id).await.expect("steps");
            let first = steps.iter().find(|s| s.name == "first").expect("first");
            assert_eq!(
                (first.state, first.attempts.forward),
                (StepState::Ready, 0),
                "[{b}] {first:?}"
            );
            assert_eq!(first.available_at, run.start_at, "[{b}] due at the start");
        }
        let mut ran = log.lock().expect("log").clone();
        ran.sort();
        assert_eq!(ran, ["now", "now", "past", "past"], "[{b}]");

        // A delay is counted from the database's time of the insert; an instant is kept.
        let run = engine.run(later.id).await.expect("read").expect("run");
        let start = run.start_at.expect("a scheduled start");
        assert_eq!(
            (start - run.created_at).num_milliseconds(),
            3_600_000,
            "[{b}]"
        );
        assert_eq!(run.priority, PRIORITY_MAX, "[{b}]");
        assert_eq!(
            step_priorities(&engine, later.id).await,
            [PRIORITY_MAX, PRIORITY_MAX],
            "[{b}] every step row, the one a compensation would use included"
        );
        let run = engine.run(at_instant.id).await.expect("read").expect("run");
        assert_eq!((run.start_at, run.priority), (Some(at), 0), "[{b}]");
        let run = engine.run(now).await.expect("read").expect("run");
        assert_eq!((run.start_at, run.priority), (None, 0), "[{b}]");

        // The business key is held from the start: the same key returns the waiting run.
        let again = engine
            .start_with("pair", &tag("again"), StartOptions::keyed("k-later"))
            .await
            .expect("resubmit");
        assert_eq!(
            (again.id, again.created, again.state),
            (later.id, false, RunState::Pending),
            "[{b}]"
        );
        engine.shutdown().await;
    }
}

/// Epoch milliseconds of an application instant.
fn chrono_ms(t: std::time::SystemTime) -> i64 {
    let d = t.duration_since(std::time::UNIX_EPOCH).expect("after 1970");
    i64::try_from(d.as_millis()).expect("in range")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_after_a_delay_is_claimed_no_sooner_than_its_start() {
    for db in backends().await {
        let b = db.backend;
        let log = Arc::new(Mutex::new(Vec::new()));
        let engine = sagaflow_testkit::engine(&db, vec![pair(&log)]).await;
        let started = engine
            .start_with(
                "pair",
                &tag("soon"),
                StartOptions::default().start_after(Duration::from_millis(400)),
            )
            .await
            .expect("start");
        let run = expect_state(&engine, started.id, RunState::Completed, b).await;
        let start = run.start_at.expect("a scheduled start");
        let history = engine.history(started.id).await.expect("history");
        let first_done = history
            .iter()
            .find(|h| h.kind == HistoryKind::Completed && h.step.as_deref() == Some("first"))
            .expect("first completed");
        assert!(
            first_done.at >= start,
            "[{b}] the first step ended at {} before its start {start}",
            first_done.at
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn among_queued_runs_the_higher_priority_runs_first() {
    for db in backends().await {
        let b = db.backend;
        let log = Arc::new(Mutex::new(Vec::new()));
        // Queued by a client-only engine: nothing is claimed until the worker starts.
        let client = fast_builder(&db)
            .with_workflow(one(&log))
            .with_workers(false)
            .start()
            .await
            .expect("client");
        let mut ids = Vec::new();
        for (t, priority) in [("a", 0), ("low", -5), ("b", 0), ("high", 10), ("c", 0)] {
            let s = client
                .start_with("one", &tag(t), StartOptions::default().priority(priority))
                .await
                .expect("start");
            ids.push(s.id);
        }
        client.shutdown().await;

        let worker = fast_builder(&db)
            .with_workflow(one(&log))
            .with_claim_batch(1)
            .with_max_in_flight(1)
            .start()
            .await
            .expect("worker");
        for id in ids {
            expect_state(&worker, id, RunState::Completed, b).await;
        }
        assert_eq!(
            *log.lock().expect("log"),
            ["high", "a", "b", "c", "low"],
            "[{b}] by priority, then in the order queued"
        );
        worker.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_options_out_of_range_are_refused_before_anything_is_stored() {
    for db in backends().await {
        let b = db.backend;
        let log = Arc::new(Mutex::new(Vec::new()));
        let engine = sagaflow_testkit::engine(&db, vec![pair(&log)]).await;
        let day = Duration::from_secs(86_400);
        let far = Timestamp::from_timestamp_millis(chrono_ms(
            std::time::SystemTime::now() + START_AHEAD_MAX + day,
        ))
        .expect("an instant");
        for (options, refused) in [
            (
                StartOptions::default().start_after(START_AHEAD_MAX + day),
                StartOption::StartAfter,
            ),
            (StartOptions::default().start_at(far), StartOption::StartAt),
            (
                StartOptions::default().priority(PRIORITY_MAX + 1),
                StartOption::Priority,
            ),
        ] {
            let err = engine
                .start_with("pair", &tag("x"), options.clone())
                .await
                .expect_err("refused");
            assert!(
                matches!(err, Error::InvalidStartOption { option, .. } if option == refused),
                "[{b}] {options:?}: {err}"
            );
        }
        // The longest delay allowed is taken.
        engine
            .start_with(
                "pair",
                &tag("x"),
                StartOptions::default().start_after(START_AHEAD_MAX),
            )
            .await
            .expect("at the bound");
        let stats = engine.stats().await.expect("stats");
        assert_eq!(
            stats.scheduled, 1,
            "[{b}] only the run at the bound: {stats:?}"
        );
        engine.shutdown().await;
    }
}
