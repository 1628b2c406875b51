//! Exit codes, and the one-line failure every command ends with when it cannot do its work.

use std::process::ExitCode;

use sagaflow::Error;

/// The command did what was asked.
pub(crate) const OK: u8 = 0;
/// It could not: the database is unreachable or failed, a row is damaged, output failed.
pub(crate) const FAILURE: u8 = 1;
/// The command line is wrong: an unknown or invalid argument, a missing `--reason`.
pub(crate) const USAGE: u8 = 2;
/// The run, step, alert or resource named does not exist (or the alert is not open).
pub(crate) const NOT_FOUND: u8 = 3;
/// The action does not apply to the run in its current state.
pub(crate) const REFUSED: u8 = 4;
/// The database's schema is not this release's: `sagaflow migrate` applies what it lacks.
pub(crate) const SCHEMA: u8 = 5;
/// `check` read the database and found runs that break the engine's invariants.
pub(crate) const VIOLATIONS: u8 = 6;

/// Why a command stopped: its exit code and one line for standard error.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl std::fmt::Display) -> Self {
        // One line, whatever the cause's text holds.
        let message = message
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Self { code, message }
    }

    pub(crate) fn failed(message: impl std::fmt::Display) -> Self {
        Self::new(FAILURE, message)
    }

    pub(crate) fn usage(message: impl std::fmt::Display) -> Self {
        Self::new(USAGE, message)
    }

    pub(crate) fn not_found(message: impl std::fmt::Display) -> Self {
        Self::new(NOT_FOUND, message)
    }

    pub(crate) fn refused(message: impl std::fmt::Display) -> Self {
        Self::new(REFUSED, message)
    }

    /// Prints `sagaflow: <message>` on standard error and gives the exit code.
    pub(crate) fn report(&self) -> ExitCode {
        eprintln!("sagaflow: {}", self.message);
        ExitCode::from(self.code)
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        match &e {
            Error::RunNotFound(_) | Error::KeyNotFound { .. } => Self::not_found(e),
            Error::InvalidInput { .. } | Error::InvalidEvent(_) | Error::PayloadTooLarge { .. } => {
                Self::usage(e)
            }
            Error::ActionNotAllowed { .. } => Self::refused(e),
            Error::InvalidQuery(_) => Self::usage(e),
            Error::SchemaOutOfDate { unknown, .. } if unknown.is_empty() => Self::new(
                SCHEMA,
                format!(
                    "{e}; run `sagaflow migrate` to apply them (`sagaflow migrate --dry-run` \
                     shows their SQL)"
                ),
            ),
            Error::SchemaOutOfDate { .. } => Self::new(
                SCHEMA,
                format!("{e}; use the sagaflow command of that release"),
            ),
            _ => Self::failed(e),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a command returns.
pub(crate) type Outcome = Result<(), Failure>;
