//! The write intents: what the transitions decide a unit of work writes, as plain data. The
//! store persists them, guarded by the states and fencing tokens they were decided from; it
//! decides nothing of its own. Nouns of the transition layer: they know the rules' types
//! (triggers, effects, changes), never SQL or a connection.

use uuid::Uuid;

use super::{Effects, RunTrigger, StepChange, Trigger};
use crate::definition::millis;
use crate::model::AlertKind;
use crate::trace::TraceContext;
use crate::wait::WaitRequest;
use crate::{RunState, StepError, StepState, Workflow};

/// A step transition decided by the evaluator or an operator action (guarded by `from`).
#[derive(Debug, Clone)]
pub struct StepWrite {
    /// Row id.
    pub id: i64,
    /// Step name (for history).
    pub name: String,
    /// Expected current state: the write is guarded by it.
    pub from: StepState,
    /// New state.
    pub to: StepState,
    /// What else changes, as the transition table says.
    pub effects: Effects,
    /// The step's new idempotency key, when it starts afresh ([`Effects::rekey`]).
    pub key: Option<String>,
}

/// Everything one evaluation or operator action writes for a run.
#[derive(Debug, Clone, Default)]
pub struct PlanWrite {
    /// Step transitions.
    pub steps: Vec<StepWrite>,
    /// New run state.
    pub run_state: Option<RunState>,
    /// Run output JSON (when completing).
    pub run_output: Option<String>,
    /// Run error JSON (when compensating or failing).
    pub run_error: Option<String>,
    /// Clear the run's error (when `run_error` is `None`): a resumed run that held none
    /// before it was paused.
    pub clear_error: bool,
    /// Attempts in flight (step row id, fencing token) whose stored deadline moves later by
    /// `extend_ms` (an operator's `extend`).
    pub extend: Vec<(i64, i32)>,
    /// Milliseconds added to the deadlines of `extend`.
    pub extend_ms: i64,
    /// Alert to raise in the same transaction.
    pub alert: Option<NewAlert>,
    /// Resolve the run's open alerts (operator actions), recording the actor as who resolved
    /// them.
    pub resolve_alerts: bool,
    /// Why the run's open alerts are resolved (the action and its reason), with
    /// `resolve_alerts`.
    pub resolution: Option<String>,
    /// Free the run's business key (it reached a final state its workflow's key policy
    /// releases).
    pub release_key: bool,
    /// The run-table trigger that decided `run_state`.
    pub trigger: Option<RunTrigger>,
    /// Record the run's history entry even when its state stays (an operator's action is
    /// audited whatever it moved).
    pub audited: bool,
    /// History event name for the run transition (`state` when empty).
    pub event: &'static str,
    /// Detail recorded with the run transition.
    pub detail: Option<String>,
}

/// A kept step of a migrated run: its state and output under the new version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepUpdate {
    /// Row id.
    pub id: i64,
    /// The state the migration was decided from: the write is guarded by it.
    pub from: StepState,
    /// The fencing token the migration was decided from: the write is guarded by it.
    pub attempt: i32,
    /// Its state.
    pub state: StepState,
    /// Its output JSON.
    pub output: Option<String>,
}

/// A step new in the version a run migrates to.
#[derive(Debug, Clone)]
pub struct StepInsert {
    /// Its state (`not_started` unless the mapping said otherwise).
    pub state: StepState,
    /// Its output JSON.
    pub output: Option<String>,
    /// Its settings, from the new version.
    pub step: NewStep,
}

/// What migrating one run writes (decided by [`super::migrate`]).
#[derive(Debug, Clone)]
pub struct MigrationWrite {
    /// The run.
    pub run_id: Uuid,
    /// The version it moves to.
    pub version: i32,
    /// Its new `name@version`.
    pub workflow_key: String,
    /// Its new input JSON, when the mapping changed it.
    pub input: Option<String>,
    /// Its kept steps.
    pub update: Vec<StepUpdate>,
    /// The rows of its dropped steps, with the state and fencing token each was decided
    /// from (the delete is guarded by them).
    pub delete: Vec<(i64, StepState, i32)>,
    /// Its new steps.
    pub insert: Vec<StepInsert>,
}

/// A run to insert.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Run id.
    pub id: Uuid,
    /// Workflow name.
    pub workflow: String,
    /// Version.
    pub version: i32,
    /// Business key: while a run holds it (as its workflow's key policy says), starting the
    /// workflow with the same key returns that run.
    pub business_key: Option<String>,
    /// Input JSON.
    pub input: String,
    /// Claim priority, copied onto every step row: higher is claimed first.
    pub priority: i32,
    /// The priority a step of the run is queued at after an attempt that did not succeed
    /// (the run's priority moved by its workflow's [`RetryLane`](crate::RetryLane)), copied
    /// onto every step row.
    pub retry_priority: i32,
    /// When its root steps become due.
    pub start: RunStart,
    /// Whether its finish is notified through the outbox (a `run_finished` notice).
    pub notify: bool,
    /// Its W3C trace context (`None`: its attempts read the run id as the trace id).
    pub trace: Option<TraceContext>,
    /// Its flow key (a tenant, a customer), copied onto every step row: the key that
    /// per-key limits of resources count by.
    pub flow_key: Option<String>,
    /// Its steps.
    pub steps: Vec<NewStep>,
}

impl NewRun {
    /// The state the run is stored in: `Running` when it starts at once (its root steps are
    /// due now), `Pending` when it was given a start time, until its first step completes.
    pub fn initial_state(&self) -> RunState {
        match self.start {
            RunStart::Now => RunState::Running,
            RunStart::At(_) | RunStart::After(_) => RunState::Pending,
        }
    }
}

