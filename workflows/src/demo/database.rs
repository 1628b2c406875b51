//! The database the demo runs on: its own fresh SQLite file, or the URL it was given.

use std::path::PathBuf;

use super::AnyResult;

/// Where the engine stores its runs.
#[derive(Debug)]
pub(crate) struct Database {
    /// The URL handed to the engine.
    pub(crate) url: String,
    /// How the header describes it (password hidden).
    pub(crate) label: String,
    /// Whether this is the demo's own throwaway file.
    pub(crate) own: bool,
}

/// Uses the URL given, or deletes and recreates the demo's own SQLite file.
pub(crate) fn prepare_database(arg: Option<&str>) -> AnyResult<Database> {
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
                "{kind} {} (used as is; only this demo's runs are counted)",
                sagaflow::redact_url(url)
            ),
            own: false,
        });
    }
    let dir = std::env::current_dir()?.join(".sagaflow");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let file: PathBuf = dir.join("sagaflow-demo.db");
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = file.clone().into_os_string();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "cannot delete the old demo database {}: {e}",
                    PathBuf::from(p).display()
                )
                .into());
            }
        }
    }
    Ok(Database {
        url: format!("sqlite://{}?mode=rwc", file.display()),
        label: "SQLite ./.sagaflow/sagaflow-demo.db (fresh file)".to_owned(),
        own: true,
    })
}
