//! Submitting the runs: every order, pair and flow from the coordinator's client-only engine,
//! interleaved so each kind is spread over the whole run, from concurrent tasks, each
//! submission retried, paused while PostgreSQL restarts. Each accepted flow that is to get its
//! event is handed to the event sender ([`super::events`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::{Engine, OnDuplicate, StartOptions};
use sagaflow_workflows::order::Order;
use tokio::sync::mpsc::UnboundedSender;
use uuid::Uuid;

use super::mix::{Item, Kind};

/// Concurrent submitters.
const SUBMITTERS: usize = 16;
/// Attempts per submission before it counts as failed.
const SUBMIT_ATTEMPTS: u32 = 20;

/// One run to submit.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    /// Its kind (which workflow).
    pub(crate) kind: Kind,
    /// Its number within its kind.
    pub(crate) n: usize,
    /// Its business key, also the order id of its effects in the ledger.
    pub(crate) key: String,
    /// Its input.
    pub(crate) input: serde_json::Value,
    /// Pairs: the root refused for good. Flows: whether the event is withheld.
    pub(crate) doomed: bool,
}

/// The runs of a chaos run: `orders` orders, `pairs` pairs and `flows` flows, interleaved by
/// their position within their kind (so the mix is the same all along the run).
pub(crate) fn plan(orders: usize, pairs: usize, flows: usize) -> Vec<Planned> {
    let mut all = Vec::with_capacity(orders + pairs + flows);
    for n in 0..orders {
        let o = Order::sample(n);
        all.push(Planned {
            kind: Kind::Order,
            n,
            key: o.order_id.clone(),
            input: serde_json::to_value(&o).unwrap_or_default(),
            doomed: false,
        });
    }
    for n in 0..pairs {
        let it = Item::pair(n);
        all.push(Planned {
            kind: Kind::Pair,
            n,
            key: it.id.clone(),
            doomed: it.refuse.is_some(),
            input: serde_json::to_value(&it).unwrap_or_default(),
        });
    }
    for n in 0..flows {
        let it = Item::flow(n);
        all.push(Planned {
            kind: Kind::Flow,
            n,
            key: it.id.clone(),
            doomed: !Item::flow_gets_event(n),
            input: serde_json::to_value(&it).unwrap_or_default(),
        });
    }
    let count = |k: Kind| match k {
        Kind::Order => orders,
        Kind::Pair => pairs,
        Kind::Flow => flows,
    };
    // Position in [0, 1) within its kind; ties by kind.
    all.sort_by(|a, b| {
        let at = |p: &Planned| (2 * p.n + 1) as f64 / (2 * count(p.kind)) as f64;
        at(a).total_cmp(&at(b)).then(a.kind.cmp(&b.kind))
    });
    all
}

/// The submission's progress, shared with the submitting tasks (readable even when they
/// are stopped half-way by the timeout).
#[derive(Debug)]
pub(crate) struct Intake {
    pub(crate) ids: Mutex<Vec<Option<Uuid>>>,
    pub(crate) errors: Mutex<Vec<String>>,
    pub(crate) accepted: AtomicUsize,
}

impl Intake {
    pub(crate) fn new(runs: usize) -> Self {
        Self {
            ids: Mutex::new(vec![None; runs]),
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
    /// The run id of each planned run (by position in the plan), `None` when it could not
    /// be submitted.
    pub(crate) ids: Vec<Option<Uuid>>,
    /// Why submissions failed (first few).
    pub(crate) errors: Vec<String>,
    /// How long it took.
    pub(crate) took: Duration,
}

/// Submits every run of `plan` from `SUBMITTERS` concurrent tasks; each submission is retried
/// (returning the existing run if an earlier attempt got through). The key of each accepted
/// flow that gets its event goes to `events`.
///
/// Each attempt holds a read guard of `gate`; the PostgreSQL restart holds the write guard,
/// so intake pauses during the restart. Otherwise a commit whose answer was lost in the
/// crash would be retried, and if the run had already finished (which frees its business
/// key) the retry would start a second run for the order: correct engine behaviour, but it
/// would blur the "one run per order" check.
pub(crate) async fn submit_all(
    engine: Engine,
    plan: Arc<Vec<Planned>>,
    intake: Arc<Intake>,
    gate: Arc<tokio::sync::RwLock<()>>,
    events: UnboundedSender<String>,
) -> Duration {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..SUBMITTERS.min(plan.len()) {
        let (engine, next, intake, gate, plan, events) = (
            engine.clone(),
            next.clone(),
            intake.clone(),
            gate.clone(),
            plan.clone(),
            events.clone(),
        );
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = plan.get(i) else {
                    return;
                };
                let opts =
                    StartOptions::keyed(p.key.clone()).on_duplicate(OnDuplicate::ReturnExisting);
                let mut last = None;
                for _ in 0..SUBMIT_ATTEMPTS {
                    let open = gate.read().await;
                    let result = engine
                        .start_with(p.kind.workflow(), &p.input, opts.clone())
                        .await;
                    drop(open);
                    match result {
                        Ok(s) => {
                            intake.ids.lock().unwrap_or_else(PoisonError::into_inner)[i] =
                                Some(s.id);
                            intake.accepted.fetch_add(1, Ordering::Relaxed);
                            if p.kind == Kind::Flow && !p.doomed {
                                let _ = events.send(p.key.clone());
                            }
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
                        errors.push(format!("{}: {e}", p.key));
                    }
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    started.elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_interleaves_the_kinds_and_dooms_a_fixed_share() {
        let plan = plan(60, 30, 40);
        assert_eq!(plan.len(), 130);
        let of = |k: Kind| plan.iter().filter(|p| p.kind == k).count();
        assert_eq!(
            (of(Kind::Order), of(Kind::Pair), of(Kind::Flow)),
            (60, 30, 40)
        );
        // Every third pair has a root refused, every fourth flow goes without its event.
        let doomed = |k: Kind| plan.iter().filter(|p| p.kind == k && p.doomed).count();
        assert_eq!(
            (doomed(Kind::Order), doomed(Kind::Pair), doomed(Kind::Flow)),
            (0, 10, 10)
        );
        // Each kind is spread over the whole plan: every tenth holds each kind.
        for part in plan.chunks(13) {
            for k in [Kind::Order, Kind::Pair, Kind::Flow] {
                assert!(
                    part.iter().any(|p| p.kind == k),
                    "{k:?} missing from a tenth"
                );
            }
        }
        // The business keys are unique.
        let keys: std::collections::HashSet<&str> = plan.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys.len(), plan.len());
    }

    #[test]
    fn a_refused_pair_names_its_root_in_its_input() {
        let p = plan(0, 6, 0);
        let refused: Vec<Option<String>> = p
            .iter()
            .map(|p| {
                serde_json::from_value::<Item>(p.input.clone())
                    .ok()
                    .and_then(|i| i.refuse)
            })
            .collect();
        assert_eq!(
            refused,
            vec![
                Some("reserve".to_owned()),
                None,
                None,
                Some("charge".to_owned()),
                None,
                None
            ]
        );
    }
}
