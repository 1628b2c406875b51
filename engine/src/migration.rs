//! Moving in-flight runs from one version of their workflow to the next.
//!
//! A run is pinned to the version it started with (`workflow_key` = `name@version`). A
//! [`Migration`] from version N to N+1 says how such a run's step states, outputs and input
//! become a run of N+1: by default step by step, by name (steps in both versions keep their
//! state and output, steps new in N+1 start `not_started`), and through a mapping closure
//! for the rest ([`Migration::map`]). [`plan`] is the dry run: what would happen to every
//! unfinished run of N, changing nothing; [`apply`] migrates each run in its own unit of
//! work under its row lock, decided afresh there, and reports the runs it refused. The
//! decision itself is the transition module's ([`crate::transition::migrate`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::definition::{Registry, Workflow};
use crate::interleave::{Point, Unit};
use crate::operator::Audit;
use crate::store::Store;
use crate::transition::migrate::{Decided, decide, step_rows};
use crate::{Error, Result, RunState, StepState, workflow_key};

/// The history event of a run moved to another version.
pub const MIGRATED: &str = "migrated";

/// Why a mapping closure refuses a run: the run stays on its version, and the plan shows
/// the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MigrationRefusal(String);

impl MigrationRefusal {
    /// A refusal, in words for the operator.
    pub fn new(reason: impl Into<String>) -> Self {
        Self(reason.into())
    }

    /// The reason.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

/// A mapping closure: rewrites a [`MigratingRun`], or refuses it.
pub type MapFn =
    dyn Fn(&mut MigratingRun) -> std::result::Result<(), MigrationRefusal> + Send + Sync;

/// How runs of workflow `name` move from version `from` to version `to`.
#[derive(Clone)]
pub struct Migration {
    name: String,
    from: i32,
    to: i32,
    map: Option<Arc<MapFn>>,
    automatic: bool,
}

impl fmt::Debug for Migration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Migration")
            .field("name", &self.name)
            .field("from", &self.from)
            .field("to", &self.to)
            .field("mapped", &self.map.is_some())
            .field("automatic", &self.automatic)
            .finish()
    }
}

impl Migration {
    /// The migration of workflow `name` from version `from` to version `to`, with the
    /// default mapping by step name.
    pub fn new(name: impl Into<String>, from: i32, to: i32) -> Self {
        Self {
            name: name.into(),
            from,
            to,
            map: None,
            automatic: false,
        }
    }

    /// Applies the migration without an operator: the supervisor leader's engine migrates
    /// the unfinished runs of the old version at every timer pass (recorded as done by
    /// `engine:<instance>`), each as an operator's `migrate` would; a run that cannot be
    /// migrated yet (an attempt in flight) is tried again at the next pass, one the mapping
    /// refuses stays on its version. Off by default: an operator applies a migration after
    /// reading its dry run.
    #[must_use]
    pub fn automatic(mut self) -> Self {
        self.automatic = true;
        self
    }

    /// Whether engines apply it without an operator ([`Migration::automatic`]).
    pub fn is_automatic(&self) -> bool {
        self.automatic
    }

    /// Adds a mapping closure, called for each run after the default mapping: it may rewrite
    /// the input, set a step's state and output, rename a step's output, or account for a
    /// step the new version dropped; returning a [`MigrationRefusal`] leaves the run as it
    /// is.
    #[must_use]
    pub fn map<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut MigratingRun) -> std::result::Result<(), MigrationRefusal>
            + Send
            + Sync
            + 'static,
    {
        self.map = Some(Arc::new(f));
        self
    }

    /// The workflow's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version runs leave.
    pub fn from(&self) -> i32 {
        self.from
    }

    /// The version runs move to.
    pub fn to(&self) -> i32 {
        self.to
    }

    /// Its mapping closure, if it has one.
    pub(crate) fn mapping(&self) -> Option<&MapFn> {
        self.map.as_deref()
    }

    /// Checks that both versions are registered and differ.
    ///
    /// # Errors
    /// [`Error::Config`] naming the problem.
    pub fn check(&self, registry: &Registry) -> Result<()> {
        let label = format!(
            "migration of `{}` from {} to {}",
            self.name, self.from, self.to
        );
        if self.from == self.to {
            return Err(Error::Config(format!(
                "{label}: the two versions are the same"
            )));
        }
        for v in [self.from, self.to] {
            if registry.get(&self.name, v).is_none() {
                return Err(Error::Config(format!(
                    "{label}: version {v} of `{}` is not registered (register both versions)",
                    self.name
                )));
            }
        }
        Ok(())
    }
}

