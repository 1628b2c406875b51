//! The effect service against its real loopback server: apply once, replay, missing key,
//! refusals, every scripted fault, and the ledger's netting check.

use std::time::Duration;

use sagaflow::StepError;
use serde_json::{Value, json};

use super::*;
use crate::eventually;
use crate::services::{IDEMPOTENCY_KEY_HEADER, Scripted, Scripted as S};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Generous bound for anything that must happen (keeps a broken test from hanging).
const BOUND: Duration = Duration::from_secs(5);

/// A server with `book` (answers a booking id from the request's `trip`), `cancel` (echoes
/// its request), and `refuse_*` operations that always refuse.
async fn server() -> Result<EffectServer, EffectError> {
    EffectServer::builder()
        .operation("book", |req| {
            Ok(json!({ "booking": format!("B-{}", req["trip"]) }))
        })
        .operation("cancel", |req| Ok(req.clone()))
        .operation("refuse_422", |_| Err(Refusal::rejected("sold out")))
        .operation("refuse_409", |_| {
            Err(Refusal::conflict("already cancelled"))
        })
        .start()
        .await
}

/// [`server`] with `outcomes` scripted for `book`, and a client of it.
async fn scripted(outcomes: &[Scripted]) -> Result<(EffectServer, EffectClient), EffectError> {
    let server = server().await?;
    server.script("book", outcomes.iter().copied())?;
    let client = server.client();
    Ok((server, client))
}

/// The error of a call that must fail.
async fn failure(
    client: &EffectClient,
    key: &str,
    op: &str,
    body: &Value,
) -> Result<StepError, String> {
    match client.call(key, op, body).await {
        Ok(answer) => Err(format!("{op} under {key:?} answered {answer}")),
        Err(err) => Ok(err),
    }
}

fn trip(n: u32) -> Value {
    json!({ "trip": n })
}

fn not_applied(err: &StepError) -> bool {
    !err.may_have_applied()
}

