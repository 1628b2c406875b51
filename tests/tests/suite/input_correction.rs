//! Corrected inputs, on both backends: a run that stopped because of what it was given (a
//! step refuses its sku) takes a new input from an operator and resumes with it; the history
//! keeps the old input and the new one with who and why; an input the workflow's schema
//! refuses changes nothing; a run that is not parked for an operator is refused.

use reqwest::StatusCode;
use sagaflow::{Engine, Error, HistoryKind, OnFailure, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, expect_state, fast_builder};
use serde_json::json;
use uuid::Uuid;

use crate::fixtures::{admin_tokens, answer, serve_admin};

const OPS: &str = "ops-secret-0123456789";
const VIEW: &str = "view-secret-0123456789";

#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
struct Item {
    sku: String,
    #[schemars(range(min = 1))]
    qty: u32,
}

/// `fulfil@1`: `charge` (the point of no return), then `ship`, which refuses the sku
/// `bad-sku`. A refusal after the pivot cannot be compensated: the run stops in `error`.
/// With `pause`, the workflow parks a failed run instead, and `charge` is undoable.
fn fulfil(pause: bool) -> Workflow {
    let mut b = Workflow::builder("fulfil", 1)
        .input::<Item>()
        .step("charge", |_: StepContext| async {
            Ok::<_, StepError>("charged")
        });
    b = if pause {
        b.compensate(|_: StepContext| async { Ok::<_, StepError>(()) })
            .on_failure(OnFailure::Pause)
    } else {
        b.pivot()
    };
    b = b
        .step("ship", |ctx: StepContext| async move {
            let item: Item = ctx.input()?;
            if item.sku == "bad-sku" {
                return Err(StepError::refused("unknown_sku", "no such sku: bad-sku"));
            }
            Ok(format!("{} x {}", item.qty, item.sku))
        })
        .after(["charge"]);
    if !pause {
        b = b.retriable();
    }
    b.build().expect("fulfil")
}

async fn engine(db: &TestDb, pause: bool) -> Engine {
    fast_builder(db)
        .with_workflow(fulfil(pause))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend))
}

