//! The one error type of the example commands: what failed, with its cause.

use std::path::PathBuf;

/// Why an example command (`sagaflow-demo`, `sagaflow-travel`) could not do its job.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine refused or failed an operation; `doing` says which.
    #[error("{doing}: {source}")]
    Engine {
        /// What the command was doing (`cannot start the engine on the demo database`, …).
        doing: String,
        /// The engine's error.
        #[source]
        source: sagaflow::Error,
    },
    /// A file or directory of the command's own database could not be prepared.
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// `create`, `delete`, …
        action: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP API of `--serve` could not listen or stopped on an I/O error.
    #[error("cannot serve the HTTP API: {0}")]
    Serve(#[from] std::io::Error),
    /// The HTTP API's token was refused (too short).
    #[error("cannot serve the HTTP API: {0}")]
    Token(String),
    /// The engine stopped publishing run events while runs were being watched.
    #[error("the engine stopped publishing events")]
    EventsClosed,
}

impl Error {
    /// An engine error, with what the command was doing.
    pub fn engine(doing: impl Into<String>, source: sagaflow::Error) -> Self {
        Self::Engine {
            doing: doing.into(),
            source,
        }
    }
}

impl From<sagaflow::Error> for Error {
    fn from(source: sagaflow::Error) -> Self {
        Self::engine("the engine failed", source)
    }
}
