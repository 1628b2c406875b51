//! Gathering what a chaos run left behind, from the database, the coordinator's record of
//! finished runs and the services' ledger, into [`Findings`]: the summary is printed from
//! them and the invariants judged on them.

use std::collections::{BTreeMap, HashMap};

use sagaflow::RunState;
use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow_testkit::services::{EffectRecord, LedgerReport, OrderStatus, Services};
use uuid::Uuid;

use super::facts::all_run_facts;
use super::mix::{CHILD_WORKFLOW, Kind};
use super::observer::Seen;
use super::stats::ChaosStats;
use super::submit::{Planned, Submitted};

/// Final states of the runs of one kind.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KindCounts {
    pub(crate) submitted: usize,
    pub(crate) completed: usize,
    pub(crate) compensated: usize,
    pub(crate) error: usize,
}

/// Everything the checks look at, gathered once.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Runs submitted (orders, pairs, flows).
    pub(crate) runs: usize,
    /// Final states by kind.
    pub(crate) by_kind: BTreeMap<Kind, KindCounts>,
    /// The state of every accepted run, by business key: its row's, or for a purged run the
    /// final state the coordinator saw.
    pub(crate) state_of: HashMap<String, RunState>,
    /// The run of every accepted business key.
    pub(crate) run_of: HashMap<String, Uuid>,
    /// Accepted runs whose row is gone after they were seen finished (retention).
    pub(crate) purged: Vec<String>,
    /// Accepted runs whose row is gone and that were never seen finished.
    pub(crate) missing_rows: Vec<String>,
    /// Runs never accepted.
    pub(crate) not_accepted: Vec<String>,
    /// Step attempts with more than one result (runs still in the database).
    pub(crate) doubled: Vec<String>,
    /// Step results in the history.
    pub(crate) outcomes: usize,
    /// Business keys whose run completed, compensated, or is in error (sorted).
    pub(crate) completed: Vec<String>,
    pub(crate) compensated: Vec<String>,
    pub(crate) error: Vec<String>,
    /// Submitted runs in the database (-1 when they could not be counted); children apart.
    pub(crate) rows_total: i64,
    /// Child runs (in the database or seen finished) and their parent run.
    pub(crate) parent_of: HashMap<Uuid, Uuid>,
    /// The state of each child run (its row's, else the last seen).
    pub(crate) child_state: HashMap<Uuid, RunState>,
    /// Child runs not finished, with their state.
    pub(crate) children_unfinished: Vec<String>,
    /// Flows that ended on version 2 (migrated while they ran).
    pub(crate) migrated: usize,
    /// Flows whose event was withheld and that compensated without being cancelled.
    pub(crate) wait_timeouts: usize,
    /// Runs whose planned fate the end contradicts (a refused pair or a flow without its
    /// event completed).
    pub(crate) fate_violations: Vec<String>,
    /// History events by name (runs still in the database).
    pub(crate) history: Vec<(String, i64)>,
    /// The ledger's effects.
    pub(crate) records: Vec<EffectRecord>,
    /// Keys applied twice, operations applied twice for one business key, effects under a
    /// key of another run.
    pub(crate) twice_keys: Vec<String>,
    pub(crate) twice_ops: Vec<String>,
    pub(crate) foreign: Vec<String>,
    /// The ledger's check of the completed and compensated runs.
    pub(crate) settled_report: LedgerReport,
    /// Runs whose final state the ledger contradicts.
    pub(crate) disagreements: Vec<String>,
    /// The ledger's check of the runs in error, and of every run.
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
    /// Completed and compensated runs.
    pub(crate) fn settled(&self) -> Vec<String> {
        self.completed
            .iter()
            .chain(&self.compensated)
            .cloned()
            .collect()
    }
}

/// Reads the runs of `plan` (accepted as `submitted`), the children, and the ledger.
pub(crate) async fn gather(
    store: &Store,
    services: &Services,
    plan: &[Planned],
    submitted: &Submitted,
    observed: &HashMap<Uuid, Seen>,
    stats: &ChaosStats,
) -> Findings {
    let mut f = Findings {
        runs: plan.len(),
        ..Findings::default()
    };
    runs(store, plan, submitted, observed, &mut f).await;
    children(store, observed, &mut f).await;
    fates(plan, stats, &mut f);
    ledger(services, plan, &mut f);
    alerts(store, &mut f).await;
    stuck(store, &mut f).await;
    f
}

