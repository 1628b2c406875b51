//! A primary and its standbys. A PostgreSQL URL may name several servers, in libpq's form
//! `postgres://user@host1:5432,host2:5432/db`; the store writes to whichever of them is the
//! primary (the one not in recovery) and follows it when a standby is promoted:
//!
//! - opening tries the servers in the order given and keeps the first that accepts writes;
//! - every new pooled connection checks that its server is still the primary, so the pool
//!   never hands out a session on a standby (a demoted primary is restarted as one);
//! - a watcher keeps one probe connection and asks it, every
//!   [`StoreOptions::primary_check_interval`](super::StoreOptions::primary_check_interval),
//!   whether its server is the primary. When the probe fails or the answer is no, it tries the
//!   servers in order again and points the pool's new connections at the one it finds.
//!
//! - the store pins the cluster it opened on (PostgreSQL's system identifier, which a
//!   standby shares with its primary and keeps when promoted): a server of another cluster
//!   answering at a listed address (an old primary's address taken by a fresh server, or a
//!   URL listing independent databases) is never taken for the primary, and the watcher's
//!   warning names it.
//!
//! A promotion is thus followed within one check interval plus one connect timeout per server
//! that does not answer. A URL with one server (or a proxy in front of the servers) keeps the
//! pool's ordinary reconnection, with no watcher and no check per connection.
//!
//! sqlx parses one host per URL, and its pool connects to one target; no crate of the stack
//! follows a primary, hence this module. It decides nothing about runs: it only picks the
//! server the store's SQL goes to.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sea_orm::sqlx::{self, Connection, Row};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Error, Result};

/// The port of a server named without one (PostgreSQL's default).
const DEFAULT_PORT: u16 = 5432;

/// The servers a PostgreSQL URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Servers {
    /// `(host, port)` in the URL's order; a host is written without IPv6 brackets.
    pub(super) hosts: Vec<(String, u16)>,
    /// The URL with the first server only and without `target_session_attrs`: what sqlx
    /// parses.
    pub(super) single: String,
}

impl Servers {
    /// `host:port,host:port`, IPv6 hosts in brackets (for messages).
    pub(super) fn list(&self) -> String {
        self.hosts
            .iter()
            .map(|(h, p)| host_port(h, *p))
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Splits a PostgreSQL URL into the servers it names. One server is the ordinary case; a
/// comma-separated list is libpq's multi-host form. `target_session_attrs`, if given, must
/// ask for what the engine needs anyway (`read-write` or `primary`).
///
/// # Errors
/// [`Error::Config`] for an empty host, a malformed port or another `target_session_attrs`.
pub(super) fn servers(url: &str) -> Result<Servers> {
    let bad = |why: String| Error::Config(format!("malformed database URL: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("no `://`".into()))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hostlist) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let mut hosts = Vec::new();
    for item in hostlist.split(',') {
        let (host, port) = if let Some(v6) = item.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad(format!("unclosed `[` in `{item}`")))?;
            (h, after.strip_prefix(':'))
        } else {
            match item.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (item, None),
            }
        };
        if host.is_empty() && hostlist.contains(',') {
            return Err(bad(format!("an empty host in `{hostlist}`")));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| bad(format!("port `{p}` of `{item}` is not a number")))?,
            None => DEFAULT_PORT,
        };
        hosts.push((host.to_owned(), port));
    }
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    let mut kept = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if k == "target_session_attrs" {
            if !matches!(&*v, "read-write" | "primary") {
                return Err(Error::Config(format!(
                    "target_session_attrs={v}: the engine writes, so it connects to the primary \
                     only (read-write or primary)"
                )));
            }
        } else {
            kept.push((k.into_owned(), v.into_owned()));
        }
    }
    let first = if hostlist.contains(',') {
        host_port(&hosts[0].0, hosts[0].1)
    } else {
        hostlist.to_owned()
    };
    let mut single = format!("{scheme}://{user}{first}{path}");
    if query.is_some() && !kept.is_empty() {
        single.push('?');
        single.push_str(
            &url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(kept)
                .finish(),
        );
    }
    Ok(Servers { hosts, single })
}

/// Whether the server behind `conn` is the primary: `Ok(true)` when it is not in recovery.
async fn ask(conn: &mut PgConnection) -> std::result::Result<bool, sqlx::Error> {
    let row = sqlx::query("SELECT pg_is_in_recovery() AS r")
        .fetch_one(conn)
        .await?;
    Ok(!row.try_get::<bool, _>("r")?)
}

