//! Parked steps on both backends: timers that fire once across instances and a SIGKILL;
//! events that arrive before, during and after their step's wait, by run id or business
//! key; timeouts that take their configured path; callback tokens completed over loopback
//! HTTP (and a forged one refused); child runs whose compensation and cancellation cascade.
//! Named so that `cargo test timer`, `event` and `child` select them.

use std::sync::Arc;
use std::time::Duration;

use sagaflow::{
    CallbackResult, Engine, EventDelivery, EventTarget, EventWait, OnTimeout, RunState,
    StartOptions, StepContext, StepError, StepState, Uuid, Workflow,
};
use sagaflow_testkit::effects::{EffectClient, EffectServer};
use sagaflow_testkit::{ChildTest, TestDb, backends, engine, eventually, expect_state};

use crate::fixtures::parked;
use serde_json::{Value, json};
use tokio::sync::Notify;

const WAIT: Duration = Duration::from_secs(30);

/// An effect server with the operations these sagas call: each answers what it was sent.
async fn effects() -> EffectServer {
    EffectServer::builder()
        .operation("notify", |req: &Value| Ok(req.clone()))
        .operation("reserve", |req: &Value| Ok(req.clone()))
        .operation("release", |req: &Value| Ok(req.clone()))
        .operation("ship", |req: &Value| Ok(req.clone()))
        .operation("charge_async", |req: &Value| Ok(req.clone()))
        .start()
        .await
        .expect("effect server")
}

/// A step body that calls `op` on the effect server with the step's idempotency key and
/// answers the body it sent: `{run, deps}`.
fn call(
    client: &EffectClient,
    op: &'static str,
) -> impl Fn(StepContext) -> futures_like::BoxFut + Send + Sync + 'static {
    let client = client.clone();
    move |ctx: StepContext| {
        let client = client.clone();
        Box::pin(async move {
            let body = json!({ "run": ctx.run_id(), "step": ctx.step() });
            client.call(ctx.idempotency_key(), op, &body).await
        })
    }
}

mod futures_like {
    pub(super) type BoxFut = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<serde_json::Value, sagaflow::StepError>> + Send,
        >,
    >;
}

/// `timed@1`: a timer `hold`, then `notify` on the effect server.
fn timed(client: &EffectClient, hold: Duration) -> Workflow {
    Workflow::builder("timed", 1)
        .timer("hold", hold)
        .step("notify", call(client, "notify"))
        .after(["hold"])
        .build()
        .expect("valid")
}

/// How often `step` of run `id` did `event` (history kind as stored).
async fn count(engine: &Engine, id: Uuid, step: &str, event: &str) -> usize {
    engine
        .history(id)
        .await
        .expect("history")
        .iter()
        .filter(|h| h.step.as_deref() == Some(step) && h.kind.to_string() == event)
        .count()
}

