//! History partitioned by time on PostgreSQL (issue 32): retention drops a past day's
//! partition once none of its runs is kept, instead of deleting the history row by row.
//!
//! Runs are filled at ages of 7 days and 1 hour to 10 days (the fill makes the partitions of
//! those days, as an engine running then would have), so that with a retention of 7 days
//! every filled run is due. Two runs of those days are written by a transaction that is
//! still open when the pass begins: the pass's first look finds the oldest day empty and goes
//! for its partition, then waits for the table's lock behind that transaction. Once it
//! commits, the pass looks again under the lock: the oldest day's run is kept (a run that
//! started ten days ago and still runs), so its history moves to the default partition and
//! the day goes; the newest day's run keeps its day, which is still within reach of the
//! retention. Nothing of either run is lost, the history of the purged runs is gone, and the
//! partitions of the coming days exist.

use std::time::Duration;

use sagaflow::sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value,
};
use sagaflow::{Engine, StepContext, StepError, Uuid, Workflow};
use sagaflow_migrations::partitions::{
    HISTORY_DEFAULT_PARTITION, HISTORY_PARTITION_SPAN_MS, history_partition_name,
};
use sagaflow_testkit::{eventually, postgres_db};

use crate::fixtures::postgres_wanted;

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;
const RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

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

/// The history table's partitions, by name.
async fn partitions(conn: &DatabaseConnection) -> Vec<String> {
    let rows = conn
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT c.relname::text AS name FROM pg_inherits AS i \
             JOIN pg_class AS c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'sagaflow_history'::regclass ORDER BY 1",
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
    let (newest, oldest) = (7 * DAY + HOUR, 10 * DAY);
    engine
        .store()
        .run_fill_finished(300, newest..oldest)
        .await
        .expect("fill");
    let day_of = |ms: i64| ms.div_euclid(HISTORY_PARTITION_SPAN_MS) * HISTORY_PARTITION_SPAN_MS;
    let (first_day, last_day) = (day_of(now - oldest), day_of(now - newest));
    let before = partitions(&conn).await;
    for day in [first_day, last_day] {
        assert!(
            before.contains(&history_partition_name(day)),
            "the fill made the partitions of its days: {before:?}"
        );
    }
    let purged: Uuid = conn
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT id FROM sagaflow_runs WHERE workflow = 'archive' ORDER BY created_at LIMIT 1",
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
    let gone = pass.await.expect("task").expect("the pass");
    assert_eq!(gone, 300, "every filled run was due");
    // On a machine slow enough that the commit came after the drop's 500 ms wait, the pass
    // left the day for the next one: that one takes it, and nothing may be lost either way.
    if partitions(&conn)
        .await
        .contains(&history_partition_name(first_day))
    {
        engine
            .purge_finished(RETENTION)
            .await
            .expect("the next pass");
    }

    let after = partitions(&conn).await;
    assert!(
        !after.contains(&history_partition_name(first_day)),
        "the oldest day went with its kept run moved out: {after:?}"
    );
    assert!(
        after.contains(&history_partition_name(last_day)),
        "the newest filled day stays while its run is kept and within reach: {after:?}"
    );
    let mut day = first_day + DAY;
    while day < last_day {
        assert!(
            !after.contains(&history_partition_name(day)),
            "a day with no kept run went: {after:?}"
        );
        day += DAY;
    }
    for ahead in [day_of(now), day_of(now) + DAY] {
        assert!(
            after.contains(&history_partition_name(ahead)),
            "the partitions of the coming days exist: {after:?}"
        );
    }
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
    engine.purge_finished(RETENTION).await.expect("second pass");
    let after = partitions(&conn).await;
    assert!(
        !after.contains(&history_partition_name(last_day)),
        "{after:?}"
    );
    assert_eq!(engine.history(old_run).await.expect("history").len(), 1);
    let orphans = one_i64(
        &conn,
        "SELECT COUNT(*) AS n FROM sagaflow_history AS h \
         WHERE NOT EXISTS (SELECT 1 FROM sagaflow_runs AS r WHERE r.id = h.run_id)",
        vec![],
    )
    .await;
    assert_eq!(orphans, 0, "no history of a purged run is left behind");
    engine.shutdown().await;
}
