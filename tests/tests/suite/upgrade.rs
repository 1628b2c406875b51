//! An upgrade across the history migration (m0020, `then_states`), on both backends: a
//! database written before it, holding runs in every state a run rests in (pending, running
//! with a step parked on an event, paused, stopped in error, completed, compensated) and
//! their history one row per transition, is upgraded by the next start; every history reads
//! as it did, and every unfinished run is then finished. On PostgreSQL the same start also
//! applies the history partitioning (m0024): the rows written before become its first
//! partition.

use std::collections::BTreeMap;
use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Database, DatabaseConnection, Statement, Value};
use sagaflow::{
    Engine, EventTarget, EventWait, HistoryEvent, RunState, StartOptions, StartTime, StepContext,
    StepError, Uuid, Workflow,
};
use sagaflow_migrations::Migrator;
use sagaflow_testkit::services::{Scripted, Services};
use sagaflow_testkit::{TestDb, backends, check_history, expect_state};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use sea_orm_migration::MigratorTrait;
use serde_json::{Value as Json, json};

use crate::fixtures::{order_settings, parked, submit_order};

/// `approval@1`: `reserve`, then the event wait `approval` (event `go`), then `ship`, which
/// answers the approval it saw.
fn approval() -> Workflow {
    Workflow::builder("approval", 1)
        .step("reserve", |ctx: StepContext| async move {
            Ok::<_, StepError>(json!({ "run": ctx.run_id() }))
        })
        .wait_for_event("approval", EventWait::named("go"))
        .after(["reserve"])
        .step("ship", |ctx: StepContext| async move {
            ctx.dep::<Json>("approval")
        })
        .after(["approval"])
        .build()
        .expect("valid")
}

async fn start(db: &TestDb, services: &Services) -> Engine {
    let order = order_saga(OrderApis::from(services), order_settings(300, 2)).expect("saga");
    sagaflow_testkit::engine(db, vec![order, approval()]).await
}

/// What a history shows, without the ids (rewriting the rows gives them new ones).
type Shown = Vec<(
    String,
    Option<String>,
    String,
    String,
    Option<i32>,
    String,
    String,
)>;

fn shown(history: &[HistoryEvent]) -> Shown {
    history
        .iter()
        .map(|e| {
            (
                e.kind.to_string(),
                e.step.clone(),
                format!("{:?}", e.from),
                format!("{:?}", e.to),
                e.attempt,
                e.actor.clone(),
                format!("{:?} {}", e.detail, e.at.timestamp_millis()),
            )
        })
        .collect()
}

async fn exec(conn: &DatabaseConnection, sql: &str, values: Vec<Value>) {
    conn.execute_raw(Statement::from_sql_and_values(
        conn.get_database_backend(),
        sql,
        values,
    ))
    .await
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Rewrites the database into the shape of the release before m0020: the migration goes
/// down (the column `then_states` is dropped), and every history row that holds folded
/// state changes becomes one row per change, in order, as that release wrote them. Returns
/// how many rows held folded changes.
async fn as_before_the_migration(db: &TestDb) -> usize {
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    let rows = conn
        .query_all_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT run_id, step, event, from_state, to_state, attempt, actor, detail, at, \
             then_states FROM sagaflow_history ORDER BY id",
        ))
        .await
        .expect("read the history");
    let mut lines: Vec<Vec<Value>> = Vec::new();
    let mut folded_rows = 0;
    for r in &rows {
        let get = |c: &str| r.try_get::<Option<String>>("", c).expect(c);
        let run: Uuid = r.try_get("", "run_id").expect("run_id");
        let actor: String = r.try_get("", "actor").expect("actor");
        let at: i64 = r.try_get("", "at").expect("at");
        let attempt: Option<i32> = r.try_get("", "attempt").expect("attempt");
        lines.push(vec![
            run.into(),
            get("step").into(),
            r.try_get::<String>("", "event").expect("event").into(),
            get("from_state").into(),
            get("to_state").into(),
            attempt.into(),
            actor.clone().into(),
            get("detail").into(),
            at.into(),
        ]);
        let Some(then) = get("then_states") else {
            continue;
        };
        folded_rows += 1;
        let then: Vec<(Option<String>, Option<String>, Option<String>)> =
            serde_json::from_str(&then).expect("folded states");
        for (step, from, to) in then {
            lines.push(vec![
                run.into(),
                step.into(),
                "state".into(),
                from.into(),
                to.into(),
                Option::<i32>::None.into(),
                actor.clone().into(),
                Option::<String>::None.into(),
                at.into(),
            ]);
        }
    }
    // m0020 down, and every migration after it first.
    let from_m0020 = u32::try_from(Migrator::migrations().len() - 19).expect("count");
    Migrator::down(&conn, Some(from_m0020))
        .await
        .expect("m0020 down");
    exec(&conn, "DELETE FROM sagaflow_history", vec![]).await;
    for (id, mut line) in lines.into_iter().enumerate() {
        line.insert(0, i64::try_from(id + 1).expect("id").into());
        exec(
            &conn,
            "INSERT INTO sagaflow_history \
             (id, run_id, step, event, from_state, to_state, attempt, actor, detail, at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            line,
        )
        .await;
    }
    if db.backend == "postgres" {
        exec(
            &conn,
            "SELECT setval(pg_get_serial_sequence('sagaflow_history', 'id'), \
             (SELECT MAX(id) FROM sagaflow_history))",
            vec![],
        )
        .await;
    }
    let _ = conn.close().await;
    folded_rows
}