/// Runs: states (from the row, else from what was seen before retention purged it), lost
/// rows, doubled results, counts.
async fn runs(
    store: &Store,
    plan: &[Planned],
    submitted: &Submitted,
    observed: &HashMap<Uuid, Seen>,
    f: &mut Findings,
) {
    let mut facts = all_run_facts(store, submitted.ids.iter().flatten().copied().collect()).await;
    for (p, id) in plan.iter().zip(&submitted.ids) {
        let counts = f.by_kind.entry(p.kind).or_default();
        counts.submitted += 1;
        let Some(id) = *id else {
            f.not_accepted.push(p.key.clone());
            continue;
        };
        f.run_of.insert(p.key.clone(), id);
        let facts = facts.remove(&id).unwrap_or_default();
        f.outcomes += facts.outcomes;
        f.doubled.extend(facts.doubled);
        let (state, version) = match (facts.state, observed.get(&id)) {
            (Some(state), _) => (state, facts.version),
            (None, Some(seen)) => {
                f.purged.push(p.key.clone());
                (seen.state, seen.version)
            }
            (None, None) => {
                f.missing_rows.push(format!(
                    "{}: run {id} has no row and was never seen finished",
                    p.key
                ));
                continue;
            }
        };
        f.state_of.insert(p.key.clone(), state);
        match state {
            RunState::Completed => counts.completed += 1,
            RunState::Compensated => counts.compensated += 1,
            RunState::Error => counts.error += 1,
            _ => {}
        }
        if p.kind == Kind::Flow && version >= 2 {
            f.migrated += 1;
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
    f.rows_total = count(
        store,
        &format!(
            "SELECT COUNT(*) AS n FROM sagaflow_runs_all WHERE workflow <> '{CHILD_WORKFLOW}'"
        ),
    )
    .await;
    f.history = store.history_event_counts().await.unwrap_or_default();
}

/// One count, -1 when it cannot be read.
async fn count(store: &Store, sql: &str) -> i64 {
    let conn = store.connection();
    conn.query_one_raw(Statement::from_string(
        conn.get_database_backend(),
        sql.to_owned(),
    ))
    .await
    .ok()
    .flatten()
    .and_then(|r| r.try_get::<i64>("", "n").ok())
    .unwrap_or(-1)
}

/// Child runs: in the database (any state) and seen finished (purged since); each child's
/// business key is `<parent run>:<step>`.
async fn children(store: &Store, observed: &HashMap<Uuid, Seen>, f: &mut Findings) {
    let parent = |key: Option<&str>| {
        key.and_then(|k| k.split(':').next())
            .and_then(|p| p.parse::<Uuid>().ok())
    };
    for (id, seen) in observed.iter().filter(|(_, s)| s.is_child()) {
        if let Some(p) = parent(seen.business_key.as_deref()) {
            f.parent_of.insert(*id, p);
        }
        f.child_state.insert(*id, seen.state);
    }
    let conn = store.connection();
    let rows = conn
        .query_all_raw(Statement::from_string(
            conn.get_database_backend(),
            format!(
                "SELECT id, business_key, state FROM sagaflow_runs_all WHERE workflow = '{CHILD_WORKFLOW}'"
            ),
        ))
        .await
        .unwrap_or_default();
    for r in rows {
        let (Ok(id), Ok(key), Ok(state)) = (
            r.try_get::<Uuid>("", "id"),
            r.try_get::<Option<String>>("", "business_key"),
            r.try_get::<String>("", "state"),
        ) else {
            continue;
        };
        if let Some(p) = parent(key.as_deref()) {
            f.parent_of.insert(id, p);
        }
        if let Ok(s) = state.parse::<RunState>() {
            f.child_state.insert(id, s);
        }
        if !matches!(state.as_str(), "completed" | "compensated" | "error") {
            f.children_unfinished
                .push(format!("child run {id} ({key:?}) is {state}"));
        }
    }
}

/// Planned fates: a pair with a refused root never completes; a flow without its event
/// never completes (its wait times out, and it compensates unless cancelled first); a child
/// run ends as its parent (a completed flow's child completed, a compensated flow's child
/// compensated).
fn fates(plan: &[Planned], stats: &ChaosStats, f: &mut Findings) {
    let key_of: HashMap<Uuid, &String> = f.run_of.iter().map(|(k, id)| (*id, k)).collect();
    for (child, parent) in &f.parent_of {
        let Some(key) = key_of.get(parent) else {
            continue;
        };
        let (parent_state, state) = (f.state_of.get(*key), f.child_state.get(child));
        let agrees = match parent_state {
            Some(RunState::Completed) => state == Some(&RunState::Completed),
            Some(RunState::Compensated) => state == Some(&RunState::Compensated),
            _ => true,
        };
        if !agrees {
            f.fate_violations.push(format!(
                "child run {child} of {key} (run {parent}, {parent_state:?}) ended {state:?}"
            ));
        }
    }
    for p in plan.iter().filter(|p| p.doomed) {
        let state = f.state_of.get(&p.key).copied();
        if state == Some(RunState::Completed) {
            let why = match p.kind {
                Kind::Pair => "a root refused for good",
                _ => "its event never sent",
            };
            f.fate_violations
                .push(format!("{} completed with {why}", p.key));
        }
        let cancelled = f
            .run_of
            .get(&p.key)
            .is_some_and(|id| stats.cancelled.contains(id));
        if p.kind == Kind::Flow && state == Some(RunState::Compensated) && !cancelled {
            f.wait_timeouts += 1;
        }
    }
}

/// Ledger: effects applied twice, foreign keys, agreement with the runs' states.
fn ledger(services: &Services, plan: &[Planned], f: &mut Findings) {
    let ledger = services.ledger();
    f.records = ledger.records();
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_order_op: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for r in &f.records {
        *per_key.entry(r.key.as_str()).or_default() += 1;
        *per_order_op
            .entry((r.order_id.as_str(), r.operation.to_string()))
            .or_default() += 1;
        // (A run never accepted fails the "no lost runs" check already.) The key's run is
        // the business key's own run, or a child of it.
        let run = r.key.split(':').next().and_then(|k| k.parse::<Uuid>().ok());
        if let Some(own) = f.run_of.get(&r.order_id)
            && run != Some(*own)
            && run.and_then(|c| f.parent_of.get(&c)) != Some(own)
        {
            f.foreign.push(format!(
                "{} of {} under key {:?}, not a key of its run or of a child of it",
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
    let keys: Vec<String> = plan.iter().map(|p| p.key.clone()).collect();
    f.all_report = ledger.check_orders(&keys);
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

/// Runs left behind (on timeout): a few with their steps, for the report; then the
/// unfinished children.
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
    f.stuck_details
        .extend(f.children_unfinished.iter().cloned());
    f.stuck = stuck.len() + f.children_unfinished.len();
}
