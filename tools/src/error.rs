//! The error of the benchmark and chaos commands: what stopped a run before it could measure
//! or check anything.

use std::path::PathBuf;

use sagaflow::sea_orm::DbErr;
use sagaflow_testkit::ClusterError;

/// Why a benchmark or chaos run could not be carried out.
///
/// A run that went through but found a broken invariant is not an error: it ends with a
/// failed [`InvariantReport`](crate::invariants::InvariantReport).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine or its store refused (opening the database, starting a run, waiting).
    #[error(transparent)]
    Engine(#[from] sagaflow::Error),
    /// Starting, configuring or restarting a PostgreSQL cluster failed, or a statement run on
    /// the server outside the engine (creating or dropping a run's database).
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A flag, or a combination of flags, cannot work.
    #[error("{0}")]
    Usage(String),
    /// A file, directory, socket or process could not be used.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A background task of the command panicked or was cancelled.
    #[error("{what}: {source}")]
    Task {
        /// The task.
        what: &'static str,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// Runs did not finish within the command's bound.
    #[error("{done}/{expected} runs completed in time")]
    TimedOut {
        /// Runs completed.
        done: usize,
        /// Runs expected.
        expected: usize,
    },
    /// A run ended in another state than the measurement needs.
    #[error("run {run} ended {state}")]
    UnexpectedEnd {
        /// The run.
        run: sagaflow::Uuid,
        /// Its final state.
        state: sagaflow::RunState,
    },
    /// A statement of the benchmark's own (the raw ceiling) failed.
    #[error("{what}: {source}")]
    Database {
        /// What the statement was for.
        what: String,
        /// The driver's error.
        #[source]
        source: DbErr,
    },
    /// A report could not be written or read as JSON.
    #[error("report {}: {source}", path.display())]
    Report {
        /// Its file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// An [`Error::Io`] saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    /// An [`Error::Database`] saying what the statement was for.
    pub fn db(what: impl Into<String>) -> impl FnOnce(DbErr) -> Self {
        let what = what.into();
        move |source| Self::Database { what, source }
    }

    /// An [`Error::Task`] naming the task.
    pub fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| Self::Task { what, source }
    }

    /// A failed statement run outside the engine (creating or dropping a run's database), as
    /// [`ClusterError::Sql`] for `sql` on the server of `url` (shown without its password).
    pub fn sql(sql: impl Into<String>, url: &str) -> impl FnOnce(DbErr) -> Self {
        let (sql, target) = (sql.into(), sagaflow::redact_url(url));
        move |source| {
            Self::Cluster(ClusterError::Sql {
                sql,
                target,
                source,
            })
        }
    }
}

/// The result of the commands' fallible steps.
pub type Result<T, E = Error> = std::result::Result<T, E>;
