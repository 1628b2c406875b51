//! History and finished runs partitioned by time on PostgreSQL (issue 32): retention drops a
//! past day's partitions once none of its runs is kept, instead of deleting the runs and
//! their history row by row.
//!
//! Runs are filled at ages from two hours into the day that began at least 7 days and 3
//! hours ago, back to 10 days (the fill makes the partitions of those days, as an engine
//! running then would have), so that with a retention of 7 days every filled run is due,
//! whatever the time of day the test runs at. Two runs of those days are written by a
//! transaction that is still open when the pass begins: the pass's first look finds the
//! oldest day empty and goes for its partition, then waits for the table's lock behind that
//! transaction. Once it commits, the pass looks again under the lock: the oldest day's run
//! is kept (a run that started ten days ago and still runs), so its history moves to the
//! default partition and the day goes; the newest day's run keeps its day, which is still
//! within reach of the retention. Nothing of either run is lost, the history of the purged runs is gone, and the
//! partitions of the coming days exist. A run of the oldest day that finished an hour ago is
//! kept too: its row moves to the finished runs' default partition.
//!
//! The filled runs are finished and hold no active key, so they are where the engine puts
//! such runs at their end: in the finished runs' table, by day. A day's finished runs go
//! with the day, and wait for it while another run of the day is kept.

use std::time::Duration;

use sagaflow::sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value,
};
use sagaflow::{Engine, StepContext, StepError, Uuid, Workflow};
use sagaflow_migrations::partitions::{
    HISTORY_DEFAULT_PARTITION, HISTORY_PARTITION_SPAN_MS, RUNS_DONE, RUNS_DONE_DEFAULT_PARTITION,
    history_partition_name, partition_name,
};
use sagaflow_testkit::{eventually, postgres_db};

use crate::fixtures::postgres_wanted;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const RETENTION_MS: i64 = 7 * DAY;
const RETENTION: Duration = Duration::from_millis(RETENTION_MS.unsigned_abs());

fn noop() -> Workflow {
    Workflow::builder("noop", 1)
        .step("only", |_ctx: StepContext| async move {
            Ok::<_, StepError>(serde_json::json!(true))
        })
        .build()
        .expect("valid")
}

async fn one_i64(conn: &DatabaseConnection, sql: &str, values: Vec<Value>) -> i64 {
    conn.query_one_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        values,
    ))
    .await
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
    .expect("a row")
    .try_get("", "n")
    .expect("n")
}

/// The partitions of the history table and of the finished runs' table, by name.
async fn partitions(conn: &DatabaseConnection) -> Vec<String> {
    let rows = conn
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT c.relname::text AS name FROM pg_inherits AS i \
             JOIN pg_class AS c ON c.oid = i.inhrelid \
             WHERE i.inhparent IN ('sagaflow_history'::regclass, 'sagaflow_runs_done'::regclass) \
             ORDER BY 1",
        ))
        .await
        .expect("partitions");
    rows.iter()
        .map(|r| r.try_get::<String>("", "name").expect("name"))
        .collect()
}

/// A run id of the millisecond `ms`, as an engine whose clock read `ms` would mint.
fn id_at(ms: i64) -> Uuid {
    let random = Uuid::new_v4().as_u128() & ((1 << 76) - 1);
    let ms = u128::try_from(ms).expect("after 1970");
    Uuid::from_u128((ms << 80) | (0x7 << 76) | random)
}

