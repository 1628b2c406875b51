//! Listing runs for a console: filters, two orders, and keyset pages with an opaque cursor.
//!
//! Every page is one indexed range read, however deep it is: no `OFFSET`, no count. "Newest
//! first" walks `(created_at, id)` downwards, through the index that matches the filter
//! (migration m0007 keeps one per filter: none, workflow, state, business key). "Most failed
//! attempts first" walks the small partial index of the runs that had a failed attempt, then
//! goes on with the others, newest first; the cursor says which of the two parts it is in.

use sea_orm::Value;
use serde::Serialize;
use uuid::Uuid;

use super::Store;
use super::row::{Exec, Row};
use crate::model::{Timestamp, timestamp};
use crate::{Error, Result, RunState};

/// Rows per page when the query does not say.
pub const RUN_PAGE_DEFAULT: u32 = 50;
/// Most rows per page.
pub const RUN_PAGE_MAX: u32 = 500;

/// The order of a run list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RunOrder {
    /// Newest first.
    #[default]
    Created,
    /// Most failed attempts first (failures, timeouts and interruptions of the run's steps,
    /// forward and compensation), then newest first: how operators triage.
    Attempts,
}

impl std::str::FromStr for RunOrder {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "created" => Ok(Self::Created),
            "attempts" => Ok(Self::Attempts),
            other => Err(Error::InvalidQuery(format!(
                "no order `{other}`; the orders are created, attempts"
            ))),
        }
    }
}

/// Which runs to list, in which order, from where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunQuery {
    /// Only runs of this workflow (any version).
    pub workflow: Option<String>,
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only runs in one of these states (with [`RunQuery::state`] too, in any of them all).
    pub states: Vec<RunState>,
    /// Only runs started with this business key.
    pub business_key: Option<String>,
    /// Only runs created at or after this instant (epoch milliseconds, database clock).
    pub created_after: Option<i64>,
    /// Only runs created before this instant (epoch milliseconds, database clock).
    pub created_before: Option<i64>,
    /// The order.
    pub order: RunOrder,
    /// Rows per page: 0 means [`RUN_PAGE_DEFAULT`]; more than [`RUN_PAGE_MAX`] is cut to it.
    pub limit: u32,
    /// Where to go on from: a previous page's [`RunPage::next`], with the same order.
    pub cursor: Option<String>,
}

impl RunQuery {
    /// Every run, newest first, one default page.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only runs of `workflow`.
    #[must_use]
    pub fn workflow(mut self, workflow: impl Into<String>) -> Self {
        self.workflow = Some(workflow.into());
        self
    }

    /// Only runs in `state`.
    #[must_use]
    pub fn state(mut self, state: RunState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only runs in one of `states` (added to those already asked for).
    #[must_use]
    pub fn states(mut self, states: impl IntoIterator<Item = RunState>) -> Self {
        self.states.extend(states);
        self
    }

    /// Only runs started with `key`.
    #[must_use]
    pub fn business_key(mut self, key: impl Into<String>) -> Self {
        self.business_key = Some(key.into());
        self
    }

    /// Only runs created in `[after, before)` (epoch milliseconds; either may be absent).
    #[must_use]
    pub fn created(mut self, after: Option<i64>, before: Option<i64>) -> Self {
        self.created_after = after;
        self.created_before = before;
        self
    }

    /// The order.
    #[must_use]
    pub fn order(mut self, order: RunOrder) -> Self {
        self.order = order;
        self
    }

    /// Rows per page.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Goes on after a previous page.
    #[must_use]
    pub fn after(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    fn page_size(&self) -> u32 {
        match self.limit {
            0 => RUN_PAGE_DEFAULT,
            n => n.min(RUN_PAGE_MAX),
        }
    }
}

/// One run in a list: what a table row shows, without input and output.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunSummary {
    /// Run id.
    pub id: Uuid,
    /// Workflow name.
    pub workflow: String,
    /// The version the run is pinned to.
    pub version: i32,
    /// Business key, if any.
    pub business_key: Option<String>,
    /// State.
    pub state: RunState,
    /// Attempts of its steps that ended without success (failures, timeouts, interruptions).
    pub failed_attempts: i64,
    /// When it was accepted.
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub created_at: Timestamp,
    /// When it last changed.
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    pub updated_at: Timestamp,
    /// When it finished.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<chrono::DateTime<chrono::Utc>>))]
    pub finished_at: Option<Timestamp>,
    /// The error envelope of the failure that stopped or unwound it.
    pub error: Option<serde_json::Value>,
}

/// One page of a run list.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RunPage {
    /// The runs, in the query's order.
    pub runs: Vec<RunSummary>,
    /// Rows of this page that could not be decoded, each as its error: listed apart so that
    /// one damaged row never hides the others.
    pub damaged: Vec<Error>,
    /// The cursor of the next page; `None` on the last one.
    pub next: Option<String>,
}