fn child_env(db: &TestDb, effects: &str, submit: usize) -> Vec<(&'static str, String)> {
    vec![
        ("SAGAFLOW_TIMER_CHILD", "1".into()),
        ("SAGAFLOW_TIMER_DB", db.url.clone()),
        ("SAGAFLOW_TIMER_EFFECTS", effects.into()),
        ("SAGAFLOW_TIMER_SUBMIT", submit.to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_fires_once_across_two_instances_and_a_sigkill() {
    const RUNS: usize = 6;
    for db in backends().await {
        let server = effects().await;
        // The first instance, a real process, starts the runs and is killed while their
        // timers are parked; the second, in this process, runs beside it all along.
        let mut first = ChildTest::spawn(
            "waits::timer_child_engine",
            &child_env(&db, &server.base_url(), RUNS),
        );
        let second = sagaflow_testkit::fast_builder(&db)
            .with_instance_id("timer-second")
            .with_workflow(timed(&server.client(), Duration::from_secs(3)))
            .start()
            .await
            .expect("second engine");
        let parked = eventually(WAIT, "every timer parked", || async {
            second
                .waiting_steps(None, 100)
                .await
                .is_ok_and(|w| w.len() == RUNS)
        });
        parked.await;
        first
            .child
            .kill()
            .await
            .expect("SIGKILL the first instance");

        let ids: Vec<Uuid> = second
            .list_runs(&sagaflow::RunQuery::default())
            .await
            .expect("list")
            .runs
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids.len(), RUNS, "[{}]", db.backend);
        for &id in &ids {
            expect_state(&second, id, RunState::Completed, db.backend).await;
            // One wake and one completion of the timer, one notification.
            assert_eq!(
                count(&second, id, "hold", "woken").await,
                1,
                "[{}]",
                db.backend
            );
            assert_eq!(
                count(&second, id, "hold", "completed").await,
                1,
                "[{}]",
                db.backend
            );
        }
        assert_eq!(server.ledger().applied("notify"), RUNS, "[{}]", db.backend);
        let calls = server
            .calls()
            .iter()
            .filter(|c| c.operation == "notify")
            .count();
        assert_eq!(
            calls, RUNS,
            "[{}] each notification called once",
            db.backend
        );
        second.shutdown().await;
        server.shutdown().await.expect("stop effects");
    }
}

/// The first instance of `timer_fires_once_…`: starts the runs, then lives until killed.
#[tokio::test]
#[ignore = "run as a child process by timer_fires_once_across_two_instances_and_a_sigkill"]
async fn timer_child_engine() {
    if std::env::var("SAGAFLOW_TIMER_CHILD").as_deref() != Ok("1") {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let client = EffectClient::new(var("SAGAFLOW_TIMER_EFFECTS"));
    let engine = Engine::builder()
        .with_database_url(var("SAGAFLOW_TIMER_DB"))
        .with_instance_id("timer-first")
        .with_workflow(timed(&client, Duration::from_secs(3)))
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(100))
        .with_timer_interval(Duration::from_millis(50))
        .with_lease(Duration::from_secs(2), Duration::from_millis(400))
        .start()
        .await
        .expect("child engine");
    let n: usize = var("SAGAFLOW_TIMER_SUBMIT").parse().expect("count");
    for _ in 0..n {
        engine.start("timed", &()).await.expect("start");
    }
    tokio::time::sleep(Duration::from_secs(180)).await;
}

/// `approval@1`: `reserve` (waits for `gate` when given; undone by `release`), then the
/// event wait `approval`, then `ship`, which answers the approval it saw.
fn approval(
    name: &str,
    server: &EffectServer,
    within: Duration,
    on_timeout: OnTimeout,
    gate: Option<Arc<Notify>>,
) -> Workflow {
    let client = server.client();
    let undo = server.client();
    Workflow::builder(name, 1)
        .step("reserve", move |ctx: StepContext| {
            let client = client.clone();
            let gate = gate.clone();
            async move {
                if let Some(g) = gate {
                    g.notified().await;
                }
                client
                    .call(
                        ctx.idempotency_key(),
                        "reserve",
                        &json!({ "run": ctx.run_id() }),
                    )
                    .await
            }
        })
        .compensate(move |ctx: StepContext| {
            let client = undo.clone();
            async move {
                client
                    .call(
                        ctx.idempotency_key(),
                        "release",
                        &json!({ "run": ctx.run_id() }),
                    )
                    .await
            }
        })
        .wait_for_event(
            "approval",
            EventWait::named("manager_approval")
                .within(within)
                .on_timeout(on_timeout),
        )
        .after(["reserve"])
        .step("ship", |ctx: StepContext| async move {
            ctx.dep::<Value>("approval")
        })
        .after(["approval"])
        .build()
        .expect("valid")
}

async fn output_of(engine: &Engine, id: Uuid, step: &str) -> Value {
    let run = engine.run(id).await.expect("run").expect("exists");
    run.output.expect("output")[step].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_arrives_before_during_and_after_the_wait() {
    for db in backends().await {
        let server = effects().await;
        let gate = Arc::new(Notify::new());
        let wf = approval(
            "approval",
            &server,
            Duration::from_millis(600),
            OnTimeout::Default(json!({ "approved": false, "by": "nobody" })),
            Some(gate.clone()),
        );
        let engine = engine(&db, vec![wf]).await;

        // Before: sent while `reserve` still runs; kept, then taken when the step waits.
        let early = engine
            .start_with("approval", &(), StartOptions::keyed("order-1"))
            .await
            .expect("start");
        eventually(WAIT, "reserve running", || async {
            engine.steps(early.id).await.is_ok_and(|s| {
                s.iter()
                    .any(|s| s.name == "reserve" && s.state == StepState::Running)
            })
        })
        .await;
        let kept = engine
            .send_event(
                EventTarget::key("approval", "order-1"),
                "manager_approval",
                &json!({ "approved": true, "by": "ann" }),
            )
            .await
            .expect("send");
        assert_eq!(
            kept,
            EventDelivery::Kept { run_id: early.id },
            "[{}]",
            db.backend
        );
        gate.notify_one();
        expect_state(&engine, early.id, RunState::Completed, db.backend).await;
        assert_eq!(output_of(&engine, early.id, "ship").await["by"], "ann");

        // During: the step waits; the event completes it at once.
        let during = engine.start("approval", &()).await.expect("start");
        gate.notify_one();
        eventually(WAIT, "approval waiting", || async {
            engine
                .waiting_steps(Some(during), 10)
                .await
                .is_ok_and(|w| w.iter().any(|w| w.step == "approval"))
        })
        .await;
        let waiting = engine.waiting_steps(Some(during), 10).await.expect("list");
        assert!(waiting[0].due_at.is_some(), "a wait shows its timeout");
        let sent = engine
            .send_event(
                during,
                "manager_approval",
                &json!({ "approved": true, "by": "bob" }),
            )
            .await
            .expect("send");
        assert_eq!(
            sent,
            EventDelivery::Delivered {
                run_id: during,
                step: "approval".into()
            }
        );
        expect_state(&engine, during, RunState::Completed, db.backend).await;
        assert_eq!(output_of(&engine, during, "ship").await["by"], "bob");

        // After: the timeout passed first and took its default; a late event is refused.
        let late = engine.start("approval", &()).await.expect("start");
        gate.notify_one();
        expect_state(&engine, late, RunState::Completed, db.backend).await;
        assert_eq!(output_of(&engine, late, "ship").await["by"], "nobody");
        let refused = engine
            .send_event(late, "manager_approval", &json!({ "approved": true }))
            .await;
        assert!(
            matches!(refused, Err(sagaflow::Error::ActionNotAllowed { .. })),
            "[{}] {refused:?}",
            db.backend
        );
        // No such run by key.
        let unknown = engine
            .send_event(EventTarget::key("approval", "nope"), "manager_approval", &1)
            .await;
        assert!(matches!(unknown, Err(sagaflow::Error::KeyNotFound { .. })));
        assert_eq!(server.ledger().applied("release"), 0, "nothing undone");
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_timeout_takes_the_configured_path() {
    for db in backends().await {
        let server = effects().await;
        let short = Duration::from_millis(300);
        let engine = sagaflow_testkit::fast_builder(&db)
            .with_workflow(approval(
                "undo",
                &server,
                short,
                OnTimeout::Compensate,
                None,
            ))
            .with_workflow(approval("ask", &server, short, OnTimeout::Fail, None))
            .with_workflow(approval(
                "assume",
                &server,
                short,
                OnTimeout::Default(json!({ "by": "default" })),
                None,
            ))
            .start()
            .await
            .expect("engine");

        // Compensate: the reservation is released and the run ends compensated.
        let undo = engine.start("undo", &()).await.expect("start");
        expect_state(&engine, undo, RunState::Compensated, db.backend).await;
        assert_eq!(server.ledger().applied("release"), 1, "[{}]", db.backend);

        // Fail: an operator decides (an alert), nothing is undone by itself.
        let ask = engine.start("ask", &()).await.expect("start");
        let run = expect_state(&engine, ask, RunState::Error, db.backend).await;
        assert!(
            run.error
                .as_ref()
                .is_some_and(|e| e["code"] == "wait_timed_out"),
            "[{}] {:?}",
            db.backend,
            run.error
        );
        assert!(!engine.run_alerts(ask).await.expect("alerts").is_empty());
        assert_eq!(server.ledger().applied("release"), 1, "no second release");

        // Default: the run goes on with the default as the event's payload.
        let assume = engine.start("assume", &()).await.expect("start");
        expect_state(&engine, assume, RunState::Completed, db.backend).await;
        assert_eq!(output_of(&engine, assume, "ship").await["by"], "default");
        assert_eq!(count(&engine, assume, "approval", "parked").await, 1);
        assert_eq!(count(&engine, assume, "approval", "woken").await, 1);
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

/// `payment@1`: `charge` hands the remote a callback token and waits for its call.
fn payment(server: &EffectServer, tokens: Arc<std::sync::Mutex<Vec<String>>>) -> Workflow {
    let client = server.client();
    Workflow::builder("payment", 1)
        .step("charge", move |ctx: StepContext| {
            let client = client.clone();
            let tokens = tokens.clone();
            async move {
                let token = ctx.callback_token().await?;
                client
                    .call(
                        ctx.idempotency_key(),
                        "charge_async",
                        &json!({ "token": token }),
                    )
                    .await?;
                tokens.lock().expect("tokens").push(token);
                Err::<Value, _>(ctx.await_callback(Duration::from_secs(60)).await)
            }
        })
        .build()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_callback_token_completes_a_step_over_http_and_a_forged_one_is_refused() {
    for db in backends().await {
        let server = effects().await;
        let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
        let engine = engine(&db, vec![payment(&server, tokens.clone())]).await;
        let (addr, _admin) = crate::fixtures::serve_admin(
            &engine,
            crate::fixtures::admin_tokens("ops-secret-0123456789", "view-secret-0123456789"),
        )
        .await;
        let admin = format!("http://{addr}");
        let id = engine.start("payment", &()).await.expect("start");
        let token = sagaflow_testkit::eventually_some(WAIT, "a token handed out", || async {
            tokens.lock().expect("tokens").first().cloned()
        })
        .await;
        parked(&engine, id).await;
        let http = reqwest::Client::new();
        // One callback: the token in the header (`None`: no header), or in the path.
        let call = |token: Option<&str>, in_path: bool, body: serde_json::Value| {
            let url = match (token, in_path) {
                (Some(t), true) => format!("{admin}/api/v1/callbacks/{t}"),
                _ => format!("{admin}/api/v1/callbacks"),
            };
            let mut req = http.post(url).json(&body);
            if let (Some(t), false) = (token, in_path) {
                req = req.header("Sagaflow-Callback-Token", t);
            }
            async move { req.send().await.expect("post") }
        };
        // Forged tokens (right run, wrong MAC; the form of an older release) and a malformed
        // one, in the path or the header: refused, nothing moves.
        let forged = flip_last(&token);
        let old_form = format!("{}.{}", id.simple(), "ab".repeat(32));
        for bad in [forged.as_str(), old_form.as_str(), "not-a-token"] {
            for in_path in [true, false] {
                let r = call(Some(bad), in_path, json!({ "ok": { "paid": true } })).await;
                assert_eq!(r.status(), 404, "[{}] {bad}", db.backend);
            }
        }
        let r = call(None, false, json!({ "ok": { "paid": true } })).await;
        assert_eq!(r.status(), 400, "[{}] no token", db.backend);
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["error"]["code"], "missing_callback_token");
        assert_eq!(
            engine.waiting_steps(Some(id), 10).await.expect("w").len(),
            1
        );
        // The remote's one call, without an admin token: the callback token is its credential,
        // in a header, out of the request line that proxies log.
        let r = call(
            Some(&token),
            false,
            json!({ "ok": { "paid": true, "amount": 42 } }),
        )
        .await;
        assert_eq!(r.status(), 202, "[{}]", db.backend);
        let run = expect_state(&engine, id, RunState::Completed, db.backend).await;
        assert_eq!(run.output.expect("output")["charge"]["amount"], 42);
        // Spent: the same token again is refused.
        let again = engine
            .complete_callback(&token, &CallbackResult::Ok(json!({})), "remote")
            .await;
        assert!(
            matches!(again, Err(sagaflow::Error::UnknownCallback)),
            "{again:?}"
        );
        assert_eq!(server.ledger().applied("charge_async"), 1);
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

/// A forged or malformed callback token is refused by its MAC, without touching the
/// database, and a spent one by a read, without a write: while another session locks the
/// database (PostgreSQL: `ACCESS EXCLUSIVE` on the steps; SQLite: the file's write lock),
/// forged tokens are answered at once, and a live token waits for the lock. A token is valid
/// once: a replay right after its delivery, while the resumed attempt runs, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callback_forged_is_refused_by_its_mac_a_spent_one_without_a_write_and_valid_once() {
    use sagaflow::internals::deliver::complete_callback;
    use sagaflow::internals::store::Store;
    use sagaflow::sea_orm::{ConnectionTrait, Database, TransactionTrait};
    for db in backends().await {
        let b = db.backend;
        let server = effects().await;
        let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
        let engine = engine(&db, vec![payment(&server, tokens.clone())]).await;
        let first = engine.start("payment", &()).await.expect("start");
        let second = engine.start("payment", &()).await.expect("start");
        let handed = sagaflow_testkit::eventually_some(WAIT, "two tokens handed out", || async {
            let t = tokens.lock().expect("tokens").clone();
            (t.len() == 2).then_some(t)
        })
        .await;
        parked(&engine, first).await;
        parked(&engine, second).await;
        let token_of = |run: Uuid| {
            handed
                .iter()
                .find(|t| t.starts_with(&run.simple().to_string()))
                .cloned()
                .expect("a token of the run")
        };
        let (live, spent) = (token_of(first), token_of(second));
        // Valid once: delivered, then replayed at once (the step is due or its resumed
        // attempt runs): the replay is refused.
        let ok = CallbackResult::Ok(json!({ "paid": true }));
        let delivered = engine.complete_callback(&spent, &ok, "remote").await;
        assert!(
            matches!(delivered, Ok(EventDelivery::Delivered { .. })),
            "[{b}] {delivered:?}"
        );
        let replay = engine.complete_callback(&spent, &ok, "remote").await;
        assert!(
            matches!(replay, Err(sagaflow::Error::UnknownCallback)),
            "[{b}] {replay:?}"
        );
        expect_state(&engine, second, RunState::Completed, b).await;

        // A store of its own, whose key is read before the database is locked below (an
        // engine reads it when it registers).
        let store = Store::connect(&db.url, None).await.expect("store");
        let warm = complete_callback(&store, &spent, &ok, "remote").await;
        assert!(
            matches!(warm, Err(sagaflow::Error::UnknownCallback)),
            "[{b}] {warm:?}"
        );
        // Another session locks the database. PostgreSQL: `ACCESS EXCLUSIVE` on the steps,
        // which stops even reads of them; SQLite: the file's write lock (readers go on).
        let other = Database::connect(&db.url).await.expect("connect");
        let held = other.begin().await.expect("begin");
        let lock = if b == "postgres" {
            "LOCK TABLE sagaflow_steps IN ACCESS EXCLUSIVE MODE"
        } else {
            "UPDATE sagaflow_runs SET updated_at = updated_at WHERE 1 = 0"
        };
        held.execute_unprepared(lock).await.expect("lock");
        // Forged tokens fail their MAC, with no read at all: answered at once on both.
        let wrong_mac = flip_last(&live);
        let unknown_run = format!(
            "{}.{}.{}",
            Uuid::new_v4().simple(),
            "cd".repeat(16),
            "ef".repeat(16)
        );
        let old_form = format!("{}.{}", first.simple(), "ab".repeat(32));
        for bad in [
            wrong_mac.as_str(),
            unknown_run.as_str(),
            old_form.as_str(),
            "junk",
        ] {
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                complete_callback(&store, bad, &ok, "forger"),
            )
            .await;
            assert!(
                matches!(r, Ok(Err(sagaflow::Error::UnknownCallback))),
                "[{b}] a forged token is refused at once under the lock: {r:?}"
            );
        }
        // A spent token has a valid MAC: it takes one read, never a write. SQLite answers
        // it at once under the write lock; on PostgreSQL the read waits for the lock, which
        // shows that the forged ones above read nothing.
        let r = tokio::time::timeout(
            Duration::from_millis(1500),
            complete_callback(&store, &spent, &ok, "remote"),
        )
        .await;
        if b == "postgres" {
            assert!(
                matches!(r, Err(_) | Ok(Err(sagaflow::Error::Db(_)))),
                "[{b}] a spent token reads the steps: {r:?}"
            );
        } else {
            assert!(
                matches!(r, Ok(Err(sagaflow::Error::UnknownCallback))),
                "[{b}] a spent token is refused by a read under the write lock: {r:?}"
            );
        }
        // The control: a live token goes on to its write, and waits for (or fails on) the lock.
        let r = tokio::time::timeout(
            Duration::from_millis(1500),
            complete_callback(&store, &live, &ok, "remote"),
        )
        .await;
        assert!(
            matches!(r, Err(_) | Ok(Err(sagaflow::Error::Db(_)))),
            "[{b}] a live token needs the write lock: {r:?}"
        );
        held.rollback().await.expect("release the lock");
        // The live token still works once the lock is gone.
        engine
            .complete_callback(&live, &ok, "remote")
            .await
            .unwrap_or_else(|e| panic!("[{b}] {e}"));
        expect_state(&engine, first, RunState::Completed, b).await;
        assert_eq!(server.ledger().applied("charge_async"), 2, "[{b}]");
        drop(store);
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

/// `token` with its last hex digit changed: the same run and nonce, a wrong MAC.
fn flip_last(token: &str) -> String {
    let (head, last) = token.split_at(token.len() - 1);
    format!("{head}{}", if last == "0" { "1" } else { "0" })
}

/// `return@1` (the child): `refund` on the effect server, undone by `release`.
fn refund(server: &EffectServer) -> Workflow {
    let client = server.client();
    let undo = server.client();
    Workflow::builder("return", 1)
        .step("refund", call(&client, "reserve"))
        .compensate(call(&undo, "release"))
        .build()
        .expect("valid")
}

/// `claim@1` (the parent): `open`, the child `return` with the parent's input, then
/// `close`, which fails when told to (so the parent compensates).
fn claim(fail_close: bool, hold_open: Option<Duration>) -> Workflow {
    Workflow::builder("claim", 1)
        .step("open", |_: StepContext| async {
            Ok::<_, StepError>("opened")
        })
        .child("return", "return", |ctx: &StepContext| {
            Ok(json!({ "for": ctx.run_id() }))
        })
        .after(["open"])
        .timer("cool_off", hold_open.unwrap_or(Duration::from_millis(1)))
        .after(["return"])
        .step("close", move |_: StepContext| async move {
            if fail_close {
                Err(StepError::refused("closed", "the claim was rejected"))
            } else {
                Ok("closed".to_owned())
            }
        })
        .after(["cool_off"])
        .build()
        .expect("valid")
}

async fn child_of(engine: &Engine, parent: Uuid) -> Uuid {
    let key = format!("{parent}:return");
    sagaflow_testkit::eventually_some(WAIT, "the child run", || async {
        engine
            .run_by_key("return", &key)
            .await
            .ok()
            .flatten()
            .map(|r| r.id)
    })
    .await
}

/// An engine with `return@1` and a `claim@1` whose `close` fails, and a run of `claim` that
/// completed its child, then compensated (the child with it); returns the child.
async fn compensated_claim(db: &TestDb, server: &EffectServer) -> (Engine, Uuid) {
    let engine = sagaflow_testkit::fast_builder(db)
        .with_workflow(refund(server))
        .with_workflow(claim(true, None))
        .start()
        .await
        .expect("engine");
    let bad = engine.start("claim", &()).await.expect("start");
    expect_state(&engine, bad, RunState::Compensated, db.backend).await;
    let child = child_of(&engine, bad).await;
    (engine, child)
}

/// An engine with `claim@1` and the child `slow_child` (`return@1`), a run of `claim` and its
/// child, parked in a wait.
async fn parked_child(db: &TestDb, slow_child: Workflow) -> (Engine, Uuid, Uuid) {
    let engine = sagaflow_testkit::fast_builder(db)
        .with_workflow(slow_child)
        .with_workflow(claim(false, None))
        .start()
        .await
        .expect("engine");
    let parent = engine.start("claim", &()).await.expect("start");
    let child = child_of(&engine, parent).await;
    parked(&engine, child).await;
    (engine, parent, child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_completes_with_its_output_and_is_compensated_with_its_parent() {
    for db in backends().await {
        let server = effects().await;
        let engine = sagaflow_testkit::fast_builder(&db)
            .with_workflow(refund(&server))
            .with_workflow(claim(false, None))
            .start()
            .await
            .expect("engine");
        let ok = engine.start("claim", &()).await.expect("start");
        let run = expect_state(&engine, ok, RunState::Completed, db.backend).await;
        let child = child_of(&engine, ok).await;
        assert_eq!(
            run.output.expect("output")["return"]["refund"]["run"],
            json!(child),
            "[{}] the parent's step completes with the child's output",
            db.backend
        );
        engine.shutdown().await;

        // A parent that fails after its child completed compensates the child.
        let (engine, child) = compensated_claim(&db, &server).await;
        expect_state(&engine, child, RunState::Compensated, db.backend).await;
        assert_eq!(server.ledger().applied("release"), 1, "[{}]", db.backend);
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_is_cancelled_with_its_parent() {
    for db in backends().await {
        let server = effects().await;
        // The child waits for an event that never comes, so it is still running.
        let slow_child = Workflow::builder("return", 1)
            .step("refund", call(&server.client(), "reserve"))
            .compensate(call(&server.client(), "release"))
            .wait_for_event("approved", EventWait::named("refund_approved"))
            .after(["refund"])
            .build()
            .expect("valid");
        let (engine, parent, child) = parked_child(&db, slow_child).await;
        engine
            .operator()
            .on_behalf_of("ops", "customer withdrew")
            .cancel(parent)
            .await
            .expect("cancel");
        expect_state(&engine, parent, RunState::Compensated, db.backend).await;
        let run = expect_state(&engine, child, RunState::Compensated, db.backend).await;
        assert!(
            run.error.as_ref().is_some_and(|e| e["code"] == "cancelled"),
            "[{}] the child was cancelled: {:?}",
            db.backend,
            run.error
        );
        assert_eq!(server.ledger().applied("release"), 1, "the refund undone");
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_sent_from_the_cli_completes_a_waiting_step() {
    use crate::cli::{code, sagaflow, stdout};
    for db in backends().await {
        let server = effects().await;
        let wf = approval(
            "approval",
            &server,
            Duration::from_secs(3600),
            OnTimeout::Fail,
            None,
        );
        let engine = engine(&db, vec![wf]).await;
        let id = engine
            .start_with("approval", &(), StartOptions::keyed("order-9"))
            .await
            .expect("start")
            .id;
        parked(&engine, id).await;
        let listed = sagaflow(&db.url, &["waiting", "--run", &id.to_string()]).await;
        code(&listed, 0, "waiting");
        assert!(
            stdout(&listed).contains("event manager_approval"),
            "[{}] {}",
            db.backend,
            stdout(&listed)
        );
        let bad = sagaflow(
            &db.url,
            &[
                "send-event",
                "manager_approval",
                "--key",
                "approval/order-9",
                "--payload",
                "{nope",
            ],
        )
        .await;
        code(&bad, 2, "a payload that is not JSON");
        let sent = sagaflow(
            &db.url,
            &[
                "send-event",
                "manager_approval",
                "--key",
                "approval/order-9",
                "--payload",
                r#"{"approved": true, "by": "cli"}"#,
                "--as",
                "alice",
                "--json",
            ],
        )
        .await;
        code(&sent, 0, "send-event");
        let answer: Value = serde_json::from_str(&stdout(&sent)).expect("json");
        assert_eq!(answer["outcome"], "delivered", "[{}] {answer}", db.backend);
        assert_eq!(answer["actor"], "cli:alice");
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        assert_eq!(output_of(&engine, id, "ship").await["by"], "cli");
        let late = sagaflow(
            &db.url,
            &["send-event", "manager_approval", "--run", &id.to_string()],
        )
        .await;
        code(&late, 4, "a finished run refuses an event");
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_sent_from_the_console_completes_a_waiting_step() {
    for db in backends().await {
        let server = effects().await;
        let wf = approval(
            "approval",
            &server,
            Duration::from_secs(3600),
            OnTimeout::Fail,
            None,
        );
        let engine = engine(&db, vec![wf]).await;
        let (addr, _admin) = crate::fixtures::serve_admin(
            &engine,
            crate::fixtures::admin_tokens("ops-secret-0123456789", "view-secret-0123456789"),
        )
        .await;
        let id = engine.start("approval", &()).await.expect("start");
        parked(&engine, id).await;
        let http = crate::console::http();
        let login = |token: &'static str| crate::fixtures::console_login(addr, token);
        let page = |cookie: String| {
            let http = http.clone();
            async move {
                http.get(format!("http://{addr}/console/runs/{id}"))
                    .header("cookie", cookie)
                    .send()
                    .await
                    .expect("page")
                    .text()
                    .await
                    .expect("body")
            }
        };
        // Everyone sees what the step waits for; only an operator gets the form.
        let viewer = page(login("view-secret-0123456789").await).await;
        assert!(viewer.contains("waiting-steps") && viewer.contains("event manager_approval"));
        assert!(
            !viewer.contains("data-action=\"send_event\""),
            "[{}]",
            db.backend
        );
        let ops = login("ops-secret-0123456789").await;
        let body = page(ops.clone()).await;
        assert!(
            body.contains("data-event=\"manager_approval\""),
            "[{}]",
            db.backend
        );
        let csrf = crate::console::csrf_of(&body);
        let post = |csrf: String, payload: &'static str| {
            let (http, ops) = (http.clone(), ops.clone());
            async move {
                http.post(format!("http://{addr}/console/runs/{id}/events"))
                    .header("cookie", ops)
                    .form(&[
                        ("csrf", csrf.as_str()),
                        ("name", "manager_approval"),
                        ("payload", payload),
                    ])
                    .send()
                    .await
                    .expect("post")
                    .status()
            }
        };
        assert_eq!(post("forged".into(), "{}").await, 403, "[{}]", db.backend);
        assert_eq!(post(csrf.clone(), "{nope").await, 400, "[{}]", db.backend);
        assert_eq!(
            post(csrf, r#"{"approved": true, "by": "<b>console</b>"}"#).await,
            303,
            "[{}]",
            db.backend
        );
        expect_state(&engine, id, RunState::Completed, db.backend).await;
        assert_eq!(output_of(&engine, id, "ship").await["by"], "<b>console</b>");
        let history = engine.history(id).await.expect("history");
        assert!(
            history
                .iter()
                .any(|h| h.kind.to_string() == "event_received" && h.actor == "console:ops"),
            "[{}]",
            db.backend
        );
        // What a user sent is escaped where the page shows it.
        let shown = page(login("ops-secret-0123456789").await).await;
        assert!(!shown.contains("<b>console</b>"), "[{}]", db.backend);
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

/// Rows of run `id` in `table`, read on the engine's own database.
async fn rows_of(engine: &Engine, table: &str, column: &str, id: Uuid) -> i64 {
    use sagaflow::sea_orm::{ConnectionTrait, Statement};
    let conn = engine.store().connection();
    let sql = format!("SELECT COUNT(*) AS n FROM {table} WHERE {column} = $1");
    conn.query_one_raw(Statement::from_sql_and_values(
        conn.get_database_backend(),
        &sql,
        [sagaflow::sea_orm::Value::from(id)],
    ))
    .await
    .unwrap_or_else(|e| panic!("{sql}: {e}"))
    .expect("a row")
    .try_get("", "n")
    .expect("n")
}

/// Where finished run `id` is once nothing can reopen it: its steps have left the steps
/// table, and on PostgreSQL its row is in the finished runs' table, not the runs table; it
/// reads as before, in `state`.
async fn finished_for_good(engine: &Engine, id: Uuid, state: RunState, b: &str, what: &str) {
    assert_eq!(
        rows_of(engine, "sagaflow_steps", "run_id", id).await,
        0,
        "[{b}] {what}: its steps are still in the steps table"
    );
    if b == "postgres" {
        let live = rows_of(engine, "sagaflow_runs", "id", id).await;
        let done = rows_of(engine, "sagaflow_runs_done", "id", id).await;
        assert_eq!((live, done), (0, 1), "[{b}] {what}: (live, finished) rows");
    }
    let run = engine.run(id).await.expect("read").expect("found");
    assert_eq!(run.state, state, "[{b}] {what}");
}

/// A child run stays where its parent can undo it (a completed child keeps its steps in the
/// runs table) until its parent finishes; then nothing can reopen it, and it leaves the hot
/// tables as any finished run does: its steps go, and on PostgreSQL it moves to the finished
/// runs' table, down every generation (a grandchild too), whether the family completed or
/// compensated. A child that ends after its parent's step is gone (the parent ended by other
/// means while it ran) moves at its own end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_leave_the_hot_tables_once_their_parent_finished() {
    for db in backends().await {
        let b = db.backend;
        let server = effects().await;
        // `outer@1` starts `claim`, which starts `return`: three generations.
        let outer = Workflow::builder("outer", 1)
            .child("claim", "claim", |_: &StepContext| Ok(json!({})))
            .build()
            .expect("valid");
        let engine = sagaflow_testkit::fast_builder(&db)
            .with_workflow(refund(&server))
            .with_workflow(claim(false, None))
            .with_workflow(outer)
            .start()
            .await
            .expect("engine");
        let top = engine.start("outer", &()).await.expect("start");
        expect_state(&engine, top, RunState::Completed, b).await;
        let mid = engine
            .run_by_key("claim", &format!("{top}:claim"))
            .await
            .expect("read")
            .expect("the child")
            .id;
        let leaf = child_of(&engine, mid).await;
        finished_for_good(&engine, top, RunState::Completed, b, "the parent").await;
        finished_for_good(&engine, mid, RunState::Completed, b, "the child").await;
        finished_for_good(&engine, leaf, RunState::Completed, b, "the grandchild").await;
        engine.shutdown().await;

        // A parent that compensates its completed child: both compensated, both gone.
        let (engine, child) = compensated_claim(&db, &server).await;
        finished_for_good(&engine, child, RunState::Compensated, b, "the undone child").await;
        engine.shutdown().await;

        // A child that ends after its parent's step is gone.
        let slow_child = Workflow::builder("return", 1)
            .wait_for_event("approved", EventWait::named("refund_approved"))
            .build()
            .expect("valid");
        let (engine, parent, child) = parked_child(&db, slow_child).await;
        {
            use sagaflow::sea_orm::{ConnectionTrait, Statement};
            let conn = engine.store().connection();
            conn.execute_raw(Statement::from_sql_and_values(
                conn.get_database_backend(),
                "DELETE FROM sagaflow_steps WHERE run_id = $1 AND name = 'return'",
                [sagaflow::sea_orm::Value::from(parent)],
            ))
            .await
            .expect("the parent's step goes");
        }
        engine
            .send_event(child, "refund_approved", &json!(true))
            .await
            .expect("event");
        expect_state(&engine, child, RunState::Completed, b).await;
        finished_for_good(&engine, child, RunState::Completed, b, "the orphan").await;
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

/// Retention never takes a completed child its parent may still compensate (defect 3): a
/// parent that parks for 30 days after its child completed keeps the child through a
/// retention of 7 days, and when it then fails, the child's effect is undone, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_completed_long_ago_outlives_retention_while_its_parent_may_compensate() {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    for db in backends().await {
        let server = effects().await;
        let clock = sagaflow::testing::TestClock::new();
        let engine = sagaflow_testkit::fast_builder(&db)
            .with_test_clock(clock.clone())
            .with_workflow(refund(&server))
            .with_workflow(claim(true, Some(30 * DAY)))
            .start()
            .await
            .expect("engine");
        let parent = engine.start("claim", &()).await.expect("start");
        let child = child_of(&engine, parent).await;
        expect_state(&engine, child, RunState::Completed, db.backend).await;
        parked(&engine, parent).await;

        clock.advance(8 * DAY);
        let purged = engine.purge_finished(7 * DAY).await.expect("purge");
        assert_eq!(purged, 0, "[{}] nothing may go yet", db.backend);
        assert!(
            engine.run(child).await.expect("read").is_some(),
            "[{}] the child its parent may compensate was purged",
            db.backend
        );

        // The parent's cool-off ends, `close` fails: the parent unwinds through its child.
        clock.advance(30 * DAY);
        expect_state(&engine, parent, RunState::Compensated, db.backend).await;
        expect_state(&engine, child, RunState::Compensated, db.backend).await;
        assert_eq!(
            server.ledger().applied("release"),
            1,
            "[{}] the child's refund undone once",
            db.backend
        );
        let report = sagaflow_testkit::check_engine_history(&engine).await;
        assert!(report.is_clean(), "[{}] {report}", db.backend);
        // Both finished: now both may go. On PostgreSQL both left the runs table for the
        // finished runs' table, whose days go whole once they are past on the wall clock,
        // which a test clock does not move; a retention under a day deletes its rows one by
        // one, as SQLite does with any retention.
        clock.advance(8 * DAY);
        let retention = if db.backend == "postgres" {
            finished_for_good(&engine, parent, RunState::Compensated, db.backend, "parent").await;
            finished_for_good(&engine, child, RunState::Compensated, db.backend, "child").await;
            Duration::from_secs(3600)
        } else {
            7 * DAY
        };
        let purged = engine.purge_finished(retention).await.expect("purge");
        assert!(purged >= 1, "[{}] the parent goes", db.backend);
        let purged_child = engine.purge_finished(retention).await.expect("purge");
        assert!(
            engine.run(child).await.expect("read").is_none(),
            "[{}] the child goes once its parent is gone ({purged} then {purged_child})",
            db.backend
        );
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}

/// A callback arrives as its wait times out. The callback's unit of work, held after it found
/// the token live, and the timer pass, run meanwhile on the due wait: one of the two wins.
/// Either the callback wakes the step with its result and the timeout finds nothing, or the
/// timeout wakes it and the callback is refused as spent. Never both: a callback kept (the
/// remote told it was accepted) for a step its timeout already woke is a result lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn event_a_callback_meeting_its_waits_timeout_never_both_win() {
    use sagaflow::internals::deliver::{complete_callback, wake_due_steps};
    use sagaflow::internals::interleave::{PauseHook, Point, Unit};
    use sagaflow::internals::store::Store;
    use sagaflow::sea_orm::ConnectionTrait;
    for db in backends().await {
        let b = db.backend;
        let server = effects().await;
        let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
        let hook = Arc::new(PauseHook::new());
        // No supervisor: the only timer pass is the test's.
        let engine = sagaflow_testkit::fast_builder(&db)
            .with_workflow(payment(&server, tokens.clone()))
            .with_supervisor(false)
            .with_pause_hook(hook.clone())
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let run = engine.start("payment", &()).await.expect("start");
        let token = sagaflow_testkit::eventually_some(WAIT, "the token handed out", || async {
            tokens.lock().expect("tokens").first().cloned()
        })
        .await;
        parked(&engine, run).await;
        let plain = Store::connect(&db.url, Some(2)).await.expect("store");
        // The wait's time has come.
        let conn = plain.connection();
        conn.execute_raw(sagaflow::sea_orm::Statement::from_sql_and_values(
            conn.get_database_backend(),
            "UPDATE sagaflow_steps SET available_at = 1 WHERE run_id = $1 AND state = 'waiting'",
            [sagaflow::sea_orm::Value::from(run)],
        ))
        .await
        .expect("due");
        let held = hook.hold(Unit::Deliver, Point::AfterReads);
        let ok = CallbackResult::Ok(json!({ "paid": true }));
        let callback = complete_callback(engine.store(), &token, &ok, "remote");
        let timeout = async {
            tokio::time::timeout(WAIT, held.reached())
                .await
                .unwrap_or_else(|_| panic!("[{b}] the callback reached its point"));
            let pass = wake_due_steps(&plain, 16, "test");
            tokio::pin!(pass);
            let woken = match tokio::time::timeout(Duration::from_millis(300), &mut pass).await {
                Ok(w) => w,
                Err(_) => {
                    held.release();
                    pass.await
                }
            };
            held.release();
            woken.expect("timer pass")
        };
        let (called, woken) = tokio::join!(callback, timeout);
        match (&called, woken) {
            (Ok(EventDelivery::Delivered { .. }), 0) => {}
            (Err(sagaflow::Error::UnknownCallback), 1) => {}
            _ => panic!("[{b}] callback {called:?}, timer pass woke {woken}: both won or neither"),
        }
        engine.shutdown().await;
        server.shutdown().await.expect("stop");
    }
}