/// A run being migrated, as the mapping closure sees it: its input and each step's state
/// and output, by name (the steps of the old version, and the steps new in the new version
/// as `not_started`).
#[derive(Debug, Clone, PartialEq)]
pub struct MigratingRun {
    pub(crate) id: Uuid,
    pub(crate) state: RunState,
    pub(crate) input: Value,
    pub(crate) steps: BTreeMap<String, MigratingStep>,
}

/// One step of a [`MigratingRun`].
#[derive(Debug, Clone, PartialEq)]
pub struct MigratingStep {
    pub(crate) state: StepState,
    pub(crate) output: Option<Value>,
    /// Its row, when the run has one (a step of the old version).
    pub(crate) row: Option<i64>,
}

impl MigratingStep {
    /// Its state.
    pub fn state(&self) -> StepState {
        self.state
    }

    /// Its output, once completed.
    pub fn output(&self) -> Option<&Value> {
        self.output.as_ref()
    }

    /// Whether the step is new in the version the run moves to.
    pub fn is_new(&self) -> bool {
        self.row.is_none()
    }
}

impl MigratingRun {
    /// The run's id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// The run's state (it does not change).
    pub fn state(&self) -> RunState {
        self.state
    }

    /// The run's input.
    pub fn input(&self) -> &Value {
        &self.input
    }

    /// The run's input, to rewrite.
    pub fn input_mut(&mut self) -> &mut Value {
        &mut self.input
    }

    /// A step by name.
    pub fn step(&self, name: &str) -> Option<&MigratingStep> {
        self.steps.get(name)
    }

    /// The names of its steps.
    pub fn step_names(&self) -> impl Iterator<Item = &str> {
        self.steps.keys().map(String::as_str)
    }

    fn step_mut(
        &mut self,
        name: &str,
    ) -> std::result::Result<&mut MigratingStep, MigrationRefusal> {
        self.steps
            .get_mut(name)
            .ok_or_else(|| MigrationRefusal::new(format!("the run has no step `{name}`")))
    }

    /// Sets a step's state: `not_started` (it runs when its dependencies completed),
    /// `completed` (give it an output with [`set_output`](Self::set_output)) or `skipped`
    /// (only in a run that is unwinding: a run going forward with a skipped step is refused).
    ///
    /// # Errors
    /// A [`MigrationRefusal`] for another state or an unknown step.
    pub fn set_state(
        &mut self,
        name: &str,
        state: StepState,
    ) -> std::result::Result<(), MigrationRefusal> {
        if !matches!(
            state,
            StepState::NotStarted | StepState::Completed | StepState::Skipped
        ) {
            return Err(MigrationRefusal::new(format!(
                "a mapping sets a step not_started, completed or skipped, not {state}"
            )));
        }
        let step = self.step_mut(name)?;
        step.state = state;
        if state != StepState::Completed {
            step.output = None;
        }
        Ok(())
    }

    /// Sets a step's output.
    ///
    /// # Errors
    /// A [`MigrationRefusal`] for an unknown step.
    pub fn set_output(
        &mut self,
        name: &str,
        output: Option<Value>,
    ) -> std::result::Result<(), MigrationRefusal> {
        self.step_mut(name)?.output = output;
        Ok(())
    }

    /// Moves the state and output of step `from` (of the old version) to step `to` (of the
    /// new version), and accounts for `from`: a renamed step.
    ///
    /// # Errors
    /// A [`MigrationRefusal`] when either step is unknown.
    pub fn rename(&mut self, from: &str, to: &str) -> std::result::Result<(), MigrationRefusal> {
        let old = self
            .steps
            .remove(from)
            .ok_or_else(|| MigrationRefusal::new(format!("the run has no step `{from}`")))?;
        let new = self.step_mut(to)?;
        new.state = old.state;
        new.output = old.output;
        Ok(())
    }

    /// Accounts for a step the new version no longer has, whatever its state: it is
    /// removed from the run.
    pub fn remove(&mut self, name: &str) -> Option<MigratingStep> {
        self.steps.remove(name)
    }
}

