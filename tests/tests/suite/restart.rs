//! Restart from a step, on both backends: a finished or stopped run becomes the source of a
//! new run that takes over the steps before the named one as done and runs from there. The
//! order saga's services are loopback HTTP servers that record every effect by idempotency
//! key, so the tests prove what was applied once and what again: the reused steps are not
//! called again, the new run's undo of a reused step undoes the source's effect once, under
//! its key. The runs are linked both ways and audited; the business key moves to the new
//! run; refusals change nothing; a restarted source takes no other action.

use reqwest::StatusCode;
use sagaflow::{
    Engine, Error, HistoryKind, OnFailure, RunState, StartOptions, StepContext, StepError, Workflow,
};
use sagaflow_testkit::services::{
    HttpServices, Operation, Scripted, ServerHandle, Services, serve,
};
use sagaflow_testkit::{TestDb, backends, check_engine_history, expect_state, fast_builder};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, order_saga};
use serde_json::json;
use uuid::Uuid;

use crate::fixtures::{Log, admin_tokens, answer, order_settings, serve_admin};

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

struct Rig {
    services: Services,
    server: ServerHandle,
    engine: Engine,
}

async fn rig(db: &TestDb) -> Rig {
    let services = Services::default();
    let server = serve(services.clone(), "127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("serve");
    let http = HttpServices::new(server.base_url());
    let wf = order_saga(OrderApis::from(&http), order_settings(2_000, 2)).expect("saga");
    let engine = sagaflow_testkit::engine(db, vec![wf]).await;
    Rig {
        services,
        server,
        engine,
    }
}

impl Rig {
    async fn order(&self, n: usize) -> (Uuid, Order) {
        let order = Order::sample(n);
        let started = self
            .engine
            .start_with(
                ORDER_WORKFLOW,
                &order,
                StartOptions::keyed(order.order_id.clone()),
            )
            .await
            .expect("start");
        (started.id, order)
    }

    /// The keys `op` was applied under for `order`, in order of application.
    fn keys(&self, order: &Order, op: Operation) -> Vec<String> {
        self.services
            .ledger()
            .records_for_order(&order.order_id)
            .into_iter()
            .filter(|r| r.operation == op)
            .map(|r| r.key)
            .collect()
    }

    async fn stop(self) {
        self.engine.shutdown().await;
        self.server.shutdown().await.expect("server shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_of_a_completed_run_reuses_the_steps_before_and_runs_the_rest() {
    for db in backends().await {
        let b = db.backend;
        let rig = rig(&db).await;
        let (source, order) = rig.order(1).await;
        let done = expect_state(&rig.engine, source, RunState::Completed, b).await;

        let op = rig
            .engine
            .operator()
            .on_behalf_of("ops:ann", "the parcel was lost: ship again");
        let restarted = op
            .restart_from(source, "ship", None)
            .await
            .expect("restart");
        assert_eq!(restarted.source, source, "[{b}]");
        assert_eq!(
            restarted.reused,
            ["reserve_stock", "charge_card"],
            "[{b}] the steps `ship` depends on"
        );
        let new = expect_state(&rig.engine, restarted.id, RunState::Completed, b).await;

        // Reserved and charged once, by the source; shipped twice, under each run's key.
        assert_eq!(
            rig.keys(&order, Operation::Reserve),
            [format!("{source}:reserve_stock")],
            "[{b}]"
        );
        assert_eq!(
            rig.keys(&order, Operation::Charge),
            [format!("{source}:charge_card")],
            "[{b}]"
        );
        assert_eq!(
            rig.keys(&order, Operation::Ship),
            [format!("{source}:ship"), format!("{}:ship", restarted.id)],
            "[{b}]"
        );
        let (was, now) = (
            done.output.expect("source output"),
            new.output.clone().expect("output"),
        );
        assert_eq!(was["charge_card"], now["charge_card"], "[{b}]");
        assert_eq!(was["reserve_stock"], now["reserve_stock"], "[{b}]");
        assert_ne!(was["ship"], now["ship"], "[{b}] a new shipment");

        // Linked both ways, audited on both, and the business key moved to the new run.
        assert_eq!(new.restarted_from, Some(source), "[{b}]");
        let old = rig.engine.run(source).await.expect("read").expect("source");
        assert_eq!(old.restarted_as, Some(restarted.id), "[{b}]");
        assert_eq!(
            old.state,
            RunState::Completed,
            "[{b}] the source is kept as it was"
        );
        let line = |h: Vec<sagaflow::HistoryEvent>, kind: HistoryKind| {
            h.into_iter()
                .find(|e| e.kind == kind)
                .unwrap_or_else(|| panic!("[{b}] no {kind} line"))
        };
        let on_source = line(
            rig.engine.history(source).await.expect("history"),
            HistoryKind::OperatorRestart,
        );
        assert_eq!(on_source.actor, "ops:ann", "[{b}]");
        let detail = on_source.detail.expect("detail");
        assert_eq!(detail["as"], json!(restarted.id), "[{b}] {detail}");
        assert_eq!(detail["reason"], "the parcel was lost: ship again", "[{b}]");
        let on_new = line(
            rig.engine.history(restarted.id).await.expect("history"),
            HistoryKind::RestartedFrom,
        );
        let detail = on_new.detail.expect("detail");
        assert_eq!(detail["from"], json!(source), "[{b}] {detail}");
        assert_eq!(detail["step"], "ship", "[{b}]");
        assert_eq!(
            detail["reused"],
            json!(["reserve_stock", "charge_card"]),
            "[{b}]"
        );
        let holder = rig
            .engine
            .run_by_key(ORDER_WORKFLOW, &order.order_id)
            .await
            .expect("by key")
            .expect("a run");
        assert_eq!(holder.id, restarted.id, "[{b}] the newest run of the key");

        // A run is restarted once: the next restart starts from the newer one.
        let again = op.restart_from(source, "ship", None).await;
        assert!(
            matches!(&again, Err(Error::ActionNotAllowed { reason, .. })
                if reason.contains(&restarted.id.to_string())),
            "[{b}] {again:?}"
        );
        check_engine_history(&rig.engine).await;
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_run_that_unwinds_undoes_the_reused_effect_once_under_its_key() {
    for db in backends().await {
        let b = db.backend;
        let rig = rig(&db).await;
        let (source, order) = rig.order(2).await;
        expect_state(&rig.engine, source, RunState::Completed, b).await;

        // The restarted run's charge is refused for good: it unwinds, and what it undoes is
        // the reservation it took over from the source.
        rig.services
            .script("charge", vec![Scripted::RefuseNotApplied]);
        let restarted = rig
            .engine
            .operator()
            .restart_from(source, "charge_card", None)
            .await
            .expect("restart");
        assert_eq!(restarted.reused, ["reserve_stock"], "[{b}]");
        expect_state(&rig.engine, restarted.id, RunState::Compensated, b).await;
        assert_eq!(
            rig.keys(&order, Operation::Reserve).len(),
            1,
            "[{b}] not reserved again"
        );
        let release = rig.keys(&order, Operation::Release);
        assert_eq!(release.len(), 1, "[{b}] released once: {release:?}");
        let undone = rig
            .services
            .ledger()
            .records_for_order(&order.order_id)
            .into_iter()
            .find(|r| r.operation == Operation::Release)
            .expect("the release");
        let reserved = rig
            .services
            .ledger()
            .get(&format!("{source}:reserve_stock"))
            .expect("the source's reservation");
        assert_eq!(
            undone.request["reservation_id"], reserved.response["reservation_id"],
            "[{b}] the release undoes the source's reservation"
        );
        rig.stop().await;
    }
}

/// `fulfil@1`: `charge` (the point of no return, logged), then `ship`, retriable, which
/// refuses the sku `bad-sku`: a run given it stops in `error`.
fn fulfil(log: &Log) -> Workflow {
    Workflow::builder("fulfil", 1)
        .on_failure(OnFailure::Compensate)
        .step_using("charge", log.clone(), |log, _: StepContext| async move {
            log.push("charge");
            Ok::<_, StepError>("charged")
        })
        .pivot()
        .step("ship", |ctx: StepContext| async move {
            let sku: String = ctx.input::<serde_json::Value>()?["sku"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if sku == "bad-sku" {
                return Err(StepError::refused("unknown_sku", "no such sku: bad-sku"));
            }
            Ok(format!("shipped {sku}"))
        })
        .after(["charge"])
        .retriable()
        .build()
        .expect("fulfil")
}

/// An engine running `fulfil@1`, and the log of its charges.
async fn fulfil_engine(db: &TestDb) -> (Engine, Log) {
    let log = Log::default();
    let engine = fast_builder(db)
        .with_workflow(fulfil(&log))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    (engine, log)
}

async fn error_run(engine: &Engine, b: &str) -> Uuid {
    let id = engine
        .start_with(
            "fulfil",
            &json!({ "sku": "bad-sku" }),
            StartOptions::keyed("o-77"),
        )
        .await
        .expect("start")
        .id;
    expect_state(engine, id, RunState::Error, b).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_of_a_run_in_error_over_http_takes_over_and_the_source_takes_no_other_action() {
    for db in backends().await {
        let b = db.backend;
        let (engine, log) = fulfil_engine(&db).await;
        let source = error_run(&engine, b).await;
        let open = |engine: &Engine| {
            let engine = engine.clone();
            async move {
                let all = engine.run_alerts(source).await.expect("alerts");
                all.into_iter().filter(|a| a.resolved_at.is_none()).count()
            }
        };
        assert!(open(&engine).await > 0, "[{b}] the error raised an alert");

        let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let client = reqwest::Client::new();
        let url = format!("http://{addr}/api/v1/runs/{source}/restart");
        let body = json!({ "step": "ship", "input": { "sku": "A-1" }, "reason": "sku fixed" });

        // A viewer may not; an input the step cannot read is still an input: the schema
        // here is open. A step the workflow lacks is refused, naming it.
        let (status, _) = answer(client.post(&url).bearer_auth(VIEW).json(&body)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");
        let wrong = json!({ "step": "pack", "reason": "x" });
        let (status, refused) = answer(client.post(&url).bearer_auth(OPS).json(&wrong)).await;
        assert_eq!(status, StatusCode::CONFLICT, "[{b}] {refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("no step `pack`")),
            "[{b}] {refused}"
        );

        let (status, restarted) = answer(client.post(&url).bearer_auth(OPS).json(&body)).await;
        assert_eq!(status, StatusCode::CREATED, "[{b}] {restarted}");
        assert_eq!(restarted["source"], json!(source), "[{b}]");
        assert_eq!(restarted["reused"], json!(["charge"]), "[{b}]");
        let id: Uuid = serde_json::from_value(restarted["id"].clone()).expect("id");
        let new = expect_state(&engine, id, RunState::Completed, b).await;
        assert_eq!(new.input, json!({ "sku": "A-1" }), "[{b}]");
        assert_eq!(new.output.expect("output")["ship"], "shipped A-1", "[{b}]");
        assert_eq!(
            log.entries(),
            ["charge"],
            "[{b}] charged once, by the source"
        );
        assert_eq!(new.business_key.as_deref(), Some("o-77"), "[{b}]");

        // The source stays in error, its alerts resolved by the restart; it takes no other
        // action: the newer run owns what it did.
        let old = engine.run(source).await.expect("read").expect("source");
        assert_eq!(old.state, RunState::Error, "[{b}]");
        assert_eq!(old.restarted_as, Some(id), "[{b}]");
        assert_eq!(open(&engine).await, 0, "[{b}] the restart resolved them");
        let resume = engine.operator().compensate(source).await;
        assert!(
            matches!(&resume, Err(Error::ActionNotAllowed { reason, .. })
                if reason.contains("restarted as run")),
            "[{b}] {resume:?}"
        );
        server.abort();
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_is_refused_with_the_reason_and_changes_nothing() {
    for db in backends().await {
        let b = db.backend;
        let (engine, log) = fulfil_engine(&db).await;
        let op = engine.operator().on_behalf_of("ops:ann", "try");
        let refused = |r: sagaflow::Result<sagaflow::Restarted>, needle: &str| match r {
            Err(Error::ActionNotAllowed { reason, .. }) if reason.contains(needle) => {}
            other => panic!("[{b}] expected a refusal saying {needle:?}: {other:?}"),
        };

        // A run that has not stopped or finished.
        let later = engine
            .start_with(
                "fulfil",
                &json!({ "sku": "A-2" }),
                StartOptions::default().start_after(std::time::Duration::from_secs(3_600)),
            )
            .await
            .expect("start")
            .id;
        refused(
            op.restart_from(later, "charge", None).await,
            "the run is pending",
        );
        let missing = op.restart_from(Uuid::now_v7(), "ship", None).await;
        assert!(
            matches!(missing, Err(Error::RunNotFound(_))),
            "[{b}] {missing:?}"
        );

        // Cancelled before it began, it is compensated: it kept no outputs, so it restarts
        // from a step with no dependencies only.
        op.cancel(later).await.expect("cancel");
        expect_state(&engine, later, RunState::Compensated, b).await;
        refused(
            op.restart_from(later, "ship", None).await,
            "kept no step outputs",
        );
        refused(op.restart_from(later, "pack", None).await, "no step `pack`");
        let old = engine.run(later).await.expect("read").expect("run");
        assert_eq!(old.restarted_as, None, "[{b}] the refusals wrote nothing");
        assert!(log.entries().is_empty(), "[{b}] {:?}", log.entries());

        let restarted = op
            .restart_from(later, "charge", None)
            .await
            .expect("from the first step");
        assert!(restarted.reused.is_empty(), "[{b}] {restarted:?}");
        let new = expect_state(&engine, restarted.id, RunState::Completed, b).await;
        assert_eq!(new.output.expect("output")["ship"], "shipped A-2", "[{b}]");
        assert_eq!(log.entries(), ["charge"], "[{b}]");
        let page = engine
            .list_runs(&sagaflow::RunQuery::default())
            .await
            .expect("list");
        assert_eq!(
            page.runs.len(),
            2,
            "[{b}] the source and its restart, no other"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_from_the_command_line_links_both_runs_and_refuses_a_second_time() {
    use crate::cli::{code, json as cli_json, sagaflow, stderr, stdout};
    for db in backends().await {
        let b = db.backend;
        let (engine, log) = fulfil_engine(&db).await;
        let source = error_run(&engine, b).await;
        let id = source.to_string();

        let answer = cli_json(
            &db.url,
            &[
                "runs",
                "restart",
                &id,
                "--from",
                "ship",
                "--input",
                r#"{"sku": "C-3"}"#,
                "--reason",
                "sku fixed",
                "--as",
                "ann",
            ],
        )
        .await;
        assert_eq!(answer["reused"], json!(["charge"]), "[{b}] {answer}");
        assert_eq!(answer["actor"], "cli:ann", "[{b}] {answer}");
        let new: Uuid = serde_json::from_value(answer["id"].clone()).expect("id");
        let run = expect_state(&engine, new, RunState::Completed, b).await;
        assert_eq!(run.output.expect("output")["ship"], "shipped C-3", "[{b}]");
        assert_eq!(log.entries(), ["charge"], "[{b}] charged once");

        let shown = sagaflow(&db.url, &["runs", "show", &id]).await;
        code(&shown, 0, "runs show");
        assert!(
            stdout(&shown).contains("restarted as") && stdout(&shown).contains(&new.to_string()),
            "[{b}] {}",
            stdout(&shown)
        );
        let again = sagaflow(
            &db.url,
            &[
                "runs", "restart", &id, "--from", "ship", "--reason", "again",
            ],
        )
        .await;
        assert_ne!(again.status.code(), Some(0), "[{b}] refused");
        assert!(
            stderr(&again).contains("restarted already"),
            "[{b}] {}",
            stderr(&again)
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_restarts_a_run_from_a_step_in_the_browser() {
    use crate::console::{Driver, click, js, screenshot, text_of, wait_css};
    use futures_util::FutureExt as _;
    let Some(driver) = crate::console::chromedriver() else {
        return;
    };
    let _turn = crate::fixtures::timing_turn().await;
    let db = sagaflow_testkit::sqlite_db();
    let (engine, log) = fulfil_engine(&db).await;
    let source = error_run(&engine, "sqlite").await;
    let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
    let driver = Driver::start(&driver).await;
    let b = driver.browser().await;
    let walked = std::panic::AssertUnwindSafe(async {
        let url = |path: &str| format!("http://{addr}{path}");
        crate::console::log_in(&b, addr, OPS).await;

        b.goto(&url(&format!("/console/runs/{source}")))
            .await
            .expect("run page");
        wait_css(&b, "#run-state[data-state=error]").await;
        click(&b, "#restart details[data-action=restarted] summary").await;
        let options = js(
            &b,
            "return Array.from(document.querySelectorAll('#restart select[name=step] option')).map(o => o.value);",
        )
        .await;
        assert_eq!(options, json!(["charge", "ship"]), "the workflow's steps");
        js(
            &b,
            r#"const f = document.querySelector('#restart form');
               f.querySelector('select[name=step]').value = 'ship';
               f.querySelector('textarea[name=input]').value = '{"sku": "D-4"}';
               return true;"#,
        )
        .await;
        wait_css(&b, "#restart textarea[name=reason]")
            .await
            .send_keys("sku fixed by ops")
            .await
            .expect("type");
        screenshot(&b, "console-restart.png").await;
        click(&b, "#restart button.confirm").await;

        // On to the new run's page, linked to its source, which it finishes.
        let link = text_of(&b, "#restarted-from").await;
        assert_eq!(link, source.to_string());
        assert!(
            text_of(&b, "#notice").await.contains("restarted from a step"),
            "the flash says what happened"
        );
        wait_css(&b, "#run-state[data-state=completed]").await;
        let current = b.current_url().await.expect("url");
        let new: Uuid = current
            .path()
            .trim_start_matches("/console/runs/")
            .parse()
            .expect("the new run's page");
        let run = engine.run(new).await.expect("read").expect("run");
        assert_eq!(run.restarted_from, Some(source));
        assert_eq!(run.output.expect("output")["ship"], "shipped D-4");
        assert_eq!(log.entries(), ["charge"], "charged once, by the source");

        // The source's page links to it and offers no action any more.
        b.goto(&url(&format!("/console/runs/{source}")))
            .await
            .expect("source page");
        assert_eq!(text_of(&b, "#restarted-as").await, new.to_string());
        let forms = js(&b, "return document.querySelectorAll('#actions, #restart').length;").await;
        assert_eq!(forms, json!(0), "a restarted source takes no action");
    })
    .catch_unwind()
    .await;
    let _ = b.close().await;
    drop(driver);
    server.abort();
    engine.shutdown().await;
    if let Err(panic) = walked {
        std::panic::resume_unwind(panic);
    }
}