/// Writes a running run of `noop@1` with the id `id` and one history row, on `conn`.
async fn running_run<C: ConnectionTrait>(conn: &C, id: Uuid, now: i64) {
    for (sql, values) in [
        (
            "INSERT INTO sagaflow_runs (id, workflow, version, workflow_key, state, input, \
             created_at, updated_at) VALUES ($1, 'noop', 1, 'noop@1', 'running', 'null', $2, $2)",
            vec![id.into(), now.into()],
        ),
        (
            "INSERT INTO sagaflow_history (run_id, event, to_state, actor, at) \
             VALUES ($1, 'submitted', 'running', 'test', $2)",
            vec![id.into(), now.into()],
        ),
    ] {
        conn.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_past_days_whole_and_keeps_the_history_of_kept_runs() {
    if !postgres_wanted("the history partitions") {
        return;
    }
    let Some(db) = postgres_db().await else {
        return;
    };
    let engine = Engine::builder()
        .with_database_url(db.url.clone())
        .with_workflow(noop())
        .with_retention(None)
        .with_workers(false)
        .start()
        .await
        .expect("engine");
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    let now = one_i64(
        &conn,
        "SELECT (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT AS n",
        vec![],
    )
    .await;
    let day_of = |ms: i64| ms.div_euclid(HISTORY_PARTITION_SPAN_MS) * HISTORY_PARTITION_SPAN_MS;
    // The newest filled run two hours into its day, and at least an hour older than the
    // retention, whatever the time of day: the newest filled day then holds filled runs
    // and, an hour into it, the recent run below. (A fixed age of 7 days and 1 hour put the
    // recent run on the day before when the test ran between 01:00 and 02:00 UTC.)
    let newest = now - (day_of(now - RETENTION_MS - 3 * HOUR) + 2 * HOUR);
    let oldest = 10 * DAY;
    engine
        .store()
        .run_fill_finished(300, newest..oldest)
        .await
        .expect("fill");
    let (first_day, last_day) = (day_of(now - oldest), day_of(now - newest));
    let before = partitions(&conn).await;
    for day in [first_day, last_day] {
        for name in [history_partition_name(day), partition_name(RUNS_DONE, day)] {
            assert!(
                before.contains(&name),
                "the fill made the partitions of its days: {before:?}"
            );
        }
    }
    let filled = "workflow IN ('archive', 'archive_b')";
    let count_in = |table: &'static str| {
        let conn = conn.clone();
        async move {
            one_i64(
                &conn,
                &format!("SELECT COUNT(*) AS n FROM {table} WHERE {filled}"),
                vec![],
            )
            .await
        }
    };
    assert_eq!(
        (count_in("sagaflow_runs").await, count_in(RUNS_DONE).await),
        (0, 300),
        "finished runs with no active key are in the finished runs' table"
    );
    let purged: Uuid = conn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT id FROM sagaflow_runs_all WHERE workflow = 'archive' ORDER BY created_at LIMIT 1",
        ))
        .await
        .expect("a filled run")
        .expect("a row")
        .try_get("", "id")
        .expect("id");

    // Two runs of those days, written by a transaction still open when the pass begins.
    let (old_run, recent_run) = (id_at(first_day + 1000), id_at(now - newest - HOUR));
    assert_eq!(
        day_of(now - newest - HOUR),
        last_day,
        "the recent run's day"
    );
    let writer = conn.begin().await.expect("begin");
    running_run(&writer, old_run, now).await;
    running_run(&writer, recent_run, now).await;
    // A run of the oldest day that finished an hour ago, ended as the engine ends one.
    let late_finisher = id_at(first_day + 3000);
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO sagaflow_runs_done (id, workflow, version, workflow_key, state, input, \
         created_at, updated_at, finished_at) \
         VALUES ($1, 'noop', 1, 'noop@1', 'completed', 'null', $2, $3, $3)",
        vec![late_finisher.into(), first_day.into(), (now - HOUR).into()],
    ))
    .await
    .expect("a late finisher");

    let pass = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.purge_finished(RETENTION).await })
    };
    // The pass waits for the history table's lock behind the open transaction.
    eventually(
        Duration::from_secs(20),
        "the drop waits for the lock",
        || {
            let conn = conn.clone();
            async move {
                one_i64(
                    &conn,
                    "SELECT COUNT(*) AS n FROM pg_locks \
                 WHERE relation = 'sagaflow_history'::regclass AND mode = 'AccessExclusiveLock' \
                 AND NOT granted",
                    vec![],
                )
                .await
                    == 1
            }
        },
    )
    .await;
    writer.commit().await.expect("commit");
    let mut gone = pass.await.expect("task").expect("the pass");
    // On a machine slow enough that the commit came after the drop's 500 ms wait, the pass
    // left the day for the next one: that one takes it, and nothing may be lost either way.
    if partitions(&conn)
        .await
        .contains(&history_partition_name(first_day))
    {
        gone += engine
            .purge_finished(RETENTION)
            .await
            .expect("the next pass");
    }
    // The filled runs of the days that went went with them; those of the newest day wait
    // for it, which its recent run keeps.
    let waiting = count_in(RUNS_DONE).await;
    assert!(
        waiting > 0 && waiting < 300,
        "the newest filled day's runs wait for their day: {waiting}"
    );
    assert_eq!(gone + u64::try_from(waiting).expect("count"), 300);
    // The run totals count what is left.
    let filled_total = || async {
        let stats = engine.stats().await.expect("stats");
        stats
            .finished
            .iter()
            .filter(|c| c.workflow.starts_with("archive"))
            .map(|c| c.runs)
            .sum::<i64>()
    };
    assert_eq!(
        filled_total().await,
        waiting,
        "the runs gone left the totals"
    );
    // Their business keys, kept in the key table, went with them.
    assert_eq!(
        count_in("sagaflow_run_keys").await,
        waiting,
        "the keys of the runs gone are free"
    );

    let after = partitions(&conn).await;
    let both = |day: i64| [history_partition_name(day), partition_name(RUNS_DONE, day)];
    for name in both(first_day) {
        assert!(
            !after.contains(&name),
            "the oldest day went with its kept runs moved out: {after:?}"
        );
    }
    for name in both(last_day) {
        assert!(
            after.contains(&name),
            "the newest filled day stays while its run is kept and within reach: {after:?}"
        );
    }
    let mut day = first_day + DAY;
    while day < last_day {
        for name in both(day) {
            assert!(
                !after.contains(&name),
                "a day with no kept run went: {after:?}"
            );
        }
        day += DAY;
    }
    for ahead in [day_of(now), day_of(now) + DAY] {
        for name in both(ahead) {
            assert!(
                after.contains(&name),
                "the partitions of the coming days exist: {after:?}"
            );
        }
    }
    // The late finisher is kept, in the finished runs' default partition, readable.
    assert_eq!(
        one_i64(
            &conn,
            &format!("SELECT COUNT(*) AS n FROM {RUNS_DONE_DEFAULT_PARTITION} WHERE id = $1"),
            vec![late_finisher.into()],
        )
        .await,
        1
    );
    assert!(
        engine.run(late_finisher).await.is_ok(),
        "the late finisher is readable"
    );
    // Nothing of the kept runs is lost; the old one's history moved to the default
    // partition, and what it writes from now on lands there too.
    for run in [old_run, recent_run] {
        let history = engine.history(run).await.expect("history");
        assert_eq!(history.len(), 1, "{run}: {history:?}");
    }
    let late = id_at(first_day + 2000);
    running_run(&conn, late, now).await;
    let in_default = |run: Uuid| {
        let conn = conn.clone();
        async move {
            one_i64(
                &conn,
                &format!("SELECT COUNT(*) AS n FROM {HISTORY_DEFAULT_PARTITION} WHERE run_id = $1"),
                vec![run.into()],
            )
            .await
        }
    };
    assert_eq!(in_default(old_run).await, 1);
    assert_eq!(in_default(late).await, 1);
    // A purged run's history is neither readable nor stored once its day went.
    assert!(engine.history(purged).await.expect("history").is_empty());
    let left = one_i64(
        &conn,
        "SELECT COUNT(*) AS n FROM sagaflow_history WHERE run_id = $1",
        vec![purged.into()],
    )
    .await;
    assert_eq!(left, 0, "the history of a purged run of a day gone is gone");

    // Once the recent run is done and due as well, its day goes too.
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "UPDATE sagaflow_runs SET state = 'completed', finished_at = $2 WHERE id = $1",
        vec![recent_run.into(), (now - 8 * DAY).into()],
    ))
    .await
    .expect("finish");
    let second = engine.purge_finished(RETENTION).await.expect("second pass");
    assert_eq!(
        second,
        u64::try_from(waiting + 1).expect("count"),
        "the recent run, and the newest day's finished runs with their day"
    );
    assert_eq!(count_in(RUNS_DONE).await, 0);
    assert_eq!(filled_total().await, 0, "the totals of the filled runs");
    assert_eq!(
        count_in("sagaflow_run_keys").await,
        0,
        "the keys of the filled runs"
    );
    let after = partitions(&conn).await;
    for name in both(last_day) {
        assert!(!after.contains(&name), "{after:?}");
    }
    assert_eq!(engine.history(old_run).await.expect("history").len(), 1);
    let orphans = one_i64(
        &conn,
        "SELECT COUNT(*) AS n FROM sagaflow_history AS h \
         WHERE NOT EXISTS (SELECT 1 FROM sagaflow_runs_all AS r WHERE r.id = h.run_id)",
        vec![],
    )
    .await;
    assert_eq!(orphans, 0, "no history of a purged run is left behind");
    engine.shutdown().await;
}

