//! The runs list's source: a page of run summaries for a query, with an opaque cursor to the
//! next page.
//!
//! Interim reading until `Engine::list_runs` is available: the newest retained runs, filtered
//! and ordered here, the cursor being an offset. Its types and call match that method's, so
//! that the page is written once.

use sagaflow_engine::{Error, Result, RunState, Timestamp};
use sea_orm::{ConnectionTrait, Statement};
use uuid::Uuid;

use crate::Engine;

/// What to list.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunQuery {
    pub(crate) workflow: Option<String>,
    pub(crate) state: Option<RunState>,
    pub(crate) business_key: Option<String>,
    pub(crate) order: RunOrder,
    pub(crate) limit: u32,
    pub(crate) cursor: Option<String>,
}

/// The order of a list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum RunOrder {
    /// Newest first.
    #[default]
    Created,
    /// Most failed attempts first, then newest.
    Attempts,
}

/// One page.
#[derive(Debug, Clone)]
pub(crate) struct RunPage {
    pub(crate) runs: Vec<RunSummary>,
    pub(crate) next: Option<String>,
}

/// One run in a list.
#[derive(Debug, Clone)]
pub(crate) struct RunSummary {
    pub(crate) id: Uuid,
    pub(crate) workflow: String,
    pub(crate) version: i32,
    pub(crate) business_key: Option<String>,
    pub(crate) state: RunState,
    pub(crate) failed_attempts: i64,
    pub(crate) created_at: Timestamp,
    pub(crate) updated_at: Timestamp,
    pub(crate) finished_at: Option<Timestamp>,
    pub(crate) error: Option<serde_json::Value>,
}

/// Newest runs read at most.
const SCAN: u32 = 1_000;

/// A page of runs for `q`.
pub(crate) async fn list_runs(engine: &Engine, q: &RunQuery) -> Result<RunPage> {
    let offset: usize = match &q.cursor {
        None => 0,
        Some(c) => c
            .parse()
            .map_err(|_| Error::Config(format!("not a cursor of this list: {c}")))?,
    };
    let limit = match q.limit {
        0 => 50,
        n => n.min(500),
    } as usize;
    let conn = engine.connection();
    let sql = format!("SELECT id FROM sagaflow_runs ORDER BY created_at DESC LIMIT {SCAN}");
    let rows = conn
        .query_all_raw(Statement::from_string(conn.get_database_backend(), sql))
        .await?;
    let mut runs = Vec::new();
    for row in rows {
        let id: Uuid = row.try_get("", "id")?;
        let Some(run) = engine.run(id).await? else {
            continue;
        };
        if q.workflow.as_ref().is_some_and(|w| *w != run.workflow)
            || q.state.is_some_and(|s| s != run.state)
            || q.business_key
                .as_ref()
                .is_some_and(|k| Some(k) != run.business_key.as_ref())
        {
            continue;
        }
        let failed_attempts = engine
            .steps(id)
            .await?
            .iter()
            .map(|s| i64::from(s.attempts.failures))
            .sum();
        runs.push(RunSummary {
            id: run.id,
            workflow: run.workflow,
            version: run.version,
            business_key: run.business_key,
            state: run.state,
            failed_attempts,
            created_at: run.created_at,
            updated_at: run.updated_at,
            finished_at: run.finished_at,
            error: run.error,
        });
    }
    if q.order == RunOrder::Attempts {
        runs.sort_by_key(|r| std::cmp::Reverse(r.failed_attempts));
    }
    let more = runs.len() > offset + limit;
    let runs: Vec<RunSummary> = runs.into_iter().skip(offset).take(limit).collect();
    Ok(RunPage {
        runs,
        next: more.then(|| (offset + limit).to_string()),
    })
}
