//! `sagaflow serve`: the console and the HTTP API of a database, without any workflow code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sagaflow::admin::{ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_ENV, AdminConfig};
use sagaflow::{Engine, redact_url};

use crate::exit::USAGE;

/// Environment variable holding the address `sagaflow serve` listens on.
const LISTEN_ENV: &str = "SAGAFLOW_LISTEN";

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on. An address beyond loopback needs a token (always given).
    #[arg(long, env = LISTEN_ENV, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// A token file: one `name role secret` per line. Without it, the operator token of
    /// SAGAFLOW_ADMIN_TOKEN (named `admin`) is used.
    #[arg(long, env = ADMIN_TOKEN_FILE_ENV, value_name = "FILE")]
    token_file: Option<PathBuf>,
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
        // The same floor as a token file's secrets (`AdminToken::new` refuses shorter ones).
        None => AdminConfig::from_env().map_err(|e| e.to_string())?,
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

pub(crate) async fn serve(
    args: ServeArgs,
    database: Option<String>,
    read_replica: Option<String>,
) -> ExitCode {
    let config = match tokens(&args) {
        Ok(c) => c,
        Err(e) => return usage(e),
    };
    let url = match crate::db::database_arg(database.as_deref())
        .map_err(|f| f.to_string())
        .and_then(|a| crate::db::database_url(&a))
    {
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
    let mut builder = Engine::builder()
        .with_database_url(url.clone())
        .with_published_workflows()
        .with_admin(args.listen, config);
    if let Some(replica) = read_replica.filter(|r| !r.is_empty()) {
        builder = builder.with_read_replica(replica);
    }
    let engine = match builder.start().await {
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
