//! How the store connects: [`StoreOptions`] with its named defaults and checks, and
//! [`redact_url`], which keeps passwords out of logs and errors.

use std::time::Duration;

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

/// Default interval at which a store given several PostgreSQL servers asks whether its
/// server is still the primary.
pub const PRIMARY_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// When an SQLite commit is on disk (SQLite's `synchronous` setting, in WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SqliteSync {
    /// Every commit is synced to disk before it returns (`synchronous=FULL`): an accepted
    /// start or a recorded step result survives a power loss. The default.
    #[default]
    Full,
    /// Commits are synced at WAL checkpoints only (`synchronous=NORMAL`). A crash of the
    /// process loses nothing, and the file is never corrupted; but a power loss or an
    /// operating-system crash can roll back the last commits: a start that returned may be
    /// gone, and a step whose result was recorded runs again (with the same idempotency key,
    /// so a remote that honours it applies its effect once). Faster, fewer fsyncs.
    Normal,
}

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
    /// SQLite's `synchronous` setting.
    pub sqlite_sync: SqliteSync,
    /// With a PostgreSQL URL naming a primary and its standbys
    /// (`postgres://user@host1:5432,host2:5432/db`): how often the store asks whether its
    /// server is still the primary; every tenth check asks all the servers, to leave a former
    /// primary that still accepts writes for the standby promoted in its place (a split
    /// brain). A promoted standby is followed within this interval plus one connect timeout
    /// (three when the old primary's host hangs rather than refuses), a split brain within
    /// ten intervals plus as much. Unused with one server.
    pub primary_check_interval: Duration,
    /// Whether opening applies the schema migrations the database lacks (the default), under
    /// the engines' migration lock. Off, opening changes no schema: it fails with
    /// [`Error::SchemaOutOfDate`] unless the schema is exactly this release's.
    pub migrate: bool,
    /// A test clock whose offset every statement's `{now}` adds to the database's time
    /// (tests only; `None` in production).
    pub test_clock: Option<crate::clock::TestClock>,
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
            sqlite_sync: SqliteSync::Full,
            primary_check_interval: PRIMARY_CHECK_INTERVAL_DEFAULT,
            migrate: true,
            test_clock: None,
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
            ("primary_check_interval", self.primary_check_interval),
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
    // A primary with its standbys (`host1:5432,host2:5432`) is not a URL to the `url` crate:
    // the first server's URL is redacted, then given the whole list back.
    if let Ok(servers) = super::primary::servers(url)
        && servers.hosts.len() > 1
    {
        let shown = redact_url(&servers.single);
        let (scheme, rest) = shown.split_once("://").unwrap_or(("", &shown));
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let at = rest[..end].rfind('@').map_or(0, |i| i + 1);
        return format!(
            "{scheme}://{}{}{}",
            &rest[..at],
            servers.list(),
            &rest[end..]
        );
    }
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
            (
                "postgres://app:hunter2@a:5432,b:5433/orders?password=hunter2",
                "postgres://app:***@a:5432,b:5433/orders?password=***",
            ),
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
