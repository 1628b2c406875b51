//! Migrating in-flight runs between versions, on both backends: the dry run reports which
//! runs of the old version would migrate (each step before and after) and which are refused
//! (and why), changing nothing; applying it re-pins the runs that migrate, which then finish
//! under the new version including its new step, and leaves the refused runs as they were.

use reqwest::StatusCode;
use sagaflow::migration::{MigratingRun, Migration, MigrationOutcome, MigrationRefusal};
use sagaflow::{
    Engine, HistoryKind, OnFailure, RunState, StepContext, StepError, StepState, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};
use serde_json::json;
use uuid::Uuid;

use crate::fixtures::{admin_tokens, answer, serve_admin};

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

/// `shipment@1`: `reserve`, then `ship`, which refuses the sku `hold`; a failed run is
/// parked (`OnFailure::Pause`).
fn v1() -> Workflow {
    Workflow::builder("shipment", 1)
        .on_failure(OnFailure::Pause)
        .step("reserve", |_: StepContext| async {
            Ok::<_, StepError>("reserved")
        })
        .compensate(|_: StepContext| async { Ok::<_, StepError>(()) })
        .step("ship", |ctx: StepContext| async move {
            let input: serde_json::Value = ctx.input()?;
            if input["sku"] == "hold" {
                return Err(StepError::refused("held", "the sku is on hold"));
            }
            Ok("shipped")
        })
        .after(["reserve"])
        .build()
        .expect("v1")
}

/// `shipment@2`: `ship` ships anything, and a new step `notify` follows it.
fn v2() -> Workflow {
    Workflow::builder("shipment", 2)
        .on_failure(OnFailure::Pause)
        .step("reserve", |_: StepContext| async {
            Ok::<_, StepError>("reserved")
        })
        .compensate(|_: StepContext| async { Ok::<_, StepError>(()) })
        .step("ship", |_: StepContext| async {
            Ok::<_, StepError>("shipped v2")
        })
        .after(["reserve"])
        .step("notify", |_: StepContext| async {
            Ok::<_, StepError>("notified")
        })
        .after(["ship"])
        .build()
        .expect("v2")
}

/// The migration: runs of the `eu` region stay on version 1.
fn migration() -> Migration {
    Migration::new("shipment", 1, 2).map(|run: &mut MigratingRun| {
        if run.input()["region"] == "eu" {
            return Err(MigrationRefusal::new("eu runs stay on version 1"));
        }
        Ok(())
    })
}

/// Two runs of version 1 parked with `ship` failed: one that migrates, one the mapping
/// refuses. Started by an engine that has only version 1.
async fn parked_runs(db: &TestDb) -> (Uuid, Uuid) {
    let old = fast_builder(db)
        .with_workflow(v1())
        .start()
        .await
        .expect("v1 engine");
    let a = old
        .start("shipment", &json!({ "sku": "hold", "region": "us" }))
        .await
        .expect("start a");
    let b = old
        .start("shipment", &json!({ "sku": "hold", "region": "eu" }))
        .await
        .expect("start b");
    for id in [a, b] {
        eventually(
            std::time::Duration::from_secs(30),
            "the run to park",
            || async {
                old.run(id).await.ok().flatten().map(|r| r.state) == Some(RunState::Paused)
            },
        )
        .await;
    }
    old.shutdown().await;
    (a, b)
}

