//! Capacity kept for compensations (`Resource::compensation_share`), with two engine
//! instances on one database and a loopback service whose routes the test holds open or
//! shut: an undo is not starved by forward calls that hold every forward slot, and an undo
//! storm that holds its slot does not starve forward calls; each kind stays within its share
//! at every instant, and every call is made once per idempotency key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use sagaflow::{Engine, Resource, RunState, StepContext, StepError, Workflow};
use sagaflow_testkit::{TestDb, backends, eventually, fast_builder};
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use uuid::Uuid;

use crate::flow_control_gates::partner;

const WAIT: Duration = Duration::from_secs(60);

/// The steps' deadline: longer than any hold of the test, so that a held call is never timed
/// out and tried again while the service still holds it (which would count two calls of one
/// slot: on a loaded machine a hold outlasted the default 30 s once).
const HELD_FOR: Duration = Duration::from_secs(600);

/// What one route of the service saw.
#[derive(Default)]
struct Route {
    now: AtomicUsize,
    peak: AtomicUsize,
    keys: Mutex<Vec<String>>,
}

/// A loopback service with routes `/reserve`, `/unreserve` and `/call`; a held route keeps
/// each request waiting until it is let go.
#[derive(Clone)]
struct Held {
    routes: Arc<HashMap<&'static str, Route>>,
    open: Arc<HashMap<&'static str, watch::Sender<bool>>>,
    url: String,
}

const ROUTES: [&str; 3] = ["reserve", "unreserve", "call"];

impl Held {
    async fn serve() -> Self {
        async fn handle(
            State(s): State<Held>,
            Path(route): Path<String>,
            headers: HeaderMap,
        ) -> &'static str {
            let Some(r) = s.routes.get(route.as_str()) else {
                return "unknown";
            };
            let now = r.now.fetch_add(1, Ordering::SeqCst) + 1;
            r.peak.fetch_max(now, Ordering::SeqCst);
            let mut open = s.open[route.as_str()].subscribe();
            let _ = open.wait_for(|o| *o).await;
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            r.keys.lock().expect("keys").push(key);
            r.now.fetch_sub(1, Ordering::SeqCst);
            "ok"
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let s = Self {
            routes: Arc::new(ROUTES.iter().map(|r| (*r, Route::default())).collect()),
            open: Arc::new(
                ROUTES
                    .iter()
                    .map(|r| (*r, watch::Sender::new(true)))
                    .collect(),
            ),
            url: format!("http://{}", listener.local_addr().expect("addr")),
        };
        let app = Router::new()
            .route("/{route}", axum::routing::post(handle))
            .with_state(s.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        s
    }

    fn hold(&self, route: &str, held: bool) {
        self.open[route].send_replace(!held);
    }

    fn now(&self, route: &str) -> usize {
        self.routes[route].now.load(Ordering::SeqCst)
    }

    fn peak(&self, route: &str) -> usize {
        self.routes[route].peak.load(Ordering::SeqCst)
    }

    fn done(&self, route: &str) -> usize {
        self.routes[route].keys.lock().expect("keys").len()
    }

    /// No idempotency key was called twice on `route`.
    fn each_once(&self, route: &str, b: &str) {
        let mut keys = self.routes[route].keys.lock().expect("keys").clone();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "[{b}] a {route} call was made twice");
    }
}

async fn post(client: &reqwest::Client, url: String, key: String) -> Result<(), StepError> {
    client
        .post(url)
        .header("idempotency-key", key)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| StepError::retryable("call", e.to_string()))?;
    Ok(())
}

/// `ship@1`: `reserve` calls `partner` (its compensation too), then `decide` waits for a
/// permit of `decide` and declines, which undoes `reserve`.
fn ship(url: &str, decide: Arc<Semaphore>) -> Workflow {
    let client = reqwest::Client::new();
    let (forward, undo) = (client.clone(), client);
    let (reserve_url, unreserve_url) = (format!("{url}/reserve"), format!("{url}/unreserve"));
    Workflow::builder("ship", 1)
        .step("reserve", move |ctx: StepContext| {
            let (c, u) = (forward.clone(), reserve_url.clone());
            async move { post(&c, u, ctx.idempotency_key().to_owned()).await }
        })
        .compensate(move |ctx: StepContext| {
            let (c, u) = (undo.clone(), unreserve_url.clone());
            async move { post(&c, u, ctx.idempotency_key().to_owned()).await }
        })
        .resource("partner")
        .deadline(HELD_FOR)
        .step_using("decide", decide, |decide, _ctx: StepContext| async move {
            let _permit = decide
                .acquire()
                .await
                .map_err(|_| StepError::retryable("gate", "closed"))?;
            Err::<(), _>(StepError::refused("declined", "the order is declined"))
        })
        .after(["reserve"])
        .deadline(HELD_FOR)
        .build()
        .expect("ship")
}

