//! Engine errors: what can go wrong between the application, the engine and the database.
//!
//! Step *outcomes* (a remote service said no) are not engine errors; they are
//! [`StepError`](crate::StepError) envelopes stored with the step.

use uuid::Uuid;

/// Errors raised by the engine's public API and background loops.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database returned an error or the connection was lost.
    #[error("database error: {0}")]
    Db(#[from] sea_orm::DbErr),

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
        /// What serde said.
        reason: String,
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

    /// Waiting for a run timed out.
    #[error("timed out waiting for run {0}")]
    WaitTimeout(Uuid),

    /// The engine has been shut down.
    #[error("the engine is shut down")]
    Shutdown,
}

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn corrupt(table: &'static str, id: impl ToString, reason: impl ToString) -> Self {
        Self::CorruptRow {
            table,
            id: id.to_string(),
            reason: reason.to_string(),
        }
    }
}
