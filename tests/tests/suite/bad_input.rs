//! The bad-input catalogue: one test per way the world hands the engine something broken.
//! Each asserts the typed error or the alert, and that the healthy runs in flight beside it
//! finished normally (a fault costs what it touches, never its neighbours). Select them with
//! `cargo test bad_input`.

use std::time::{Duration, Instant};

use sagaflow::sea_orm::{ConnectionTrait, Database, Statement};
use sagaflow::{Engine, Error, Health, RunState, StepContext, StepError, Workflow};
use sagaflow_tests::{TestDb, backends, eventually_some, expect_state, fast_builder, sqlite_db};
use sagaflow_workflows::order::ORDER_WORKFLOW;
use uuid::Uuid;

use crate::fixtures::{OrderRig, order_rig, submit_order};

/// Healthy order sagas in flight beside the fault.
struct Neighbours {
    rig: OrderRig,
    ids: Vec<Uuid>,
    backend: &'static str,
}

const NEIGHBOURS: usize = 8;

async fn neighbours(db: &TestDb, first: usize) -> Neighbours {
    let rig = order_rig(db, 2_000, 3).await;
    let mut ids = Vec::new();
    for n in first..first + NEIGHBOURS {
        ids.push(submit_order(&rig.engine, n).await.0);
    }
    Neighbours {
        rig,
        ids,
        backend: db.backend,
    }
}

impl Neighbours {
    /// Every healthy run completed, and the engine is still healthy.
    async fn finished_normally(&self) {
        for id in &self.ids {
            expect_state(&self.rig.engine, *id, RunState::Completed, self.backend).await;
        }
        assert!(
            matches!(self.rig.engine.health(), Health::Running),
            "[{}] the neighbours' engine is {:?}",
            self.backend,
            self.rig.engine.health()
        );
    }

    async fn stop(self) {
        self.rig.engine.shutdown().await;
    }
}

async fn neighbours_finish(db: &TestDb, check: impl AsyncFnOnce(&Neighbours)) {
    let n = neighbours(db, 0).await;
    check(&n).await;
    n.finished_normally().await;
    n.stop().await;
}

