//! The engine's metrics, recorded through the `metrics` facade: whatever recorder the process
//! installed receives them (`sagaflow::metrics::install_prometheus` installs a Prometheus
//! one), and with none installed each recording is a call into a no-op.
//!
//! Counters move after the transaction that made the change commits, by the instance that
//! committed it: the commit returns what the unit of work did ([`Happened`]), and the use
//! case that committed hands it to [`record`] (a rolled-back unit records nothing). With one instance, the counters therefore
//! equal what the database holds. Labels take bounded values only (workflow and step names,
//! states, outcomes, alert kinds), interned once per process so that recording allocates no
//! string.
//!
//! The queue gauges are read from the database ([`refresh_queue_gauges`]) and are the same
//! on every instance: fleet-wide figures. The in-flight and leader gauges are this process's.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};

use ::metrics::{
    SharedString, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge,
    histogram,
};
use uuid::Uuid;

use crate::model::AlertKind;
use crate::rows::RunRow;
use crate::store::{Happened, PlanWrite, RunMoved, Store, WorkflowQueue};
use crate::transition::Trigger;
use crate::transition::operator::is_cancelled;
use crate::{Result, RunState};

/// Counter: runs started (accepted), by `workflow`.
pub const RUNS_STARTED: &str = "sagaflow_runs_started_total";
/// Counter: runs that finished, by `workflow` and final `state` (`completed`, `compensated`,
/// `cancelled`).
pub const RUNS_FINISHED: &str = "sagaflow_runs_finished_total";
/// Counter: runs that entered `error` (they wait for an operator), by `workflow`.
pub const RUNS_ERRORED: &str = "sagaflow_runs_errored_total";
/// Counter: step attempts that ended, forward and compensation alike, by `workflow`, `step`
/// and `outcome` (`succeeded`, `failed_not_applied`, `failed_unknown`, `interrupted`,
/// `deferred`).
pub const STEP_ATTEMPTS: &str = "sagaflow_step_attempts_total";
/// Counter: alerts raised, by `kind`.
pub const ALERTS: &str = "sagaflow_alerts_total";
/// Histogram: how long step attempts answered by an agent took, by `workflow` and `step`.
pub const STEP_ATTEMPT_DURATION: &str = "sagaflow_step_attempt_duration_seconds";
/// Histogram: runs from creation to their final state, by `workflow` and final `state`.
pub const RUN_DURATION: &str = "sagaflow_run_duration_seconds";
/// Histogram: from a run's first step falling due (its creation, or its scheduled start) to
/// that step's first claim, by `workflow`.
pub const RUN_START_LATENCY: &str = "sagaflow_run_start_latency_seconds";
/// Histogram: from a step falling due to its claim, by `workflow`.
pub const STEP_CLAIM_LATENCY: &str = "sagaflow_step_claim_latency_seconds";
/// Gauge: steps due now (`ready`, `compensation_ready`), by `workflow`; fleet-wide.
pub const STEPS_READY: &str = "sagaflow_steps_ready";
/// Gauge: steps queued for later (a retry's backoff, a scheduled start), by `workflow`;
/// fleet-wide.
pub const STEPS_SCHEDULED: &str = "sagaflow_steps_scheduled";
/// Gauge: steps with an attempt in flight (`running`, `compensating`) by `workflow`;
/// fleet-wide.
pub const STEPS_RUNNING: &str = "sagaflow_steps_running";
/// Gauge: seconds since the oldest due step became due, by `workflow`; fleet-wide.
pub const OLDEST_READY_AGE: &str = "sagaflow_oldest_ready_age_seconds";
/// Gauge: step attempts in flight on this process's engines.
pub const STEPS_IN_FLIGHT: &str = "sagaflow_steps_in_flight";
/// Gauge: 1 while an engine of this process is the supervisor leader, else 0.
pub const LEADER: &str = "sagaflow_leader";

