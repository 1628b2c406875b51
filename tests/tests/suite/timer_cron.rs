//! Recurring schedules, on both backends: every tick of a schedule is fired once across two
//! engines, with no duplicate and no gap when the leader goes away; ticks missed while the
//! engines were stopped follow the schedule's policy; invalid schedules are refused with the
//! problem named; operators list, pause and resume schedules through the API and the CLI,
//! audited, and unauthenticated callers are refused.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow::testing::TestClock;
use sagaflow::{
    Engine, EngineBuilder, Error, HistoryKind, MissedTicks, Schedule, ScheduleView, StepContext,
    StepError, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, fast_builder};

use crate::fixtures::{admin_tokens, answer, serve_admin};

/// `tick@1`: one step that does nothing.
fn tick() -> Workflow {
    Workflow::builder("tick", 1)
        .step("only", |_ctx: StepContext| async { Ok::<_, StepError>(()) })
        .build()
        .expect("valid")
}

/// A schedule of `tick` named `name` on `expression`, missed ticks as `missed` says.
fn every(name: &str, expression: &str, missed: MissedTicks) -> Schedule {
    Schedule::cron(name, expression)
        .expect("valid expression")
        .workflow("tick")
        .input(&serde_json::json!({ "from": name }))
        .expect("input")
        .missed(missed)
}

fn builder(db: &TestDb, id: &str, schedules: &[Schedule]) -> EngineBuilder {
    let mut b = fast_builder(db).with_instance_id(id).with_workflow(tick());
    for s in schedules {
        b = b.with_schedule(s.clone());
    }
    b
}

/// The business keys of the runs of `tick`, with how many runs hold each.
async fn keys(engine: &Engine) -> BTreeMap<String, i64> {
    let conn = engine.connection();
    let rows = conn
        .query_all_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT business_key, COUNT(*) AS n FROM sagaflow_runs_all WHERE workflow = 'tick' \
             GROUP BY business_key",
        ))
        .await
        .expect("runs");
    rows.iter()
        .map(|r| {
            (
                r.try_get::<Option<String>>("", "business_key")
                    .expect("key")
                    .unwrap_or_default(),
                r.try_get::<i64>("", "n").expect("count"),
            )
        })
        .collect()
}

/// The ticks (epoch ms) of schedule `name`'s runs, read from their business keys.
fn ticks_of(keys: &BTreeMap<String, i64>, name: &str) -> Vec<i64> {
    let prefix = format!("schedule:{name}:");
    let mut ticks: Vec<i64> = keys
        .keys()
        .filter_map(|k| k.strip_prefix(&prefix))
        .map(|t| {
            t.parse::<sagaflow::Timestamp>()
                .unwrap_or_else(|e| panic!("tick `{t}`: {e}"))
                .timestamp_millis()
        })
        .collect();
    ticks.sort_unstable();
    ticks
}

