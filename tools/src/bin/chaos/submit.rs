//! Submitting the orders: every order from the coordinator's client-only engine, from
//! concurrent tasks, each submission retried, paused while PostgreSQL restarts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::{Engine, OnDuplicate, StartOptions};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order};
use uuid::Uuid;

/// Concurrent submitters.
const SUBMITTERS: usize = 16;
/// Attempts per submission before it counts as failed.
const SUBMIT_ATTEMPTS: u32 = 20;
/// The submission's progress, shared with the submitting tasks (readable even when they
/// are stopped half-way by the timeout).
#[derive(Debug)]
pub(crate) struct Intake {
    pub(crate) ids: Mutex<Vec<Option<Uuid>>>,
    pub(crate) errors: Mutex<Vec<String>>,
    pub(crate) accepted: AtomicUsize,
}

impl Intake {
    pub(crate) fn new(orders: usize) -> Self {
        Self {
            ids: Mutex::new(vec![None; orders]),
            errors: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
        }
    }

    pub(crate) fn snapshot(&self, took: Duration) -> Submitted {
        Submitted {
            ids: self
                .ids
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            errors: self
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            took,
        }
    }
}

/// What the submission produced.
#[derive(Debug, Default)]
pub(crate) struct Submitted {
    /// The run id of each order (by order number), `None` when it could not be submitted.
    pub(crate) ids: Vec<Option<Uuid>>,
    /// Why submissions failed (first few).
    pub(crate) errors: Vec<String>,
    /// How long it took.
    pub(crate) took: Duration,
}

/// Submits orders `0..orders` from `SUBMITTERS` concurrent tasks; each submission is retried
/// (returning the existing run if an earlier attempt got through).
///
/// Each attempt holds a read guard of `gate`; the PostgreSQL restart holds the write guard,
/// so intake pauses during the restart. Otherwise a commit whose answer was lost in the
/// crash would be retried, and if the run had already finished (which frees its business
/// key) the retry would start a second run for the order: correct engine behaviour, but it
/// would blur the "one run per order" check.
pub(crate) async fn submit_all(
    engine: Engine,
    orders: usize,
    intake: Arc<Intake>,
    gate: Arc<tokio::sync::RwLock<()>>,
) -> Duration {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..SUBMITTERS.min(orders) {
        let (engine, next, intake, gate) =
            (engine.clone(), next.clone(), intake.clone(), gate.clone());
        tasks.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= orders {
                    return;
                }
                let order = Order::sample(n);
                let opts = StartOptions::keyed(order.order_id.clone())
                    .on_duplicate(OnDuplicate::ReturnExisting);
                let mut last = None;
                for _ in 0..SUBMIT_ATTEMPTS {
                    let open = gate.read().await;
                    let result = engine
                        .start_with(ORDER_WORKFLOW, &order, opts.clone())
                        .await;
                    drop(open);
                    match result {
                        Ok(s) => {
                            intake.ids.lock().unwrap_or_else(PoisonError::into_inner)[n] =
                                Some(s.id);
                            intake.accepted.fetch_add(1, Ordering::Relaxed);
                            last = None;
                            break;
                        }
                        Err(e) => {
                            last = Some(e.to_string());
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                    }
                }
                if let Some(e) = last {
                    let mut errors = intake.errors.lock().unwrap_or_else(PoisonError::into_inner);
                    if errors.len() < 5 {
                        errors.push(format!("{}: {e}", order.order_id));
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    started.elapsed()
}
