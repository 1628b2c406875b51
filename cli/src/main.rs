//! `sagaflow`: commands for operating a sagaflow database without any workflow code.
//!
//! `sagaflow serve` serves the console and the HTTP API over a database that the engines of
//! an application use. It runs no step and no workflow code: it reads runs, definitions,
//! alerts and statistics, acts as operator, and starts runs of the workflows those engines
//! published, which the engines then execute.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use sagaflow::admin::{ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_ENV, AdminConfig, TOKEN_SECRET_MIN_CHARS};
use sagaflow::{Engine, redact_url};

/// Environment variable holding the database URL of `sagaflow serve`.
const DATABASE_URL_ENV: &str = "SAGAFLOW_DATABASE_URL";
/// Environment variable holding the address `sagaflow serve` listens on.
const LISTEN_ENV: &str = "SAGAFLOW_LISTEN";

/// Exit code of a usage error: a missing or invalid argument, no token.
const USAGE: u8 = 2;

/// Operate a sagaflow database: `sagaflow serve` serves its console and HTTP API without any
/// workflow code.
#[derive(Debug, Parser)]
#[command(name = "sagaflow", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the console and the HTTP API of a database, without any workflow code.
    ///
    /// Reads runs, definitions, alerts and statistics, acts as operator, and starts runs of
    /// the workflows that the application's engines published to the database (their newest
    /// version, the input checked against the published JSON Schema); those engines execute
    /// them. Runs no step itself. Applies the schema migrations the database lacks, as any
    /// engine start does. Every route but /healthz needs a bearer token: give a token file,
    /// or an operator token in SAGAFLOW_ADMIN_TOKEN; there is no anonymous mode.
    #[command(after_help = "\
Token file: one token per line, `name role secret`; role `read-only` or `operator`; \
secrets of 16 characters at least; `#` starts a comment line.

Examples:
  sagaflow serve --database-url ./orders.db --token-file /etc/sagaflow/tokens
  SAGAFLOW_ADMIN_TOKEN=... sagaflow serve --database-url postgres://app@db/orders \\
      --listen 0.0.0.0:8080")]
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The database: an SQLite file's path, an `sqlite:` URL, or a `postgres://` URL. It must
    /// exist (an SQLite path is never created).
    #[arg(long, env = DATABASE_URL_ENV, value_name = "URL", hide_env_values = true)]
    database_url: String,

    /// The address to listen on. An address beyond loopback needs a token (always given).
    #[arg(long, env = LISTEN_ENV, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// A token file: one `name role secret` per line. Without it, the operator token of
    /// SAGAFLOW_ADMIN_TOKEN (named `admin`) is used.
    #[arg(long, env = ADMIN_TOKEN_FILE_ENV, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,sea_orm=warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(args)),
    }
}

/// Prints `sagaflow: …` and gives the failure exit code.
fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("sagaflow: {message}");
    ExitCode::FAILURE
}

/// Prints `sagaflow serve: …` and gives the usage exit code.
fn usage(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("sagaflow serve: {message}");
    ExitCode::from(USAGE)
}

/// The tokens: the token file's, else `SAGAFLOW_ADMIN_TOKEN`'s; none is a usage error.
fn tokens(args: &ServeArgs) -> Result<AdminConfig, String> {
    let config = match args
        .token_file
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty())
    {
        Some(file) => AdminConfig::from_token_file(file).map_err(|e| e.to_string())?,
        None => {
            // The same floor as a token file's secrets.
            let chars = std::env::var(ADMIN_TOKEN_ENV)
                .map(|t| t.trim().chars().count())
                .unwrap_or(0);
            if chars > 0 && chars < TOKEN_SECRET_MIN_CHARS {
                return Err(format!(
                    "{ADMIN_TOKEN_ENV} has {chars} characters, fewer than the \
                     {TOKEN_SECRET_MIN_CHARS} required"
                ));
            }
            AdminConfig::from_env()
        }
    };
    if config.has_tokens() {
        Ok(config)
    } else {
        Err(format!(
            "no token: give --token-file FILE (or {ADMIN_TOKEN_FILE_ENV}), or an operator token \
             in {ADMIN_TOKEN_ENV}; every route but /healthz needs one"
        ))
    }
}

/// The URL the engine opens: URLs as given; a plain path as an existing SQLite file (read
/// and written, never created).
fn database_url(arg: &str) -> Result<String, String> {
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
            "no SQLite database at {}: serve opens the database of existing engines and \
             creates none",
            path.display()
        ));
    }
    Ok(format!("sqlite://{}?mode=rw", path.display()))
}

async fn serve(args: ServeArgs) -> ExitCode {
    let config = match tokens(&args) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let url = match database_url(&args.database_url) {
        Ok(u) => u,
        Err(e) => return usage(e),
    };
    // Migrations: serve opens the database as every engine start does, applying under the
    // engines' migration lock the migrations it lacks. A console of a release is run beside
    // the engines of that release; refusing an older schema would only make the operator run
    // the same migrations by starting an engine first. A database migrated by a newer release
    // is refused (its migrations are unknown here), with the migrator's message.
    // GET /metrics: the recorder is the process's, installed before the engine starts.
    if let Err(e) = sagaflow::metrics::install_prometheus() {
        return fail(e);
    }
    let engine = match Engine::builder()
        .with_database_url(url.clone())
        .with_published_workflows()
        .with_admin(args.listen, config)
        .start()
        .await
    {
        Ok(e) => e,
        Err(e) => {
            let mut message = format!("cannot serve {}: {e}", redact_url(&url));
            if message.contains("has been applied but its file is missing") {
                message.push_str(
                    "\n  (a newer release of sagaflow migrated this database: serve it with \
                     the sagaflow command of that release)",
                );
            }
            return fail(message);
        }
    };
    match engine.admin_addr() {
        Some(addr) => println!("sagaflow serve: listening on http://{addr}"),
        None => println!("sagaflow serve: listening on http://{}", args.listen),
    }
    tracing::info!(database = %redact_url(&url), "serving; Ctrl-C or SIGTERM stops");
    let code = tokio::select! {
        () = sagaflow::admin::stop_signal() => ExitCode::SUCCESS,
        e = engine.fatal_error() => fail(format!("stopped: {e}")),
    };
    engine.shutdown().await;
    code
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{Cli, database_url};

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

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
