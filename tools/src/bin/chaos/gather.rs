//! Gathering what a chaos run left behind, from the database and the services' ledger, into
//! [`Findings`]: the summary is printed from them and the invariants judged on them.

use std::collections::{BTreeMap, HashMap};

use sagaflow::RunState;
use sagaflow::internals::store::Store;
use sagaflow_testkit::services::{EffectRecord, LedgerReport, OrderStatus, Services};
use sagaflow_workflows::order::Order;
use uuid::Uuid;

use super::facts::all_run_facts;
use super::submit::Submitted;

/// Everything the checks look at, gathered once.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Orders submitted.
    pub(crate) orders: usize,
    /// The state of every accepted run whose row was found, by order id.
    pub(crate) state_of: HashMap<String, RunState>,
    /// The run of every accepted order.
    pub(crate) run_of: HashMap<String, Uuid>,
    /// Accepted runs without a row.
    pub(crate) missing_rows: Vec<String>,
    /// Orders never accepted.
    pub(crate) not_accepted: Vec<String>,
    /// Step attempts with more than one result.
    pub(crate) doubled: Vec<String>,
    /// Step results in the history.
    pub(crate) outcomes: usize,
    /// Orders whose run completed, compensated, or is in error (sorted).
    pub(crate) completed: Vec<String>,
    pub(crate) compensated: Vec<String>,
    pub(crate) error: Vec<String>,
    /// Runs in the database (-1 when they could not be counted).
    pub(crate) rows_total: i64,
    /// History events by name.
    pub(crate) history: Vec<(String, i64)>,
    /// The ledger's effects.
    pub(crate) records: Vec<EffectRecord>,
    /// Keys applied twice, operations applied twice for one order, effects under a key of
    /// another run.
    pub(crate) twice_keys: Vec<String>,
    pub(crate) twice_ops: Vec<String>,
    pub(crate) foreign: Vec<String>,
    /// The ledger's check of the completed and compensated orders.
    pub(crate) settled_report: LedgerReport,
    /// Runs whose final state the ledger contradicts.
    pub(crate) disagreements: Vec<String>,
    /// The ledger's check of the orders in error, and of every order.
    pub(crate) error_report: LedgerReport,
    pub(crate) all_report: LedgerReport,
    /// Runs in error without an alert.
    pub(crate) unalerted: Vec<String>,
    /// Runs in error by the first clause of their alert's reason.
    pub(crate) error_kinds: BTreeMap<String, usize>,
    /// A few runs in error with what the ledger shows for them.
    pub(crate) error_examples: Vec<String>,
    /// Runs not terminal (on timeout): a few with their steps, then the rest.
    pub(crate) stuck: usize,
    pub(crate) stuck_details: Vec<String>,
}

impl Findings {
    /// Completed and compensated orders.
    pub(crate) fn settled(&self) -> Vec<String> {
        self.completed
            .iter()
            .chain(&self.compensated)
            .cloned()
            .collect()
    }
}

/// Reads the runs of `submitted` and the services' ledger.
pub(crate) async fn gather(store: &Store, services: &Services, submitted: &Submitted) -> Findings {
    let orders = submitted.ids.len();
    let order_ids: Vec<String> = (0..orders).map(|n| Order::sample(n).order_id).collect();
    let mut f = Findings {
        orders,
        ..Findings::default()
    };
    runs(store, submitted, &order_ids, &mut f).await;
    ledger(services, &order_ids, &mut f);
    alerts(store, &mut f).await;
    stuck(store, &mut f).await;
    f
}

/// Runs: states, lost rows, doubled results, counts.
async fn runs(store: &Store, submitted: &Submitted, order_ids: &[String], f: &mut Findings) {
    let mut facts = all_run_facts(store, submitted.ids.iter().flatten().copied().collect()).await;
    for (n, id) in submitted.ids.iter().enumerate() {
        let order_id = &order_ids[n];
        let Some(id) = *id else {
            f.not_accepted.push(order_id.clone());
            continue;
        };
        f.run_of.insert(order_id.clone(), id);
        let facts = facts.remove(&id).unwrap_or_default();
        f.outcomes += facts.outcomes;
        f.doubled.extend(facts.doubled);
        match facts.state {
            Some(state) => {
                f.state_of.insert(order_id.clone(), state);
            }
            None => f
                .missing_rows
                .push(format!("{order_id}: run {id} has no row")),
        }
    }
    let by_state = |s: RunState| -> Vec<String> {
        let mut v: Vec<String> = f
            .state_of
            .iter()
            .filter(|(_, st)| **st == s)
            .map(|(o, _)| o.clone())
            .collect();
        v.sort();
        v
    };
    (f.completed, f.compensated, f.error) = (
        by_state(RunState::Completed),
        by_state(RunState::Compensated),
        by_state(RunState::Error),
    );
    f.rows_total = store
        .run_count_by_state()
        .await
        .map_or(-1, |c| i64::try_from(c.total()).unwrap_or(i64::MAX));
    f.history = store.history_event_counts().await.unwrap_or_default();
}

