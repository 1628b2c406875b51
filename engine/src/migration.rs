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

use serde_json::Value;
use uuid::Uuid;

pub use crate::definition::migration::{
    MapFn, MigratingRun, MigratingStep, Migration, MigrationOutcome, MigrationPlan,
    MigrationRefusal, RunMigration, StepMigration, Versions,
};
use crate::interleave::{Point, Unit};
use crate::operator::Audit;
use crate::store::Store;
use crate::transition::migrate::{Decided, decide, step_rows};
use crate::{Result, RunState, workflow_key};

/// The history event of a run moved to another version.
pub const MIGRATED: &str = "migrated";

/// The most runs one page of a dry run reads ([`plan_page`]).
pub const PLAN_PAGE_MAX: u32 = 500;

/// The dry run: what migrating would do to every unfinished run of the old version, read
/// page by page ([`PLAN_PAGE_MAX`] runs each) without a transaction or a lock. Changes
/// nothing. Its size grows with the runs; the HTTP API and the console show one page at a
/// time ([`plan_page`]).
///
/// # Errors
/// [`crate::Error::Db`].
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
/// [`crate::Error::Db`].
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
/// [`crate::Error::Db`].
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
/// [`crate::Error::Db`].
pub async fn apply_one(
    store: &Store,
    v: Versions<'_>,
    id: Uuid,
    audit: &Audit,
) -> Result<Option<RunMigration>> {
    let mut tx = store.begin().await?;
    let Some((run, restarted_as)) = tx.run_lock_for_action(id).await? else {
        return Ok(None);
    };
    // A run restarted as another is left as it is: the newer run owns what it did.
    if restarted_as.is_some()
        || run.workflow != v.migration.name()
        || run.version != v.migration.from()
    {
        tx.rollback().await?;
        return Ok(None);
    }
    let mut read = tx.steps_lock(&[id]).await?;
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
    tx.history_push(id, MIGRATED, &audit.actor, Some(detail.to_string()));
    tx.pause_point(Unit::Migrate, Point::BeforeCommit).await;
    crate::metrics::record(tx.commit().await?);
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
            reason: Some(refusal.reason().to_owned()),
            steps: Vec::new(),
            input_changed: false,
        },
    }
}