/// The system identifier of the cluster the server behind `conn` belongs to: made by
/// `initdb`, copied to every standby by `pg_basebackup`, kept by a promotion. `None` when
/// the role may not read it (a managed service may revoke `pg_control_system()`).
async fn cluster_of(conn: &mut PgConnection) -> std::result::Result<Option<i64>, sqlx::Error> {
    match sqlx::query("SELECT system_identifier AS s FROM pg_control_system()")
        .fetch_one(conn)
        .await
    {
        Ok(row) => Ok(Some(row.try_get::<i64, _>("s")?)),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why the server behind `conn` is not this store's primary, if it is not: a standby, or a
/// server of another cluster than `cluster` (the one the store opened on). A server of
/// another cluster answering at a listed address is an old primary's address reused by a
/// fresh server, or a URL that lists independent databases; writing there would split the
/// runs between two databases that never meet.
async fn disqualify(
    conn: &mut PgConnection,
    cluster: Option<i64>,
) -> std::result::Result<Option<String>, sqlx::Error> {
    if !ask(conn).await? {
        return Ok(Some("a standby (in recovery)".into()));
    }
    let Some(ours) = cluster else {
        return Ok(None);
    };
    Ok(match cluster_of(conn).await? {
        Some(theirs) if theirs != ours => Some(format!(
            "a primary of another cluster (system identifier {theirs}, not {ours}): refused"
        )),
        _ => None,
    })
}

/// A check for the pool's new connections: a session on a standby, or on a server of
/// another cluster than `cluster`, is refused, so the pool retries (and meanwhile the
/// watcher finds the new primary).
pub(super) async fn refuse_unless_primary(
    conn: &mut PgConnection,
    cluster: Option<i64>,
) -> std::result::Result<(), sqlx::Error> {
    match disqualify(conn, cluster).await? {
        None => Ok(()),
        Some(why) => Err(sqlx::Error::Configuration(
            format!("the server is {why}; the engine writes to its primary only").into(),
        )),
    }
}

/// Finds and follows the primary among the servers of a URL.
#[derive(Debug, Clone)]
pub(super) struct Primary {
    servers: Servers,
    /// Every session option of the store's connections; only host and port vary.
    base: PgConnectOptions,
    connect_timeout: Duration,
    /// The system identifier of the cluster of the primary the store opened on; `None`
    /// before that, or when the role may not read it.
    cluster: Option<i64>,
}

impl Primary {
    pub(super) fn new(servers: Servers, base: PgConnectOptions, connect_timeout: Duration) -> Self {
        Self {
            servers,
            base,
            connect_timeout,
            cluster: None,
        }
    }

    /// Pins the cluster of the primary found at open (its probe connection `probe`):
    /// from now on a server of another cluster is never taken for the primary.
    ///
    /// # Errors
    /// When the probe does not answer.
    pub(super) async fn pin_cluster(
        &mut self,
        probe: &mut PgConnection,
    ) -> std::result::Result<(), String> {
        self.cluster = tokio::time::timeout(self.connect_timeout, cluster_of(probe))
            .await
            .map_err(|_| "no answer within the connect timeout".to_owned())?
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The cluster pinned by [`Primary::pin_cluster`].
    pub(super) fn cluster(&self) -> Option<i64> {
        self.cluster
    }

    /// The same servers, their sessions set up as `base` (the pool's options).
    pub(super) fn with_base(self, base: PgConnectOptions) -> Self {
        Self { base, ..self }
    }

    /// The URL with the first server only, which sqlx parses.
    pub(super) fn single_url(&self) -> &str {
        &self.servers.single
    }

    /// Host and port of server `i`.
    pub(super) fn host(&self, i: usize) -> (String, u16) {
        self.servers.hosts[i].clone()
    }

    /// The connection options for server `i`.
    pub(super) fn options(&self, i: usize) -> PgConnectOptions {
        let (host, port) = &self.servers.hosts[i];
        self.base.clone().host(host).port(*port)
    }

    /// Connects to server `i` within the connect timeout.
    async fn connect(&self, i: usize) -> std::result::Result<PgConnection, String> {
        match tokio::time::timeout(
            self.connect_timeout,
            PgConnection::connect_with(&self.options(i)),
        )
        .await
        {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no connection within the connect timeout of {:?}",
                self.connect_timeout
            )),
        }
    }

    /// The first server, in the URL's order, that is the primary, with an open connection to
    /// it; else what each server answered.
    pub(super) async fn locate(&self) -> std::result::Result<(usize, PgConnection), String> {
        let mut causes = Vec::new();
        for i in 0..self.servers.hosts.len() {
            let name = host_port(&self.servers.hosts[i].0, self.servers.hosts[i].1);
            match self.connect(i).await {
                Ok(mut c) => match tokio::time::timeout(
                    self.connect_timeout,
                    disqualify(&mut c, self.cluster),
                )
                .await
                {
                    Ok(Ok(None)) => return Ok((i, c)),
                    Ok(Ok(Some(why))) => causes.push(format!("{name}: {why}")),
                    Ok(Err(e)) => causes.push(format!("{name}: {e}")),
                    Err(_) => causes.push(format!("{name}: no answer within the connect timeout")),
                },
                Err(e) => causes.push(format!("{name}: {e}")),
            }
        }
        Err(causes.join("; "))
    }

    /// Starts the watcher that follows the primary for `pool`, which connects to server
    /// `current` (whose open probe connection is `probe`). It stops when the guard is dropped.
    pub(super) fn watch(
        self,
        pool: PgPool,
        current: usize,
        probe: PgConnection,
        every: Duration,
    ) -> DropGuard {
        let stop = CancellationToken::new();
        let guard = stop.clone().drop_guard();
        tokio::spawn(async move {
            let mut current = current;
            let mut probe = Some(probe);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(every) => {}
                }
                let healthy = match probe.as_mut() {
                    Some(c) => matches!(
                        tokio::time::timeout(self.connect_timeout, ask(c)).await,
                        Ok(Ok(true))
                    ),
                    None => false,
                };
                if healthy {
                    continue;
                }
                if let Some(c) = probe.take() {
                    // Dead or demoted: its close may never be answered.
                    drop(tokio::time::timeout(self.connect_timeout, c.close()).await);
                }
                match self.locate().await {
                    Ok((i, c)) => {
                        if i != current {
                            pool.set_connect_options(self.options(i));
                            tracing::warn!(
                                from = %host_port(&self.servers.hosts[current].0, self.servers.hosts[current].1),
                                to = %host_port(&self.servers.hosts[i].0, self.servers.hosts[i].1),
                                "the primary moved; new connections go to the new primary"
                            );
                            current = i;
                        }
                        probe = Some(c);
                    }
                    Err(causes) => tracing::warn!(
                        servers = %self.servers.list(),
                        %causes,
                        "no primary among the database servers; checking again"
                    ),
                }
            }
        });
        guard
    }
}