/// Ledger: effects applied twice, foreign keys, agreement with the runs' states.
fn ledger(services: &Services, order_ids: &[String], f: &mut Findings) {
    let ledger = services.ledger();
    f.records = ledger.records();
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_order_op: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for r in &f.records {
        *per_key.entry(r.key.as_str()).or_default() += 1;
        *per_order_op
            .entry((r.order_id.as_str(), r.operation.to_string()))
            .or_default() += 1;
        // (An order never accepted fails the "no lost runs" check already.)
        let run = r.key.split(':').next().unwrap_or("");
        if let Some(own) = f.run_of.get(&r.order_id)
            && own.to_string() != run
        {
            f.foreign.push(format!(
                "{} of {} under key {:?}, not a key of the order's run",
                r.operation, r.order_id, r.key
            ));
        }
    }
    f.twice_keys = per_key
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("key {k:?} applied {n} times"))
        .collect();
    f.twice_ops = per_order_op
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|((o, op), n)| format!("{op} applied {n} times for {o}"))
        .collect();
    f.settled_report = ledger.check_orders(&f.settled());
    for o in &f.completed {
        let s = f.settled_report.orders.get(o).copied();
        if s != Some(OrderStatus::Shipped) {
            f.disagreements
                .push(format!("{o}: run completed, ledger says {s:?}"));
        }
    }
    for o in &f.compensated {
        let s = f.settled_report.orders.get(o).copied();
        if !matches!(s, Some(OrderStatus::Compensated | OrderStatus::Untouched)) {
            f.disagreements
                .push(format!("{o}: run compensated, ledger says {s:?}"));
        }
    }
    f.error_report = ledger.check_orders(&f.error);
    f.all_report = ledger.check_orders(order_ids);
}

/// Alerts of runs in error.
async fn alerts(store: &Store, f: &mut Findings) {
    for o in &f.error {
        let id = f.run_of[o];
        let alerts = store.alert_list(Some(id), false).await.unwrap_or_default();
        match alerts.first() {
            None => f.unalerted.push(format!("{o} (run {id})")),
            Some(a) => {
                // The reason's first clause: "pivot `ship` may have taken effect", ...
                let short = a.reason.split([';', '(']).next().unwrap_or("").trim();
                *f.error_kinds
                    .entry(format!("{short} [{}]", a.kind))
                    .or_default() += 1;
                if f.error_examples.len() < 3 {
                    let applied: Vec<String> = f
                        .records
                        .iter()
                        .filter(|r| r.order_id == *o)
                        .map(|r| r.operation.to_string())
                        .collect();
                    f.error_examples.push(format!(
                        "{o} (run {id}): ledger shows {}",
                        if applied.is_empty() {
                            "nothing".to_owned()
                        } else {
                            applied.join(" + ")
                        }
                    ));
                }
            }
        }
    }
}

/// Runs left behind (on timeout): a few with their steps, for the report.
async fn stuck(store: &Store, f: &mut Findings) {
    let mut stuck = Vec::new();
    for (o, st) in &f.state_of {
        if !st.is_terminal() {
            stuck.push((o.clone(), f.run_of[o], *st));
        }
    }
    stuck.sort();
    for (o, id, st) in stuck.iter().take(3) {
        let steps = store.run_steps(*id).await.unwrap_or_default();
        let steps: Vec<String> = steps
            .iter()
            .map(|s| {
                format!(
                    "{}={} a{} f{}/{} by {:?}",
                    s.name,
                    s.state.as_str(),
                    s.attempt,
                    s.failure_count,
                    s.max_failures,
                    s.locked_by
                )
            })
            .collect();
        f.stuck_details
            .push(format!("{o} run {id} {st}: {}", steps.join(", ")));
    }
    f.stuck_details.extend(
        stuck
            .iter()
            .skip(3)
            .map(|(o, id, st)| format!("{o} run {id} {st}")),
    );
    f.stuck = stuck.len();
}