/// Gauge: attempts of a resource's steps in flight, by `resource`; fleet-wide.
pub const RESOURCE_IN_FLIGHT: &str = "sagaflow_resource_in_flight";
/// Gauge: due steps of a resource waiting for a claim, by `resource`; fleet-wide.
pub const RESOURCE_WAITING: &str = "sagaflow_resource_waiting";
/// Gauge: a resource's circuit breaker, by `resource`: 0 closed, 1 half-open, 2 open;
/// fleet-wide.
pub const RESOURCE_BREAKER: &str = "sagaflow_resource_breaker_state";
/// Gauge: of [`RESOURCE_IN_FLIGHT`], compensation attempts, by `resource`; fleet-wide.
pub const RESOURCE_COMPENSATIONS_IN_FLIGHT: &str = "sagaflow_resource_compensations_in_flight";
/// Gauge: of [`RESOURCE_WAITING`], compensations, by `resource`; fleet-wide.
pub const RESOURCE_COMPENSATIONS_WAITING: &str = "sagaflow_resource_compensations_waiting";
/// Gauge: the slots of a resource's `max_in_flight` kept for compensation attempts, by
/// `resource` (0 when both kinds share them).
pub const RESOURCE_COMPENSATION_SLOTS: &str = "sagaflow_resource_compensation_slots";

/// Every metric name, with its kind (`counter`, `histogram`, `gauge`).
pub const ALL: [(&str, &str); 21] = [
    (RUNS_STARTED, "counter"),
    (RUNS_FINISHED, "counter"),
    (RUNS_ERRORED, "counter"),
    (STEP_ATTEMPTS, "counter"),
    (ALERTS, "counter"),
    (STEP_ATTEMPT_DURATION, "histogram"),
    (RUN_DURATION, "histogram"),
    (RUN_START_LATENCY, "histogram"),
    (STEP_CLAIM_LATENCY, "histogram"),
    (STEPS_READY, "gauge"),
    (STEPS_SCHEDULED, "gauge"),
    (STEPS_RUNNING, "gauge"),
    (OLDEST_READY_AGE, "gauge"),
    (STEPS_IN_FLIGHT, "gauge"),
    (LEADER, "gauge"),
    (RESOURCE_IN_FLIGHT, "gauge"),
    (RESOURCE_WAITING, "gauge"),
    (RESOURCE_BREAKER, "gauge"),
    (RESOURCE_COMPENSATIONS_IN_FLIGHT, "gauge"),
    (RESOURCE_COMPENSATIONS_WAITING, "gauge"),
    (RESOURCE_COMPENSATION_SLOTS, "gauge"),
];