async fn folded_rows(engine: &Engine) -> i64 {
    let conn = engine.connection();
    let row = conn
        .query_one_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT COUNT(*) AS n FROM sagaflow_history WHERE then_states IS NOT NULL",
        ))
        .await
        .expect("count")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

async fn rows_in(engine: &Engine, table: &str) -> i64 {
    let conn = engine.connection();
    let row = conn
        .query_one_raw(Statement::from_string(
            conn.get_database_backend(),
            format!("SELECT COUNT(*) AS n FROM {table}"),
        ))
        .await
        .expect("count")
        .expect("a row");
    row.try_get("", "n").expect("n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_over_the_history_migration_keeps_every_run_and_its_history() {
    for db in backends().await {
        let b = db.backend;
        let services = Services::default();
        let engine = start(&db, &services).await;

        // Runs in every state a run rests in.
        let (completed, _) = submit_order(&engine, 0).await;
        expect_state(&engine, completed, RunState::Completed, b).await;
        services.script("ship", vec![Scripted::Permanent]);
        let (compensated, _) = submit_order(&engine, 1).await;
        expect_state(&engine, compensated, RunState::Compensated, b).await;
        // A pivot that may have shipped: stopped for an operator.
        services.script("ship", vec![Scripted::Hang, Scripted::Permanent]);
        let (stopped, _) = submit_order(&engine, 2).await;
        expect_state(&engine, stopped, RunState::Error, b).await;
        let order = Order::sample(3);
        let mut later = StartOptions::keyed(order.order_id.clone());
        later.start = StartTime::After(Duration::from_secs(3600));
        let pending = engine
            .start_with(ORDER_WORKFLOW, &order, later)
            .await
            .expect("start later")
            .id;
        let waiting = engine
            .start_with("approval", &(), StartOptions::keyed("w"))
            .await
            .expect("start")
            .id;
        parked(&engine, waiting).await;
        let paused = engine
            .start_with("approval", &(), StartOptions::keyed("p"))
            .await
            .expect("start")
            .id;
        parked(&engine, paused).await;
        engine.operator().pause(paused).await.expect("pause");
        let runs = [completed, compensated, stopped, pending, waiting, paused];
        let mut before = BTreeMap::new();
        for id in runs {
            let run = engine.run(id).await.expect("run").expect("exists");
            let history = engine.history(id).await.expect("history");
            before.insert(id, (run.state, shown(&history)));
        }
        assert!(
            before[&waiting].0 == RunState::Running && before[&paused].0 == RunState::Paused,
            "[{b}] {before:?}"
        );
        assert_eq!(before[&pending].0, RunState::Pending, "[{b}]");
        engine.shutdown().await;

        // The release before: one history row per transition, and no `then_states`.
        let folded = as_before_the_migration(&db).await;
        assert!(folded >= 6, "[{b}] the new engine folded {folded} row(s)");

        // The next start migrates; every run and every history reads as before.
        let services = Services::default();
        let engine = start(&db, &services).await;
        assert_eq!(folded_rows(&engine).await, 0, "[{b}] nothing folded yet");
        if b == "postgres" {
            // m0024 made the table partitioned, the old rows its first partition.
            let kept = rows_in(&engine, "sagaflow_history_before").await;
            assert!(
                kept > 0,
                "[{b}] the old rows are in the partition of before"
            );
            assert_eq!(
                kept,
                rows_in(&engine, "sagaflow_history").await,
                "[{b}] all of them, and nothing new yet"
            );
        }
        for (id, (state, history)) in &before {
            let run = engine.run(*id).await.expect("run").expect("exists");
            assert_eq!(run.state, *state, "[{b}] {id}");
            let now = engine.history(*id).await.expect("history");
            assert_eq!(&shown(&now), history, "[{b}] {id}");
        }

        // Every unfinished run finishes on the upgraded schema.
        let op = engine.operator();
        op.resume(paused).await.expect("resume");
        for (id, key) in [(waiting, "w"), (paused, "p")] {
            parked(&engine, id).await;
            engine
                .send_event(
                    EventTarget::key("approval", key),
                    "go",
                    &json!({ "ok": true }),
                )
                .await
                .expect("send");
            expect_state(&engine, id, RunState::Completed, b).await;
        }
        op.retry(stopped, "ship").await.expect("retry");
        expect_state(&engine, stopped, RunState::Completed, b).await;
        op.cancel(pending).await.expect("cancel");
        expect_state(&engine, pending, RunState::Compensated, b).await;
        assert!(
            folded_rows(&engine).await > 0,
            "[{b}] the upgraded schema folds again"
        );
        engine.shutdown().await;
        let report = check_history(&db).await;
        assert_eq!(report.runs_checked, 6, "[{b}]");
        assert!(report.is_clean(), "[{b}] {report}");
    }
}
