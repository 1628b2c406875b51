//! Setting the stage: logging, the PostgreSQL server (given, or a private cluster), how to
//! restart it mid-run, and the settings the run prints in its header.

use std::path::PathBuf;

use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow_testkit::{self as postgres, PgCluster};
use sagaflow_tools::Error;
use tracing_subscriber::EnvFilter;

use super::cli::Args;

/// Where and how to restart PostgreSQL mid-run.
#[derive(Debug, Clone)]
pub(crate) struct RestartTarget {
    pub(crate) bin: Option<PathBuf>,
    pub(crate) data_dir: PathBuf,
    pub(crate) log: Option<PathBuf>,
}

impl RestartTarget {
    /// `pg_ctl restart -m immediate` of the server; how long it took. Blocking.
    pub(crate) fn restart(&self) -> Result<std::time::Duration, Error> {
        Ok(postgres::restart_immediate(
            self.bin.as_deref(),
            &self.data_dir,
            self.log.as_deref(),
        )?)
    }
}

/// The server's superuser URL: `--database-url`, or a private cluster started now (returned
/// too: it is deleted when dropped, unless `--keep-db`).
pub(crate) async fn postgres(args: &Args) -> Result<(String, Option<PgCluster>), Error> {
    if let Some(url) = &args.database_url {
        return Ok((url.clone(), None));
    }
    let script = postgres::script_path(args.pg_script.as_deref());
    let mut cluster = tokio::task::spawn_blocking(move || PgCluster::start(&script))
        .await
        .map_err(Error::task("starting a PostgreSQL cluster"))??;
    cluster.keep = args.keep_db;
    if !args.fast_unsafe {
        postgres::make_durable(&cluster.url).await?;
    }
    println!(
        "  postgres: private throwaway cluster in {}",
        cluster.dir.display()
    );
    Ok((cluster.url.clone(), Some(cluster)))
}

/// How to restart the server mid-run, if the run restarts it (prints why not, otherwise).
pub(crate) fn restart_target(args: &Args, own: Option<&PgCluster>) -> Option<RestartTarget> {
    if args.no_pg_restart || args.pg_restarts == 0 {
        println!("  postgres restart: off (--no-pg-restart or --pg-restarts 0)");
        None
    } else if let Some(c) = own {
        Some(RestartTarget {
            bin: Some(c.bin.clone()),
            data_dir: c.data_dir(),
            log: Some(c.dir.join("server.log")),
        })
    } else if let Some(d) = &args.pg_ctl_data_dir {
        Some(RestartTarget {
            bin: postgres::pg_bin(args.pg_bin.as_deref()),
            data_dir: d.clone(),
            log: None,
        })
    } else {
        println!(
            "  postgres restart: skipped (the server is not ours; pass --pg-ctl-data-dir to restart it)"
        );
        None
    }
}

/// Engine logs on stderr, errors only unless `RUST_LOG` says otherwise.
pub(crate) fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("error,sagaflow_engine::signals=off")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// `fsync` and `synchronous_commit` as the engine's sessions see them.
pub(crate) async fn durability(store: &Store) -> String {
    let show = |what: &'static str| async move {
        store
            .connection()
            .query_one_raw(Statement::from_string(
                store.connection().get_database_backend(),
                format!("SHOW {what}"),
            ))
            .await
            .ok()
            .flatten()
            .and_then(|r| r.try_get_by_index::<String>(0).ok())
            .unwrap_or_else(|| "?".into())
    };
    format!(
        "fsync={} · synchronous_commit={} · full_page_writes={}",
        show("fsync").await,
        show("synchronous_commit").await,
        show("full_page_writes").await
    )
}

/// A share as a percentage with one decimal.
pub(crate) fn pct(x: f64) -> String {
    format!("{}%", (x * 1000.0).round() / 10.0)
}
