//! The database an example command (`sagaflow-demo`, `sagaflow-travel`) runs on: its own
//! fresh SQLite file, or the URL it was given.

use std::path::PathBuf;

use crate::Error;

/// Where the engine stores its runs.
#[derive(Debug)]
pub struct Database {
    /// The URL handed to the engine.
    pub url: String,
    /// How the header describes it (password hidden).
    pub label: String,
    /// Whether this is the command's own throwaway file.
    pub own: bool,
}

/// Uses the URL given, or deletes and recreates the command's own SQLite file,
/// `./.sagaflow/<command>.db`.
///
/// # Errors
/// When the directory cannot be created or an old file cannot be deleted.
pub fn prepare(arg: Option<&str>, command: &str) -> Result<Database, Error> {
    if let Some(url) = arg.filter(|u| !u.trim().is_empty()) {
        let kind = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            "PostgreSQL"
        } else if url.starts_with("sqlite:") {
            "SQLite"
        } else {
            "database"
        };
        return Ok(Database {
            url: url.to_owned(),
            label: format!(
                "{kind} {} (used as is; only this command's runs are counted)",
                sagaflow::redact_url(url)
            ),
            own: false,
        });
    }
    let dir = std::env::current_dir()
        .map_err(|source| Error::File {
            action: "find the current directory",
            path: PathBuf::from("."),
            source,
        })?
        .join(".sagaflow");
    std::fs::create_dir_all(&dir).map_err(|source| Error::File {
        action: "create",
        path: dir.clone(),
        source,
    })?;
    let file: PathBuf = dir.join(format!("{command}.db"));
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = file.clone().into_os_string();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::File {
                    action: "delete the old database",
                    path: PathBuf::from(p),
                    source,
                });
            }
        }
    }
    Ok(Database {
        url: format!("sqlite://{}?mode=rwc", file.display()),
        label: format!("SQLite ./.sagaflow/{command}.db (fresh file)"),
        own: true,
    })
}