/// Buckets (seconds) of [`STEP_ATTEMPT_DURATION`]: a local call to a slow remote one.
pub const STEP_DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];
/// Buckets (seconds) of [`RUN_DURATION`]: sub-second sagas to ones that wait for hours.
pub const RUN_DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0,
];
/// Buckets (seconds) of [`RUN_START_LATENCY`] and [`STEP_CLAIM_LATENCY`]: a woken claim
/// loop answers in milliseconds, a polling one within its poll interval.
pub const LATENCY_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// Describes every metric (help text and unit) to the installed recorder. Recorders keep
/// descriptions given after they were installed only, so call it after installing one;
/// calling it again does no harm. Engines call it when they are built.
pub fn describe() {
    describe_counter!(
        RUNS_STARTED,
        Unit::Count,
        "Runs started (accepted), per workflow."
    );
    describe_counter!(
        RUNS_FINISHED,
        Unit::Count,
        "Runs that finished, per workflow and final state (completed, compensated, cancelled)."
    );
    describe_counter!(
        RUNS_ERRORED,
        Unit::Count,
        "Runs that entered the error state and wait for an operator, per workflow."
    );
    describe_counter!(
        STEP_ATTEMPTS,
        Unit::Count,
        "Step attempts (forward and compensation) that ended, per workflow, step and outcome \
         (succeeded, failed_not_applied, failed_unknown, interrupted, deferred)."
    );
    describe_counter!(ALERTS, Unit::Count, "Alerts raised, per kind.");
    describe_histogram!(
        STEP_ATTEMPT_DURATION,
        Unit::Seconds,
        "Duration of step attempts answered by an agent, per workflow and step."
    );
    describe_histogram!(
        RUN_DURATION,
        Unit::Seconds,
        "Duration of runs from creation to their final state, per workflow and final state."
    );
    describe_histogram!(
        RUN_START_LATENCY,
        Unit::Seconds,
        "Time from a run's first step falling due (creation or scheduled start) to its first claim, per workflow."
    );
    describe_histogram!(
        STEP_CLAIM_LATENCY,
        Unit::Seconds,
        "Time from a step falling due to its claim, per workflow."
    );
    describe_gauge!(
        RESOURCE_IN_FLIGHT,
        Unit::Count,
        "Attempts of a remote resource's steps in flight on any instance (from the database)."
    );
    describe_gauge!(
        RESOURCE_WAITING,
        Unit::Count,
        "Due steps of a remote resource waiting for a claim: for its limits, or a free slot (from the database)."
    );
    describe_gauge!(
        RESOURCE_BREAKER,
        Unit::Count,
        "A remote resource's circuit breaker: 0 closed, 1 half-open, 2 open (from the database)."
    );
    describe_gauge!(
        RESOURCE_COMPENSATIONS_IN_FLIGHT,
        Unit::Count,
        "Of a remote resource's attempts in flight, compensation attempts (from the database)."
    );
    describe_gauge!(
        RESOURCE_COMPENSATIONS_WAITING,
        Unit::Count,
        "Of a remote resource's due steps waiting for a claim, compensations (from the database)."
    );
    describe_gauge!(
        RESOURCE_COMPENSATION_SLOTS,
        Unit::Count,
        "Slots of a remote resource's concurrency kept for compensation attempts; 0 when shared."
    );
    describe_gauge!(
        STEPS_READY,
        Unit::Count,
        "Steps due now, per workflow (from the database: the same on every instance)."
    );
    describe_gauge!(
        STEPS_SCHEDULED,
        Unit::Count,
        "Steps queued for later (retry backoff, scheduled start), per workflow (from the database)."
    );
    describe_gauge!(
        STEPS_RUNNING,
        Unit::Count,
        "Steps with an attempt in flight on any instance, per workflow (from the database)."
    );
    describe_gauge!(
        OLDEST_READY_AGE,
        Unit::Seconds,
        "Seconds since the oldest due step became due, per workflow (from the database)."
    );
    describe_gauge!(
        STEPS_IN_FLIGHT,
        Unit::Count,
        "Step attempts in flight on this instance."
    );
    describe_gauge!(
        LEADER,
        Unit::Count,
        "1 while this instance is the supervisor leader, else 0."
    );
    // The gauges of this process exist from the start, at 0.
    gauge!(STEPS_IN_FLIGHT).increment(0.0);
    gauge!(LEADER).increment(0.0);
}

/// Interned label values (workflow and step names): bounded by the definitions, so at most
/// this many are kept; past it a value is allocated per use rather than kept.
const LABELS_MAX: usize = 4096;

/// The label value for `s`, shared rather than allocated on every use.
fn label(s: &str) -> SharedString {
    static LABELS: OnceLock<RwLock<HashMap<Box<str>, SharedString>>> = OnceLock::new();
    let labels = LABELS.get_or_init(RwLock::default);
    if let Some(l) = labels.read().unwrap_or_else(PoisonError::into_inner).get(s) {
        return l.clone();
    }
    let mut map = labels.write().unwrap_or_else(PoisonError::into_inner);
    if map.len() >= LABELS_MAX {
        return SharedString::from_owned(s.to_owned());
    }
    map.entry(s.into())
        .or_insert_with(|| SharedString::from_shared(std::sync::Arc::from(s)))
        .clone()
}