/// Where run `id`'s row is: `"live"` (the runs table), `"done"` (the finished runs') or
/// `"nowhere"`.
async fn where_is(conn: &DatabaseConnection, id: Uuid) -> &'static str {
    let row = conn
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            format!(
                "SELECT (SELECT COUNT(*) FROM sagaflow_runs WHERE id = $1) AS live, \
                 (SELECT COUNT(*) FROM {RUNS_DONE} WHERE id = $1) AS done"
            ),
            vec![id.into()],
        ))
        .await
        .expect("where is the run")
        .expect("a row");
    let n = |c: &str| row.try_get::<i64>("", c).expect("a count");
    match (n("live"), n("done")) {
        (1, 0) => "live",
        (0, 1) => "done",
        (0, 0) => "nowhere",
        _ => "both",
    }
}

/// A run that ends for good moves into the finished runs' table at its end, and reads as
/// before: by id, in lists, its history; an operator's action on it is refused as on any
/// finished run (not "no such run"), an event to it too, and a restart from it works and
/// links the two. A business key it keeps after its end (the default policy) stays taken in
/// the key table: starting the workflow with it again returns the finished run; one its
/// policy releases is free. The two tables and the view of both have the same columns, in
/// the same order (a run moves with `DELETE … RETURNING` into `INSERT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_moves_to_the_finished_table_and_reads_as_before() {
    if !postgres_wanted("the finished runs' table") {
        return;
    }
    let Some(db) = postgres_db().await else {
        return;
    };
    let keyed = |name: &str, policy: sagaflow::KeyPolicy| {
        Workflow::builder(name, 1)
            .business_keys(policy)
            .step("only", |_ctx: StepContext| async move {
                Ok::<_, StepError>(serde_json::json!(true))
            })
            .build()
            .expect("valid")
    };
    let engine = Engine::builder()
        .with_database_url(db.url.clone())
        .with_workflow(noop())
        .with_workflow(keyed("retained", sagaflow::KeyPolicy::WhileRetained))
        .with_workflow(keyed("active", sagaflow::KeyPolicy::WhileActive))
        .with_retention(None)
        .start()
        .await
        .expect("engine");
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    let wait = Duration::from_secs(30);

    let plain = engine
        .start("noop", &serde_json::json!(null))
        .await
        .expect("start");
    let retained = engine
        .start_with(
            "retained",
            &serde_json::json!(null),
            sagaflow::StartOptions::keyed("k1"),
        )
        .await
        .expect("start")
        .id;
    let active = engine
        .start_with(
            "active",
            &serde_json::json!(null),
            sagaflow::StartOptions::keyed("k1"),
        )
        .await
        .expect("start")
        .id;
    for id in [plain, retained, active] {
        let run = engine.wait(id, wait).await.expect("finishes");
        assert_eq!(run.state, sagaflow::RunState::Completed, "{id}");
    }
    for id in [plain, active, retained] {
        assert_eq!(where_is(&conn, id).await, "done", "{id}");
    }
    // The kept key still returns the finished run; the released one starts a new run.
    let again = engine
        .start_with(
            "retained",
            &serde_json::json!(null),
            sagaflow::StartOptions::keyed("k1"),
        )
        .await
        .expect("start");
    assert_eq!((again.id, again.created), (retained, false));
    let fresh = engine
        .start_with(
            "active",
            &serde_json::json!(null),
            sagaflow::StartOptions::keyed("k1"),
        )
        .await
        .expect("start");
    assert!(fresh.created && fresh.id != active, "{fresh:?}");
    engine.wait(fresh.id, wait).await.expect("finishes");

    // Reads.
    let run = engine.run(plain).await.expect("read").expect("found");
    assert_eq!(run.state, sagaflow::RunState::Completed);
    assert!(!engine.history(plain).await.expect("history").is_empty());
    let detail = engine
        .run_detail(plain)
        .await
        .expect("read")
        .expect("found");
    assert_eq!(detail.run.state, sagaflow::RunState::Completed);
    let listed = engine
        .list_runs(&sagaflow::RunQuery::default())
        .await
        .expect("list");
    for id in [plain, retained, active] {
        assert!(listed.runs.iter().any(|r| r.id == id), "{id} is listed");
    }
    assert_eq!(
        engine
            .run_by_key("retained", "k1")
            .await
            .expect("by key")
            .map(|r| r.id),
        Some(retained)
    );

    // Actions on it are refused as on a finished run.
    let op = engine.operator();
    match op.cancel(plain).await {
        Err(sagaflow::Error::ActionNotAllowed { .. }) => {}
        other => panic!("a cancel of a finished run: {other:?}"),
    }
    match engine
        .send_event(plain, "poke", &serde_json::json!(1))
        .await
    {
        Err(sagaflow::Error::ActionNotAllowed { .. }) => {}
        other => panic!("an event to a finished run: {other:?}"),
    }
    // A restart from it runs again and links the two.
    let restarted = op.restart_from(plain, "only", None).await.expect("restart");
    engine
        .wait(restarted.id, wait)
        .await
        .expect("the restart finishes");
    let source = engine.run(plain).await.expect("read").expect("found");
    assert_eq!(source.restarted_as, Some(restarted.id));
    match op.restart_from(plain, "only", None).await {
        Err(sagaflow::Error::ActionNotAllowed { .. }) => {}
        other => panic!("a second restart of the same run: {other:?}"),
    }

    // The same columns in the same order.
    let columns = |table: &'static str| {
        let conn = conn.clone();
        async move {
            conn.query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT column_name::text AS c, data_type::text AS t FROM information_schema.columns \
                 WHERE table_name = $1 ORDER BY ordinal_position",
                vec![table.into()],
            ))
            .await
            .expect("columns")
            .iter()
            .map(|r| {
                (
                    r.try_get::<String>("", "c").expect("c"),
                    r.try_get::<String>("", "t").expect("t"),
                )
            })
            .collect::<Vec<_>>()
        }
    };
    let live = columns("sagaflow_runs").await;
    assert_eq!(columns(RUNS_DONE).await, live);
    assert_eq!(columns("sagaflow_runs_all").await, live);
    let named: Vec<String> = sagaflow_migrations::partitions::RUN_TABLE_COLUMNS
        .split(',')
        .map(|c| c.trim().to_owned())
        .collect();
    let names: Vec<String> = live.into_iter().map(|(c, _)| c).collect();
    assert_eq!(
        names, named,
        "RUN_TABLE_COLUMNS names the runs table's columns in order"
    );
    engine.shutdown().await;
}
