//! Opening the store: bounded waits that keep the driver's cause, session limits, migrations
//! and a probing write. The options are in `options.rs`, the SQLite file's identity in
//! `file.rs`.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection};
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteSynchronous};
use sea_orm::sqlx::{self, Connection};
use sea_orm::{ConnectOptions, Database, DbErr, RuntimeErr};

use super::conn::Db;
use super::file::FileIdentity;
use super::lite::LiteDb;
use super::options::{StoreOptions, redact_url};
use super::primary::{self, Primary};
use super::row::Exec;
use super::{Backend, SqliteSync, Store, pg_pool_default};
use crate::{Error, Result};

/// How long a statement waits for another connection's lock on an SQLite file before it
/// fails (the sqlx driver's default, which the pool keeps).
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a read replica waits for it to replay the migrations its primary has
/// (an engine started beside a fresh schema opens the replica a moment after migrating).
const REPLICA_SCHEMA_WAIT: Duration = Duration::from_secs(30);

/// Whether an SQLite URL opens its file read-only (`mode=ro`, or `immutable`).
fn sqlite_read_only(url: &str) -> bool {
    let Some((_, query)) = url.split_once('?') else {
        return false;
    };
    url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| match &*k {
        "mode" => v == "ro",
        "immutable" => matches!(&*v, "1" | "true"),
        _ => false,
    })
}

fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

fn sqlx_err(e: sqlx::Error) -> DbErr {
    DbErr::Conn(RuntimeErr::SqlxError(Arc::new(e)))
}