/// When a new run's root steps become due, on the database clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunStart {
    /// At once.
    #[default]
    Now,
    /// At this instant (epoch milliseconds); at once if it has passed.
    At(i64),
    /// This many milliseconds after the insert (`{now}` + delay).
    After(i64),
}

/// A step row to insert with its run.
#[derive(Debug, Clone)]
pub struct NewStep {
    /// Step name.
    pub name: String,
    /// Failure threshold.
    pub max_failures: i32,
    /// Interruption cap.
    pub max_interruptions: i32,
    /// First deadline in ms.
    pub deadline_ms: i64,
    /// Deadline cap in ms.
    pub deadline_cap_ms: i64,
    /// Stable idempotency key.
    pub idempotency_key: String,
    /// Whether the step has no dependencies: it is queued at once, so a run needs no
    /// evaluation to start.
    pub ready: bool,
    /// The remote resource whose limits its attempts obey.
    pub resource: Option<String>,
}

impl NewRun {
    /// The rows of a new run of `wf`: its steps with their settings, root steps queued,
    /// idempotency keys `<run id>:<step>` (SAS-2: stable across every retry).
    #[allow(clippy::too_many_arguments)]
    pub fn for_workflow(
        wf: &Workflow,
        input: String,
        business_key: Option<String>,
        start: RunStart,
        priority: i32,
        notify: bool,
        trace: TraceContext,
    ) -> Self {
        let id = Uuid::now_v7();
        let steps = wf
            .steps()
            .iter()
            .map(|s| NewStep {
                name: s.name().to_owned(),
                max_failures: s.settings().retry.max_failures_stored(),
                max_interruptions: s.settings().retry.max_interruptions_stored(),
                deadline_ms: millis(s.settings().deadline.initial),
                deadline_cap_ms: millis(s.settings().deadline.cap),
                // SAS-2: stable across every retry of this step in this run.
                idempotency_key: format!("{id}:{}", s.name()),
                ready: s.is_root(),
                resource: s.resource().map(str::to_owned),
            })
            .collect();
        Self {
            id,
            workflow: wf.name().to_owned(),
            version: wf.version(),
            business_key,
            input,
            priority,
            retry_priority: wf.retry_lane().retry_priority(priority),
            start,
            notify,
            trace: Some(trace),
            flow_key: None,
            steps,
        }
    }
}

/// An alert to insert.
#[derive(Debug, Clone)]
pub struct NewAlert {
    /// Run concerned, if any.
    pub run_id: Option<Uuid>,
    /// Step concerned, if any.
    pub step: Option<String>,
    /// What it is about.
    pub kind: AlertKind,
    /// What happened.
    pub reason: String,
    /// Attempts the step made in the phase that failed (forward or compensation); 0 when the
    /// alert names no step.
    pub attempts: i32,
    /// What the operator can do.
    pub actions: Vec<String>,
    /// While the alert is open, a second alert with the same key is not inserted.
    pub open_key: Option<String>,
}

/// Which deadline condition fences an attempt-end write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadlineGuard {
    /// The attempt's answer: only before `complete_by` (SAS-3: a late answer is a failure).
    Live,
    /// The supervisor's timeout: only after `complete_by`, so for one attempt either the
    /// answer or the timeout wins, never both.
    Expired,
    /// An interruption (the owner is gone): whatever the deadline.
    Any,
}

/// The decided end of one attempt of a claimed step, fenced by `(id, from, attempt, owner)`
/// and the deadline guard.
#[derive(Debug, Clone)]
pub struct StepFinish {
    /// Row id.
    pub id: i64,
    /// Run id.
    pub run_id: Uuid,
    /// `name@version` of the step's workflow.
    pub workflow_key: String,
    /// Step name.
    pub name: String,
    /// The fencing token of the lease.
    pub attempt: i32,
    /// The lease owner (`LockedBy`).
    pub owner: String,
    /// What the transition table decided.
    pub change: StepChange,
    /// Output JSON (when the change stores it).
    pub output: Option<String>,
    /// The failure, for history and the step's `error`.
    pub error: Option<StepError>,
    /// The deadline condition.
    pub guard: DeadlineGuard,
    /// How long the attempt ran, when an agent answered for it (for the metrics).
    pub elapsed: Option<std::time::Duration>,
    /// What happens to the step's stored wait.
    pub wait: WaitWrite,
}

/// What an attempt's end does to the step's stored wait (`wait`, `wait_key`).
#[derive(Debug, Clone, Default)]
pub enum WaitWrite {
    /// Left as it is: the attempt's answer was lost (a timeout, an interruption) or nothing
    /// ran (damaged data), so the next attempt resumes the same wait.
    #[default]
    Keep,
    /// Cleared: the attempt answered (its callback token, if any, is spent).
    Clear,
    /// A park: the step waits for this, and what follows the park in the same
    /// transaction (a child run to start) travels with it.
    Set(Box<Park>),
}

impl StepFinish {
    /// The history event name of the change.
    pub fn event(&self) -> &'static str {
        match self.change.on {
            Trigger::Succeeded => "completed",
            Trigger::FailedWillRetry => "retry",
            Trigger::Deferred => "deferred",
            Trigger::TimedOut | Trigger::TimedOutForGood => "timeout",
            Trigger::Interrupted | Trigger::InterruptedTooOften => "interrupted",
            Trigger::SetAside => "set_aside",
            Trigger::Parked => "parked",
            _ => "failed",
        }
    }
}

/// A park written by a completion batch, for what follows it in the same transaction.
#[derive(Debug, Clone)]
pub struct Park {
    /// The run.
    pub run_id: Uuid,
    /// The parked step's row.
    pub step_id: i64,
    /// The step's name.
    pub step: String,
    /// What it asked for.
    pub request: WaitRequest,
    /// The child run to start, built from the child's workflow (a child step).
    pub child: Option<NewRun>,
}