async fn schedule(engine: &Engine, name: &str) -> ScheduleView {
    engine
        .schedules()
        .await
        .expect("schedules")
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("schedule {name} is stored"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_cron_fires_once_per_tick_across_two_instances() {
    for db in backends().await {
        let b = db.backend;
        // Every second; ticks missed while the lease changes hands are all fired.
        let s = every(
            "each-second",
            "* * * * * *",
            MissedTicks::FireAll { max: 60 },
        );
        let one = builder(&db, "cron-a", std::slice::from_ref(&s))
            .start()
            .await
            .expect("engine a");
        let two = builder(&db, "cron-b", std::slice::from_ref(&s))
            .start()
            .await
            .expect("engine b");
        let count = |e: &Engine| {
            let e = e.clone();
            async move { ticks_of(&keys(&e).await, "each-second").len() }
        };
        eventually(Duration::from_secs(20), "three ticks fired", || async {
            count(&one).await >= 3
        })
        .await;
        // The leader goes away in the middle; the other instance takes over.
        let is_leader = |e: &Engine| e.supervisor().is_some_and(|s| s.is_leader());
        eventually(Duration::from_secs(10), "a leader", || async {
            is_leader(&one) || is_leader(&two)
        })
        .await;
        let (leader, survivor) = if is_leader(&one) {
            (one, two)
        } else {
            (two, one)
        };
        let before = count(&survivor).await;
        leader.shutdown().await;
        eventually(
            Duration::from_secs(30),
            "three more ticks fired",
            || async { count(&survivor).await >= before + 3 },
        )
        .await;
        let fired = keys(&survivor).await;

        let dupes: Vec<_> = fired.iter().filter(|(_, n)| **n != 1).collect();
        assert!(dupes.is_empty(), "[{b}] a tick started two runs: {dupes:?}");
        let ticks = ticks_of(&fired, "each-second");
        assert!(ticks.len() >= 6, "[{b}] {ticks:?}");
        let gaps: Vec<_> = ticks.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
        assert!(gaps.is_empty(), "[{b}] ticks missing between {gaps:?}");

        // Each run says it was started by the schedule.
        let key = fired.keys().next_back().expect("a key");
        let run = survivor
            .run_by_key("tick", key)
            .await
            .expect("read")
            .expect("the run of the key");
        let history = survivor.history(run.id).await.expect("history");
        assert!(
            history.iter().any(|h| h.actor == "schedule:each-second"
                && matches!(&h.kind, HistoryKind::Other(k) if k == "scheduled")),
            "[{b}] {history:?}"
        );
        survivor.shutdown().await;
    }
}

/// Moves `clock` so that the database's time reads `at_ms` now.
fn set_db_time(clock: &TestClock, at_ms: i64) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    clock.set_offset_ms(at_ms - i64::try_from(now).expect("ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_cron_missed_ticks_follow_the_policy() {
    /// 2030-01-01T00:00:00.500Z: the first tick of a schedule each minute is 59.5 s away.
    const START_MS: i64 = 1_893_456_000_500;
    const MINUTE: i64 = 60_000;
    for db in backends().await {
        let b = db.backend;
        let clock = TestClock::new();
        set_db_time(&clock, START_MS);
        let schedules = [
            every("skip", "0 * * * * *", MissedTicks::Skip),
            every("once", "* * * * *", MissedTicks::FireOnce),
            every("all", "0 * * * * *", MissedTicks::FireAll { max: 3 }),
        ];
        let first = builder(&db, "cron-missed-1", &schedules)
            .with_test_clock(clock.clone())
            .start()
            .await
            .expect("first start");
        for s in first.schedules().await.expect("schedules") {
            assert_eq!(
                s.next_tick_at.timestamp_millis(),
                START_MS - 500 + MINUTE,
                "[{b}] {s:?}"
            );
        }
        first.shutdown().await;

        // Ten ticks pass while no engine runs: 00:01 to 00:10.
        clock.advance(Duration::from_millis(10 * 60_000));
        let second = builder(&db, "cron-missed-2", &schedules)
            .with_test_clock(clock.clone())
            .start()
            .await
            .expect("second start");
        let next = START_MS - 500 + 11 * MINUTE;
        eventually(
            Duration::from_secs(20),
            "every schedule caught up",
            || async {
                second
                    .schedules()
                    .await
                    .expect("schedules")
                    .iter()
                    .all(|s| s.next_tick_at.timestamp_millis() == next)
            },
        )
        .await;
        let fired = keys(&second).await;
        let minute = |m: i64| START_MS - 500 + m * MINUTE;
        assert_eq!(ticks_of(&fired, "skip"), Vec::<i64>::new(), "[{b}] skip");
        assert_eq!(ticks_of(&fired, "once"), vec![minute(10)], "[{b}] once");
        assert_eq!(
            ticks_of(&fired, "all"),
            vec![minute(8), minute(9), minute(10)],
            "[{b}] the latest three"
        );
        let all = schedule(&second, "all").await;
        assert_eq!(
            all.last_fired_at.map(|t| t.timestamp_millis()),
            Some(minute(10)),
            "[{b}]"
        );
        assert!(all.last_run_id.is_some(), "[{b}] {all:?}");
        assert_eq!(schedule(&second, "skip").await.last_fired_at, None, "[{b}]");

        // Restarting with the same expression keeps the next tick; a changed one moves it.
        second.shutdown().await;
        let changed = [every("all", "0 30 * * * *", MissedTicks::FireOnce)];
        let third = builder(&db, "cron-missed-3", &changed)
            .with_test_clock(clock.clone())
            .start()
            .await
            .expect("third start");
        let all = schedule(&third, "all").await;
        assert_eq!(
            all.next_tick_at.timestamp_millis(),
            START_MS - 500 + 30 * MINUTE,
            "[{b}] the next half hour"
        );
        assert_eq!(all.missed, MissedTicks::FireOnce, "[{b}]");
        assert_eq!(
            schedule(&third, "once")
                .await
                .next_tick_at
                .timestamp_millis(),
            next,
            "[{b}] a schedule the engine no longer declares is kept as it was"
        );
        third.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_cron_invalid_schedules_are_refused_naming_the_problem() {
    let bad = Schedule::cron("bad", "61 * * * *").expect_err("minute 61");
    assert!(
        matches!(&bad, Error::InvalidSchedule { name, reason } if name == "bad" && reason.contains("61 * * * *")),
        "{bad}"
    );
    let never = Schedule::cron("never", "0 0 30 2 *").expect_err("February 30th");
    assert!(matches!(never, Error::InvalidSchedule { .. }), "{never}");
    let zone = Schedule::cron("zoned", "0 0 2 * * *")
        .and_then(|s| s.time_zone("Mars/Olympus"))
        .expect_err("unknown zone");
    assert!(zone.to_string().contains("Mars/Olympus"), "{zone}");
    let moscow = Schedule::cron("zoned", "0 0 2 * * *")
        .and_then(|s| s.time_zone("Europe/Moscow"))
        .expect("a known zone");
    assert_eq!(moscow.zone(), "Europe/Moscow");
    let empty = Schedule::cron(" ", "* * * * *").expect_err("empty name");
    assert!(matches!(empty, Error::InvalidSchedule { .. }), "{empty}");

    for db in backends().await {
        let b = db.backend;
        let unknown = fast_builder(&db)
            .with_workflow(tick())
            .with_schedule(
                Schedule::cron("orphan", "* * * * *")
                    .expect("valid")
                    .workflow("nowhere"),
            )
            .start()
            .await
            .expect_err("unknown workflow");
        assert!(
            matches!(&unknown, Error::InvalidSchedule { name, reason } if name == "orphan" && reason.contains("nowhere")),
            "[{b}] {unknown}"
        );
        let twice = fast_builder(&db)
            .with_workflow(tick())
            .with_schedule(every("twin", "* * * * *", MissedTicks::Skip))
            .with_schedule(every("twin", "*/5 * * * *", MissedTicks::Skip))
            .start()
            .await
            .expect_err("a name declared twice");
        assert!(twice.to_string().contains("twin"), "[{b}] {twice}");
        let zero = fast_builder(&db)
            .with_workflow(tick())
            .with_schedule(every("none", "* * * * *", MissedTicks::FireAll { max: 0 }))
            .start()
            .await
            .expect_err("FireAll of no tick");
        assert!(zero.to_string().contains("max"), "[{b}] {zero}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_cron_pause_and_resume_through_the_api_and_the_cli() {
    for db in backends().await {
        let b = db.backend;
        let s = every("paused", "* * * * * *", MissedTicks::FireOnce);
        let engine = builder(&db, "cron-api", std::slice::from_ref(&s))
            .start()
            .await
            .expect("engine");
        let (addr, server) = serve_admin(
            &engine,
            admin_tokens("ops-secret-0123456789", "view-secret-0123456789"),
        )
        .await;
        let base = format!("http://{addr}/api/v1/schedules");
        let http = reqwest::Client::new();

        let (status, _) = answer(http.get(&base)).await;
        assert_eq!(status, 401, "[{b}] no token");
        let (status, _) = answer(
            http.post(format!("{base}/paused/pause"))
                .json(&serde_json::json!({ "reason": "x" })),
        )
        .await;
        assert_eq!(status, 401, "[{b}] no token to pause");
        let (status, body) = answer(http.get(&base).bearer_auth("view-secret-0123456789")).await;
        assert_eq!(status, 200, "[{b}] {body}");
        let listed = &body["schedules"][0];
        assert_eq!(listed["name"], "paused", "[{b}] {body}");
        assert_eq!(listed["expression"], "* * * * * *", "[{b}] {body}");
        assert!(listed["next_tick_at"].is_string(), "[{b}] {body}");
        let (status, body) = answer(
            http.post(format!("{base}/paused/pause"))
                .bearer_auth("view-secret-0123456789")
                .json(&serde_json::json!({ "reason": "x" })),
        )
        .await;
        assert_eq!(status, 403, "[{b}] a read-only token: {body}");
        let (status, body) = answer(
            http.post(format!("{base}/paused/pause"))
                .bearer_auth("ops-secret-0123456789")
                .json(&serde_json::json!({ "reason": " " })),
        )
        .await;
        assert_eq!(
            (status.as_u16(), body["error"]["code"].as_str()),
            (400, Some("reason_required")),
            "[{b}] {body}"
        );
        let (status, body) = answer(
            http.post(format!("{base}/nothing/pause"))
                .bearer_auth("ops-secret-0123456789")
                .json(&serde_json::json!({ "reason": "why" })),
        )
        .await;
        assert_eq!(status, 404, "[{b}] {body}");

        eventually(Duration::from_secs(20), "a tick fired", || async {
            !ticks_of(&keys(&engine).await, "paused").is_empty()
        })
        .await;
        let (status, body) = answer(
            http.post(format!("{base}/paused/pause"))
                .bearer_auth("ops-secret-0123456789")
                .json(&serde_json::json!({ "reason": "month-end freeze" })),
        )
        .await;
        assert_eq!(status, 200, "[{b}] {body}");
        assert_eq!(body["schedule"]["paused"], true, "[{b}] {body}");
        assert_eq!(body["schedule"]["paused_by"], "api:ops", "[{b}] {body}");
        assert_eq!(
            body["schedule"]["paused_reason"], "month-end freeze",
            "[{b}] {body}"
        );
        // A pass in flight when the pause committed may still fire the tick at hand.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let at_pause = ticks_of(&keys(&engine).await, "paused");
        // Three ticks come and go while paused: none fires.
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        assert_eq!(
            ticks_of(&keys(&engine).await, "paused"),
            at_pause,
            "[{b}] no tick fires while paused"
        );

        // The CLI lists it paused, with who and why, then resumes it.
        let url = db.url.clone();
        let list = crate::cli::json(&url, &["schedules"]).await;
        assert_eq!(list["schedules"][0]["paused_by"], "api:ops", "[{b}] {list}");
        let resumed = crate::cli::json(
            &url,
            &[
                "schedules",
                "resume",
                "paused",
                "--reason",
                "freeze over",
                "--as",
                "alice",
            ],
        )
        .await;
        assert_eq!(resumed["actor"], "cli:alice", "[{b}] {resumed}");
        assert_eq!(resumed["schedule"]["paused"], false, "[{b}] {resumed}");
        let last = *at_pause.last().expect("a tick before the pause");
        eventually(
            Duration::from_secs(20),
            "a tick after the resume",
            || async {
                ticks_of(&keys(&engine).await, "paused")
                    .last()
                    .is_some_and(|t| *t > last + 3_000)
            },
        )
        .await;
        let out = crate::cli::sagaflow(
            &url,
            &[
                "schedules",
                "pause",
                "nothing",
                "--reason",
                "x",
                "--as",
                "alice",
            ],
        )
        .await;
        crate::cli::code(&out, 3, "an unknown schedule");
        assert!(
            crate::cli::stderr(&out).contains("paused"),
            "[{b}] names the schedules there are: {}",
            crate::cli::stderr(&out)
        );

        server.abort();
        engine.shutdown().await;
    }
}

/// Two operators resume one paused schedule at once: each read it paused and chose its first
/// tick after "now". The one that writes second must not set the schedule due again at the
/// tick it chose, which the first one's resume may already have fired (a second run of the
/// tick under key policies that allow one): its write is conditioned on the schedule being
/// still paused with the expression it read, and misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_cron_a_resume_decided_from_a_stale_read_changes_nothing() {
    for db in backends().await {
        let b = db.backend;
        // Hourly: no tick fires while the test runs.
        let s = every("hourly", "0 0 * * * *", MissedTicks::FireOnce);
        let engine = builder(&db, "cron-resume", std::slice::from_ref(&s))
            .start()
            .await
            .expect("engine");
        let op = engine.operator().on_behalf_of("ops:ann", "maintenance");
        op.pause_schedule("hourly").await.expect("pause");
        let store = engine.store();
        let stale = store
            .schedule_get("hourly")
            .await
            .expect("read")
            .expect("stored");
        assert!(stale.paused, "[{b}]");
        let resumed = op.resume_schedule("hourly").await.expect("resume");
        // The other operator's resume, decided from its read while the schedule was paused,
        // at a tick of its own (an hour earlier than the first resume's).
        let earlier = resumed.next_tick_at.timestamp_millis() - 3_600_000;
        let applied = store
            .schedule_resume(&stale, earlier)
            .await
            .expect("resume");
        assert!(!applied, "[{b}] the stale resume applied");
        let now = schedule(&engine, "hourly").await;
        assert_eq!(now.next_tick_at, resumed.next_tick_at, "[{b}]");
        assert!(!now.paused, "[{b}]");
        // Resuming a resumed schedule is answered with it as it is.
        let again = op.resume_schedule("hourly").await.expect("resume again");
        assert_eq!(again.next_tick_at, resumed.next_tick_at, "[{b}]");
        engine.shutdown().await;
    }
}
