//! Rolling a run back to a step and going forward again, on both backends: the steps after
//! the step are compensated in reverse order, then run again under new idempotency keys
//! (with a new input when the operator gives one), under the same run id. The services are
//! loopback HTTP servers that record every effect by idempotency key, so the tests prove
//! what was undone once and what was applied anew. Refusals say why and change nothing.

use reqwest::StatusCode;
use sagaflow::{
    Engine, Error, HistoryKind, RunState, StartOptions, StepContext, StepError, Workflow,
};
use sagaflow_testkit::services::{
    Charge, ChargeRequest, HttpServices, Operation, RefundRequest, ReleaseRequest, Reservation,
    ReserveRequest, ServerHandle, Services, serve,
};
use sagaflow_testkit::{TestDb, backends, check_engine_history, expect_state, fast_builder};
use sagaflow_workflows::order::Order;
use serde_json::json;
use uuid::Uuid;

use crate::fixtures::{admin_tokens, answer, serve_admin};

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";
/// The most `approve` lets through, in cents.
const LIMIT_CENTS: u64 = 5_000;

fn failed(e: impl std::fmt::Display) -> StepError {
    StepError::retryable("service", e.to_string())
}

/// `settle@1`: `reserve_stock` (undone by a release) → `charge_card` (undone by a refund) →
/// `approve`, retriable, which refuses an amount over [`LIMIT_CENTS`]: such a run stops in
/// `error` with its stock reserved and its card charged.
fn settle(http: &HttpServices) -> Workflow {
    let (inv, pay) = (http.inventory(), http.payments());
    Workflow::builder("settle", 1)
        .input::<Order>()
        .step_using(
            "reserve_stock",
            inv.clone(),
            |inv, ctx: StepContext| async move {
                let o: Order = ctx.input()?;
                let req = ReserveRequest {
                    order_id: o.order_id,
                    sku: o.sku,
                    qty: o.qty,
                };
                inv.reserve(ctx.idempotency_key(), req)
                    .await
                    .map_err(failed)
            },
        )
        .compensate_using(inv, |inv, ctx: StepContext| async move {
            let r: Reservation = ctx.output()?;
            let req = ReleaseRequest {
                order_id: r.order_id,
                reservation_id: r.reservation_id,
            };
            inv.release(ctx.idempotency_key(), req)
                .await
                .map_err(failed)
        })
        .step_using(
            "charge_card",
            pay.clone(),
            |pay, ctx: StepContext| async move {
                let o: Order = ctx.input()?;
                let req = ChargeRequest {
                    order_id: o.order_id,
                    amount_cents: o.amount_cents,
                };
                pay.charge(ctx.idempotency_key(), req).await.map_err(failed)
            },
        )
        .after(["reserve_stock"])
        .compensate_using(pay, |pay, ctx: StepContext| async move {
            let c: Charge = ctx.output()?;
            let req = RefundRequest {
                order_id: c.order_id,
                charge_id: c.charge_id,
            };
            pay.refund(ctx.idempotency_key(), req).await.map_err(failed)
        })
        .step("approve", |ctx: StepContext| async move {
            let o: Order = ctx.input()?;
            if o.amount_cents > LIMIT_CENTS {
                return Err(StepError::refused(
                    "over_limit",
                    format!("{} cents is over the limit", o.amount_cents),
                ));
            }
            Ok("approved")
        })
        .after(["charge_card"])
        .retriable()
        .build()
        .expect("settle")
}

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
    let engine = fast_builder(db)
        .with_workflow(settle(&http))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    Rig {
        services,
        server,
        engine,
    }
}

impl Rig {
    /// A run charged `amount_cents`, stopped in error by `approve`.
    async fn over_limit(&self, n: usize, b: &str) -> (Uuid, Order) {
        let order = Order {
            amount_cents: 9_999,
            ..Order::sample(n)
        };
        let id = self
            .engine
            .start_with(
                "settle",
                &order,
                StartOptions::keyed(order.order_id.clone()),
            )
            .await
            .expect("start")
            .id;
        expect_state(&self.engine, id, RunState::Error, b).await;
        (id, order)
    }

