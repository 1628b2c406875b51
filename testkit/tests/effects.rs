//! The example of docs/testing.md: a saga against the effect service, on both backends.
use sagaflow::{RunState, Workflow};
use sagaflow_testkit::effects::{EffectServer, Refusal};
use sagaflow_testkit::{backends, engine, expect_state};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hotel_cancels_the_flight_exactly_once() {
    for db in backends().await {
        let server = EffectServer::builder()
            .operation("book_flight", |_| Ok(json!({ "booking": "F-1" })))
            .operation("cancel_flight", |req| Ok(req.clone()))
            .operation("book_hotel", |_| Err(Refusal::rejected("sold out")))
            .start()
            .await
            .expect("loopback effect server");
        let wf = Workflow::builder("trip", 1)
            .step_using("flight", server.client(), |api, ctx| async move {
                api.call(ctx.idempotency_key(), "book_flight", &()).await
            })
            .compensate_using(server.client(), |api, ctx| async move {
                let booked: Value = ctx.output()?; // what book_flight answered
                api.call(ctx.idempotency_key(), "cancel_flight", &booked)
                    .await
            })
            .step_using("hotel", server.client(), |api, ctx| async move {
                api.call(ctx.idempotency_key(), "book_hotel", &()).await
            })
            .after(["flight"])
            .build()
            .expect("valid workflow");
        let engine = engine(&db, vec![wf]).await;
        let id = engine.start("trip", &()).await.expect("start");
        expect_state(&engine, id, RunState::Compensated, db.backend).await;
        let ledger = server.ledger(); // one flight booked, then cancelled, each exactly once
        let pairs = ledger.pairs("book_flight", "cancel_flight", "booking");
        assert!(pairs.matched.len() == 1 && pairs.is_net(), "{pairs:?}");
        engine.shutdown().await;
    }
}