/// The workflow name of a `name@version` key (the version is not a label).
fn workflow_of(key: &str) -> &str {
    key.rsplit_once('@').map_or(key, |(name, _)| name)
}

/// How a step attempt ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The attempt succeeded.
    Succeeded,
    /// It failed, and the remote side did not act.
    FailedNotApplied,
    /// It failed (or timed out), and the remote side may have acted (or did).
    FailedUnknown,
    /// Its instance went away (crash, stop) before it answered.
    Interrupted,
    /// The remote asked to be called again later and applied nothing (not a failure).
    Deferred,
}

impl AttemptOutcome {
    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::FailedNotApplied => "failed_not_applied",
            Self::FailedUnknown => "failed_unknown",
            Self::Interrupted => "interrupted",
            Self::Deferred => "deferred",
        }
    }

    /// The outcome of an attempt ended by `on`; `not_applied` when it failed and its remote
    /// did not act.
    pub fn of(on: Trigger, not_applied: bool) -> Self {
        match on {
            Trigger::Succeeded => Self::Succeeded,
            Trigger::Interrupted | Trigger::InterruptedTooOften => Self::Interrupted,
            Trigger::Deferred => Self::Deferred,
            _ if not_applied => Self::FailedNotApplied,
            _ => Self::FailedUnknown,
        }
    }
}

/// A finished run's `state` label: `cancelled` for a run an operator cancelled (it ends
/// compensated with a `cancelled` error envelope), else its final state.
fn final_label(state: RunState, cancelled: bool) -> &'static str {
    match (state, cancelled) {
        (RunState::Compensated, true) => "cancelled",
        (s, _) => s.as_str(),
    }
}

/// Counts what a committed unit of work did ([`StoreTx::commit`](crate::store::StoreTx::commit)
/// returns it), by the instance that committed it.
pub fn record(happened: Happened) {
    for a in happened.attempts {
        let (workflow, step) = (label(workflow_of(&a.workflow_key)), label(&a.step));
        if let Some(d) = a.elapsed {
            histogram!(STEP_ATTEMPT_DURATION, "workflow" => workflow.clone(), "step" => step.clone())
                .record(d.as_secs_f64());
        }
        let outcome = AttemptOutcome::of(a.on, a.not_applied);
        counter!(STEP_ATTEMPTS, "workflow" => workflow, "step" => step, "outcome" => outcome.as_str())
            .increment(1);
    }
    for r in happened.runs {
        match r {
            RunMoved::Finished {
                workflow,
                state,
                cancelled,
                created_at,
            } => {
                let (workflow, state) = (label(&workflow), final_label(state, cancelled));
                histogram!(RUN_DURATION, "workflow" => workflow.clone(), "state" => state)
                    .record(run_seconds(created_at));
                counter!(RUNS_FINISHED, "workflow" => workflow, "state" => state).increment(1);
            }
            RunMoved::Errored { workflow } => {
                counter!(RUNS_ERRORED, "workflow" => label(&workflow)).increment(1);
            }
        }
    }
}

/// The runs whose plans leave their run with a `cancelled` error envelope (what the run's
/// `error` holds after the write).
pub(crate) fn cancelled_runs(plans: &[(RunRow, PlanWrite)]) -> Vec<Uuid> {
    plans
        .iter()
        .filter(|(run, p)| {
            let error = match (&p.run_error, p.clear_error) {
                (Some(e), _) => Some(e.as_str()),
                (None, true) => None,
                (None, false) => run.error.as_deref(),
            };
            error.is_some_and(is_cancelled)
        })
        .map(|(run, _)| run.id)
        .collect()
}

/// Seconds from a run's creation at `created_at` (database clock) to now (this instance's
/// clock).
fn run_seconds(created_at: i64) -> f64 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    millis_to_secs(now_ms - created_at)
}