    /// The effects of `op` for `order`: (key, request, response), in order of application.
    fn effects(
        &self,
        order: &Order,
        op: Operation,
    ) -> Vec<(String, serde_json::Value, serde_json::Value)> {
        self.services
            .ledger()
            .records_for_order(&order.order_id)
            .into_iter()
            .filter(|r| r.operation == op)
            .map(|r| (r.key, r.request, r.response))
            .collect()
    }

    async fn stop(self) {
        self.engine.shutdown().await;
        self.server.shutdown().await.expect("server shutdown");
    }
}

/// The run rolled back to `reserve_stock` with the amount corrected: the charge was refunded
/// once, under the compensation of its own key, and charged anew under a new key; the stock
/// was reserved once and never released.
async fn expect_recharged(rig: &Rig, id: Uuid, order: &Order, b: &str) {
    let run = expect_state(&rig.engine, id, RunState::Completed, b).await;
    assert_eq!(run.input["amount_cents"], 2_500, "[{b}] the new input");
    let output = run.output.expect("output");
    assert_eq!(
        output["charge_card"]["amount_cents"], 2_500,
        "[{b}] {output}"
    );
    assert_eq!(
        rig.effects(order, Operation::Reserve).len(),
        1,
        "[{b}] reserved once"
    );
    assert!(
        rig.effects(order, Operation::Release).is_empty(),
        "[{b}] never released"
    );
    let charges = rig.effects(order, Operation::Charge);
    assert_eq!(charges.len(), 2, "[{b}] {charges:?}");
    let (first, second) = (&charges[0], &charges[1]);
    assert_eq!(first.0, format!("{id}:charge_card"), "[{b}]");
    assert_eq!(first.1["amount_cents"], 9_999, "[{b}]");
    assert_ne!(second.0, first.0, "[{b}] charged anew under a new key");
    assert!(
        second.0.starts_with(&format!("{id}:charge_card:")),
        "[{b}] {}",
        second.0
    );
    assert_eq!(second.1["amount_cents"], 2_500, "[{b}]");
    let refunds = rig.effects(order, Operation::Refund);
    assert_eq!(refunds.len(), 1, "[{b}] refunded once: {refunds:?}");
    assert_eq!(
        refunds[0].1["charge_id"], first.2["charge_id"],
        "[{b}] the refund undoes the first charge"
    );
    assert_eq!(
        refunds[0].0,
        format!("{id}:charge_card:compensate"),
        "[{b}]"
    );
    assert_eq!(
        output["reserve_stock"],
        rig.effects(order, Operation::Reserve)[0].2,
        "[{b}] the kept step's output"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_undoes_the_steps_after_the_step_and_runs_them_again_with_a_new_input() {
    for db in backends().await {
        let b = db.backend;
        let rig = rig(&db).await;
        let (id, order) = rig.over_limit(1, b).await;
        let corrected = json!(Order {
            amount_cents: 2_500,
            ..order.clone()
        });
        let state = rig
            .engine
            .operator()
            .on_behalf_of("ops:ann", "charged over the limit")
            .rollback(id, "reserve_stock", Some(corrected))
            .await
            .expect("rollback");
        assert_eq!(state, RunState::Compensating, "[{b}]");
        expect_recharged(&rig, id, &order, b).await;

        let history = rig.engine.history(id).await.expect("history");
        let asked = history
            .iter()
            .find(|h| h.kind == HistoryKind::OperatorRollback)
            .unwrap_or_else(|| panic!("[{b}] no operator_rollback line"));
        assert_eq!(asked.actor, "ops:ann", "[{b}]");
        let detail = asked.detail.clone().expect("detail");
        assert_eq!(detail["step"], "reserve_stock", "[{b}] {detail}");
        assert_eq!(detail["reason"], "charged over the limit", "[{b}] {detail}");
        let forward = history.iter().any(|h| {
            h.detail
                .as_ref()
                .and_then(|d| d["reason"].as_str())
                .is_some_and(|r| r.contains("rolled back to `reserve_stock`"))
        });
        assert!(forward, "[{b}] the run went forward again: {history:?}");

        // Restarted once finished, it reuses the charge under the key it was made with (the
        // run's step rows are gone; its history kept the key the rollback gave): undoing the
        // new run refunds that charge, once.
        let over = json!(Order {
            amount_cents: 9_999,
            ..order.clone()
        });
        let op = rig
            .engine
            .operator()
            .on_behalf_of("ops:ann", "approve again");
        let restarted = op
            .restart_from(id, "approve", Some(over))
            .await
            .expect("restart");
        assert_eq!(restarted.reused, ["reserve_stock", "charge_card"], "[{b}]");
        expect_state(&rig.engine, restarted.id, RunState::Error, b).await;
        op.compensate(restarted.id).await.expect("compensate");
        expect_state(&rig.engine, restarted.id, RunState::Compensated, b).await;
        let charges = rig.effects(&order, Operation::Charge);
        assert_eq!(charges.len(), 2, "[{b}] not charged again: {charges:?}");
        let refunds = rig.effects(&order, Operation::Refund);
        assert_eq!(refunds.len(), 2, "[{b}] {refunds:?}");
        assert_eq!(
            refunds[1].0,
            format!("{}:compensate", charges[1].0),
            "[{b}]"
        );
        assert_eq!(
            refunds[1].1["charge_id"], charges[1].2["charge_id"],
            "[{b}]"
        );
        let releases = rig.effects(&order, Operation::Release);
        assert_eq!(releases.len(), 1, "[{b}] released once: {releases:?}");
        check_engine_history(&rig.engine).await;
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_over_http_and_from_the_command_line() {
    use crate::cli::{code, sagaflow, stdout};
    for db in backends().await {
        let b = db.backend;
        let rig = rig(&db).await;
        let (addr, server) = serve_admin(&rig.engine, admin_tokens(OPS, VIEW)).await;
        let client = reqwest::Client::new();

        let (id, order) = rig.over_limit(2, b).await;
        let url = format!("http://{addr}/api/v1/runs/{id}/actions/rollback");
        let input = json!(Order {
            amount_cents: 2_500,
            ..order.clone()
        });
        let body = json!({ "step": "reserve_stock", "input": input, "reason": "limit" });
        let (status, _) = answer(client.post(&url).bearer_auth(VIEW).json(&body)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}]");
        let wrong =
            json!({ "step": "reserve_stock", "input": { "amount_cents": "lots" }, "reason": "x" });
        let (status, refused) = answer(client.post(&url).bearer_auth(OPS).json(&wrong)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {refused}");
        assert_eq!(refused["error"]["code"], "invalid_input", "[{b}] {refused}");
        let resume = format!("http://{addr}/api/v1/runs/{id}/actions/resume");
        let (status, refused) = answer(client.post(&resume).bearer_auth(OPS).json(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "[{b}] {refused}");
        assert_eq!(
            refused["error"]["code"], "input_not_taken",
            "[{b}] {refused}"
        );
        let (status, done) = answer(client.post(&url).bearer_auth(OPS).json(&body)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {done}");
        assert_eq!(done["state"], "compensating", "[{b}] {done}");
        expect_recharged(&rig, id, &order, b).await;

        let (id, order) = rig.over_limit(3, b).await;
        let input = json!(Order {
            amount_cents: 2_500,
            ..order.clone()
        })
        .to_string();
        let run = id.to_string();
        let o = sagaflow(
            &db.url,
            &[
                "rollback",
                &run,
                "--to",
                "reserve_stock",
                "--input",
                &input,
                "--reason",
                "limit",
                "--as",
                "ann",
            ],
        )
        .await;
        code(&o, 0, "rollback");
        assert!(stdout(&o).contains("compensating"), "[{b}] {}", stdout(&o));
        expect_recharged(&rig, id, &order, b).await;
        server.abort();
        rig.stop().await;
    }
}

/// `past@1`: `charge`, the pivot, then `ship`, retriable, which refuses: a run stops in
/// error past its point of no return.
fn past() -> Workflow {
    Workflow::builder("past", 1)
        .step("charge", |_: StepContext| async { Ok::<_, StepError>(1) })
        .pivot()
        .step("ship", |_: StepContext| async {
            Err::<(), _>(StepError::refused("no_carrier", "no carrier"))
        })
        .after(["charge"])
        .retriable()
        .build()
        .expect("past")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_is_refused_with_the_reason_when_it_cannot_be_done_safely() {
    for db in backends().await {
        let b = db.backend;
        let rig = rig(&db).await;
        let engine = fast_builder(&db)
            .with_workflow(past())
            .start()
            .await
            .expect("engine");
        let op = rig.engine.operator().on_behalf_of("ops:ann", "try");
        let refused = |r: sagaflow::Result<RunState>, needle: &str| match r {
            Err(Error::ActionNotAllowed { reason, .. }) if reason.contains(needle) => {}
            other => panic!("[{b}] expected a refusal saying {needle:?}: {other:?}"),
        };
        let (id, order) = rig.over_limit(4, b).await;
        refused(op.rollback(id, "approve", None).await, "not completed");
        refused(op.rollback(id, "pack", None).await, "no step `pack`");
        let bad = op
            .rollback(id, "reserve_stock", Some(json!({ "order_id": 7 })))
            .await;
        assert!(
            matches!(bad, Err(Error::InvalidInput { .. })),
            "[{b}] {bad:?}"
        );
        // Nothing was written: still in error, charged once, nothing refunded.
        let run = rig.engine.run(id).await.expect("read").expect("run");
        assert_eq!(run.state, RunState::Error, "[{b}]");
        assert_eq!(run.input["amount_cents"], 9_999, "[{b}]");
        assert!(rig.effects(&order, Operation::Refund).is_empty(), "[{b}]");

        // Past the pivot nothing before it is undone.
        let stopped = engine.start("past", &json!(null)).await.expect("start");
        expect_state(&engine, stopped, RunState::Error, b).await;
        refused(
            engine.operator().rollback(stopped, "charge", None).await,
            "point of no return",
        );
        // A finished run does not roll back.
        let ok = Order {
            amount_cents: 100,
            ..Order::sample(5)
        };
        let done = rig.engine.start("settle", &ok).await.expect("start");
        expect_state(&rig.engine, done, RunState::Completed, b).await;
        refused(
            op.rollback(done, "reserve_stock", None).await,
            "only a running run or one in error",
        );
        engine.shutdown().await;
        rig.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_rolls_a_run_back_in_the_browser() {
    use crate::console::{Driver, click, js, screenshot, text_of, wait_css};
    use futures_util::FutureExt as _;
    let Some(driver) = crate::console::chromedriver() else {
        return;
    };
    let _turn = crate::fixtures::timing_turn().await;
    let db = sagaflow_testkit::sqlite_db();
    let rig = rig(&db).await;
    let (id, order) = rig.over_limit(6, "sqlite").await;
    let (addr, server) = serve_admin(&rig.engine, admin_tokens(OPS, VIEW)).await;
    let driver = Driver::start(&driver).await;
    let b = driver.browser().await;
    let walked = std::panic::AssertUnwindSafe(async {
        let url = |path: &str| format!("http://{addr}{path}");
        crate::console::log_in(&b, addr, OPS).await;
        b.goto(&url(&format!("/console/runs/{id}")))
            .await
            .expect("run page");
        wait_css(&b, "#run-state[data-state=error]").await;
        let form = "details[data-action=rollback][data-step=reserve_stock]";
        click(&b, &format!("{form} summary")).await;
        let input = json!(Order {
            amount_cents: 2_500,
            ..order.clone()
        })
        .to_string();
        js(
            &b,
            &format!(
                "document.querySelector('{form} textarea[name=input]').value = {}; return true;",
                serde_json::Value::from(input)
            ),
        )
        .await;
        wait_css(&b, &format!("{form} textarea[name=reason]"))
            .await
            .send_keys("charged over the limit")
            .await
            .expect("type");
        screenshot(&b, "console-rollback.png").await;
        click(&b, &format!("{form} button.confirm")).await;
        assert!(
            text_of(&b, "#notice").await.contains("rollback"),
            "the flash says what happened"
        );
        wait_css(&b, "#run-state[data-state=completed]").await;
    })
    .catch_unwind()
    .await;
    let _ = b.close().await;
    drop(driver);
    server.abort();
    if walked.is_ok() {
        expect_recharged(&rig, id, &order, "sqlite").await;
    }
    rig.stop().await;
    if let Err(panic) = walked {
        std::panic::resume_unwind(panic);
    }
}
