//! The checker's reads: plain read-only SQL over the stored columns, one page of runs at a
//! time with their steps, history and open alerts.
//!
//! These statements live here rather than in the engine's store on purpose: a checker that
//! decoded rows through the code it checks would inherit that code's mistakes. States stay
//! text here and are judged by the rules; only ids, counters and times are typed.

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, QueryResult, Statement, Value};
use uuid::Uuid;

use super::report::HistoryLine;
use crate::{Result, WorkflowDescription};

/// A run's columns the checks read.
#[derive(Debug, Clone)]
pub(super) struct RunRec {
    pub(super) id: Uuid,
    pub(super) workflow_key: String,
    pub(super) state: String,
    pub(super) error: Option<String>,
    pub(super) dirty: bool,
    pub(super) start_at: Option<i64>,
    pub(super) parent_step: Option<i64>,
}

/// A step row's columns the checks read.
#[derive(Debug, Clone)]
pub(super) struct StepRec {
    pub(super) name: String,
    pub(super) state: String,
    pub(super) available_at: Option<i64>,
    pub(super) attempt: i32,
    pub(super) wait: Option<String>,
}

/// One page of runs with what belongs to them.
#[derive(Debug, Default)]
pub(super) struct Page {
    pub(super) runs: Vec<RunRec>,
    pub(super) steps: HashMap<Uuid, Vec<StepRec>>,
    pub(super) lines: HashMap<Uuid, Vec<HistoryLine>>,
    pub(super) open_alerts: HashMap<Uuid, usize>,
}

/// Reads pages inside the caller's transaction.
#[derive(Debug)]
pub(super) struct Reader<'t> {
    txn: &'t DatabaseTransaction,
    backend: DbBackend,
}

impl<'t> Reader<'t> {
    pub(super) fn new(txn: &'t DatabaseTransaction, backend: DbBackend) -> Self {
        Self { txn, backend }
    }

    /// A statement with `$n` placeholders, which SQLite reads as `?n`.
    fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
        let sql = match self.backend {
            DbBackend::Postgres => sql.to_owned(),
            _ => sql.replace('$', "?"),
        };
        Statement::from_sql_and_values(self.backend, sql, values)
    }

    async fn all(&self, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>> {
        Ok(self.txn.query_all_raw(self.stmt(sql, values)).await?)
    }

    /// Up to `limit` runs after `after` in id order, with their steps, history and the
    /// number of their open alerts.
    pub(super) async fn page(&self, after: Option<Uuid>, limit: u32) -> Result<Page> {
        const COLS: &str =
            "id, workflow_key, state, error, dirty, start_at, parent_step FROM sagaflow_runs_all";
        let rows = match after {
            Some(id) => {
                let sql = format!("SELECT {COLS} WHERE id > $1 ORDER BY id LIMIT $2");
                self.all(&sql, vec![id.into(), i64::from(limit).into()])
                    .await?
            }
            None => {
                let sql = format!("SELECT {COLS} ORDER BY id LIMIT $1");
                self.all(&sql, vec![i64::from(limit).into()]).await?
            }
        };
        let mut page = Page::default();
        for r in &rows {
            page.runs.push(RunRec {
                id: r.try_get("", "id")?,
                workflow_key: r.try_get("", "workflow_key")?,
                state: r.try_get("", "state")?,
                error: r.try_get("", "error")?,
                dirty: r.try_get("", "dirty")?,
                start_at: r.try_get("", "start_at")?,
                parent_step: r.try_get("", "parent_step")?,
            });
        }
        let (Some(first), Some(last)) = (page.runs.first(), page.runs.last()) else {
            return Ok(page);
        };
        // The page's runs are the ones in [first, last]: one range read per table, along
        // the (run_id, …) indexes.
        let range = || vec![Value::from(first.id), Value::from(last.id)];
        let sql = "SELECT run_id, name, state, available_at, attempt, wait FROM sagaflow_steps \
                   WHERE run_id >= $1 AND run_id <= $2 ORDER BY run_id, id";
        for r in &self.all(sql, range()).await? {
            let run: Uuid = r.try_get("", "run_id")?;
            page.steps.entry(run).or_default().push(StepRec {
                name: r.try_get("", "name")?,
                state: r.try_get("", "state")?,
                available_at: r.try_get("", "available_at")?,
                attempt: r.try_get("", "attempt")?,
                wait: r.try_get("", "wait")?,
            });
        }
        let sql = "SELECT run_id, id, step, event, from_state, to_state, attempt, actor, detail, at, \
                   then_states FROM sagaflow_history WHERE run_id >= $1 AND run_id <= $2 \
                   ORDER BY run_id, id";
        for r in &self.all(sql, range()).await? {
            let run: Uuid = r.try_get("", "run_id")?;
            let at: i64 = r.try_get("", "at")?;
            let detail: Option<String> = r.try_get("", "detail")?;
            let line = HistoryLine {
                id: r.try_get("", "id")?,
                step: r.try_get("", "step")?,
                event: r.try_get("", "event")?,
                from: r.try_get("", "from_state")?,
                to: r.try_get("", "to_state")?,
                attempt: r.try_get("", "attempt")?,
                actor: r.try_get("", "actor")?,
                detail: detail
                    .map(|d| serde_json::from_str(&d).unwrap_or(serde_json::Value::String(d))),
                at: chrono::DateTime::from_timestamp_millis(at).unwrap_or_default(),
            };
            let then: Option<String> = r.try_get("", "then_states")?;
            let lines = page.lines.entry(run).or_default();
            lines.extend(unfold(line, then.as_deref()));
        }
        let sql = "SELECT run_id FROM sagaflow_alerts \
                   WHERE run_id >= $1 AND run_id <= $2 AND resolved_at IS NULL";
        for r in &self.all(sql, range()).await? {
            let run: Uuid = r.try_get("", "run_id")?;
            *page.open_alerts.entry(run).or_default() += 1;
        }
        Ok(page)
    }

    /// The published description of `name@version` (`key`): `None` when none was published
    /// or it does not decode.
    pub(super) async fn definition(&self, key: &str) -> Result<Option<WorkflowDescription>> {
        let sql = "SELECT description FROM sagaflow_definitions WHERE workflow_key = $1";
        let rows = self.all(sql, vec![key.to_owned().into()]).await?;
        let Some(r) = rows.first() else {
            return Ok(None);
        };
        let text: String = r.try_get("", "description")?;
        Ok(serde_json::from_str(&text).ok())
    }
}

/// A stored history row as the lines it records: its own, then the `state` changes folded
/// into it (`then_states`: a JSON array of `[step, from, to]`, `step` null for the run), with
/// its id, actor and time. Read here, not through the engine's decoding (see the module's
/// docs). A column that does not decode becomes a line whose state is that text, which no
/// path accepts: the run is reported, and the other runs are still checked.
fn unfold(line: HistoryLine, then: Option<&str>) -> Vec<HistoryLine> {
    type Folded = Vec<(Option<String>, Option<String>, Option<String>)>;
    let Some(text) = then else {
        return vec![line];
    };
    let folded: Folded = serde_json::from_str(text).unwrap_or_else(|_| {
        vec![(
            line.step.clone(),
            None,
            Some(format!("then_states: {text}")),
        )]
    });
    let mut out = Vec::with_capacity(1 + folded.len());
    for (step, from, to) in folded {
        out.push(HistoryLine {
            id: line.id,
            step,
            event: "state".to_owned(),
            from,
            to,
            attempt: None,
            actor: line.actor.clone(),
            detail: None,
            at: line.at,
        });
    }
    out.insert(0, line);
    out
}