/// Where a page starts. Cursors are text of our own making: `c.<created>.<id>` (newest
/// first), `a.<failed>.<created>.<id>` (most failed attempts first, among the runs that had
/// one) and `z` or `z.<created>.<id>` (most failed attempts first, among the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cursor {
    Created(i64, Uuid),
    Failed(i64, i64, Uuid),
    Rest(Option<(i64, Uuid)>),
}

impl Cursor {
    fn parse(text: &str, order: RunOrder) -> Result<Self> {
        let bad = || {
            Error::InvalidQuery(
                "the cursor is not one this list gave out (cursors belong to their order)".into(),
            )
        };
        let parts: Vec<&str> = text.split('.').collect();
        let num = |s: &str| s.parse::<i64>().map_err(|_| bad());
        let id = |s: &str| Uuid::try_parse(s).map_err(|_| bad());
        let cursor = match parts.as_slice() {
            ["c", created, run] => Self::Created(num(created)?, id(run)?),
            ["a", failed, created, run] => Self::Failed(num(failed)?, num(created)?, id(run)?),
            ["z"] => Self::Rest(None),
            ["z", created, run] => Self::Rest(Some((num(created)?, id(run)?))),
            _ => return Err(bad()),
        };
        let fits = match cursor {
            Self::Created(..) => order == RunOrder::Created,
            Self::Failed(..) | Self::Rest(_) => order == RunOrder::Attempts,
        };
        if fits { Ok(cursor) } else { Err(bad()) }
    }

    fn text(self) -> String {
        match self {
            Self::Created(c, id) => format!("c.{c}.{}", id.simple()),
            Self::Failed(f, c, id) => format!("a.{f}.{c}.{}", id.simple()),
            Self::Rest(None) => "z".into(),
            Self::Rest(Some((c, id))) => format!("z.{c}.{}", id.simple()),
        }
    }
}

/// The key of a listed row.
struct Key {
    failed: i64,
    created: i64,
    id: Uuid,
}

const LIST_COLS: &str = "id, workflow, version, business_key, state, failed_attempts, error, \
                         created_at, updated_at, finished_at";

impl Store {
    /// One page of runs (see the module documentation).
    ///
    /// # Errors
    /// [`Error::InvalidQuery`] for a cursor this list did not give out (or one of another
    /// order); [`Error::Db`].
    pub async fn run_list(&self, query: &RunQuery) -> Result<RunPage> {
        let size = query.page_size() as usize;
        let cursor = query
            .cursor
            .as_deref()
            .map(|c| Cursor::parse(c, query.order))
            .transpose()?;
        let mut page = RunPage::default();
        match query.order {
            RunOrder::Created => {
                let after = match cursor {
                    Some(Cursor::Created(c, id)) => Some((c, id)),
                    _ => None,
                };
                let tail = self
                    .list_part(query, Part::All, after, size, &mut page)
                    .await?;
                page.next = tail.next().map(|k| Cursor::Created(k.created, k.id).text());
            }
            RunOrder::Attempts => {
                if let Some(Cursor::Rest(after)) = cursor {
                    let tail = self
                        .list_part(query, Part::Rest, after, size, &mut page)
                        .await?;
                    page.next = tail
                        .next()
                        .map(|k| Cursor::Rest(Some((k.created, k.id))).text());
                    return Ok(page);
                }
                let after = match cursor {
                    Some(Cursor::Failed(f, c, id)) => Some((f, c, id)),
                    _ => None,
                };
                let part = Part::Failed(after);
                let tail = self.list_part(query, part, None, size, &mut page).await?;
                if let Some(k) = tail.next() {
                    page.next = Some(Cursor::Failed(k.failed, k.created, k.id).text());
                    return Ok(page);
                }
                // The failed runs are done: fill the page with the others, newest first. A
                // page that is full just now still looks one row ahead, so that the last
                // page never links to an empty one.
                let room = size - page.runs.len() - page.damaged.len();
                let rest = self
                    .list_part(query, Part::Rest, None, room, &mut page)
                    .await?;
                page.next = match (rest.more, rest.last) {
                    (false, _) => None,
                    (true, None) => Some(Cursor::Rest(None).text()),
                    (true, Some(k)) => Some(Cursor::Rest(Some((k.created, k.id))).text()),
                };
            }
        }
        Ok(page)
    }