/// Starts a run with the bad sku and waits until it stops in `state`.
async fn stopped(engine: &Engine, state: RunState, b: &str) -> Uuid {
    let id = engine
        .start("fulfil", &json!({ "sku": "bad-sku", "qty": 2 }))
        .await
        .expect("start");
    sagaflow_testkit::eventually(
        std::time::Duration::from_secs(30),
        "the run to stop for an operator",
        || async { engine.run(id).await.ok().flatten().map(|r| r.state) == Some(state) },
    )
    .await;
    let _ = b;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_correction_resumes_a_run_in_error_with_the_new_input() {
    for db in backends().await {
        let b = db.backend;
        let engine = engine(&db, false).await;
        let id = stopped(&engine, RunState::Error, b).await;

        let op = engine
            .operator()
            .on_behalf_of("ops:ada", "the sku was mistyped");
        let state = op
            .replace_input(id, json!({ "sku": "A-1", "qty": 2 }))
            .await
            .expect("replace input");
        assert_eq!(state, RunState::Running, "[{b}]");
        let run = expect_state(&engine, id, RunState::Completed, b).await;
        assert_eq!(run.input, json!({ "sku": "A-1", "qty": 2 }), "[{b}]");
        let output = run.output.expect("output");
        assert_eq!(output["ship"], "2 x A-1", "[{b}] {output}");

        let history = engine.history(id).await.expect("history");
        let event = history
            .iter()
            .find(|h| h.kind == HistoryKind::OperatorReplaceInput)
            .unwrap_or_else(|| panic!("[{b}] no input_replaced event"));
        assert_eq!(event.actor, "ops:ada", "[{b}]");
        let detail = event.detail.clone().expect("detail");
        assert_eq!(
            detail["old"],
            json!({ "sku": "bad-sku", "qty": 2 }),
            "[{b}]"
        );
        assert_eq!(detail["new"], json!({ "sku": "A-1", "qty": 2 }), "[{b}]");
        assert_eq!(detail["reason"], "the sku was mistyped", "[{b}]");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_correction_resumes_a_paused_run() {
    for db in backends().await {
        let b = db.backend;
        let engine = engine(&db, true).await;
        let id = stopped(&engine, RunState::Paused, b).await;
        let state = engine
            .operator()
            .on_behalf_of("ops:ada", "sku corrected")
            .replace_input(id, json!({ "sku": "B-7", "qty": 1 }))
            .await
            .expect("replace input");
        assert_eq!(state, RunState::Running, "[{b}]");
        let run = expect_state(&engine, id, RunState::Completed, b).await;
        assert_eq!(run.output.expect("output")["ship"], "1 x B-7", "[{b}]");
        // The failure the run was parked for stays as its last (overcome) error.
        assert!(
            run.error.as_ref().is_none_or(|e| e["code"] != "paused"),
            "[{b}] {:?}",
            run.error
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_correction_refuses_an_invalid_input_and_changes_nothing() {
    for db in backends().await {
        let b = db.backend;
        let engine = engine(&db, false).await;
        let id = stopped(&engine, RunState::Error, b).await;
        let before = engine.run(id).await.expect("read").expect("run");
        let history = engine.history(id).await.expect("history").len();
        let op = engine.operator().on_behalf_of("ops:ada", "try");

        match op
            .replace_input(id, json!({ "sku": "A-1", "qty": 0 }))
            .await
        {
            Err(Error::InvalidInput { field, .. }) => {
                let field = field.unwrap_or_else(|| panic!("[{b}] the field is named"));
                assert_eq!(field.pointer, "/qty", "[{b}] {field:?}");
            }
            other => panic!("[{b}] expected invalid input, got {other:?}"),
        }
        assert!(
            matches!(
                op.replace_input(id, json!({ "qty": 1 })).await,
                Err(Error::InvalidInput { .. })
            ),
            "[{b}] a missing field is refused"
        );
        let after = engine.run(id).await.expect("read").expect("run");
        assert_eq!(
            (after.state, &after.input, after.updated_at),
            (before.state, &before.input, before.updated_at),
            "[{b}] nothing changed"
        );
        assert_eq!(
            engine.history(id).await.expect("history").len(),
            history,
            "[{b}] nothing recorded"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_correction_refuses_a_run_not_parked_for_an_operator() {
    for db in backends().await {
        let b = db.backend;
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let held = gate.clone();
        let wf = Workflow::builder("held", 1)
            .step("wait", move |_: StepContext| {
                let gate = held.clone();
                async move {
                    let _permit = gate
                        .acquire()
                        .await
                        .map_err(|e| StepError::retryable("gate", e.to_string()))?;
                    Ok(())
                }
            })
            .build()
            .expect("held");
        let engine = fast_builder(&db)
            .with_workflow(wf)
            .start()
            .await
            .expect("start engine");
        let id = engine
            .start("held", &json!({ "n": 1 }))
            .await
            .expect("start");
        let op = engine.operator().on_behalf_of("ops:ada", "try");
        match op.replace_input(id, json!({ "n": 2 })).await {
            Err(Error::ActionNotAllowed { reason, .. }) => {
                assert!(reason.contains("paused"), "[{b}] {reason}");
            }
            other => panic!("[{b}] expected a refusal, got {other:?}"),
        }
        assert_eq!(
            engine.run(id).await.expect("read").expect("run").input,
            json!({ "n": 1 }),
            "[{b}]"
        );
        gate.add_permits(1);
        expect_state(&engine, id, RunState::Completed, b).await;
        assert!(
            matches!(
                op.replace_input(id, json!({ "n": 2 })).await,
                Err(Error::ActionNotAllowed { .. })
            ),
            "[{b}] a finished run is refused"
        );
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_correction_over_the_api_needs_an_operator_token_and_a_reason() {
    for db in backends().await {
        let b = db.backend;
        let engine = engine(&db, false).await;
        let (addr, server) = serve_admin(&engine, admin_tokens(OPS, VIEW)).await;
        let id = stopped(&engine, RunState::Error, b).await;
        let http = reqwest::Client::new();
        let url = format!("http://{addr}/api/v1/runs/{id}/input");
        let good = json!({ "input": { "sku": "C-3", "qty": 4 }, "reason": "sku corrected" });

        let (status, _) = answer(http.put(&url).json(&good)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "[{b}]");
        let (status, body) = answer(http.put(&url).bearer_auth(VIEW).json(&good)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "[{b}] {body}");
        let (status, body) = answer(
            http.put(&url)
                .bearer_auth(OPS)
                .json(&json!({ "input": { "sku": "C-3", "qty": 4 } })),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("reason_required")),
            "[{b}] {body}"
        );
        let (status, body) = answer(
            http.put(&url)
                .bearer_auth(OPS)
                .json(&json!({ "input": { "sku": 7, "qty": 4 }, "reason": "r" })),
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_input")),
            "[{b}] {body}"
        );
        assert_eq!(
            body["error"]["fields"][0]["pointer"], "/sku",
            "[{b}] {body}"
        );
        assert_eq!(
            engine.run(id).await.expect("read").expect("run").state,
            RunState::Error,
            "[{b}] refused requests changed nothing"
        );

        let (status, body) = answer(http.put(&url).bearer_auth(OPS).json(&good)).await;
        assert_eq!(status, StatusCode::OK, "[{b}] {body}");
        assert_eq!(body["actor"], "api:ops", "[{b}] {body}");
        assert_eq!(body["state"], "running", "[{b}] {body}");
        let run = expect_state(&engine, id, RunState::Completed, b).await;
        assert_eq!(run.output.expect("output")["ship"], "4 x C-3", "[{b}]");
        let (status, body) = answer(http.put(&url).bearer_auth(OPS).json(&good)).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("action_not_allowed")),
            "[{b}] {body}"
        );
        server.abort();
        engine.shutdown().await;
    }
}