#[tokio::test]
async fn the_first_call_applies_and_a_repeat_replays() -> TestResult {
    let server = server().await?;
    assert!(server.addr().ip().is_loopback());
    let client = server.client();
    let first = client.call("k1", "book", &trip(1)).await?;
    let again = client.call("k1", "book", &trip(1)).await?;
    assert_eq!(first, json!({ "booking": "B-1" }));
    assert_eq!(again, first);
    client.call("k2", "book", &trip(2)).await?;
    // The same key for another operation is another effect.
    client.call("k1", "cancel", &first).await?;

    let ledger = server.ledger();
    assert_eq!((ledger.applied("book"), ledger.replays("book")), (2, 1));
    assert_eq!(ledger.applied("cancel"), 1);
    let record = ledger.get("book", "k1").ok_or("no record of k1")?;
    assert_eq!((record.seq, record.replays), (1, 1));
    assert_eq!(record.request, trip(1));
    assert_eq!(ledger.records().len(), 3);
    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn concurrent_first_calls_apply_once() -> TestResult {
    let server = server().await?;
    let calls = (0..8).map(|_| {
        let client = server.client();
        tokio::spawn(async move { client.call("k", "book", &trip(7)).await })
    });
    for call in calls.collect::<Vec<_>>() {
        assert_eq!(call.await??, json!({ "booking": "B-7" }));
    }
    let ledger = server.ledger();
    assert_eq!((ledger.applied("book"), ledger.replays("book")), (1, 7));
    Ok(())
}

#[tokio::test]
async fn a_call_without_a_key_is_400_and_applies_nothing() -> TestResult {
    let server = server().await?;
    let url = format!("{}/book", server.base_url());
    let raw = reqwest::Client::new()
        .post(&url)
        .json(&trip(1))
        .send()
        .await?;
    assert_eq!(raw.status().as_u16(), 400);
    let err = failure(&server.client(), "", "book", &trip(1)).await?;
    assert!(!err.retryable && not_applied(&err), "{err:?}");
    assert!(server.ledger().is_empty());
    Ok(())
}

#[tokio::test]
async fn refusals_are_409_or_422_and_apply_nothing() -> TestResult {
    let server = server().await?;
    let http = reqwest::Client::new();
    for (op, status) in [("refuse_422", 422), ("refuse_409", 409)] {
        let url = format!("{}/{op}", server.base_url());
        let raw = http.post(&url).header(IDEMPOTENCY_KEY_HEADER, "raw");
        assert_eq!(raw.json(&trip(1)).send().await?.status().as_u16(), status);
        let err = failure(&server.client(), "k", op, &trip(1)).await?;
        assert_eq!(
            err,
            StepError::refused(err.code.clone(), err.message.clone())
        );
        assert_eq!(server.ledger().refused(op), 2);
    }
    assert!(server.ledger().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_reused_key_with_another_request_is_refused() -> TestResult {
    let server = server().await?;
    let client = server.client();
    client.call("k", "book", &trip(1)).await?;
    let err = failure(&client, "k", "book", &trip(2)).await?;
    assert!(!err.retryable && not_applied(&err), "{err:?}");
    assert_eq!(server.ledger().applied("book"), 1);
    Ok(())
}

#[tokio::test]
async fn unknown_operations_are_refused() -> TestResult {
    let server = server().await?;
    let script = server.script("nope", [Scripted::Transient]);
    assert!(matches!(script, Err(EffectError::UnknownOperation(op)) if op == "nope"));
    let err = failure(&server.client(), "k", "nope", &trip(1)).await?;
    assert!(!err.retryable && not_applied(&err), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn invalid_or_duplicate_names_do_not_start() {
    let bad = EffectServer::builder().operation("a/b", |_| Ok(Value::Null));
    let started = bad.start().await;
    assert!(matches!(started, Err(EffectError::InvalidOperation(n)) if n == "a/b"));
    let twice = EffectServer::builder()
        .operation("a", |_| Ok(Value::Null))
        .operation("a", |_| Ok(Value::Null));
    let started = twice.start().await;
    assert!(matches!(started, Err(EffectError::DuplicateOperation(n)) if n == "a"));
}

#[tokio::test]
async fn faults_answered_before_applying_leave_nothing_applied() -> TestResult {
    let cases = [
        (S::Transient, "transient", true),
        (S::BusyNotApplied, "busy", true),
        (S::Permanent, "permanent", false),
        (S::RefuseNotApplied, "conflict", false),
    ];
    let (server, client) = scripted(&cases.map(|(fault, ..)| fault)).await?;
    for (fault, code, retryable) in cases {
        let err = failure(&client, "k", "book", &trip(1)).await?;
        assert_eq!((err.code.as_str(), err.retryable), (code, retryable));
        assert!(not_applied(&err), "{fault:?}: {err:?}");
        if fault == S::BusyNotApplied {
            assert_eq!(err.details, Some(json!({ "retry_after_ms": 1000 })));
        }
    }
    assert!(server.ledger().is_empty());
    assert_eq!(server.scripted_left("book"), 0);
    assert_eq!(server.fault_counts().total(), 4);

    client.call("k", "book", &trip(1)).await?;
    assert_eq!(server.ledger().applied("book"), 1);
    Ok(())
}

#[tokio::test]
async fn lost_replies_apply_and_leave_the_outcome_unknown() -> TestResult {
    let lost = [
        S::ResetAfterApply,
        S::BadGatewayAfterApply,
        S::GatewayTimeoutAfterApply,
    ];
    let (server, client) = scripted(&lost).await?;
    for (n, fault) in (1..).zip(lost) {
        let err = failure(&client, "k", "book", &trip(1)).await?;
        assert!(
            err.retryable && err.may_have_applied(),
            "{fault:?}: {err:?}"
        );
        assert_eq!(err.code, "transport");
        let ledger = server.ledger();
        assert_eq!((ledger.applied("book"), ledger.replays("book")), (1, n - 1));
    }
    // The retry gets the stored answer.
    assert_eq!(
        client.call("k", "book", &trip(1)).await?,
        json!({ "booking": "B-1" })
    );
    assert_eq!(server.fault_counts().lost_reply, 3);
    Ok(())
}

#[tokio::test]
async fn a_hang_applies_and_answers_nothing_until_shutdown() -> TestResult {
    let (server, client) = scripted(&[Scripted::Hang, Scripted::Hang]).await?;

    // A caller with a timeout gives up with an unknown outcome.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()?;
    let impatient = EffectClient::with_client(server.base_url(), http);
    let err = failure(&impatient, "k1", "book", &trip(1)).await?;
    assert!(err.retryable && err.may_have_applied(), "{err:?}");

    // A caller without one waits until the server stops, then gets a 502.
    let waiting = tokio::spawn(async move { client.call("k2", "book", &trip(2)).await });
    let ledger = server.ledger();
    eventually(BOUND, "both hung calls applied", || {
        let applied = ledger.applied("book");
        async move { applied == 2 }
    })
    .await;
    assert!(!waiting.is_finished());
    server.shutdown().await?;
    let err = tokio::time::timeout(BOUND, waiting).await??.err();
    let err = err.ok_or("a hung call answered 2xx")?;
    assert!(err.retryable && err.may_have_applied(), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn pairs_net_forward_effects_against_their_undos() -> TestResult {
    let server = server().await?;
    let client = server.client();
    let b1 = client.call("f1", "book", &trip(1)).await?;
    client.call("f2", "book", &trip(2)).await?;
    client.call("u1", "cancel", &b1).await?;
    client
        .call("u3", "cancel", &json!({ "booking": "B-3" }))
        .await?;

    let pairs = server.ledger().pairs("book", "cancel", "booking");
    assert!(!pairs.is_net());
    assert_eq!(pairs.matched.len(), 1);
    assert_eq!(
        (
            pairs.matched[0].0.key.as_str(),
            pairs.matched[0].1.key.as_str()
        ),
        ("f1", "u1")
    );
    let keys = |effects: &[Effect]| effects.iter().map(|e| e.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&pairs.not_undone), ["f2"]);
    assert_eq!(keys(&pairs.undoes_nothing), ["u3"]);

    client
        .call("u2", "cancel", &json!({ "booking": "B-2" }))
        .await?;
    client
        .call("u3", "cancel", &json!({ "booking": "B-3" }))
        .await?; // a replay, not an effect
    let ledger = server.ledger();
    assert_eq!(ledger.pairs("book", "cancel", "booking").matched.len(), 2);
    assert!(ledger.pairs("book", "cancel", "trip").not_undone.len() == 2);
    Ok(())
}