async fn both_versions(db: &TestDb) -> Engine {
    fast_builder(db)
        .with_workflow(v1())
        .with_workflow(v2())
        .with_migration(migration())
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_plans_then_applies_and_the_run_finishes_under_the_new_version() {
    for db in backends().await {
        let b = db.backend;
        let (a, refused) = parked_runs(&db).await;
        let engine = both_versions(&db).await;
        let history_before = engine.history(a).await.expect("history").len();

        let op = engine
            .operator()
            .on_behalf_of("ops:ada", "ship v2 ships held skus");
        let plan = op.migration_plan("shipment", 1, 2).await.expect("plan");
        assert_eq!(plan.runs.len(), 2, "[{b}] {plan:?}");
        let pa = plan.runs.iter().find(|r| r.run_id == a).expect("a planned");
        assert_eq!(pa.outcome, MigrationOutcome::Migrates, "[{b}] {pa:?}");
        let notify = pa
            .steps
            .iter()
            .find(|s| s.step == "notify")
            .expect("notify");
        assert_eq!(
            (notify.before, notify.after),
            (None, Some(StepState::NotStarted)),
            "[{b}]"
        );
        let ship = pa.steps.iter().find(|s| s.step == "ship").expect("ship");
        assert_eq!(
            (ship.before, ship.after),
            (Some(StepState::Failed), Some(StepState::Failed)),
            "[{b}]"
        );
        let pb = plan
            .runs
            .iter()
            .find(|r| r.run_id == refused)
            .expect("b planned");
        assert_eq!(pb.outcome, MigrationOutcome::Refused, "[{b}] {pb:?}");
        assert_eq!(
            pb.reason.as_deref(),
            Some("eu runs stay on version 1"),
            "[{b}]"
        );
        // The dry run changed nothing.
        for id in [a, refused] {
            let run = engine.run(id).await.expect("read").expect("run");
            assert_eq!((run.version, run.state), (1, RunState::Paused), "[{b}]");
        }
        assert_eq!(
            engine.history(a).await.expect("history").len(),
            history_before,
            "[{b}]"
        );

        let report = op.migrate("shipment", 1, 2).await.expect("apply");
        assert_eq!(
            (report.migrating(), report.refused()),
            (1, 1),
            "[{b}] {report:?}"
        );
        let run = engine.run(a).await.expect("read").expect("run");
        assert_eq!((run.version, run.state), (2, RunState::Paused), "[{b}]");
        let history = engine.history(a).await.expect("history");
        let migrated = history
            .iter()
            .find(|h| h.kind == HistoryKind::Migrated)
            .unwrap_or_else(|| panic!("[{b}] no migrated event"));
        assert_eq!(migrated.actor, "ops:ada", "[{b}]");
        let detail = migrated.detail.clone().expect("detail");
        assert_eq!(
            (detail["from"].clone(), detail["to"].clone()),
            (json!(1), json!(2)),
            "[{b}]"
        );
        assert_eq!(detail["reason"], "ship v2 ships held skus", "[{b}]");

        // Resumed, the run finishes under version 2, its new step included.
        op.resume(a).await.expect("resume");
        let done = expect_state(&engine, a, RunState::Completed, b).await;
        let output = done.output.expect("output");
        assert_eq!(output["ship"], "shipped v2", "[{b}] {output}");
        assert_eq!(output["notify"], "notified", "[{b}] {output}");

        // The refused run is untouched, and a second apply finds nothing more to migrate.
        let run = engine.run(refused).await.expect("read").expect("run");
        assert_eq!((run.version, run.state), (1, RunState::Paused), "[{b}]");
        let again = op.migrate("shipment", 1, 2).await.expect("apply again");
        assert_eq!(
            (again.migrating(), again.refused()),
            (0, 1),
            "[{b}] {again:?}"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_to_start_without_both_versions() {
    let db = sagaflow_testkit::sqlite_db();
    let err = fast_builder(&db)
        .with_workflow(v1())
        .with_migration(migration())
        .start()
        .await
        .expect_err("version 2 is missing");
    assert!(
        err.to_string()
            .contains("version 2 of `shipment` is not registered"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_over_the_api_plans_for_any_token_and_applies_for_an_operator() {
    for db in backends().await {
        let b = db.backend;
        let (a, _) = parked_runs(&db).await;
        let engine = both_versions(&db).await;
        let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let http = reqwest::Client::new();
        let url = |p: &str| format!("http://{addr}/api/v1/migrations/shipment/1/2/{p}");

        let (status, _) = answer(http.get(url("plan"))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}]");
        let (status, body) = answer(http.get(url("plan")).bearer_auth(VIEW)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");
        assert_eq!(
            body["runs"].as_array().map(Vec::len),
            Some(2),
            "[{b}] {body}"
        );
        assert!(body.get("next_after").is_none(), "[{b}] {body}");
        // Paged: one run a page, each page naming where the next starts.
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..3 {
            let q = after
                .as_ref()
                .map_or("?limit=1".to_owned(), |a| format!("?limit=1&after={a}"));
            let (status, body) =
                answer(http.get(format!("{}{q}", url("plan"))).bearer_auth(VIEW)).await;
            assert_eq!(status, StatusCode::OK, "[{b}] {body}");
            let runs = body["runs"].as_array().expect("runs");
            assert!(runs.len() <= 1, "[{b}] {body}");
            seen.extend(
                runs.iter()
                    .filter_map(|r| r["run_id"].as_str().map(str::to_owned)),
            );
            after = body["next_after"].as_str().map(str::to_owned);
            if after.is_none() {
                break;
            }
        }
        assert!(after.is_none(), "[{b}] the pages end");
        seen.dedup();
        assert_eq!(seen.len(), 2, "[{b}] {seen:?}");
        let (status, body) = answer(
            http.get(format!("{}?limit=1&bogus=1", url("plan")))
                .bearer_auth(VIEW),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {body}");
        if b == "postgres" {
            // The dry run takes no lock: it answers while another session holds every step.
            use sagaflow::sea_orm::{ConnectionTrait, Database, TransactionTrait};
            let other = Database::connect(&db.url).await.expect("connect");
            let held = other.begin().await.expect("begin");
            held.execute_unprepared("SELECT id FROM sagaflow_steps FOR UPDATE")
                .await
                .expect("lock the steps");
            let plan = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                answer(http.get(url("plan")).bearer_auth(VIEW)),
            )
            .await;
            assert!(
                matches!(&plan, Ok((StatusCode::OK, _))),
                "[{b}] the dry run waited for a lock: {plan:?}"
            );
            held.rollback().await.expect("release");
        }

        let reason = json!({ "reason": "ship v2" });
        let (status, body) = answer(http.post(url("apply")).bearer_auth(VIEW).json(&reason)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {body}");
        let (status, body) = answer(
            http.post(url("apply"))
                .bearer_auth(OPS)
                .json(&json!({ "reason": " " })),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("reason_required")),
            "[{b}] {body}"
        );
        assert_eq!(
            engine.run(a).await.expect("read").expect("run").version,
            1,
            "[{b}]"
        );

        let (status, body) = answer(http.post(url("apply")).bearer_auth(OPS).json(&reason)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");
        let outcomes: Vec<&str> = body["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .filter_map(|r| r["outcome"].as_str())
            .collect();
        assert!(
            outcomes.contains(&"migrated") && outcomes.contains(&"refused"),
            "[{b}] {body}"
        );
        let run = engine.run(a).await.expect("read").expect("run");
        assert_eq!(run.version, 2, "[{b}]");
        let history = engine.history(a).await.expect("history");
        assert!(
            history
                .iter()
                .any(|h| h.actor == "api:ops" && h.kind.as_ref() == "migrated"),
            "[{b}]"
        );
        server.abort();
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_the_cli_dry_runs_then_applies_the_default_mapping() {
    use crate::cli::{code, sagaflow, stdout};
    for db in backends().await {
        let b = db.backend;
        let (a, other) = parked_runs(&db).await;
        // An engine with both versions has published them; the command maps by step name.
        let engine = both_versions(&db).await;
        let dry = sagaflow(
            &db.url,
            &["runs", "migrate", "shipment", "--from", "1", "--to", "2"],
        )
        .await;
        code(&dry, 0, "dry run");
        assert!(
            stdout(&dry).contains("2 would migrate, 0 refused"),
            "[{b}] {}",
            stdout(&dry)
        );
        for id in [a, other] {
            let run = engine.run(id).await.expect("read").expect("run");
            assert_eq!(run.version, 1, "[{b}] the dry run changed nothing");
        }
        let no_reason = sagaflow(
            &db.url,
            &[
                "runs", "migrate", "shipment", "--from", "1", "--to", "2", "--apply",
            ],
        )
        .await;
        code(&no_reason, 2, "--apply needs a reason");
        let applied = sagaflow(
            &db.url,
            &[
                "runs",
                "migrate",
                "shipment",
                "--from",
                "1",
                "--to",
                "2",
                "--apply",
                "--reason",
                "v2 ships held skus",
                "--as",
                "alice",
                "--json",
            ],
        )
        .await;
        code(&applied, 0, "apply");
        let report: serde_json::Value = serde_json::from_str(&stdout(&applied)).expect("json");
        assert!(
            report["runs"]
                .as_array()
                .is_some_and(|r| r.len() == 2 && r.iter().all(|r| r["outcome"] == "migrated")),
            "[{b}] {report}"
        );
        let history = engine.history(a).await.expect("history");
        let migrated = history
            .iter()
            .find(|h| h.kind == HistoryKind::Migrated)
            .unwrap_or_else(|| panic!("[{b}] no migrated event"));
        assert_eq!(migrated.actor, "cli:alice", "[{b}]");
        assert_eq!(engine.run(a).await.expect("read").expect("run").version, 2);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_the_console_shows_the_dry_run_then_applies_it() {
    for db in backends().await {
        let b = db.backend;
        let (a, refused) = parked_runs(&db).await;
        let engine = both_versions(&db).await;
        let (addr, _server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let http = crate::console::http();
        let login = |token: &'static str| crate::fixtures::console_login(addr, token);
        let page = |cookie: String| {
            let http = http.clone();
            async move {
                let r = http
                    .get(format!(
                        "http://{addr}/console/migrations?workflow=shipment&from=1&to=2"
                    ))
                    .header("cookie", cookie)
                    .send()
                    .await
                    .expect("page");
                (r.status(), r.text().await.expect("body"))
            }
        };
        // A read-only session sees the dry run, without the apply form.
        let (status, body) = page(login(VIEW).await).await;
        assert_eq!(status, StatusCode::OK, "[{b}]");
        assert!(
            body.contains(&format!("data-run=\"{a}\" data-outcome=\"migrates\"")),
            "[{b}]"
        );
        assert!(
            body.contains(&format!("data-run=\"{refused}\" data-outcome=\"refused\"")),
            "[{b}] {body}"
        );
        assert!(!body.contains("data-action=\"migrate\""), "[{b}]");
        // An operator applies it, with a reason and the session's CSRF token.
        let ops = login(OPS).await;
        let (_, body) = page(ops.clone()).await;
        let csrf = crate::console::csrf_of(&body);
        assert!(
            body.contains("1 would migrate, 1 refused") && !body.contains("on this page"),
            "[{b}] one page holds the whole plan: {body}"
        );
        // A later page counts its own runs, and says that applying moves every run.
        let later = http
            .get(format!(
                "http://{addr}/console/migrations?workflow=shipment&from=1&to=2&after={}",
                Uuid::nil()
            ))
            .header("cookie", ops.clone())
            .send()
            .await
            .expect("page")
            .text()
            .await
            .expect("body");
        assert!(
            later.contains("on this page, 1 would migrate")
                && later.contains("(all pages, not only this one)"),
            "[{b}] {later}"
        );
        let form = |csrf: &str, reason: &str| {
            vec![
                ("csrf", csrf.to_owned()),
                ("workflow", "shipment".to_owned()),
                ("from", "1".to_owned()),
                ("to", "2".to_owned()),
                ("reason", reason.to_owned()),
            ]
        };
        let post = |form: Vec<(&'static str, String)>| {
            let (http, ops) = (http.clone(), ops.clone());
            async move {
                http.post(format!("http://{addr}/console/migrations"))
                    .header("cookie", ops)
                    .form(&form)
                    .send()
                    .await
                    .expect("post")
                    .status()
            }
        };
        assert_eq!(
            post(form("forged", "x")).await,
            StatusCode::FORBIDDEN,
            "[{b}]"
        );
        assert_eq!(
            post(form(&csrf, " ")).await,
            StatusCode::BAD_REQUEST,
            "[{b}]"
        );
        assert_eq!(engine.run(a).await.expect("read").expect("run").version, 1);
        assert_eq!(
            post(form(&csrf, "ship v2 ships held skus")).await,
            StatusCode::SEE_OTHER,
            "[{b}]"
        );
        assert_eq!(engine.run(a).await.expect("read").expect("run").version, 2);
        assert_eq!(
            engine
                .run(refused)
                .await
                .expect("read")
                .expect("run")
                .version,
            1
        );
        let history = engine.history(a).await.expect("history");
        assert!(
            history
                .iter()
                .any(|h| h.kind == HistoryKind::Migrated && h.actor == "console:ops"),
            "[{b}]"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_automatically_when_the_migration_says_so() {
    for db in backends().await {
        let b = db.backend;
        let (a, refused) = parked_runs(&db).await;
        let engine = fast_builder(&db)
            .with_workflow(v1())
            .with_workflow(v2())
            .with_migration(migration().automatic())
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        eventually(
            std::time::Duration::from_secs(30),
            "the leader to migrate the run by itself",
            || async {
                engine
                    .run(a)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| r.version == 2)
            },
        )
        .await;
        let history = engine.history(a).await.expect("history");
        let migrated = history
            .iter()
            .find(|h| h.kind == HistoryKind::Migrated)
            .unwrap_or_else(|| panic!("[{b}] no migrated event"));
        assert!(
            migrated.actor.starts_with("engine:"),
            "[{b}] {}",
            migrated.actor
        );
        // The mapping's refusal holds at every pass: that run stays on version 1.
        let run = engine.run(refused).await.expect("read").expect("run");
        assert_eq!(run.version, 1, "[{b}]");
        engine.shutdown().await;
    }
}

/// A run can be started on an older registered version (to test a migration from it); the
/// newest is the default, and a version the engine lacks is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_a_run_can_start_on_an_older_registered_version() {
    for db in backends().await {
        let b = db.backend;
        let engine = both_versions(&db).await;
        let input = json!({ "sku": "hold", "region": "us" });
        let old = engine
            .start_with(
                "shipment",
                &input,
                sagaflow::StartOptions::default().version(1),
            )
            .await
            .unwrap_or_else(|e| panic!("[{b}] {e}"))
            .id;
        let new = engine.start("shipment", &input).await.expect("start");
        let version = |id| {
            let engine = &engine;
            async move { engine.run(id).await.expect("read").expect("run").version }
        };
        assert_eq!((version(old).await, version(new).await), (1, 2), "[{b}]");
        let missing = engine
            .start_with(
                "shipment",
                &input,
                sagaflow::StartOptions::default().version(9),
            )
            .await;
        assert!(
            matches!(missing, Err(sagaflow::Error::WorkflowNotFound(ref w)) if w == "shipment@9"),
            "[{b}] {missing:?}"
        );
        engine.shutdown().await;
    }
}
