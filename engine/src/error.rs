//! Engine errors: what can go wrong between the application, the engine and the database.
//!
//! Step *outcomes* (a remote service said no) are not engine errors; they are
//! [`StepError`](crate::StepError) envelopes stored with the step.

use std::sync::Arc;

use sea_orm::sqlx;
use sea_orm::{ConnAcquireErr, DbErr, RuntimeErr};
use uuid::Uuid;

/// A database driver's error, kept as it was raised: its message is the driver's, and its
/// [`source`](std::error::Error::source) is the driver's error itself, for code that must
/// look inside (`downcast_ref::<sagaflow::sea_orm::DbErr>()`). Most code reads it through
/// [`Error::sqlstate`], [`Error::sqlite_code`], [`Error::is_unique_violation`] and
/// [`Error::is_connection_lost`], which do not depend on the driver's types.
#[derive(Clone)]
pub struct DbError(Arc<DbErr>);

impl DbError {
    /// The driver's error.
    pub(crate) fn driver(&self) -> &DbErr {
        &self.0
    }
}

impl From<DbErr> for DbError {
    fn from(e: DbErr) -> Self {
        Self(Arc::new(e))
    }
}

impl std::fmt::Debug for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl From<DbErr> for Error {
    fn from(e: DbErr) -> Self {
        Self::Db(e.into())
    }
}

/// Errors raised by the engine's public API and background loops.
///
/// Database failures keep the driver's own error ([`Error::Db`], [`Error::Connect`]): match
/// on [`Error::sqlstate`] (PostgreSQL), [`Error::sqlite_code`] (SQLite's extended result
/// code), or the helpers [`Error::is_unique_violation`] and [`Error::is_connection_lost`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database returned an error or the connection was lost. The driver's error is kept
    /// as it was raised (see [`Error::sqlstate`]).
    #[error("database error: {0}")]
    Db(DbError),

    /// The database could not be reached at start: `target` names it without its password,
    /// `source` is the driver's cause (connection refused, name resolution, authentication,
    /// TLS, timeout).
    #[error("cannot connect to {target}: {source}")]
    Connect {
        /// The database, as a URL without password.
        target: String,
        /// The driver's error.
        #[source]
        source: DbError,
    },

    /// The database cannot be written (a read-only file or server, missing privileges): the
    /// engine refuses to start rather than failing in its loops later.
    #[error("database {target} is not writable: {source}")]
    ReadOnly {
        /// The database, as a URL without password.
        target: String,
        /// The driver's error for the probing write.
        #[source]
        source: DbError,
    },

    /// The engine lost its database for good (an SQLite file deleted or replaced under it):
    /// it stopped claiming work. See `Engine::health`.
    #[error("database lost: {0}")]
    DatabaseLost(String),

    /// No workflow of this name is registered with the engine.
    #[error("workflow `{0}` is not registered")]
    WorkflowNotFound(String),

    /// A run refers to a workflow version this engine does not have.
    #[error("workflow `{name}` version {version} is not registered (run {run_id})")]
    VersionNotFound {
        /// Workflow name.
        name: String,
        /// The version the run is pinned to.
        version: i32,
        /// The run.
        run_id: Uuid,
    },

    /// The submitted input does not deserialise into the workflow's input type.
    #[error("input for workflow `{workflow}` is invalid: {reason}")]
    InvalidInput {
        /// Workflow name.
        workflow: String,
        /// What is wrong (what the schema check or serde said).
        reason: String,
        /// Where, when the input's JSON Schema found it (a JSON Pointer into the input).
        field: Option<FieldError>,
    },

    /// A run input exceeds the configured limit. (An oversized step *output* is a terminal
    /// step failure with code `output_too_large`.)
    #[error("{what} is {size} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Which payload.
        what: String,
        /// Its serialized size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// A retained run already holds the business key (returned only when the start asked to
    /// reject duplicates; by default the existing run is returned instead).
    #[error("workflow `{workflow}` already has run {existing} ({state}) for business key `{key}`")]
    DuplicateKey {
        /// Workflow name.
        workflow: String,
        /// The business key.
        key: String,
        /// The id of the run holding the key.
        existing: Uuid,
        /// Its state when looked up.
        state: crate::RunState,
    },

    /// A start option is out of its range or malformed: a start time further ahead than the
    /// engine schedules, a priority outside the allowed range, or a W3C trace context that
    /// does not parse.
    #[error("start option `{option}` is invalid: {reason}")]
    InvalidStartOption {
        /// The option.
        option: StartOption,
        /// What is wrong.
        reason: String,
    },

    /// A query the engine cannot answer as asked (a list cursor it did not give out, a
    /// filter of the wrong form); the message says what is wrong.
    #[error("invalid query: {0}")]
    InvalidQuery(String),

    /// A workflow definition is invalid; the message names the offending step.
    #[error("invalid workflow definition `{workflow}`: {reason}")]
    InvalidDefinition {
        /// Workflow name.
        workflow: String,
        /// What is wrong, naming the step.
        reason: String,
    },

    /// No run with this id exists.
    #[error("run {0} not found")]
    RunNotFound(Uuid),

    /// An operator action does not apply to the run in its current state.
    #[error("cannot {action} run {run_id}: {reason}")]
    ActionNotAllowed {
        /// The action that was asked for.
        action: &'static str,
        /// The run.
        run_id: Uuid,
        /// Why not.
        reason: String,
    },

    /// A stored row could not be decoded; the row is left untouched and an alert raised.
    #[error("corrupt row in {table} ({id}): {reason}")]
    CorruptRow {
        /// Table name.
        table: &'static str,
        /// Row id.
        id: String,
        /// What could not be decoded.
        reason: String,
    },

    /// The leader lease was lost (expired or taken over): the write was not made.
    #[error("leader lease `{name}` term {term} is no longer held")]
    LeaseLost {
        /// Lease name.
        name: String,
        /// The term that was lost.
        term: i64,
    },

    /// The engine configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// No retained run of the workflow holds this business key.
    #[error("no run of workflow `{workflow}` has business key `{business_key}`")]
    KeyNotFound {
        /// The workflow.
        workflow: String,
        /// The key.
        business_key: String,
    },

    /// An event (or a callback's result) that cannot be sent: its name or payload says why.
    #[error("invalid event: {0}")]
    InvalidEvent(String),

    /// No step holds this callback token: it is forged, or spent (the step that issued it
    /// moved on).
    #[error("unknown or spent callback token")]
    UnknownCallback,

    /// Waiting for a run timed out.
    #[error("timed out waiting for run {0}")]
    WaitTimeout(Uuid),

    /// The engine has been shut down.
    #[error("the engine is shut down")]
    Shutdown,

    /// The database's schema is not this release's, and the engine was told not to migrate
    /// it (`StoreOptions::migrate` off): it lacks migrations of this release (`pending`), or
    /// a newer release migrated it (`unknown`).
    #[error(
        "the schema of {target} is not this release's: {}",
        schema_mismatch(pending, unknown)
    )]
    SchemaOutOfDate {
        /// The database, as a URL without password.
        target: String,
        /// Migrations of this release it lacks, oldest first.
        pending: Vec<String>,
        /// Migrations it has that this release does not know.
        unknown: Vec<String>,
    },

    /// A recurring schedule is invalid: its cron expression, its time zone, its input, or a
    /// workflow the engine does not know; the message says which.
    #[error("invalid schedule `{name}`: {reason}")]
    InvalidSchedule {
        /// Schedule name.
        name: String,
        /// What is wrong.
        reason: String,
    },

    /// No schedule with this name is stored.
    #[error("schedule `{0}` not found")]
    ScheduleNotFound(String),
}

