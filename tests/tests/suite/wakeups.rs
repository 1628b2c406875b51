//! Wake-ups across engines on PostgreSQL: a notification names the loop it concerns and the
//! engine that sent it. An engine ignores its own, wakes only the loop named by another's,
//! and wakes every loop for a payload it does not understand. PostgreSQL only: SQLite has no
//! notifications.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sagaflow::internals::Registry;
use sagaflow::internals::scheduler::{Scheduler, SchedulerConfig};
use sagaflow::internals::signals::Signals;
use sagaflow::internals::store::{READY_CHANNEL, Store, Wake};
use sagaflow::sea_orm::{ConnectionTrait, DbBackend, Statement};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const OWN: &str = "wake-w1";
const WAIT: Duration = Duration::from_secs(10);

/// Waits (bounded) for a wake-up.
async fn woken(what: &str, f: impl Future<Output = ()>) {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("the {what} loop was not woken within {WAIT:?}"));
}

/// Whether a wake-up is pending right now (it is consumed if so).
async fn pending(f: impl Future<Output = ()>) -> bool {
    tokio::time::timeout(Duration::ZERO, f).await.is_ok()
}

async fn notify(store: &Store, payload: &str) {
    store
        .connection()
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT pg_notify($1, $2)",
            [READY_CHANNEL.into(), payload.into()],
        ))
        .await
        .expect("notify");
}

/// A listener of instance [`OWN`], once listening, with its signals.
async fn listener(
    store: &Store,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Arc<Signals> {
    let signals = Arc::new(Signals::new(vec![]));
    let scheduler = Arc::new(
        Scheduler::new(
            store.clone(),
            Arc::new(Registry::new()),
            signals.clone(),
            SchedulerConfig::new(OWN),
        )
        .expect("scheduler"),
    );
    scheduler.spawn_listener(tracker, cancel.clone());
    // Once it listens, the listener wakes both loops to catch up.
    woken("claim", signals.claimer_woken()).await;
    woken("evaluation", signals.evaluator_woken()).await;
    signals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_ignores_its_own_notifications_and_wakes_only_the_loop_named() {
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    let store = Store::connect(&db.url, None).await.expect("store");
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let signals = listener(&store, &tracker, &cancel).await;

    // Its own notification, then another engine's asking for evaluation only: once the
    // second woke the evaluation loop, the first was handled too, and woke nothing.
    notify(&store, &Wake::ALL.payload(OWN)).await;
    notify(&store, &Wake::EVALUATE.payload("wake-w2")).await;
    woken("evaluation", signals.evaluator_woken()).await;
    assert!(
        !pending(signals.claimer_woken()).await,
        "the engine's own notification woke its claim loop"
    );

    // Another engine's steps became ready: the claim loop wakes, the evaluation loop does not.
    notify(&store, &Wake::CLAIM.payload("wake-w2")).await;
    woken("claim", signals.claimer_woken()).await;
    assert!(
        !pending(signals.evaluator_woken()).await,
        "a notification for claimers woke the evaluation loop"
    );

    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_payload_not_understood_wakes_every_loop() {
    let Some(db) = sagaflow_testkit::postgres_db().await else {
        return;
    };
    let store = Store::connect(&db.url, None).await.expect("store");
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let signals = listener(&store, &tracker, &cancel).await;

    // A plain `NOTIFY sagaflow_ready` (an older engine, an operator), a payload of a newer
    // format, one naming a kind this release does not know, and one that names this very
    // engine in a newer format: each wakes both loops.
    let own_in_a_newer_format = format!("v2:c:{OWN}");
    for payload in [
        "",
        "v9:anything at all",
        "v1:x:wake-w2",
        own_in_a_newer_format.as_str(),
    ] {
        notify(&store, payload).await;
        woken("claim", signals.claimer_woken()).await;
        woken("evaluation", signals.evaluator_woken()).await;
    }

    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}
