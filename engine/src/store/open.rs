//! Opening the store: bounded waits that keep the driver's cause, session limits, migrations,
//! a probing write, and the identity of an SQLite file.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection};
use sea_orm::sqlx::sqlite::SqliteConnectOptions;
use sea_orm::sqlx::{self, Connection};
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DbErr, RuntimeErr, Statement, TransactionTrait,
};

use super::{Backend, PG_POOL_DEFAULT, Store};
use crate::{Error, Result};

/// Default wait for one connection to be established.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default wait for a pooled connection.
pub const ACQUIRE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default PostgreSQL `statement_timeout` of the engine's sessions.
pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default PostgreSQL `lock_timeout` of the engine's sessions. Generous: under heavy
/// contention on a loaded machine, a claim can wait seconds for another claimer's commit
/// (measured: over 5 s with 100 claimers on 2 cores), and failing it would only cost a
/// pause. A frozen session is ended by `idle_in_transaction_session_timeout` long before.
pub const LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default PostgreSQL `idle_in_transaction_session_timeout` of the engine's sessions.
pub const IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// How the store connects, and the limits its database sessions run under.
///
/// The PostgreSQL session limits keep one frozen or hung engine from holding others
/// hostage: no statement of the engine waits longer than `lock_timeout` for a row lock, none
/// runs longer than `statement_timeout`, and a transaction left idle (its process frozen
/// mid-transaction) is ended by the server after `idle_in_transaction_timeout`, releasing its
/// locks. The engine never keeps a transaction open across user code or a network call, so
/// the limits only ever fire on a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// PostgreSQL pool size (SQLite always uses one connection).
    pub pool_size: Option<u32>,
    /// Wait for one connection to be established.
    pub connect_timeout: Duration,
    /// Wait for a connection from the pool.
    pub acquire_timeout: Duration,
    /// PostgreSQL `statement_timeout`.
    pub statement_timeout: Duration,
    /// PostgreSQL `lock_timeout`.
    pub lock_timeout: Duration,
    /// PostgreSQL `idle_in_transaction_session_timeout`.
    pub idle_in_transaction_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            pool_size: None,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            acquire_timeout: ACQUIRE_TIMEOUT_DEFAULT,
            statement_timeout: STATEMENT_TIMEOUT_DEFAULT,
            lock_timeout: LOCK_TIMEOUT_DEFAULT,
            idle_in_transaction_timeout: IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT,
        }
    }
}

