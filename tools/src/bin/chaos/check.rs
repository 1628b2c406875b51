//! The checks after a chaos run, and the summary.
//!
//! Invariants (each printed as `[ok]` or `[FAIL]`; any failure makes the exit code 1):
//! 1. every run is terminal (`completed`, `compensated` or `error`);
//! 2. no run is lost: every order was accepted, every accepted id has a row, and there is
//!    exactly one run per order;
//! 3. exactly once: no idempotency key applied twice, no operation applied twice for one
//!    order, and every effect carries a key of its order's own run;
//! 4. fenced results: no step attempt has two results in the history (completed, retry,
//!    failed or timeout): a late or stale answer never got through (SAS-3);
//! 5. net consistency of every run not in `error` (reserved ⇒ shipped or released; charged ⇒
//!    shipped or refunded), and the ledger agrees with the run's state (`completed` ⇒
//!    shipped, `compensated` ⇒ nothing left applied); runs in `error` may legitimately be
//!    half-way and are reported separately;
//! 6. every run in `error` has an alert;
//! 7. no engine process exited on its own, and the PostgreSQL restart (when asked for)
//!    worked.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sagaflow::{RunState, Store};
use sagaflow_testkit::services::{Operation, OrderStatus, Services};
use sagaflow_tools::measure::{Latencies, ms};
use sagaflow_workflows::order::Order;
use uuid::Uuid;

use super::coordinator::Ending;
use super::submit::Submitted;

/// The mid-run PostgreSQL restart.
#[derive(Debug)]
pub(crate) struct Restart {
    /// When it was started, since the beginning of the run.
    pub(crate) at: Duration,
    /// How long `pg_ctl restart` took, or why it failed.
    pub(crate) result: Result<Duration, sagaflow_tools::Error>,
}

/// What the coordinator did to the fleet.
#[derive(Debug, Default)]
pub(crate) struct ChaosStats {
    /// SIGKILLs.
    pub(crate) kills: u64,
    /// For each SIGKILL that hit a process with steps in flight: the time until all of them
    /// were released to the queue.
    pub(crate) rescues: Vec<Duration>,
    /// SIGKILLs of a process that held no step at that moment.
    pub(crate) idle_kills: u64,
    /// Engine processes started again.
    pub(crate) restarts: u64,
    /// Engine processes that exited on their own.
    pub(crate) unexpected_exits: Vec<String>,
    /// Engine processes that did not stop within the grace period at the end.
    pub(crate) forced_stops: usize,
    /// Progress polls that failed (PostgreSQL down).
    pub(crate) monitor_errors: u64,
    /// Whether a PostgreSQL restart was asked for.
    pub(crate) pg_restart_expected: bool,
    /// The PostgreSQL restart, if it happened.
    pub(crate) pg_restart: Option<Restart>,
    /// Time from the start of the chaos to the end of the main loop.
    pub(crate) elapsed: Duration,
    /// Why the main loop ended.
    pub(crate) ending: Option<Ending>,
}

/// Collects invariant lines.
#[derive(Debug, Default)]
struct Verdict {
    lines: Vec<String>,
    failed: usize,
}

impl Verdict {
    fn check(&mut self, ok: bool, text: String, details: &[String]) {
        if ok {
            self.lines.push(format!("  [ok]   {text}"));
        } else {
            self.failed += 1;
            self.lines.push(format!("  [FAIL] {text}"));
            for d in details.iter().take(10) {
                self.lines.push(format!("           - {d}"));
            }
            if details.len() > 10 {
                self.lines
                    .push(format!("           … and {} more", details.len() - 10));
            }
        }
    }
}

/// What the database says about one run.
#[derive(Debug, Default)]
struct RunFacts {
    /// Its state, `None` when the row is missing (or unreadable).
    state: Option<RunState>,
    /// Step results recorded in its history.
    outcomes: usize,
    /// Attempts with more than one recorded result: a fenced write that let a stale or
    /// late answer through.
    doubled: Vec<String>,
}

/// Events that record the result of one step attempt.
const OUTCOMES: [&str; 5] = ["completed", "retry", "failed", "timeout", "interrupted"];