/// Milliseconds as seconds, never negative.
fn millis_to_secs(ms: i64) -> f64 {
    // Durations of a few years at most: exact in an f64.
    #[allow(clippy::cast_precision_loss)]
    let secs = ms.max(0) as f64 / 1000.0;
    secs
}

/// Records a run accepted for `workflow` (after its insert committed).
pub fn run_started(workflow: &str) {
    counter!(RUNS_STARTED, "workflow" => label(workflow)).increment(1);
}

/// Records an alert raised.
pub fn alert_raised(kind: &AlertKind) {
    counter!(ALERTS, "kind" => alert_kind(kind)).increment(1);
}

/// The `kind` label of an alert kind (`other` for kinds this version does not know).
fn alert_kind(kind: &AlertKind) -> &'static str {
    match kind {
        AlertKind::RunError => "run_error",
        AlertKind::RunPaused => "run_paused",
        AlertKind::PoisonStep => "poison_step",
        AlertKind::UnknownVersion => "unknown_version",
        AlertKind::CorruptRow => "corrupt_row",
        AlertKind::SupervisorStalled => "supervisor_stalled",
        AlertKind::DefinitionChanged => "definition_changed",
        AlertKind::BacklogGrowing => "backlog_growing",
        AlertKind::BreakerOpen => "breaker_open",
        AlertKind::NoInstanceForWorkflow => "no_instance_for_workflow",
        AlertKind::SplitBrain => "split_brain",
        AlertKind::DeliveryDeadLettered => "delivery_dead_lettered",
        AlertKind::Other(_) => "other",
    }
}

/// Records a claim: the time the step waited after falling due (`due_at` and `db_now` in
/// epoch ms, database clock), and, for the first claim of a run's first step, the run's
/// start latency.
pub(crate) fn claimed(workflow_key: &str, due_at: Option<i64>, db_now: i64, first_of_run: bool) {
    let Some(due_at) = due_at else {
        return;
    };
    let workflow = label(workflow_of(workflow_key));
    let waited = millis_to_secs(db_now - due_at);
    if first_of_run {
        histogram!(RUN_START_LATENCY, "workflow" => workflow.clone()).record(waited);
    }
    histogram!(STEP_CLAIM_LATENCY, "workflow" => workflow).record(waited);
}

/// Changes the in-flight gauge by `delta` attempts.
pub(crate) fn in_flight(delta: f64) {
    gauge!(STEPS_IN_FLIGHT).increment(delta);
}

/// The leader gauge's share of one term: [`LEADER`] counts 1 more while it lives. Several
/// engines of one process leading (under different lease names) add up.
#[derive(Debug)]
pub struct LeaderGauge(());

/// The terms alive in this process. The gauge is set to it, never moved by a difference: a
/// term begun before a recorder was installed (its increment lost) would otherwise take the
/// gauge below what leads when it ends. The lock keeps a count and its write in one order.
static LEADER_TERMS: std::sync::Mutex<i32> = std::sync::Mutex::new(0);

/// Moves the count of live terms by `by` and sets the gauge to it.
fn leader_terms(by: i32) {
    let mut terms = LEADER_TERMS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *terms += by;
    gauge!(LEADER).set(f64::from(*terms));
}

impl LeaderGauge {
    /// Counts this instance as leader until the value is dropped.
    pub fn raise() -> Self {
        leader_terms(1);
        Self(())
    }
}

impl Drop for LeaderGauge {
    fn drop(&mut self) {
        leader_terms(-1);
    }
}

/// Reads the queue per workflow from the database and sets the queue gauges
/// ([`set_queue_gauges`]).
///
/// # Errors
/// [`crate::Error::Db`].
pub async fn refresh_queue_gauges(store: &Store) -> Result<()> {
    set_queue_gauges(&store.queue_by_workflow().await?);
    set_resource_gauges(&store.resource_list().await?);
    Ok(())
}

