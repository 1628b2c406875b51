//! Which database, and how the commands open it: a client-only engine that changes no schema,
//! or (for `migrate`) a plain connection.

use std::path::Path;
use std::time::Duration;

use sagaflow::sea_orm::{ConnectOptions, Database, DatabaseConnection};
use sagaflow::{Engine, redact_url};

use crate::exit::Failure;

/// Environment variable holding the database URL.
pub(crate) const DATABASE_URL_ENV: &str = "SAGAFLOW_DATABASE_URL";
/// Environment variable holding the read replica the reading commands and `serve` read from.
pub(crate) const READ_REPLICA_ENV: &str = "SAGAFLOW_READ_REPLICA_URL";
/// Environment variable read for the database URL when [`DATABASE_URL_ENV`] is not set.
pub(crate) const DATABASE_URL_FALLBACK_ENV: &str = "DATABASE_URL";

/// How long a command waits to connect, and for a pooled connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The database argument: the flag (or `SAGAFLOW_DATABASE_URL`, which clap reads), else
/// `DATABASE_URL`; none is a usage error.
pub(crate) fn database_arg(flag: Option<&str>) -> Result<String, Failure> {
    let fallback = std::env::var(DATABASE_URL_FALLBACK_ENV).ok();
    match flag
        .filter(|f| !f.trim().is_empty())
        .map(str::to_owned)
        .or(fallback.filter(|f| !f.trim().is_empty()))
    {
        Some(url) => Ok(url),
        None => Err(Failure::usage(format!(
            "no database: give --database-url URL (or {DATABASE_URL_ENV}, or \
             {DATABASE_URL_FALLBACK_ENV})"
        ))),
    }
}

/// The URL to open: URLs as given; a plain path as an existing SQLite file (read and
/// written, never created).
pub(crate) fn database_url(arg: &str) -> Result<String, String> {
    let arg = arg.trim();
    if arg.is_empty() {
        return Err(format!("--database-url (or {DATABASE_URL_ENV}) is empty"));
    }
    if arg.starts_with("sqlite:") || arg.starts_with("postgres:") || arg.starts_with("postgresql:")
    {
        return Ok(arg.to_owned());
    }
    if arg.contains("://") {
        return Err(format!(
            "unsupported database URL `{}`: give an SQLite file's path, an sqlite: URL or a \
             postgres:// URL",
            redact_url(arg)
        ));
    }
    let path = Path::new(arg);
    if !path.is_file() {
        return Err(format!(
            "no SQLite database at {}: sagaflow opens the database of existing engines and \
             creates none",
            path.display()
        ));
    }
    Ok(format!("sqlite://{}?mode=rw", path.display()))
}

/// The checked URL of the database argument.
pub(crate) fn url(flag: Option<&str>) -> Result<String, Failure> {
    database_url(&database_arg(flag)?).map_err(Failure::usage)
}

/// A client-only engine over the database: it runs no step, registers as no instance,
/// publishes nothing, and applies no migration (a schema that is not this release's is
/// refused with [`crate::exit::SCHEMA`]). Given a read replica, its lists, counts and
/// overviews are read there.
pub(crate) async fn client(url: &str, read_replica: Option<&str>) -> Result<Engine, Failure> {
    let mut builder = Engine::builder()
        .with_database_url(url)
        .with_published_workflows()
        .with_schema_migrations(false)
        .with_connect_timeouts(CONNECT_TIMEOUT, CONNECT_TIMEOUT);
    if let Some(replica) = read_replica.filter(|r| !r.is_empty()) {
        builder = builder.with_read_replica(replica);
    }
    builder.start().await.map_err(Failure::from)
}

/// A plain connection, for the migrations.
pub(crate) async fn connection(url: &str) -> Result<DatabaseConnection, Failure> {
    let mut options = ConnectOptions::new(url.to_owned());
    options
        .sqlx_logging(false)
        .max_connections(1)
        .connect_timeout(CONNECT_TIMEOUT)
        .acquire_timeout(CONNECT_TIMEOUT);
    Database::connect(options)
        .await
        .map_err(|e| Failure::failed(format!("cannot connect to {}: {e}", redact_url(url))))
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn urls_are_used_as_given_and_a_path_must_be_an_existing_file() {
        assert_eq!(
            database_url("postgres://u@h/db").as_deref(),
            Ok("postgres://u@h/db")
        );
        assert_eq!(
            database_url("sqlite://x.db?mode=rw").as_deref(),
            Ok("sqlite://x.db?mode=rw")
        );
        assert!(database_url("mysql://u@h/db").is_err());
        assert!(database_url("").is_err());
        let e = database_url("/nonexistent/orders.db").expect_err("refused");
        assert!(e.contains("creates none"), "{e}");
    }
}