async fn run_facts(store: &Store, id: Uuid) -> RunFacts {
    // PostgreSQL may have been restarted a moment ago: retry a little.
    let mut facts = RunFacts::default();
    for _ in 0..20 {
        match store.run_get(id).await {
            Ok(row) => {
                facts.state = row.map(|r| r.state);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    let mut history = Vec::new();
    for _ in 0..20 {
        match store.run_history(id).await {
            Ok(h) => {
                history = h;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    // One result per attempt: forward attempts leave `running`, compensations `compensating`.
    let mut per_attempt: BTreeMap<(String, String, i32), Vec<String>> = BTreeMap::new();
    for h in history
        .iter()
        .filter(|h| OUTCOMES.contains(&h.event.as_str()))
    {
        facts.outcomes += 1;
        per_attempt
            .entry((
                h.step.clone().unwrap_or_default(),
                h.from_state.clone().unwrap_or_default(),
                h.attempt.unwrap_or(-1),
            ))
            .or_default()
            .push(format!("{} by {}", h.event, h.actor));
    }
    for ((step, from, attempt), events) in per_attempt {
        if events.len() > 1 {
            facts.doubled.push(format!(
                "run {id} step {step} attempt {attempt} (from {from}): {}",
                events.join(", ")
            ));
        }
    }
    facts
}

/// `run_facts` of every id, from a few concurrent readers.
async fn all_run_facts(store: &Store, ids: Vec<Uuid>) -> HashMap<Uuid, RunFacts> {
    const READERS: usize = 8;
    let chunk = ids.len().div_ceil(READERS).max(1);
    let mut tasks = tokio::task::JoinSet::new();
    for part in ids.chunks(chunk) {
        let (store, part) = (store.clone(), part.to_vec());
        tasks.spawn(async move {
            let mut out = Vec::with_capacity(part.len());
            for id in part {
                out.push((id, run_facts(&store, id).await));
            }
            out
        });
    }
    let mut facts = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        if let Ok(part) = done {
            facts.extend(part);
        }
    }
    facts
}

/// Runs every check, prints the summary, and returns whether every invariant held.
pub(crate) async fn verify(
    store: &Store,
    services: &Services,
    submitted: &Submitted,
    stats: &ChaosStats,
) -> bool {
    let orders = submitted.ids.len();
    let order_ids: Vec<String> = (0..orders).map(|n| Order::sample(n).order_id).collect();
    let mut v = Verdict::default();

    // Runs.
    let mut state_of: HashMap<String, RunState> = HashMap::new();
    let mut run_of: HashMap<String, Uuid> = HashMap::new();
    let mut missing_rows = Vec::new();
    let mut not_accepted = Vec::new();
    let mut doubled = Vec::new();
    let mut outcomes = 0;
    let mut facts = all_run_facts(store, submitted.ids.iter().flatten().copied().collect()).await;
    for (n, id) in submitted.ids.iter().enumerate() {
        let order_id = &order_ids[n];
        let Some(id) = *id else {
            not_accepted.push(order_id.clone());
            continue;
        };
        run_of.insert(order_id.clone(), id);
        let f = facts.remove(&id).unwrap_or_default();
        outcomes += f.outcomes;
        doubled.extend(f.doubled);
        match f.state {
            Some(state) => {
                state_of.insert(order_id.clone(), state);
            }
            None => missing_rows.push(format!("{order_id}: run {id} has no row")),
        }
    }
    let by_state = |s: RunState| -> Vec<&String> {
        let mut v: Vec<&String> = state_of
            .iter()
            .filter(|(_, st)| **st == s)
            .map(|(o, _)| o)
            .collect();
        v.sort();
        v
    };
    let (completed, compensated, error) = (
        by_state(RunState::Completed),
        by_state(RunState::Compensated),
        by_state(RunState::Error),
    );
    let rows_total: i64 = store
        .run_count_by_state()
        .await
        .map(|c| c.iter().map(|(_, n)| *n).sum())
        .unwrap_or(-1);
    let history = store.history_event_counts().await.unwrap_or_default();

    // Ledger.
    let ledger = services.ledger();
    let records = ledger.records();
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_order_op: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut foreign = Vec::new();
    for r in &records {
        *per_key.entry(r.key.as_str()).or_default() += 1;
        *per_order_op
            .entry((r.order_id.as_str(), r.operation.to_string()))
            .or_default() += 1;
        // (An order never accepted fails the "no lost runs" check already.)
        let run = r.key.split(':').next().unwrap_or("");
        if let Some(own) = run_of.get(&r.order_id)
            && own.to_string() != run
        {
            foreign.push(format!(
                "{} of {} under key {:?}, not a key of the order's run",
                r.operation, r.order_id, r.key
            ));
        }
    }
    let twice_keys: Vec<String> = per_key
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, n)| format!("key {k:?} applied {n} times"))
        .collect();
    let twice_ops: Vec<String> = per_order_op
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|((o, op), n)| format!("{op} applied {n} times for {o}"))
        .collect();
    let settled: Vec<String> = completed
        .iter()
        .chain(compensated.iter())
        .map(|o| (*o).clone())
        .collect();
    let settled_report = ledger.check_orders(&settled);
    let mut disagreements = Vec::new();
    for o in &completed {
        let s = settled_report.orders.get(*o).copied();
        if s != Some(OrderStatus::Shipped) {
            disagreements.push(format!("{o}: run completed, ledger says {s:?}"));
        }
    }
    for o in &compensated {
        let s = settled_report.orders.get(*o).copied();
        if !matches!(s, Some(OrderStatus::Compensated | OrderStatus::Untouched)) {
            disagreements.push(format!("{o}: run compensated, ledger says {s:?}"));
        }
    }
    let error_ids: Vec<String> = error.iter().map(|o| (*o).clone()).collect();
    let error_report = ledger.check_orders(&error_ids);
    let all_report = ledger.check_orders(&order_ids);

    // Alerts of runs in error.
    let mut unalerted = Vec::new();
    let mut error_kinds: BTreeMap<String, usize> = BTreeMap::new();
    let mut error_examples = Vec::new();
    for o in &error {
        let id = run_of[*o];
        let alerts = store.alert_list(Some(id), false).await.unwrap_or_default();
        match alerts.first() {
            None => unalerted.push(format!("{o} (run {id})")),
            Some(a) => {
                // The reason's first clause: "pivot `ship` may have taken effect", ...
                let short = a.reason.split([';', '(']).next().unwrap_or("").trim();
                *error_kinds
                    .entry(format!("{short} [{}]", a.kind))
                    .or_default() += 1;
                if error_examples.len() < 3 {
                    let applied: Vec<String> = records
                        .iter()
                        .filter(|r| r.order_id == **o)
                        .map(|r| r.operation.to_string())
                        .collect();
                    error_examples.push(format!(
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

    // Runs left behind (on timeout): a few with their steps, for the report.
    let mut stuck = Vec::new();
    for (o, st) in &state_of {
        if !st.is_terminal() {
            stuck.push((o.clone(), run_of[o], *st));
        }
    }
    stuck.sort();
    let mut stuck_details: Vec<String> = Vec::new();
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
        stuck_details.push(format!("{o} run {id} {st}: {}", steps.join(", ")));
    }
    stuck_details.extend(
        stuck
            .iter()
            .skip(3)
            .map(|(o, id, st)| format!("{o} run {id} {st}")),
    );

    // Summary.
    let faults = services.fault_counts();
    let by_service: Vec<String> = services
        .fault_counts_by_service()
        .iter()
        // The order saga's services only (the travel saga's are idle here).
        .filter(|(s, _)| Operation::ORDER.iter().any(|op| op.service() == **s))
        .map(|(s, c)| format!("{s} {}/{}/{}", c.transient, c.hang, c.permanent))
        .collect();
    let a = &all_report.applied;
    let hist = |e: &str| history.iter().find(|(n, _)| n == e).map_or(0, |(_, c)| *c);
    let secs = stats.elapsed.as_secs_f64();
    println!("\nresults ({secs:.1} s)");
    println!(
        "  runs        completed {} · compensated {} · error {} · not terminal {} · {:.0} runs/s",
        completed.len(),
        compensated.len(),
        error.len(),
        stuck.len(),
        (completed.len() + compensated.len() + error.len()) as f64 / secs.max(0.001)
    );
    let pg = match (&stats.pg_restart, stats.pg_restart_expected) {
        (Some(r), _) => match &r.result {
            Ok(took) => format!(
                "postgres restarted at {:.0} s (back in {:.1} s)",
                r.at.as_secs_f64(),
                took.as_secs_f64()
            ),
            Err(_) => "postgres restart failed".to_owned(),
        },
        (None, true) => "postgres restart did not happen".to_owned(),
        (None, false) => "no postgres restart".to_owned(),
    };
    println!(
        "  chaos       kills {} · restarts {} · {pg} · failed progress polls {}",
        stats.kills, stats.restarts, stats.monitor_errors
    );
    println!(
        "  faults      transient {} · hang {} · lost replies {} · terminal {} (per service t/h/p: {})",
        faults.transient,
        faults.hang,
        faults.lost_reply,
        faults.permanent,
        by_service.join(", ")
    );
    println!(
        "  supervisor  timeouts handled {} (re-queued or failed at the threshold) · interruptions {} (attempts lost with a killed process)",
        hist("timeout"),
        hist("interrupted")
    );
    let rescues = Latencies::of(stats.rescues.iter().copied());
    println!(
        "  rescue      after SIGKILL: {} kills with steps in flight, released in p50 {} · p99 {} · max {} ({} kills hit an idle process)",
        rescues.len(),
        ms(rescues.percentile(50.0)),
        ms(rescues.percentile(99.0)),
        ms(rescues.max()),
        stats.idle_kills
    );
    let hist_line: Vec<String> = history.iter().map(|(e, n)| format!("{e} {n}")).collect();
    println!("  history     {}", hist_line.join(" · "));
    println!(
        "  effects     reserve {} · release {} · charge {} · refund {} · ship {} · replays {}",
        a.reserve, a.release, a.charge, a.refund, a.ship, all_report.replays
    );
    if !error.is_empty() {
        let kinds: Vec<String> = error_kinds
            .iter()
            .map(|(k, n)| format!("{n}× {k}"))
            .collect();
        for k in &kinds {
            println!("  error runs  {k}");
        }
        println!(
            "              their ledger: {} settled, {} half-way (allowed: they wait for an operator)",
            error_report.count(OrderStatus::Shipped)
                + error_report.count(OrderStatus::Compensated)
                + error_report.count(OrderStatus::Untouched),
            error_report.count(OrderStatus::Inconsistent)
        );
        for e in &error_examples {
            println!("              e.g. {e}");
        }
    }

    // Invariants.
    let terminal = completed.len() + compensated.len() + error.len();
    v.check(
        stuck.is_empty() && missing_rows.is_empty() && not_accepted.is_empty(),
        format!(
            "every run terminal: {terminal}/{orders} (completed {}, compensated {}, error {})",
            completed.len(),
            compensated.len(),
            error.len()
        ),
        &stuck_details,
    );
    let mut lost = missing_rows.clone();
    lost.extend(not_accepted.iter().map(|o| format!("{o}: never accepted")));
    lost.extend(submitted.errors.iter().cloned());
    let one_per_order = rows_total == i64::try_from(state_of.len()).unwrap_or(-1);
    if !one_per_order {
        lost.push(format!(
            "{rows_total} run rows for {} accepted orders",
            state_of.len()
        ));
    }
    v.check(
        lost.is_empty(),
        format!(
            "no lost runs: {} accepted, {} rows found, {rows_total} runs in the database",
            run_of.len(),
            state_of.len()
        ),
        &lost,
    );
    let mut once = twice_keys.clone();
    once.extend(twice_ops.iter().cloned());
    once.extend(foreign.iter().cloned());
    v.check(
        once.is_empty(),
        format!(
            "exactly once: {} effects, {} keys applied twice, {} operations applied twice per order, {} under foreign keys",
            records.len(),
            twice_keys.len(),
            twice_ops.len(),
            foreign.len()
        ),
        &once,
    );
    v.check(
        doubled.is_empty(),
        format!(
            "fenced results: {outcomes} step results in the history, {} attempts with two results",
            doubled.len()
        ),
        &doubled,
    );
    let mut consistency = settled_report.violations.clone();
    consistency.extend(disagreements.iter().cloned());
    v.check(
        consistency.is_empty(),
        format!(
            "net consistency: {} completed/compensated orders consistent with the ledger ({} error runs reported above)",
            settled.len(),
            error.len()
        ),
        &consistency,
    );
    v.check(
        unalerted.is_empty(),
        format!(
            "alerts: {}/{} error runs have an alert",
            error.len() - unalerted.len(),
            error.len()
        ),
        &unalerted,
    );
    let mut fleet_issues: Vec<String> = stats
        .unexpected_exits
        .iter()
        .map(|e| format!("exited on its own: {e}"))
        .collect();
    if let Some(Restart { result: Err(e), .. }) = &stats.pg_restart {
        fleet_issues.push(format!("postgres restart failed: {e}"));
    }
    if stats.pg_restart_expected && stats.pg_restart.is_none() {
        fleet_issues.push("postgres restart did not happen".into());
    }
    v.check(
        fleet_issues.is_empty(),
        format!(
            "chaos as planned: {} kills, {} engine processes exited on their own, postgres restart {}",
            stats.kills,
            stats.unexpected_exits.len(),
            match (&stats.pg_restart, stats.pg_restart_expected) {
                (Some(Restart { result: Ok(_), .. }), _) => "done",
                (Some(_), _) => "failed",
                (None, true) => "missing",
                (None, false) => "skipped",
            }
        ),
        &fleet_issues,
    );
    println!("\ninvariants");
    for l in &v.lines {
        println!("{l}");
    }
    if stats.forced_stops > 0 {
        println!(
            "  note: {} engine processes did not shut down within 10 s and were killed",
            stats.forced_stops
        );
    }
    let passed = v.failed == 0;
    let result = match (stats.ending, passed) {
        (Some(Ending::Interrupted), _) => "INTERRUPTED",
        (_, true) => "PASS",
        (_, false) => "FAIL",
    };
    println!("\nresult: {result} ({} of 7 invariants failed)", v.failed);
    passed
}
