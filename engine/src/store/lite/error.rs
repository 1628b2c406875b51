//! SQLite errors of the fast path, in the driver's error vocabulary: the rest of the engine
//! classifies them (unique violation, data refused, connection lost, read-only) exactly as it
//! does errors from the sqlx driver.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::sync::Arc;

use sea_orm::sqlx::error::{DatabaseError, ErrorKind};
use sea_orm::{DbErr, RuntimeErr};

/// An error SQLite returned: its extended result code and message.
#[derive(Debug, thiserror::Error)]
#[error("{message} (SQLite code {code})")]
pub(crate) struct LiteError {
    code: i32,
    message: String,
    code_text: String,
}

impl LiteError {
    fn new(code: i32, message: String) -> Self {
        Self {
            code,
            message,
            code_text: code.to_string(),
        }
    }
}

impl DatabaseError for LiteError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.code_text))
    }

    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        // The extended codes of SQLITE_CONSTRAINT (19).
        match self.code {
            1555 | 2067 => ErrorKind::UniqueViolation,
            787 => ErrorKind::ForeignKeyViolation,
            1299 => ErrorKind::NotNullViolation,
            275 => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// Where an error arose, to pick the matching [`DbErr`] variant.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    Conn,
    Exec,
    Query,
}

/// SQLITE_BUSY and its extended codes: another connection holds the lock.
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    const SQLITE_BUSY: i32 = 5;
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code & 0xff == SQLITE_BUSY)
}

/// A rusqlite error as the [`DbErr`] the rest of the engine reads.
pub(super) fn db_err(phase: Phase, e: rusqlite::Error) -> DbErr {
    let runtime = match e {
        rusqlite::Error::SqliteFailure(f, message) => {
            let message = message.unwrap_or_else(|| f.to_string());
            RuntimeErr::SqlxError(Arc::new(sea_orm::sqlx::Error::Database(Box::new(
                LiteError::new(f.extended_code, message),
            ))))
        }
        other => RuntimeErr::Internal(other.to_string()),
    };
    match phase {
        Phase::Conn => DbErr::Conn(runtime),
        Phase::Exec => DbErr::Exec(runtime),
        Phase::Query => DbErr::Query(runtime),
    }
}
