//! Published definitions: every engine records the workflows it runs (graph, roles,
//! policies, input schema) in the database, so that a console or an HTTP client can draw and
//! validate them without the application's code. A changed graph under an unchanged version
//! with unfinished runs raises a `definition_changed` alert.

use std::time::Duration;

use sagaflow::{AlertKind, Engine, StepContext, StepError, Workflow, WorkflowDescription};
use sagaflow_testkit::{TestDb, backends, fast_builder};
use serde::Deserialize;

/// The order's input, published as a JSON Schema.
#[derive(Deserialize, schemars::JsonSchema)]
#[allow(dead_code)] // read through its schema only
struct Order {
    /// Business id of the order.
    order_id: String,
    qty: u32,
}

/// `order@1`: reserve (undone by a release) → charge (the pivot), and with `ship`, a third
/// step after the charge. Step bodies never finish: runs stay unfinished.
fn order(ship: bool) -> Workflow {
    let idle = |_: StepContext| async { std::future::pending::<Result<(), StepError>>().await };
    let mut b = Workflow::builder("order", 1)
        .input::<Order>()
        .step("reserve", idle)
        .compensate(idle)
        .step("charge", idle)
        .after(["reserve"])
        .pivot();
    if ship {
        b = b.step("ship", idle).after(["charge"]).retriable();
    }
    b.build().expect("valid")
}

/// The kinds of the open alerts (each stored with its notice for the sinks).
async fn open_kinds(engine: &Engine) -> Vec<AlertKind> {
    engine
        .open_alerts()
        .await
        .expect("alerts")
        .into_iter()
        .map(|a| a.kind)
        .collect()
}

