//! The identity of an opened SQLite file, so that a file deleted or replaced under a
//! running engine is noticed ([`Store::check_file`]) instead of written to in vain.

use super::Store;
use crate::{Error, Result};

/// The identity of an SQLite file, taken at open: a file deleted or replaced under a running
/// engine no longer matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileIdentity {
    path: std::path::PathBuf,
    id: (u64, u64),
}

impl FileIdentity {
    /// `None` for an in-memory database (no file). The path is made absolute, so a process
    /// that changes its working directory later is not mistaken for one that lost its file.
    pub(super) fn of(path: &std::path::Path) -> Option<Self> {
        let path = std::fs::canonicalize(path).ok()?;
        file_id(&path).ok().map(|id| Self { path, id })
    }

    /// `Err` with the reason when the file at the path is not the file opened.
    pub(super) fn check(&self) -> std::result::Result<(), String> {
        match file_id(&self.path) {
            Ok(id) if id == self.id => Ok(()),
            Ok(_) => Err(format!(
                "the SQLite file {} was replaced by another file; the engine's connection \
                 still writes to the old one, which nobody will read",
                self.path.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "the SQLite file {} was deleted; the engine's connection still writes to the \
                 unlinked file, which is lost when the engine stops",
                self.path.display()
            )),
            Err(e) => Err(format!(
                "the SQLite file {} cannot be examined: {e}",
                self.path.display()
            )),
        }
    }
}

#[cfg(unix)]
fn file_id(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn file_id(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    // Without inode numbers, a deletion is still seen; a replacement is not.
    std::fs::metadata(path).map(|_| (0, 0))
}

impl Store {
    /// The database, as a URL without password.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether the store watches a file ([`Store::check_file`] can fail): an SQLite database
    /// on disk.
    pub fn has_file(&self) -> bool {
        self.file.is_some()
    }

    /// Checks that the SQLite file the store opened is still the file at its path.
    ///
    /// # Errors
    /// [`Error::DatabaseLost`] naming what happened; always `Ok` on PostgreSQL and for an
    /// in-memory SQLite database.
    pub fn check_file(&self) -> Result<()> {
        match &self.file {
            Some(f) => f.check().map_err(Error::DatabaseLost),
            None => Ok(()),
        }
    }

    /// `e`, unless the SQLite file was deleted or replaced meanwhile: then that is the cause
    /// to report, whatever the lost file answered (SQLite says "disk I/O error").
    pub fn lost_or(&self, e: Error) -> Error {
        self.check_file().err().unwrap_or(e)
    }
}
