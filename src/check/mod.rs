//! A history checker: reads a sagaflow database and reports the runs whose stored rows break
//! the engine's invariants.
//!
//! Usable on any sagaflow database, after a test, a chaos run or a production incident: it
//! only reads (in one read-only snapshot: `REPEATABLE READ, READ ONLY` on PostgreSQL, one
//! read transaction on SQLite), so it may run beside live engines. Runs are read by pages
//! of [`PAGE`] in id order, each page with its steps, history, open alerts, and the
//! published definition of its workflow version.
//!
//! The invariants ([`Invariant`]):
//!
//! 1. [`Invariant::Path`]: a run's history is a path of the transition tables
//!    ([`RUN_RULES`](sagaflow_engine::transition::RUN_RULES),
//!    [`STEP_RULES`](sagaflow_engine::transition::STEP_RULES)). Each line that names a state
//!    change (`from` → `to`: `state`, the attempt ends, `woken`, `set_aside`, the operator
//!    actions) is an edge of its table; consecutive run lines chain (each `from` is the
//!    previous `to`) and the last one is the run's stored state; consecutive lines of a step
//!    chain too, across the claims, which write no line (`ready` → `running`,
//!    `compensation_ready` → `compensating`). A line whose `from` equals its `to` on the run
//!    (an operator's `extend`) changes nothing and is only chained. Lines without states
//!    (`event_received`, `migrated`, …) are skipped; `migrated` rewrote step states without
//!    lines, so step chains start afresh after it.
//! 2. [`Invariant::InFlightAfterFinish`]: no `completed` or `compensated` run has a step
//!    `running` or `compensating` (a completed child run keeps its step rows, none in flight).
//! 3. [`Invariant::Uncompensated`]: in a `compensated` run, every step that may have acted
//!    (its history shows it `completed`, or a forward attempt that timed out, was interrupted,
//!    or failed with an outcome other than `not_applied`) and that its published definition
//!    declares compensatable with a compensation has a line into `compensated`.
//! 4. [`Invariant::OverlappingAttempts`]: the attempts of a step do not overlap. Each claim
//!    raises the step's `attempt` (the fencing token) by one and each attempt's end (result,
//!    timeout, interruption, park, deferral, set-aside) writes one line with it: per step the
//!    ends come in order 1, 2, 3 …, none twice, none missing, and the step row's counter
//!    is the last end, or one more while an attempt is in flight.
//! 5. [`Invariant::Stuck`]: every unfinished run can move: it is marked for evaluation
//!    (`dirty`), or has a step due (`ready`/`compensation_ready` with a due time), in flight,
//!    or waiting with its stated wait, or is `pending` with a scheduled start, or is in
//!    `error` or `paused` with an open alert (or `paused` with its pause envelope). A run in
//!    `error` whose alerts were all acknowledged is reported: nothing moves it, and nothing
//!    says so any more.
//!
//! ```no_run
//! # async fn demo(engine: &sagaflow::Engine) -> Result<(), sagaflow::Error> {
//! let report = sagaflow::check::check(engine.connection()).await?;
//! if !report.is_clean() {
//!     eprintln!("{report}");
//! }
//! # Ok(()) }
//! ```

mod read;
mod report;
mod rules;
mod states;

use std::collections::HashMap;

use sea_orm::{AccessMode, DatabaseConnection, DbBackend, IsolationLevel, TransactionTrait};

pub use report::{CheckReport, HistoryLine, Invariant, Violation};

use crate::Result;

/// Runs read per page.
pub const PAGE: u32 = 500;

/// Checks every run of the database behind `db` and reports the violations found.
///
/// # Errors
/// [`Error::Db`](crate::Error::Db) when a read fails (for example on a schema that is not
/// this release's). Rows whose columns hold unknown states are reported as violations, not
/// errors.
pub async fn check(db: &DatabaseConnection) -> Result<CheckReport> {
    let backend = db.get_database_backend();
    // SQLite has one kind of transaction, a snapshot from its first read; sea-orm warns when
    // given settings for it.
    let (isolation, access) = match backend {
        DbBackend::Postgres => (
            Some(IsolationLevel::RepeatableRead),
            Some(AccessMode::ReadOnly),
        ),
        _ => (None, None),
    };
    let txn = db.begin_with_config(isolation, access).await?;
    let reader = read::Reader::new(&txn, backend);
    let tables = rules::Tables::new();
    let mut definitions = HashMap::new();
    let mut report = CheckReport::default();
    let mut after = None;
    loop {
        let page = reader.page(after, PAGE).await?;
        let Some(last) = page.runs.last() else { break };
        after = Some(last.id);
        for key in page.runs.iter().map(|r| &r.workflow_key) {
            if !definitions.contains_key(key) {
                let description = reader.definition(key).await?;
                definitions.insert(key.clone(), description);
            }
        }
        for run in &page.runs {
            let data = rules::RunData {
                run,
                steps: page.steps.get(&run.id).map_or(&[], Vec::as_slice),
                lines: page.lines.get(&run.id).map_or(&[], Vec::as_slice),
                open_alerts: page.open_alerts.get(&run.id).copied().unwrap_or(0),
                definition: definitions.get(&run.workflow_key).and_then(Option::as_ref),
            };
            rules::check_run(&tables, &data, &mut report.violations);
            report.runs_checked += 1;
        }
    }
    // Read-only: nothing to keep.
    txn.rollback().await?;
    Ok(report)
}