/// Sets the resource gauges ([`RESOURCE_IN_FLIGHT`], [`RESOURCE_WAITING`], their
/// compensations, [`RESOURCE_COMPENSATION_SLOTS`], [`RESOURCE_BREAKER`]) from
/// [`Store::resource_list`]. Resources are declared in code, a handful: no series is dropped.
pub fn set_resource_gauges(resources: &[crate::resource::ResourceView]) {
    #[allow(clippy::cast_precision_loss)] // counts of steps: exact in an f64
    for r in resources {
        gauge!(RESOURCE_IN_FLIGHT, "resource" => r.name.clone()).set(r.in_flight as f64);
        gauge!(RESOURCE_WAITING, "resource" => r.name.clone()).set(r.waiting as f64);
        gauge!(RESOURCE_COMPENSATIONS_IN_FLIGHT, "resource" => r.name.clone())
            .set(r.compensations_in_flight as f64);
        gauge!(RESOURCE_COMPENSATIONS_WAITING, "resource" => r.name.clone())
            .set(r.compensations_waiting as f64);
        let kept = r
            .limits
            .compensation_share
            .filter(|_| r.limits.max_in_flight.is_some())
            .map_or(0, |s| s.in_flight);
        gauge!(RESOURCE_COMPENSATION_SLOTS, "resource" => r.name.clone()).set(f64::from(kept));
        let breaker = match r.breaker.state {
            crate::resource::BreakerState::Closed => 0.0,
            crate::resource::BreakerState::HalfOpen => 1.0,
            crate::resource::BreakerState::Open => 2.0,
        };
        gauge!(RESOURCE_BREAKER, "resource" => r.name.clone()).set(breaker);
    }
}

/// Sets the queue gauges ([`STEPS_READY`], [`STEPS_SCHEDULED`], [`STEPS_RUNNING`],
/// [`OLDEST_READY_AGE`]) from the queues read by [`Store::queue_by_workflow`]. A workflow
/// whose queue emptied since the last call is set to 0.
pub fn set_queue_gauges(queues: &[WorkflowQueue]) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(PoisonError::into_inner);
    let seen = seen.get_or_insert_with(HashSet::new);
    let now: HashSet<&str> = queues.iter().map(|q| q.workflow.as_str()).collect();
    for gone in seen.iter().filter(|w| !now.contains(w.as_str())) {
        let workflow = label(gone);
        for name in [
            STEPS_READY,
            STEPS_SCHEDULED,
            STEPS_RUNNING,
            OLDEST_READY_AGE,
        ] {
            gauge!(name, "workflow" => workflow.clone()).set(0.0);
        }
    }
    #[allow(clippy::cast_precision_loss)] // counts of steps: exact in an f64
    for q in queues {
        let workflow = label(&q.workflow);
        gauge!(STEPS_READY, "workflow" => workflow.clone()).set(q.ready as f64);
        gauge!(STEPS_SCHEDULED, "workflow" => workflow.clone()).set(q.scheduled as f64);
        gauge!(STEPS_RUNNING, "workflow" => workflow.clone()).set(q.running as f64);
        gauge!(OLDEST_READY_AGE, "workflow" => workflow).set(millis_to_secs(q.oldest_ready_ms));
    }
    *seen = queues.iter().map(|q| q.workflow.clone()).collect();
}

#[cfg(test)]
mod tests {
    use super::{final_label, label, workflow_of};
    use crate::RunState;

    #[test]
    fn labels_are_names_without_versions_and_shared() {
        assert_eq!(workflow_of("order@3"), "order");
        assert_eq!(workflow_of("plain"), "plain");
        assert_eq!(workflow_of("a@b@2"), "a@b");
        let (a, b) = (label("order"), label("order"));
        assert_eq!(a, b);
        assert_eq!(&*a, "order");
    }

    #[test]
    fn a_cancelled_run_is_labelled_cancelled_only_when_compensated() {
        assert_eq!(final_label(RunState::Compensated, true), "cancelled");
        assert_eq!(final_label(RunState::Compensated, false), "compensated");
        assert_eq!(final_label(RunState::Completed, true), "completed");
    }
}