impl StoreOptions {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::Config`] naming a zero timeout.
    pub fn validate(&self) -> Result<()> {
        for (name, d) in [
            ("connect_timeout", self.connect_timeout),
            ("acquire_timeout", self.acquire_timeout),
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
            (
                "idle_in_transaction_timeout",
                self.idle_in_transaction_timeout,
            ),
        ] {
            if d < Duration::from_millis(1) {
                return Err(Error::Config(format!("{name} must be at least 1 ms")));
            }
        }
        Ok(())
    }
}

/// `url` with its password (in the user part or a `password` query parameter) replaced by
/// `***`, fit for logs and `Debug`. A string that does not parse as a URL is masked whole
/// after its scheme, since it cannot be told what part of it is secret.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            if u.query_pairs().any(|(k, _)| is_secret_param(&k)) {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_secret_param(&k) {
                            "***".to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Err(_) => match url.split_once(':') {
            Some((scheme, _)) if !scheme.contains('/') => format!("{scheme}:***"),
            _ => "***".to_owned(),
        },
    }
}

fn is_secret_param(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password") || k == "sslkey" || k.contains("secret") || k.contains("token")
}

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
    fn of(path: &std::path::Path) -> Option<Self> {
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

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

fn sqlx_err(e: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(Arc::new(e)))
}

impl Store {
    /// Connects to `url` (`sqlite://path?mode=rwc` or `postgres://…`) with default
    /// [`StoreOptions`] and the given pool size, and brings the schema up to date.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub async fn connect(url: &str, pool_size: Option<u32>) -> Result<Self> {
        Self::open(
            url,
            &StoreOptions {
                pool_size,
                ..StoreOptions::default()
            },
        )
        .await
    }

    /// Connects to `url`, brings the schema up to date and proves the database writable.
    ///
    /// SQLite gets one pooled connection (it has one writer anyway, and a single connection
    /// rules out lock-upgrade deadlocks between our own transactions) and WAL journaling.
    /// PostgreSQL sessions get the limits of [`StoreOptions`].
    ///
    /// # Errors
    /// [`Error::Config`] for an unsupported or malformed URL; [`Error::Connect`] with the
    /// driver's cause when the database cannot be reached in `connect_timeout`;
    /// [`Error::ReadOnly`] when it cannot be written; [`Error::Db`] when a migration fails.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        options.validate()?;
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(Error::Config(format!(
                "unsupported database URL `{}` (use sqlite:// or postgres://)",
                redact_url(url)
            )));
        };
        let malformed = |e: sqlx::Error| {
            Error::Config(format!("malformed database URL `{}`: {e}", redact_url(url)))
        };
        let (target, file) = match backend {
            Backend::Postgres => {
                let o = PgConnectOptions::from_str(url).map_err(malformed)?;
                let target = format!(
                    "postgres://{}@{}:{}/{}",
                    o.get_username(),
                    o.get_host(),
                    o.get_port(),
                    o.get_database().unwrap_or(o.get_username())
                );
                // One direct connection first: a pool retries a failing connect until its
                // acquire timeout and then reports only "pool timed out"; this attempt
                // reports the driver's cause (refused, unknown host, authentication, TLS).
                match tokio::time::timeout(options.connect_timeout, PgConnection::connect_with(&o))
                    .await
                {
                    Ok(Ok(c)) => {
                        let _ = c.close().await;
                    }
                    Ok(Err(e)) => {
                        return Err(Error::Connect {
                            target,
                            source: sqlx_err(e),
                        });
                    }
                    Err(_) => {
                        return Err(Error::Connect {
                            target,
                            source: DbErr::Conn(RuntimeErr::Internal(format!(
                                "no connection within the connect timeout of {:?}",
                                options.connect_timeout
                            ))),
                        });
                    }
                }
                (target, None)
            }
            Backend::Sqlite => {
                let o = SqliteConnectOptions::from_str(url).map_err(malformed)?;
                (redact_url(url), Some(o.get_filename().to_owned()))
            }
        };
        let mut opts = ConnectOptions::new(url.to_owned());
        opts.sqlx_logging(false)
            .connect_timeout(options.connect_timeout)
            .acquire_timeout(options.acquire_timeout)
            .max_connections(match backend {
                Backend::Sqlite => 1,
                // The wake-up listener holds one connection for good.
                Backend::Postgres => options.pool_size.unwrap_or(PG_POOL_DEFAULT).max(2),
            });
        if backend == Backend::Postgres {
            // Index-driven plans only (AT-5, JM-4): every statement of the engine reaches its
            // rows through an index, by key or by the claim's partial index. Left to its
            // statistics, the planner turns to sequential and bitmap scans whenever a queue
            // table's statistics are missing or stale (always, in its first minutes; often,
            // as dead row versions come and go), and in our profiles those plans cost
            // milliseconds per statement where the index path costs tenths. Sequential and
            // bitmap scans stay possible where no index applies; parallel workers are never
            // worth their start-up for statements this small. This also keeps the generic
            // plans PostgreSQL caches for prepared statements on the index path when they were
            // made while a table was still tiny. JIT compilation is off: a disabled scan
            // keeps its estimated cost of 10^10, which would cross `jit_above_cost` for any
            // statement that must still scan a small table (the instances, a lease) and spend
            // hundreds of milliseconds compiling it (seen with pg_stat_statements).
            // The timeouts are the session limits of `StoreOptions`.
            let limits = [
                ("statement_timeout", millis(options.statement_timeout)),
                ("lock_timeout", millis(options.lock_timeout)),
                (
                    "idle_in_transaction_session_timeout",
                    millis(options.idle_in_transaction_timeout),
                ),
            ];
            opts.map_sqlx_postgres_opts(move |o| {
                o.application_name("sagaflow")
                    .options([
                        ("enable_seqscan", "off"),
                        ("enable_bitmapscan", "off"),
                        ("max_parallel_workers_per_gather", "0"),
                        ("jit", "off"),
                    ])
                    .options(limits.clone())
            });
        }
        let db = Database::connect(opts)
            .await
            .map_err(|source| Error::Connect {
                target: target.clone(),
                source,
            })?;
        let mut store = Self::from_connection(db)?;
        store.target = Arc::from(target.as_str());
        store.file = file.as_deref().and_then(FileIdentity::of).map(Arc::new);
        let read_only = |source: DbErr| {
            let e = Error::Db(source);
            if e.sqlite_code().is_some_and(|c| c & 0xff == 8)
                || e.sqlstate().as_deref() == Some("25006")
            {
                match e {
                    Error::Db(source) => Error::ReadOnly {
                        target: target.clone(),
                        source,
                    },
                    other => other,
                }
            } else {
                e
            }
        };
        if backend == Backend::Sqlite {
            super::sqlite::enable_wal(&store.db)
                .await
                .map_err(read_only)?;
        }
        sagaflow_migrations::migrate(&store.db)
            .await
            .map_err(read_only)?;
        // A probe that fails for a lost connection is reported as such, not as read-only.
        store.probe_write().await.map_err(|source| {
            if Error::Db(source.clone()).is_connection_lost() {
                Error::Connect {
                    target: target.clone(),
                    source,
                }
            } else {
                Error::ReadOnly {
                    target: target.clone(),
                    source,
                }
            }
        })?;
        if backend == Backend::Postgres {
            store.warn_if_commits_are_asynchronous().await;
        }
        Ok(store)
    }

    /// Proves the database writable: a write that changes nothing, rolled back. A read-only
    /// file, server or transaction, or a role without write privileges, fails here rather
    /// than in every loop of a started engine.
    async fn probe_write(&self) -> std::result::Result<(), DbErr> {
        let txn = self.db.begin().await?;
        txn.execute_raw(Statement::from_string(
            self.db.get_database_backend(),
            "UPDATE sagaflow_instances SET heartbeat_at = heartbeat_at WHERE 1 = 0",
        ))
        .await?;
        txn.rollback().await
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_wherever_a_url_carries_them() {
        for (url, want) in [
            (
                "postgres://app:hunter2@db.example:5432/orders",
                "postgres://app:***@db.example:5432/orders",
            ),
            (
                "postgres://app@db/orders?password=hunter2&sslmode=require",
                "postgres://app@db/orders?password=***&sslmode=require",
            ),
            ("postgres://app@db/orders", "postgres://app@db/orders"),
            (
                "sqlite://./data/app.db?mode=rwc",
                "sqlite://./data/app.db?mode=rwc",
            ),
            ("postgres://app:hunter2@[::1/orders", "postgres:***"),
        ] {
            let shown = redact_url(url);
            assert_eq!(shown, want, "{url}");
            assert!(!shown.contains("hunter2"));
        }
    }

    #[test]
    fn zero_timeouts_are_refused_by_name() {
        let e = StoreOptions {
            lock_timeout: Duration::ZERO,
            ..StoreOptions::default()
        }
        .validate()
        .expect_err("zero");
        assert!(e.to_string().contains("lock_timeout"), "{e}");
        StoreOptions::default()
            .validate()
            .expect("defaults are valid");
    }
}