/// Says what a [`Error::SchemaOutOfDate`] lacks or has in excess.
fn schema_mismatch(pending: &[String], unknown: &[String]) -> String {
    let mut parts = Vec::new();
    if !pending.is_empty() {
        parts.push(format!(
            "{} migration(s) pending ({})",
            pending.len(),
            pending.join(", ")
        ));
    }
    if !unknown.is_empty() {
        parts.push(format!(
            "migrated by a newer release ({} unknown here)",
            unknown.join(", ")
        ));
    }
    parts.join("; ")
}

/// A start option that can be refused, named as `StartOptions` sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOption {
    /// A start at an instant (`start_at`).
    StartAt,
    /// A start after a delay (`start_after`).
    StartAfter,
    /// The claim priority (`priority`).
    Priority,
    /// The W3C `traceparent` the run continues (`trace_parent`).
    TraceParent,
    /// The W3C `tracestate` kept with it (`trace_state`).
    TraceState,
}

impl std::fmt::Display for StartOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::StartAt => "start_at",
            Self::StartAfter => "start_after",
            Self::Priority => "priority",
            Self::TraceParent => "trace_parent",
            Self::TraceState => "trace_state",
        })
    }
}

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The driver's database error, when this error came from the database.
    pub(crate) fn db_err(&self) -> Option<&DbErr> {
        match self {
            Self::Db(e) | Self::Connect { source: e, .. } | Self::ReadOnly { source: e, .. } => {
                Some(e.driver())
            }
            _ => None,
        }
    }

    fn sqlx(&self) -> Option<&sqlx::Error> {
        match self.db_err()? {
            DbErr::Conn(RuntimeErr::SqlxError(e))
            | DbErr::Exec(RuntimeErr::SqlxError(e))
            | DbErr::Query(RuntimeErr::SqlxError(e)) => Some(e),
            _ => None,
        }
    }

    fn database_code(&self) -> Option<String> {
        match self.sqlx()? {
            sqlx::Error::Database(d) => d.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    /// The SQLSTATE of a PostgreSQL error (e.g. `23505` for a unique violation).
    pub fn sqlstate(&self) -> Option<String> {
        match self.sqlx()? {
            sqlx::Error::Database(d)
                if d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some() =>
            {
                d.code().map(|c| c.into_owned())
            }
            _ => None,
        }
    }

    /// The extended result code of an SQLite error (e.g. `2067` for a unique violation,
    /// `8` for a read-only database).
    pub fn sqlite_code(&self) -> Option<i32> {
        match self.sqlx()? {
            // The driver's SQLite errors and the fast path's both give the extended code as
            // their code; PostgreSQL's is a SQLSTATE.
            sqlx::Error::Database(d)
                if d.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_none() =>
            {
                d.code().and_then(|c| c.parse().ok())
            }
            _ => None,
        }
    }

    /// Whether a unique constraint refused the write.
    pub fn is_unique_violation(&self) -> bool {
        match self.sqlx() {
            Some(sqlx::Error::Database(d)) => d.is_unique_violation(),
            _ => false,
        }
    }

    /// Whether the connection to the database failed or was lost (as opposed to a statement
    /// the database refused): worth retrying once the database is back.
    pub fn is_connection_lost(&self) -> bool {
        if matches!(self, Self::Connect { .. } | Self::DatabaseLost(_)) {
            return true;
        }
        if let Some(DbErr::ConnectionAcquire(
            ConnAcquireErr::Timeout | ConnAcquireErr::ConnectionClosed,
        )) = self.db_err()
        {
            return true;
        }
        match self.sqlx() {
            Some(
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Protocol(_),
            ) => true,
            Some(sqlx::Error::Database(_)) => {
                let code = self.database_code().unwrap_or_default();
                // PostgreSQL: class 08 (connection exception), 57P01-57P03 (the server is
                // shutting down or restarting). SQLite: SQLITE_IOERR and its extended codes
                // (the low byte is 10), SQLITE_CANTOPEN (14), SQLITE_READONLY_DBMOVED (1032).
                code.starts_with("08")
                    || matches!(code.as_str(), "57P01" | "57P02" | "57P03")
                    || code
                        .parse::<i32>()
                        .is_ok_and(|c| c & 0xff == 10 || c & 0xff == 14 || c == 1032)
            }
            _ => false,
        }
    }

    /// Whether the database refused the data of a write — a constraint, a trigger raising
    /// an error, a value of the wrong type — rather than failing as a whole (a timeout, a
    /// lost connection): the same write without the offending row would succeed.
    pub fn is_data_refused(&self) -> bool {
        if !matches!(self.sqlx(), Some(sqlx::Error::Database(_))) {
            return false;
        }
        let code = self.database_code().unwrap_or_default();
        // PostgreSQL: class 22 (data exception), class 23 (integrity constraint violation),
        // P0001 (raised by a PL/pgSQL trigger). SQLite: SQLITE_CONSTRAINT and its extended
        // codes (low byte 19, including RAISE(ABORT) in a trigger), SQLITE_MISMATCH (20).
        code.starts_with("22")
            || code.starts_with("23")
            || code == "P0001"
            || code
                .parse::<i32>()
                .is_ok_and(|c| c & 0xff == 19 || c & 0xff == 20)
    }

    pub(crate) fn corrupt(table: &'static str, id: impl ToString, reason: impl ToString) -> Self {
        Self::CorruptRow {
            table,
            id: id.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// What is wrong with an input, and where: the first place, found in document order, that
/// does not match the input's JSON Schema.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FieldError {
    /// A JSON Pointer (RFC 6901) to the offending value in the input: `""` for the input as a
    /// whole, `/lines/0/sku` for a field of the first line.
    pub pointer: String,
    /// What is wrong there.
    pub message: String,
}

impl FieldError {
    /// What is wrong at `pointer` (a JSON Pointer into the document concerned).
    pub fn new(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            pointer: pointer.into(),
            message: message.into(),
        }
    }
}