/// What migrating a run does, or did, to one of its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepMigration {
    /// The step.
    pub step: String,
    /// Its state before (`None`: new in the version the run moves to).
    pub before: Option<StepState>,
    /// Its state after (`None`: dropped).
    pub after: Option<StepState>,
    /// Whether its output changes.
    pub output_changed: bool,
}

/// What migrating one run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum MigrationOutcome {
    /// The dry run: the run would migrate.
    Migrates,
    /// Applied: the run migrated.
    Migrated,
    /// The run stays on its version (the reason says why).
    Refused,
}

/// One run in a migration plan or report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunMigration {
    /// The run.
    pub run_id: Uuid,
    /// Its state.
    pub state: RunState,
    /// What happens to it.
    pub outcome: MigrationOutcome,
    /// Why it is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Each step, before and after (for a run that migrates).
    pub steps: Vec<StepMigration>,
    /// Whether its input changes.
    pub input_changed: bool,
}

/// The dry run or the report of a migration: every unfinished run of the old version.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MigrationPlan {
    /// The workflow.
    pub workflow: String,
    /// The version runs leave.
    pub from: i32,
    /// The version runs move to.
    pub to: i32,
    /// The runs, oldest first.
    pub runs: Vec<RunMigration>,
    /// Where the next page of a paged dry run starts (pass it as `after`); `None` on the
    /// last page, and in a report of an applied migration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<Uuid>,
}

impl MigrationPlan {
    /// How many runs migrate (or would).
    pub fn migrating(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| r.outcome != MigrationOutcome::Refused)
            .count()
    }

    /// How many runs are refused.
    pub fn refused(&self) -> usize {
        self.runs.len() - self.migrating()
    }
}

/// The two versions a migration moves between, with the migration.
#[derive(Debug, Clone, Copy)]
pub struct Versions<'a> {
    /// The migration.
    pub migration: &'a Migration,
    /// The version runs leave.
    pub old: &'a Workflow,
    /// The version runs move to.
    pub new: &'a Workflow,
}

/// The most runs one page of a dry run reads ([`plan_page`]).
pub const PLAN_PAGE_MAX: u32 = 500;

/// The dry run: what migrating would do to every unfinished run of the old version, read
/// page by page ([`PLAN_PAGE_MAX`] runs each) without a transaction or a lock. Changes
/// nothing. Its size grows with the runs; the HTTP API and the console show one page at a
/// time ([`plan_page`]).
///
/// # Errors
/// [`Error::Db`].
pub async fn plan(store: &Store, v: Versions<'_>) -> Result<MigrationPlan> {
    let mut page = plan_page(store, v, None, PLAN_PAGE_MAX).await?;
    while let Some(after) = page.next_after.take() {
        let next = plan_page(store, v, Some(after), PLAN_PAGE_MAX).await?;
        page.runs.extend(next.runs);
        page.next_after = next.next_after;
    }
    Ok(page)
}

/// One page of the dry run: at most `limit` (1 to [`PLAN_PAGE_MAX`]) unfinished runs of the
/// old version by id, after run `after`; [`MigrationPlan::next_after`] names where the next
/// page starts. Read without a transaction or a lock, so a dry run never holds SQLite's
/// writer nor locks a step on PostgreSQL; what it shows is decided afresh, under the run's
/// lock, when the migration is applied.
///
/// # Errors
/// [`Error::Db`].
pub async fn plan_page(
    store: &Store,
    v: Versions<'_>,
    after: Option<Uuid>,
    limit: u32,
) -> Result<MigrationPlan> {
    let key = workflow_key(v.migration.name(), v.migration.from());
    let limit = limit.clamp(1, PLAN_PAGE_MAX);
    let rows = store.runs_unfinished_page(&key, after, limit).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let mut steps = store.steps_read(&ids).await?;
    let mut runs = Vec::with_capacity(rows.len());
    for run in &rows {
        let decided = match steps.take(run.id) {
            Ok(s) => decide(v, run, &s),
            Err(d) => Err(MigrationRefusal::new(d.to_error().to_string())),
        };
        runs.push(report(
            run.id,
            run.state,
            decided,
            MigrationOutcome::Migrates,
        ));
    }
    let full = rows.len() == usize::try_from(limit).unwrap_or(usize::MAX);
    Ok(MigrationPlan {
        workflow: v.migration.name().to_owned(),
        from: v.migration.from(),
        to: v.migration.to(),
        runs,
        next_after: if full {
            rows.last().map(|r| r.id)
        } else {
            None
        },
    })
}