/// Connects once to `o` within `timeout`, to report the driver's cause when it fails.
async fn check_reachable(o: &PgConnectOptions, target: &str, timeout: Duration) -> Result<()> {
    match tokio::time::timeout(timeout, PgConnection::connect_with(o)).await {
        Ok(Ok(c)) => {
            let _ = c.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(Error::Connect {
            target: target.to_owned(),
            source: sqlx_err(e).into(),
        }),
        Err(_) => Err(Error::Connect {
            target: target.to_owned(),
            source: DbErr::Conn(RuntimeErr::Internal(format!(
                "no connection within the connect timeout of {timeout:?}"
            )))
            .into(),
        }),
    }
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

    /// Connects to `url`, brings the schema up to date (or, with [`StoreOptions::migrate`]
    /// off, checks that it is this release's and changes nothing) and proves the database
    /// writable.
    ///
    /// SQLite gets one pooled connection (it has one writer anyway, and a single connection
    /// rules out lock-upgrade deadlocks between our own transactions) and WAL journaling.
    /// PostgreSQL sessions get the limits of [`StoreOptions`].
    ///
    /// # Errors
    /// [`Error::Config`] for an unsupported or malformed URL; [`Error::Connect`] with the
    /// driver's cause when the database cannot be reached in `connect_timeout`;
    /// [`Error::ReadOnly`] when it cannot be written; [`Error::Db`] when a migration fails;
    /// [`Error::SchemaOutOfDate`] when migrations are off and the schema is not this
    /// release's.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        Self::open_as(url, options, false).await
    }

    /// Connects to a PostgreSQL standby (or a load balancer in front of several) to serve
    /// reads that may lag: lists, counts, run pages, event streams. Nothing is written: no
    /// migration, no probe; the schema must be this release's.
    ///
    /// # Errors
    /// [`Error::Config`] for an SQLite URL or one naming several servers; [`Error::Connect`]
    /// as [`Store::open`]; [`Error::SchemaOutOfDate`] when the replica's schema is not this
    /// release's within 30 s (it may still be replaying the migrations of its primary), or
    /// at once when it has migrations this release does not know.
    pub async fn open_replica(url: &str, options: &StoreOptions) -> Result<Self> {
        if !url.starts_with("postgres:") && !url.starts_with("postgresql:") {
            return Err(Error::Config(format!(
                "a read replica is a PostgreSQL server, not `{}`",
                redact_url(url)
            )));
        }
        if primary::servers(url)?.hosts.len() > 1 {
            return Err(Error::Config(format!(
                "a read replica URL names one server (or a load balancer in front of several), \
                 not `{}`",
                redact_url(url)
            )));
        }
        Self::open_as(
            url,
            &StoreOptions {
                migrate: false,
                ..options.clone()
            },
            true,
        )
        .await
    }

    async fn open_as(url: &str, options: &StoreOptions, replica: bool) -> Result<Self> {
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
        let mut primary = None;
        let (target, file) = match backend {
            Backend::Postgres => {
                let servers = primary::servers(url)?;
                let o = PgConnectOptions::from_str(&servers.single).map_err(malformed)?;
                let hosts = if servers.hosts.len() > 1 {
                    servers.list()
                } else {
                    format!("{}:{}", o.get_host(), o.get_port())
                };
                let target = format!(
                    "postgres://{}@{hosts}/{}",
                    o.get_username(),
                    o.get_database().unwrap_or(o.get_username())
                );
                if servers.hosts.len() > 1 {
                    // Every server at once, keeping the primary and its connection (the
                    // watcher's probe, once the pool exists).
                    let finder = Primary::new(servers, o, options.connect_timeout);
                    let (i, probe, _) = finder
                        .locate(None)
                        .await
                        .map_err(|causes| primary::connect_error(&target, causes))?;
                    primary = Some((finder, i, probe));
                } else {
                    // One direct connection first: a pool retries a failing connect until
                    // its acquire timeout and then reports only "pool timed out"; this
                    // attempt reports the driver's cause (refused, unknown host,
                    // authentication, TLS).
                    check_reachable(&o, &target, options.connect_timeout).await?;
                }
                (target, None)
            }
            Backend::Sqlite => {
                let o = SqliteConnectOptions::from_str(url).map_err(malformed)?;
                (redact_url(url), Some(o.get_filename().to_owned()))
            }
        };
        let single = match &primary {
            Some((finder, ..)) => finder.single_url().to_owned(),
            None => url.to_owned(),
        };
        let mut opts = ConnectOptions::new(single);
        opts.sqlx_logging(false)
            .connect_timeout(options.connect_timeout)
            .acquire_timeout(options.acquire_timeout)
            // No idle reaping and no lifetime cap: either makes sqlx 0.9.0 run its pool
            // maintenance task, whose sweep can read an underflowed idle count and spin on a
            // core for good, hanging the process's shutdown (sqlx issue 3645, fixed upstream
            // after 0.9.0; seen here once as a suite process stuck at 100% CPU in
            // `CloseEvent::do_until` after its engines stopped). The pools are small and
            // fixed, and a connection is checked before each use, so neither is needed.
            .idle_timeout(None)
            .max_lifetime(None)
            .max_connections(match backend {
                Backend::Sqlite => 1,
                // The wake-up listener holds one connection for good.
                Backend::Postgres => options.pool_size.unwrap_or_else(pg_pool_default).max(2),
            });
        if backend == Backend::Sqlite {
            let sync = match options.sqlite_sync {
                SqliteSync::Full => SqliteSynchronous::Full,
                SqliteSync::Normal => SqliteSynchronous::Normal,
            };
            opts.map_sqlx_sqlite_opts(move |o| o.synchronous(sync));
        }
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
            let at = primary.as_ref().map(|(finder, i, _)| finder.host(*i));
            opts.map_sqlx_postgres_opts(move |o| {
                let o = match &at {
                    Some((host, port)) => o.host(host).port(*port),
                    None => o,
                };
                o.application_name("sagaflow")
                    .options([
                        ("enable_seqscan", "off"),
                        ("enable_bitmapscan", "off"),
                        ("max_parallel_workers_per_gather", "0"),
                        ("jit", "off"),
                    ])
                    .options(limits.clone())
            });
            if let Some((finder, ..)) = &primary {
                // A new connection must reach the primary; an idle one opened before the
                // watcher moved the pool (to a promoted standby while the old primary still
                // runs) is discarded rather than handed out.
                let pin = finder.pin();
                opts.map_sqlx_postgres_pool_opts(move |p| {
                    let (at_connect, at_acquire) = (pin.clone(), pin.clone());
                    p.after_connect(move |conn, _| {
                        let pin = at_connect.clone();
                        Box::pin(async move { primary::refuse_unless_primary(conn, &pin).await })
                    })
                    // The pool's own liveness ping runs here, after the age check: a
                    // connection to a former primary that hangs is dropped at once rather
                    // than pinged until the acquire times out.
                    .test_before_acquire(false)
                    .before_acquire(move |conn, meta| {
                        let stale = at_acquire.predates_move(meta.age);
                        Box::pin(
                            async move { Ok(!stale && sqlx::Connection::ping(conn).await.is_ok()) },
                        )
                    })
                });
            }
        }
        let db = Database::connect(opts)
            .await
            .map_err(|source| Error::Connect {
                target: target.clone(),
                source: source.into(),
            })?;
        let mut store = Self::from_connection(db)?;
        if let Some((finder, i, probe)) = primary {
            let pool = store.db.get_postgres_connection_pool().clone();
            let finder = finder.with_base((*pool.connect_options()).clone());
            let pin = finder.pin();
            let guard = finder.watch(pool, i, probe, options.primary_check_interval);
            store.primary = Some(primary::Watcher::new(guard, pin));
        }
        store.target = Arc::from(target.as_str());
        store.file = file.as_deref().and_then(FileIdentity::of).map(Arc::new);
        store.clock.clone_from(&options.test_clock);
        let identity = store.file.clone();
        if replica {
            store.replica = true;
            // A replica replays the migrations a primary just applied a little later: wait
            // for it (bounded) rather than refuse an engine started beside a fresh schema.
            let until = tokio::time::Instant::now() + REPLICA_SCHEMA_WAIT;
            loop {
                let status = sagaflow_migrations::status(&store.db).await?;
                if status.is_current() {
                    return Ok(store);
                }
                if !status.unknown.is_empty() || tokio::time::Instant::now() >= until {
                    return Err(Error::SchemaOutOfDate {
                        target,
                        pending: status.pending,
                        unknown: status.unknown,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        store
            .prepare(url, target, file, backend, options)
            .await
            // SQLite answers for a file deleted mid-start with "disk I/O error": the lost
            // file is the cause to report.
            .map_err(|e| match identity.map(|f| f.check()) {
                Some(Err(lost)) => Error::DatabaseLost(lost),
                _ => e,
            })
    }

    /// The rest of [`Store::open`] once connected: checks or migrates the schema, switches
    /// SQLite to WAL and its fast path, and proves the database writable.
    async fn prepare(
        mut self,
        url: &str,
        target: String,
        file: Option<std::path::PathBuf>,
        backend: Backend,
        options: &StoreOptions,
    ) -> Result<Self> {
        let store = &mut self;
        let read_only = |source: DbErr| {
            let e = Error::from(source);
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
        if !options.migrate {
            // Checked before anything is written, even the journal mode.
            let status = sagaflow_migrations::status(&store.db).await?;
            if !status.is_current() {
                return Err(Error::SchemaOutOfDate {
                    target,
                    pending: status.pending,
                    unknown: status.unknown,
                });
            }
        }
        if backend == Backend::Sqlite {
            super::sqlite::enable_wal(&store.db)
                .await
                .map_err(read_only)?;
        }
        if options.migrate {
            sagaflow_migrations::migrate(&store.db)
                .await
                .map_err(read_only)?;
        }
        if let (Some(path), true) = (file.as_deref(), store.file.is_some()) {
            // On a file, the engine's own statements take the fast path; the pool stays for
            // applications' transactions (`Engine::connection`). An in-memory database
            // exists only inside the pool's connection.
            let lite = LiteDb::open(
                path,
                sqlite_read_only(url),
                options.sqlite_sync,
                SQLITE_BUSY_TIMEOUT,
            );
            // The file must still be the one migrated above: deleted or replaced meanwhile,
            // it is lost, not unreachable.
            store.check_file()?;
            let lite = lite.map_err(|source| Error::Connect {
                target: target.clone(),
                source: source.into(),
            })?;
            store.exec = Db::Lite(lite);
        }
        // A probe that fails for a lost connection is reported as such, not as read-only.
        store.probe_write().await.map_err(|source| {
            if Error::from(source.clone()).is_connection_lost() {
                Error::Connect {
                    target: target.clone(),
                    source: source.into(),
                }
            } else {
                Error::ReadOnly {
                    target: target.clone(),
                    source: source.into(),
                }
            }
        })?;
        if backend == Backend::Postgres {
            store.warn_if_commits_are_asynchronous().await;
        }
        Ok(self)
    }

    /// Proves the database writable: a write that changes nothing, rolled back. A read-only
    /// file, server or transaction, or a role without write privileges, fails here rather
    /// than in every loop of a started engine.
    async fn probe_write(&self) -> std::result::Result<(), DbErr> {
        let txn = self.exec.begin().await?;
        txn.execute(self.stmt(
            "UPDATE sagaflow_instances SET heartbeat_at = heartbeat_at WHERE 1 = 0",
            vec![],
        ))
        .await?;
        txn.rollback().await
    }
}