async fn start(db: &TestDb, id: &str, wf: Workflow, workers: bool) -> Engine {
    fast_builder(db)
        .with_instance_id(id)
        .with_workflow(wf)
        .with_workers(workers)
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

async fn published(engine: &Engine, backend: &str) -> (WorkflowDescription, String) {
    let defs = engine.definitions().await.expect("definitions");
    assert_eq!(defs.len(), 1, "[{backend}] {defs:?}");
    let d = defs.into_iter().next().expect("one");
    assert_eq!((d.key.as_str(), d.version), ("order@1", 1), "[{backend}]");
    let description = d.description.expect("readable");
    (description, d.published_by)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_publishes_the_graph_roles_policies_and_input_schema_of_its_workflows() {
    for db in backends().await {
        let b = db.backend;
        let engine = start(&db, "publisher-1", order(false), true).await;
        let (d, by) = published(&engine, b).await;
        assert_eq!(by, "publisher-1", "[{b}]");
        let steps: Vec<_> = d
            .steps
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.kind.as_str(),
                    s.after.clone(),
                    s.compensates,
                )
            })
            .collect();
        assert_eq!(
            steps,
            [
                ("reserve", "compensatable", vec![], true),
                ("charge", "pivot", vec!["reserve".to_owned()], false),
            ],
            "[{b}]"
        );
        let schema = d.input_schema.expect("the input type's schema");
        assert_eq!(schema["properties"]["qty"]["type"], "integer", "[{b}]");
        assert_eq!(
            schema["properties"]["order_id"]["description"], "Business id of the order.",
            "[{b}]"
        );
        engine.shutdown().await;

        // A client-only engine publishes too, and the same definition raises nothing.
        let client = start(&db, "client-1", order(false), false).await;
        let (again, by) = published(&client, b).await;
        assert_eq!((again.steps.len(), by.as_str()), (2, "client-1"), "[{b}]");
        let kinds = open_kinds(&client).await;
        assert!(kinds.is_empty(), "[{b}] {kinds:?}");
        client.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_graph_under_an_unchanged_version_raises_an_alert_while_its_runs_are_unfinished()
{
    for db in backends().await {
        let b = db.backend;

        // Without unfinished runs a changed graph just replaces the published one.
        let first = start(&db, "changer-1", order(false), false).await;
        first.shutdown().await;
        let second = start(&db, "changer-2", order(true), false).await;
        assert_eq!(published(&second, b).await.0.steps.len(), 3, "[{b}]");
        let kinds = open_kinds(&second).await;
        assert!(kinds.is_empty(), "[{b}] {kinds:?}");

        // A run accepted under the three-step graph, unfinished; then the graph changes back.
        second
            .start("order", &serde_json::json!({ "order_id": "o-1", "qty": 2 }))
            .await
            .expect("start");
        second.shutdown().await;
        let third = start(&db, "changer-3", order(false), false).await;
        assert_eq!(published(&third, b).await.0.steps.len(), 2, "[{b}]");
        assert_eq!(
            open_kinds(&third).await,
            [AlertKind::DefinitionChanged],
            "[{b}]"
        );
        let open = third.open_alerts().await.expect("alerts");
        let alert = open
            .iter()
            .find(|a| a.kind == AlertKind::DefinitionChanged)
            .unwrap_or_else(|| panic!("[{b}] no open definition_changed alert in {open:?}"));
        assert!(
            alert.reason.contains("`order` version 1") && alert.reason.contains("1 run(s)"),
            "[{b}] {}",
            alert.reason
        );
        third.shutdown().await;

        // Started again with the same graph: the alert stays open once, not raised again.
        let fourth = start(&db, "changer-4", order(false), false).await;
        let kinds = open_kinds(&fourth).await;
        assert_eq!(kinds, [AlertKind::DefinitionChanged], "[{b}] {kinds:?}");
        tokio::time::timeout(Duration::from_secs(10), fourth.shutdown())
            .await
            .expect("shutdown");
    }
}

/// Two engines publish a version's first row at once, with different graphs, while runs of
/// the first one's begin: the second must see the first's row (it waits for it) and raise the
/// alert, not find no row and overwrite the graph unseen. PostgreSQL only: on SQLite the
/// second engine's transaction waits for the first's whole, and the race cannot happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_graph_published_at_the_same_moment_as_the_first_one_raises_the_alert() {
    use sagaflow::sea_orm::{ConnectionTrait, Database, Statement, TransactionTrait};
    for db in backends().await {
        let b = db.backend;
        if b != "postgres" {
            continue;
        }
        // The three-step graph's text, and a run of it left unfinished; then its row is gone,
        // as before the first engine published it.
        let first = start(&db, "first-1", order(true), false).await;
        first
            .start("order", &serde_json::json!({ "order_id": "o-1", "qty": 2 }))
            .await
            .expect("start");
        first.shutdown().await;
        let conn = Database::connect(db.url.as_str()).await.expect("connect");
        let pg = conn.get_database_backend();
        let row = conn
            .query_one_raw(Statement::from_string(
                pg,
                "SELECT description FROM sagaflow_definitions WHERE workflow_key = 'order@1'",
            ))
            .await
            .expect("read")
            .expect("published");
        let text: String = row.try_get("", "description").expect("description");
        conn.execute_raw(Statement::from_string(
            pg,
            "DELETE FROM sagaflow_definitions WHERE workflow_key = 'order@1'",
        ))
        .await
        .expect("delete");
        // The first engine's publication, not yet committed.
        let publishing = conn.begin().await.expect("begin");
        publishing
            .execute_raw(Statement::from_sql_and_values(
                pg,
                "INSERT INTO sagaflow_definitions \
                   (workflow_key, name, version, description, published_by, published_at) \
                 VALUES ('order@1', 'order', 1, $1, 'first-2', 0)",
                [text.into()],
            ))
            .await
            .expect("insert");
        // The second engine starts and reaches the row the first holds; then the first
        // commits.
        let waits = async {
            loop {
                let n = conn
                    .query_one_raw(Statement::from_string(
                        pg,
                        "SELECT COUNT(*) AS n FROM pg_stat_activity \
                         WHERE wait_event_type = 'Lock' AND query LIKE '%sagaflow_definitions%' \
                           AND datname = current_database() AND pid <> pg_backend_pid()",
                    ))
                    .await
                    .expect("activity")
                    .map_or(0, |r| r.try_get::<i64>("", "n").expect("n"));
                if n > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let first_commits = async {
            tokio::time::timeout(Duration::from_secs(20), waits)
                .await
                .unwrap_or_else(|_| panic!("[{b}] the second engine's publication waits"));
            publishing.commit().await.expect("commit");
        };
        let (second, ()) = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::join!(start(&db, "second-1", order(false), false), first_commits)
        })
        .await
        .unwrap_or_else(|_| panic!("[{b}] the second engine starts"));
        assert_eq!(
            open_kinds(&second).await,
            [AlertKind::DefinitionChanged],
            "[{b}] a graph replaced while its run is unfinished"
        );
        assert_eq!(published(&second, b).await.0.steps.len(), 2, "[{b}]");
        second.shutdown().await;
    }
}