/// `call@1`: one step calling `partner` on `/call`.
fn call(url: &str) -> Workflow {
    let client = reqwest::Client::new();
    let url = format!("{url}/call");
    Workflow::builder("call", 1)
        .step("call", move |ctx: StepContext| {
            let (c, u) = (client.clone(), url.clone());
            async move { post(&c, u, ctx.idempotency_key().to_owned()).await }
        })
        .resource("partner")
        .deadline(HELD_FOR)
        .build()
        .expect("call")
}

async fn two_engines(db: &TestDb, s: &Held, decide: &Arc<Semaphore>) -> (Engine, Engine) {
    // Three slots, one kept for compensations.
    let partner = Resource::new("partner")
        .max_in_flight(3)
        .compensation_share(1, 0);
    let start = |id: &str| {
        fast_builder(db)
            .with_instance_id(id)
            .with_max_in_flight(16)
            .with_workflow(ship(&s.url, decide.clone()))
            .with_workflow(call(&s.url))
            .with_resource(partner.clone())
            .start()
    };
    let a = start("share-a").await.expect("engine a");
    let b = start("share-b").await.expect("engine b");
    (a, b)
}

/// Starts `n` runs of `workflow` on each engine.
async fn start_on_both(engines: [&Engine; 2], workflow: &str, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for e in engines {
        for _ in 0..n {
            ids.push(e.start(workflow, &json!({})).await.expect("start"));
        }
    }
    ids
}

async fn all_end(engine: &Engine, ids: &[Uuid], state: RunState, b: &str) {
    for id in ids {
        let run = engine
            .wait(*id, WAIT)
            .await
            .unwrap_or_else(|e| panic!("[{b}] run {id}: {e}"));
        assert_eq!(run.state, state, "[{b}] run {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flow_control_compensations_keep_their_share_across_two_instances() {
    for db in backends().await {
        let b = db.backend;
        let s = Held::serve().await;
        let decide = Arc::new(Semaphore::new(0));
        let (one, two) = two_engines(&db, &s, &decide).await;
        let both = [&one, &two];

        // 1. An undo is not starved by forward calls holding every forward slot.
        let shipped = start_on_both(both, "ship", 2).await;
        eventually(WAIT, &format!("[{b}] every reserve to be made"), || async {
            s.done("reserve") == 4
        })
        .await;
        s.hold("call", true);
        let calls = start_on_both(both, "call", 4).await;
        eventually(
            WAIT,
            &format!("[{b}] two forward calls held, six waiting"),
            || async {
                let p = partner(&one).await;
                s.now("call") == 2 && p.waiting == 6 && p.compensations_waiting == 0
            },
        )
        .await;
        decide.add_permits(4);
        all_end(&one, &shipped, RunState::Compensated, b).await;
        assert_eq!(s.done("unreserve"), 4, "[{b}] every reserve undone");
        assert_eq!(
            (s.now("call"), s.done("call")),
            (2, 0),
            "[{b}] the forward calls were held all along"
        );

        // 2. An undo storm holding its slot does not starve forward calls.
        s.hold("call", false);
        all_end(&one, &calls, RunState::Completed, b).await;
        s.hold("unreserve", true);
        let storm = start_on_both(both, "ship", 3).await;
        eventually(WAIT, &format!("[{b}] every reserve to be made"), || async {
            s.done("reserve") == 10
        })
        .await;
        decide.add_permits(6);
        eventually(
            WAIT,
            &format!("[{b}] one compensation held, five waiting"),
            || async {
                let p = partner(&two).await;
                s.now("unreserve") == 1
                    && (p.compensations_in_flight, p.compensations_waiting) == (1, 5)
            },
        )
        .await;
        let more = start_on_both(both, "call", 3).await;
        all_end(&two, &more, RunState::Completed, b).await;
        assert_eq!(s.now("unreserve"), 1, "[{b}] the undo was held all along");
        s.hold("unreserve", false);
        all_end(&two, &storm, RunState::Compensated, b).await;

        assert_eq!(
            s.peak("call"),
            2,
            "[{b}] forward calls over their two slots"
        );
        assert_eq!(
            s.peak("unreserve"),
            1,
            "[{b}] compensations over their slot"
        );
        for route in ROUTES {
            s.each_once(route, b);
        }
        let p = partner(&one).await;
        assert_eq!(
            (p.in_flight, p.waiting, p.compensations_in_flight),
            (0, 0, 0),
            "[{b}] all done"
        );
        one.shutdown().await;
        two.shutdown().await;
    }
}