    /// Reads up to `size` rows of one part into `page` (one more is read to know whether a
    /// next page exists).
    async fn list_part(
        &self,
        query: &RunQuery,
        part: Part,
        after: Option<(i64, Uuid)>,
        size: usize,
        page: &mut RunPage,
    ) -> Result<Tail> {
        let mut conds: Vec<String> = Vec::new();
        let mut values: Vec<Value> = Vec::new();
        let bind = |values: &mut Vec<Value>, v: Value| {
            values.push(v);
            format!("${}", values.len())
        };
        if let Some(w) = &query.workflow {
            let p = bind(&mut values, w.clone().into());
            conds.push(format!("workflow = {p}"));
        }
        let mut states: Vec<RunState> = query.state.into_iter().collect();
        for s in &query.states {
            if !states.contains(s) {
                states.push(*s);
            }
        }
        match states.as_slice() {
            [] => {}
            [state] => {
                let p = bind(&mut values, state.as_str().into());
                conds.push(format!("state = {p}"));
            }
            several => {
                let ps: Vec<String> = several
                    .iter()
                    .map(|s| bind(&mut values, s.as_str().into()))
                    .collect();
                conds.push(format!("state IN ({})", ps.join(", ")));
            }
        }
        if let Some(k) = &query.business_key {
            let p = bind(&mut values, k.clone().into());
            conds.push(format!("business_key = {p}"));
        }
        if let Some(t) = query.created_after {
            let p = bind(&mut values, t.into());
            conds.push(format!("created_at >= {p}"));
        }
        if let Some(t) = query.created_before {
            let p = bind(&mut values, t.into());
            conds.push(format!("created_at < {p}"));
        }
        let order = match part {
            Part::All | Part::Rest => "created_at DESC, id DESC",
            Part::Failed(_) => "failed_attempts DESC, created_at DESC, id DESC",
        };
        match part {
            Part::All => {}
            Part::Rest => conds.push("failed_attempts = 0".into()),
            Part::Failed(_) => conds.push("failed_attempts > 0".into()),
        }
        if let Some((created, id)) = after {
            let (c, i) = (
                bind(&mut values, created.into()),
                bind(&mut values, id.into()),
            );
            conds.push(format!("(created_at, id) < ({c}, {i})"));
        }
        if let Part::Failed(Some((failed, created, id))) = part {
            let (f, c, i) = (
                bind(&mut values, failed.into()),
                bind(&mut values, created.into()),
                bind(&mut values, id.into()),
            );
            conds.push(format!(
                "(failed_attempts, created_at, id) < ({f}, {c}, {i})"
            ));
        }
        let filter = if conds.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", conds.join(" AND "))
        };
        let limit = bind(
            &mut values,
            i64::try_from(size + 1).unwrap_or(i64::MAX).into(),
        );
        let sql = format!(
            "SELECT {LIST_COLS} FROM sagaflow_runs_all{filter} ORDER BY {order} LIMIT {limit}"
        );
        let rows = self.exec.query_all(self.stmt(&sql, values)).await?;
        let more = rows.len() > size;
        let mut last = None;
        for r in rows.iter().take(size) {
            let key = Key {
                failed: r.try_get::<i32>("", "failed_attempts")?.into(),
                created: r.try_get("", "created_at")?,
                id: r.try_get("", "id")?,
            };
            match summary(r, &key) {
                Ok(s) => page.runs.push(s),
                Err(e) => page.damaged.push(e),
            }
            last = Some(key);
        }
        Ok(Tail { more, last })
    }
}

/// What a part's read left behind.
struct Tail {
    /// Rows remain after the page.
    more: bool,
    /// The key of the last row taken.
    last: Option<Key>,
}

impl Tail {
    /// The key to go on from, when rows remain.
    fn next(self) -> Option<Key> {
        if self.more { self.last } else { None }
    }
}

/// The part of the runs a statement reads.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// Every run matching the filters, newest first.
    All,
    /// Runs with a failed attempt, most first, after the key.
    Failed(Option<(i64, i64, Uuid)>),
    /// Runs without one, newest first.
    Rest,
}

fn summary(r: &Row, key: &Key) -> Result<RunSummary> {
    const T: &str = "sagaflow_runs";
    let state: String = r.try_get("", "state")?;
    let error: Option<String> = r.try_get("", "error")?;
    let error = error
        .map(|e| {
            serde_json::from_str(&e).map_err(|err| {
                Error::corrupt(T, key.id, format!("column `error` is not JSON: {err}"))
            })
        })
        .transpose()?;
    Ok(RunSummary {
        id: key.id,
        workflow: r.try_get("", "workflow")?,
        version: r.try_get("", "version")?,
        business_key: r.try_get("", "business_key")?,
        state: super::rows::state_of(T, key.id, &state)?,
        failed_attempts: key.failed,
        created_at: timestamp(key.created),
        updated_at: timestamp(r.try_get("", "updated_at")?),
        finished_at: r.try_get::<Option<i64>>("", "finished_at")?.map(timestamp),
        error,
    })
}