/// Migrates every unfinished run of the old version, each in its own unit of work under its
/// row lock, decided afresh there; a refused run is left as it is and reported. Each
/// migrated run records a `migrated` event (versions, steps, actor and reason) and is marked
/// for evaluation, which queues the new steps whose dependencies completed.
///
/// # Errors
/// [`Error::Db`].
pub async fn apply(store: &Store, v: Versions<'_>, audit: &Audit) -> Result<MigrationPlan> {
    let key = workflow_key(v.migration.name(), v.migration.from());
    let ids: Vec<Uuid> = {
        let tx = store.begin().await?;
        let rows = tx.runs_unfinished_of(&key).await?;
        tx.rollback().await?;
        rows.into_iter().map(|r| r.id).collect()
    };
    let mut runs = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = apply_one(store, v, id, audit).await? {
            runs.push(r);
        }
    }
    Ok(MigrationPlan {
        workflow: v.migration.name().to_owned(),
        from: v.migration.from(),
        to: v.migration.to(),
        runs,
        next_after: None,
    })
}

/// Migrates run `id` in its own unit of work (`None` when it finished or moved meanwhile).
///
/// # Errors
/// [`Error::Db`].
pub async fn apply_one(
    store: &Store,
    v: Versions<'_>,
    id: Uuid,
    audit: &Audit,
) -> Result<Option<RunMigration>> {
    let mut tx = store.begin().await?;
    let Some(run) = tx.lock_run_for_action(id).await? else {
        return Ok(None);
    };
    if run.workflow != v.migration.name() || run.version != v.migration.from() {
        tx.rollback().await?;
        return Ok(None);
    }
    let mut read = tx.steps_of(&[id]).await?;
    tx.pause_point(Unit::Migrate, Point::AfterReads).await;
    let decided = match read.take(id) {
        Ok(s) => decide(v, &run, &s).map(|d| (d, s)),
        Err(d) => Err(MigrationRefusal::new(d.to_error().to_string())),
    };
    let (decided, steps) = match decided {
        Ok(x) => x,
        Err(refusal) => {
            // Nothing was written but the lock's mark for evaluation: undone.
            tx.rollback().await?;
            return Ok(Some(report(
                id,
                run.state,
                Err(refusal),
                MigrationOutcome::Migrated,
            )));
        }
    };
    let write = step_rows(v, &run, &steps, &decided);
    let moved: Vec<Value> = decided
        .changes
        .iter()
        .filter(|c| c.before != c.after || c.output_changed)
        .map(|c| serde_json::json!({ "step": c.step, "before": c.before, "after": c.after }))
        .collect();
    let mut detail = serde_json::json!({
        "from": v.migration.from(),
        "to": v.migration.to(),
        "steps": moved,
        "input_changed": decided.input_changed,
    });
    if let Some(reason) = &audit.reason {
        detail["reason"] = reason.clone().into();
    }
    if !tx.run_migrate(&write).await? {
        // A step moved after it was read (the row locks make this a last line): nothing is
        // written, and the run is decided again at the next try.
        tx.rollback().await?;
        let refusal = MigrationRefusal::new(
            "a step of the run moved while it was being migrated; try again".to_owned(),
        );
        return Ok(Some(report(
            id,
            run.state,
            Err(refusal),
            MigrationOutcome::Migrated,
        )));
    }
    tx.history_push(id, None, MIGRATED, &audit.actor, Some(detail.to_string()));
    tx.pause_point(Unit::Migrate, Point::BeforeCommit).await;
    tx.commit().await?;
    Ok(Some(report(
        id,
        run.state,
        Ok(decided),
        MigrationOutcome::Migrated,
    )))
}

/// The report of one run: its step changes when it migrates, the reason when it is refused.
fn report(
    id: Uuid,
    state: RunState,
    decided: std::result::Result<Decided, MigrationRefusal>,
    outcome: MigrationOutcome,
) -> RunMigration {
    match decided {
        Ok(d) => RunMigration {
            run_id: id,
            state,
            outcome,
            reason: None,
            steps: d.changes,
            input_changed: d.input_changed,
        },
        Err(refusal) => RunMigration {
            run_id: id,
            state,
            outcome: MigrationOutcome::Refused,
            reason: Some(refusal.0),
            steps: Vec::new(),
            input_changed: false,
        },
    }
}