/// The watcher of a store, stopped when the last clone of the store is dropped.
#[derive(Debug, Clone)]
pub(super) struct Watcher(#[allow(dead_code)] pub(super) Arc<DropGuard>);

pub(super) fn connect_error(target: &str, causes: String) -> Error {
    Error::Connect {
        target: target.to_owned(),
        source: sea_orm::DbErr::Conn(sea_orm::RuntimeErr::Internal(format!(
            "no server is the primary: {causes}"
        )))
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(url: &str) -> Vec<(String, u16)> {
        servers(url).expect(url).hosts
    }

    #[test]
    fn one_server_keeps_its_url() {
        for url in [
            "postgres://app:pw@db.example:6432/orders?sslmode=require",
            "postgres://db/orders",
            "postgresql://app@[::1]:5433/orders",
        ] {
            let s = servers(url).expect(url);
            assert_eq!(s.single, url);
            assert_eq!(s.hosts.len(), 1);
        }
        assert_eq!(hosts("postgres://db/orders"), [("db".to_owned(), 5432)]);
        assert_eq!(
            hosts("postgresql://app@[::1]:5433/orders"),
            [("::1".to_owned(), 5433)]
        );
    }

    #[test]
    fn a_host_list_is_split_and_the_first_host_parsed() {
        let s = servers(
            "postgres://app:pw@a.example:5432,[::1]:5433,c.example/orders?sslmode=prefer&target_session_attrs=read-write",
        )
        .expect("url");
        assert_eq!(
            s.hosts,
            [
                ("a.example".to_owned(), 5432),
                ("::1".to_owned(), 5433),
                ("c.example".to_owned(), 5432)
            ]
        );
        assert_eq!(
            s.single,
            "postgres://app:pw@a.example:5432/orders?sslmode=prefer"
        );
        assert_eq!(s.list(), "a.example:5432,[::1]:5433,c.example:5432");
    }

    #[test]
    fn a_standby_only_session_and_malformed_lists_are_refused_by_name() {
        for (url, says) in [
            (
                "postgres://a:1,b:2/db?target_session_attrs=read-only",
                "target_session_attrs=read-only",
            ),
            ("postgres://a:1,:2/db", "empty host"),
            ("postgres://a:1,b:x/db", "port `x`"),
            ("postgres://[::1:5432,b/db", "unclosed"),
        ] {
            let e = servers(url).expect_err(url).to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