fn noop()
-> impl Fn(StepContext) -> std::future::Ready<Result<(), StepError>> + Send + Sync + 'static {
    |_| std::future::ready(Ok(()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_cyclic_graph() {
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            let e = Workflow::builder("w", 1)
                .step("a", noop())
                .after(["b"])
                .step("b", noop())
                .after(["a"])
                .build()
                .expect_err("a cycle");
            assert!(
                matches!(&e, Error::InvalidDefinition { reason, .. } if reason.contains("cycle")),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_duplicate_step() {
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            let e = Workflow::builder("w", 1)
                .step("a", noop())
                .step("a", noop())
                .build()
                .expect_err("a duplicate");
            assert!(
                matches!(&e, Error::InvalidDefinition { reason, .. } if reason.contains("duplicate step name `a`")),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_dependency() {
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            let e = Workflow::builder("w", 1)
                .step("a", noop())
                .after(["ghost"])
                .build()
                .expect_err("an unknown dependency");
            assert!(
                matches!(&e, Error::InvalidDefinition { reason, .. } if reason.contains("unknown step `ghost`")),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unknown_workflow_at_submit() {
    for db in backends().await {
        neighbours_finish(&db, async |n| {
            let e = n
                .rig
                .engine
                .start("no-such-workflow", &serde_json::json!({}))
                .await
                .expect_err("unknown workflow");
            assert!(
                matches!(&e, Error::WorkflowNotFound(w) if w == "no-such-workflow"),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_input_of_the_wrong_shape() {
    for db in backends().await {
        neighbours_finish(&db, async |n| {
            let e = n
                .rig
                .engine
                .start(ORDER_WORKFLOW, &serde_json::json!({"order_id": 7}))
                .await
                .expect_err("wrong shape");
            assert!(
                matches!(&e, Error::InvalidInput { workflow, .. } if workflow == ORDER_WORKFLOW),
                "{e}"
            );
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_oversized_input() {
    for db in backends().await {
        let rig = order_rig(&db, 2_000, 3).await;
        // The neighbours' engine keeps the default limit; this one takes at most 1 KiB.
        let wf = sagaflow_workflows::order::order_saga(
            sagaflow_workflows::order::OrderApis::from(&rig.services),
            crate::fixtures::order_settings(2_000, 3),
        )
        .expect("saga");
        let small = fast_builder(&db)
            .with_workflow(wf)
            .with_max_input_bytes(1024)
            .with_workers(false)
            .start()
            .await
            .expect("start");
        let mut order = sagaflow_workflows::order::Order::sample(900);
        order.address = "x".repeat(4096);
        let e = small
            .start(ORDER_WORKFLOW, &order)
            .await
            .expect_err("oversized");
        assert!(
            matches!(&e, Error::PayloadTooLarge { limit: 1024, size, .. } if *size > 4096),
            "[{}] {e}",
            db.backend
        );
        small.shutdown().await;
        rig.engine.shutdown().await;
        neighbours_finish(&db, async |_| {}).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_malformed_url() {
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            for url in [
                "mysql://root@localhost/db",
                "postgres://user:secret@[::1/db",
                "postgres://user:secret@host:notaport/db",
            ] {
                let e = Engine::builder()
                    .with_database_url(url)
                    .with_workflow(
                        Workflow::builder("w", 1)
                            .step("a", noop())
                            .build()
                            .expect("wf"),
                    )
                    .start()
                    .await
                    .expect_err("malformed URL");
                let text = e.to_string();
                assert!(matches!(e, Error::Config(_)), "{url}: {text}");
                assert!(!text.contains("secret"), "the password leaked: {text}");
            }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_unreachable_postgres() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    for db in backends().await {
        neighbours_finish(&db, async |_| {
            let url = format!("postgres://sagaflow:hunter2@127.0.0.1:{port}/nowhere");
            let began = Instant::now();
            let e = Engine::builder()
                .with_database_url(url)
                .with_workflow(
                    Workflow::builder("w", 1)
                        .step("a", noop())
                        .build()
                        .expect("wf"),
                )
                .start()
                .await
                .expect_err("unreachable");
            let took = began.elapsed();
            let text = e.to_string();
            assert!(matches!(e, Error::Connect { .. }), "{text}");
            assert!(e.is_connection_lost(), "{text}");
            assert!(
                text.contains(&format!("127.0.0.1:{port}")),
                "names host and port: {text}"
            );
            assert!(
                text.to_lowercase().contains("refused"),
                "keeps the cause: {text}"
            );
            assert!(!text.contains("hunter2"), "the password leaked: {text}");
            assert!(took < Duration::from_secs(3), "took {took:?}");
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_read_only_sqlite() {
    let db = sqlite_db();
    // The neighbours write the file; a second engine opens it read-only.
    neighbours_finish(&db, async |_| {
        let url = db.url.replace("mode=rwc", "mode=ro");
        let e = fast_builder(&db)
            .with_database_url(url)
            .with_workflow(
                Workflow::builder("w", 1)
                    .step("a", noop())
                    .build()
                    .expect("wf"),
            )
            .start()
            .await
            .expect_err("read-only");
        assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
        assert_eq!(e.sqlite_code().map(|c| c & 0xff), Some(8), "{e}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_sqlite_file_deleted_mid_run() {
    // The neighbours run on their own database; the victim's file is deleted under it.
    let neighbours_db = sqlite_db();
    let n = neighbours(&neighbours_db, 0).await;
    let victim_db = sqlite_db();
    let victim = order_rig(&victim_db, 2_000, 3).await;
    for i in 100..110 {
        submit_order(&victim.engine, i).await;
    }
    let path = victim_db
        .url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .expect("path")
        .to_owned();
    std::fs::remove_file(&path).expect("delete the file");
    let fatal = tokio::time::timeout(Duration::from_secs(5), victim.engine.fatal_error())
        .await
        .expect("the engine notices within 5 s");
    assert!(
        matches!(&fatal, Error::DatabaseLost(why) if why.contains("deleted")),
        "{fatal}"
    );
    assert!(matches!(victim.engine.health(), Health::Failed(_)));
    let e = victim
        .engine
        .start(
            ORDER_WORKFLOW,
            &sagaflow_workflows::order::Order::sample(200),
        )
        .await
        .expect_err("no more starts");
    assert!(matches!(e, Error::DatabaseLost(_)), "{e}");
    victim.engine.shutdown().await;
    n.finished_normally().await;
    n.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_sqlite_file_replaced_mid_run() {
    let victim_db = sqlite_db();
    let victim = order_rig(&victim_db, 2_000, 3).await;
    let path = victim_db
        .url
        .trim_start_matches("sqlite://")
        .split('?')
        .next()
        .expect("path")
        .to_owned();
    let copy = format!("{path}.copy");
    std::fs::copy(&path, &copy).expect("copy");
    std::fs::rename(&copy, &path).expect("replace");
    let fatal = tokio::time::timeout(Duration::from_secs(5), victim.engine.fatal_error())
        .await
        .expect("the engine notices within 5 s");
    assert!(
        matches!(&fatal, Error::DatabaseLost(why) if why.contains("replaced")),
        "{fatal}"
    );
    victim.engine.shutdown().await;
}

/// Runs `sql` (with `{id}` replaced) on the database.
async fn edit(db: &TestDb, sql: &str) {
    let conn = Database::connect(db.url.as_str()).await.expect("connect");
    conn.execute_raw(Statement::from_string(conn.get_database_backend(), sql))
        .await
        .expect("edit");
    let _ = conn.close().await;
}

#[allow(dead_code)]
async fn wait_alert(engine: &Engine, kind: &str, run: Uuid) -> sagaflow::AlertRow {
    eventually_some(Duration::from_secs(15), "the alert", || async {
        engine
            .run_alerts(run)
            .await
            .ok()
            .and_then(|a| a.into_iter().find(|a| a.kind == kind))
    })
    .await
}

#[allow(dead_code)]
async fn unused(db: &TestDb) {
    edit(db, "SELECT 1").await;
}
