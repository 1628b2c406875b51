//! A primary and its standbys. A PostgreSQL URL may name several servers, in libpq's form
//! `postgres://user@host1:5432,host2:5432/db`; the store writes to whichever of them is the
//! primary (the one not in recovery) and follows it when a standby is promoted:
//!
//! - opening asks every server at once and keeps the primary (the server not in recovery);
//! - the store pins the cluster it opened on and the newest timeline it has seen
//!   (PostgreSQL's system identifier, which a standby shares with its primary and keeps when
//!   promoted, and the timeline, which each promotion raises). A server of another cluster at
//!   a listed address (an old primary's address taken by a fresh server) is never taken for
//!   the primary, nor is a former primary still writable on an older timeline (a split
//!   brain, which lasts until it stops accepting writes, and while a server of it does not
//!   answer); a URL listing primaries of two clusters fails at open;
//! - every new pooled connection checks that its server is that primary, so the pool never
//!   hands out a session on a standby (a demoted primary is restarted as one) or a stranger;
//! - a watcher keeps one probe connection and asks it, every
//!   [`StoreOptions::primary_check_interval`](super::StoreOptions::primary_check_interval),
//!   whether its server is the primary. When the probe fails or the answer is no, and on
//!   every tenth check anyway, it asks all the servers again and points the pool at the
//!   primary on the newest timeline; idle connections opened before a move are discarded.
//!
//! A promotion is thus followed within one check interval and one connect timeout when the
//! old primary's host refuses connections, and up to three connect timeouts when it hangs
//! (the probe's question, then a visit's connect and question); a split brain within ten
//! check intervals and as much. A URL with one server (or a proxy in front of the
//! servers) keeps the pool's ordinary reconnection, with no watcher and no check per
//! connection.
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

/// How often, in checks of the probe, the watcher also asks every listed server whether it
/// is a primary of the cluster on a newer timeline: a standby promoted while the old primary
/// still runs (a split brain).
const SCAN_EVERY: u32 = 10;

/// Who a primary is: the cluster (its system identifier, made by `initdb`, copied to every
/// standby by `pg_basebackup`, kept by a promotion) and the timeline it writes (one more with
/// each promotion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    cluster: i64,
    timeline: i64,
}

/// The identity of the primary behind `conn`; `None` when the server will not tell: the role
/// may not read it (a managed service may revoke `pg_control_system()`; then it is not asked
/// again), or the server refuses the question otherwise.
async fn identify(
    conn: &mut PgConnection,
    pin: &Pin,
) -> std::result::Result<Option<Identity>, sqlx::Error> {
    if pin.get().denied {
        return Ok(None);
    }
    // The timeline is the first eight hex digits of the current WAL file's name.
    let sql = "SELECT s.system_identifier AS c, \
                 ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint AS t \
               FROM pg_control_system() s";
    match sqlx::query(sql).fetch_one(conn).await {
        Ok(row) => Ok(Some(Identity {
            cluster: row.try_get("c")?,
            timeline: row.try_get("t")?,
        })),
        Err(sqlx::Error::Database(e)) => {
            if e.code().as_deref() == Some("42501") {
                pin.get().denied = true;
            }
            tracing::debug!(error = %e, "the server does not tell its cluster and timeline");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// What the store knows of the cluster it writes to, shared by its watcher and its pool's
/// connection checks; and the count of the pool's moves, for those who hold a connection of
/// their own (the wake-up listener).
#[derive(Debug)]
pub(super) struct Pin(std::sync::Mutex<Pinned>, tokio::sync::watch::Sender<u64>);

#[derive(Debug, Default)]
struct Pinned {
    /// The cluster of the primary the store opened on (`None`: not known or not readable).
    cluster: Option<i64>,
    /// The newest timeline seen on a primary of it.
    timeline: i64,
    /// When the pool was last pointed at another server.
    moved: Option<std::time::Instant>,
    /// The role may not read the identity: it is not asked for again.
    denied: bool,
    /// The split brain the last look found, if it found one, or kept (see [`Split`]).
    split: Option<Split>,
    /// Looks at every server so far.
    looks: u64,
}

/// A split brain: more than one server of the cluster accepting writes (the primary and a
/// former primary on an older timeline, which the store refuses but which still writes for
/// whoever reaches it). A look that finds only one keeps the split when a server of it did
/// not answer in time: whether that one still accepts writes is not known.
#[derive(Debug, Clone)]
struct Split {
    /// The servers accepting writes, by their index in the URL.
    members: Vec<usize>,
    /// Them, named with their timelines, for the operator.
    names: String,
}

/// What a server is to the store.
enum Verdict {
    /// Its primary, with its identity when readable.
    Primary(Option<Identity>),
    /// A former primary of its cluster, still writable on an older timeline (a split brain):
    /// refused, and why.
    Former(Identity, String),
    /// A standby, or a server of another cluster: refused, and why.
    Not(String),
}

impl Pin {
    fn new() -> Self {
        Self(
            std::sync::Mutex::default(),
            tokio::sync::watch::Sender::new(0),
        )
    }

    /// Notes that the pool now connects to another server.
    fn moved(&self) {
        self.get().moved = Some(std::time::Instant::now());
        self.1.send_modify(|n| *n += 1);
    }

    fn get(&self) -> std::sync::MutexGuard<'_, Pinned> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes the primary the store now writes to.
    fn note(&self, id: Option<Identity>) {
        if let Some(id) = id {
            let mut p = self.get();
            p.cluster.get_or_insert(id.cluster);
            p.timeline = p.timeline.max(id.timeline);
        }
    }

    /// What a primary of identity `id` is to the store.
    fn verdict(&self, id: Option<Identity>) -> Verdict {
        let Some(id) = id else {
            return Verdict::Primary(None);
        };
        let p = self.get();
        match p.cluster {
            Some(ours) if ours != id.cluster => Verdict::Not(format!(
                "a primary of another cluster (system identifier {}, not {ours}): refused",
                id.cluster
            )),
            _ if id.timeline < p.timeline => Verdict::Former(
                id,
                format!(
                    "a former primary, still writable on timeline {} while the cluster is on {} \
                     (a split brain): refused",
                    id.timeline, p.timeline
                ),
            ),
            _ => Verdict::Primary(Some(id)),
        }
    }

    /// The servers accepting writes that the last look at every server found, when it found
    /// more than one (or kept them: see [`Split`]).
    pub(super) fn split_brain(&self) -> Option<String> {
        self.get().split.as_ref().map(|s| s.names.clone())
    }

    /// How many looks at every server the watcher has taken.
    pub(super) fn looks(&self) -> u64 {
        self.get().looks
    }

    /// Whether a pooled connection `age` old was opened before the pool last moved.
    pub(super) fn predates_move(&self, age: Duration) -> bool {
        self.get().moved.is_some_and(|at| age > at.elapsed())
    }
}

/// What the server behind `conn` is to the store.
async fn judge(conn: &mut PgConnection, pin: &Pin) -> std::result::Result<Verdict, sqlx::Error> {
    if !ask(conn).await? {
        return Ok(Verdict::Not("a standby (in recovery)".into()));
    }
    let id = identify(conn, pin).await?;
    Ok(pin.verdict(id))
}

/// A check for the pool's new connections: a session on a standby, on a server of another
/// cluster, or on a former primary left behind by a promotion, is refused, so the pool
/// retries (and meanwhile the watcher finds the primary).
pub(super) async fn refuse_unless_primary(
    conn: &mut PgConnection,
    pin: &Pin,
) -> std::result::Result<(), sqlx::Error> {
    match judge(conn, pin).await? {
        Verdict::Primary(_) => Ok(()),
        Verdict::Former(_, why) | Verdict::Not(why) => Err(sqlx::Error::Configuration(
            format!("the server is {why}; the engine writes to its primary only").into(),
        )),
    }
}

/// A primary found by [`Primary::locate`]: its index in the URL, an open connection to it,
/// and its identity.
pub(super) type Found = (usize, PgConnection, Option<Identity>);

/// What a visit to a server found.
enum Visit {
    /// The primary: a connection to it, and its identity.
    Primary(PgConnection, Option<Identity>),
    /// A former primary still accepting writes (a split brain), and why it is refused.
    Former(Identity, String),
    /// Not a primary (a standby, a server of another cluster), or down (its host refuses
    /// connections), and why.
    Not(String),
    /// No answer within the connect timeout, or a failure that does not say the server is
    /// down (an unreachable host, a refused login, too many clients, a connection reset):
    /// whether it accepts writes is not known.
    Silent(String),
}

/// What a failure to reach or ask a server says of it: down when its host refuses
/// connections, else not known.
fn unreached(e: &sqlx::Error) -> Visit {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            Visit::Not(e.to_string())
        }
        _ => Visit::Silent(e.to_string()),
    }
}

/// Finds and follows the primary among the servers of a URL.
#[derive(Debug, Clone)]
pub(super) struct Primary {
    servers: Servers,
    /// Every session option of the store's connections; only host and port vary.
    base: PgConnectOptions,
    connect_timeout: Duration,
    pin: Arc<Pin>,
}

impl Primary {
    pub(super) fn new(servers: Servers, base: PgConnectOptions, connect_timeout: Duration) -> Self {
        Self {
            servers,
            base,
            connect_timeout,
            pin: Arc::new(Pin::new()),
        }
    }

    /// What the store knows of its cluster, for the pool's connection checks.
    pub(super) fn pin(&self) -> Arc<Pin> {
        self.pin.clone()
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

    fn name(&self, i: usize) -> String {
        host_port(&self.servers.hosts[i].0, self.servers.hosts[i].1)
    }

    /// The connection options for server `i`.
    pub(super) fn options(&self, i: usize) -> PgConnectOptions {
        let (host, port) = &self.servers.hosts[i];
        self.base.clone().host(host).port(*port)
    }

    /// Connects to server `i` and judges it, within the connect timeout for each.
    async fn visit(&self, i: usize) -> Visit {
        let mut c = match tokio::time::timeout(
            self.connect_timeout,
            PgConnection::connect_with(&self.options(i)),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return unreached(&e),
            Err(_) => {
                return Visit::Silent(format!(
                    "no connection within the connect timeout of {:?}",
                    self.connect_timeout
                ));
            }
        };
        match tokio::time::timeout(self.connect_timeout, judge(&mut c, &self.pin)).await {
            Ok(Ok(Verdict::Primary(id))) => Visit::Primary(c, id),
            Ok(Ok(Verdict::Former(id, why))) => {
                self.close_later(c);
                Visit::Former(id, why)
            }
            Ok(Ok(Verdict::Not(why))) => Visit::Not(why),
            Ok(Err(e)) => unreached(&e),
            Err(_) => Visit::Silent("no answer within the connect timeout".into()),
        }
    }

    /// Closes `c` in the background: a dead or hung server may never answer its close.
    fn close_later(&self, c: PgConnection) {
        let within = self.connect_timeout;
        tokio::spawn(async move { drop(tokio::time::timeout(within, c.close()).await) });
    }

    /// The primary among the servers, all asked at once (so that a server that does not
    /// answer costs one connect timeout, whatever its place): the one on the newest
    /// timeline when every primary tells its identity, else, and among equals, `current` or
    /// the first in the URL's order. The store takes the cluster of the one chosen when it
    /// has none yet; primaries of two clusters then are an error. More than one server of
    /// the cluster accepting writes (a former primary on an older timeline counts) is a
    /// split brain, logged as an error, and kept while a server of it does not answer. Else
    /// what each server answered.
    pub(super) async fn locate(
        &self,
        current: Option<usize>,
    ) -> std::result::Result<Found, String> {
        let n = self.servers.hosts.len();
        let mut visits = tokio::task::JoinSet::new();
        for i in 0..n {
            let me = self.clone();
            visits.spawn(async move { (i, me.visit(i).await) });
        }
        let mut answers: Vec<Visit> = (0..n).map(|_| Visit::Not("not asked".into())).collect();
        while let Some(joined) = visits.join_next().await {
            // A visit cancelled (the runtime shutting down) stays "not asked".
            if let Ok((i, visit)) = joined {
                answers[i] = visit;
            }
        }
        let primaries: Vec<(usize, Option<Identity>)> = answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Visit::Primary(_, id) => Some((i, *id)),
                _ => None,
            })
            .collect();
        if self.pin.get().cluster.is_none() {
            // Two primaries of different clusters in one URL: which one holds the runs is
            // not for the engine to guess.
            let clusters: Vec<(usize, i64)> = primaries
                .iter()
                .filter_map(|(i, id)| Some((*i, id.as_ref()?.cluster)))
                .collect();
            if let Some(&(j, other)) = clusters.iter().find(|(_, c)| *c != clusters[0].1) {
                for a in answers {
                    if let Visit::Primary(c, _) = a {
                        self.close_later(c);
                    }
                }
                return Err(format!(
                    "the URL lists primaries of different clusters: {} (system identifier {}) \
                     and {} ({other}); list one primary and its standbys",
                    self.name(clusters[0].0),
                    clusters[0].1,
                    self.name(j)
                ));
            }
        }
        // Timelines are compared only when every primary tells its own: a server that does
        // not must not lose to one that does (nor win).
        let told = primaries.iter().all(|(_, id)| id.is_some());
        let best = primaries
            .iter()
            .map(|(i, id)| {
                let timeline = if told {
                    id.map_or(0, |id| id.timeline)
                } else {
                    0
                };
                (timeline, Some(*i) == current, std::cmp::Reverse(*i))
            })
            .max()
            .map(|(_, _, std::cmp::Reverse(i))| i);
        self.split_note(&answers, best);
        let mut causes = Vec::new();
        let mut found = None;
        for (i, a) in answers.into_iter().enumerate() {
            match a {
                Visit::Primary(c, id) if Some(i) == best => found = Some((i, c, id)),
                Visit::Primary(c, _) => self.close_later(c),
                Visit::Former(_, e) | Visit::Not(e) | Visit::Silent(e) => {
                    causes.push(format!("{}: {e}", self.name(i)));
                }
            }
        }
        match found {
            Some(f) => {
                self.pin.note(f.2);
                Ok(f)
            }
            None => Err(causes.join("; ")),
        }
    }

    /// Notes the split brain a look's `answers` show, if any: more than one server accepting
    /// writes; or the last look's split, kept while the servers of it that could not be
    /// asked this time ([`Visit::Silent`]: they may still accept writes, and the operator's
    /// alert stays open) and those that accept writes are more than one. Logged as an error
    /// while it lasts; `best` is the server followed.
    fn split_note(&self, answers: &[Visit], best: Option<usize>) {
        let writable: Vec<(usize, Option<Identity>)> = answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Visit::Primary(_, id) => Some((i, *id)),
                Visit::Former(id, _) => Some((i, Some(*id))),
                Visit::Not(_) | Visit::Silent(_) => None,
            })
            .collect();
        let mut pinned = self.pin.get();
        pinned.looks += 1;
        // Kept while the servers that may accept writes are still more than one: those that
        // do, and those of the split that cannot be asked.
        let still_split = |s: &Split| {
            let unknown = s
                .members
                .iter()
                .filter(|&&i| matches!(answers.get(i), Some(Visit::Silent(_))))
                .count();
            writable.len() + unknown > 1
        };
        pinned.split = if writable.len() > 1 {
            Some(Split {
                members: writable.iter().map(|(i, _)| *i).collect(),
                names: writable
                    .iter()
                    .map(|(i, id)| match id {
                        Some(id) => format!("{} (timeline {})", self.name(*i), id.timeline),
                        None => self.name(*i),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        } else {
            pinned.split.take().filter(still_split)
        };
        let Some(split) = pinned.split.clone() else {
            return;
        };
        drop(pinned);
        let following = best.map(|i| self.name(i)).unwrap_or_default();
        if writable.len() > 1 {
            tracing::error!(
                primaries = %split.names,
                %following,
                "more than one primary of the cluster accepts writes (a split brain); \
                 following the newest timeline: fence the others, since what they commit now \
                 is on no other server"
            );
        } else {
            tracing::error!(
                primaries = %split.names,
                %following,
                "a server of the split brain does not answer: it may still accept writes, \
                 so the split brain is not over until it answers or refuses connections"
            );
        }
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
            let mut checks: u32 = 0;
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
                // The first check looks at every server too (a promotion during the open).
                let scan = checks.is_multiple_of(SCAN_EVERY);
                checks = checks.wrapping_add(1);
                if healthy && !scan {
                    continue;
                }
                match self.locate(Some(current)).await {
                    Ok((i, c, _)) if i != current => {
                        // The pool first (a move waits for nothing), then the old probe.
                        pool.set_connect_options(self.options(i));
                        self.pin.moved();
                        tracing::warn!(
                            from = %self.name(current),
                            to = %self.name(i),
                            "the primary moved; new connections go to the new primary"
                        );
                        if let Some(old) = probe.replace(c) {
                            self.close_later(old);
                        }
                        current = i;
                    }
                    Ok((_, c, _)) => {
                        if healthy {
                            self.close_later(c);
                        } else if let Some(old) = probe.replace(c) {
                            self.close_later(old);
                        }
                    }
                    Err(causes) => {
                        if !healthy {
                            if let Some(old) = probe.take() {
                                self.close_later(old);
                            }
                            tracing::warn!(
                                servers = %self.servers.list(),
                                %causes,
                                "no primary among the database servers; checking again"
                            );
                        }
                    }
                }
            }
        });
        guard
    }
}

/// The watcher of a store, stopped when the last clone of the store is dropped; and the
/// count of its moves.
#[derive(Debug, Clone)]
pub(super) struct Watcher {
    _stop: Arc<DropGuard>,
    pub(super) moves: tokio::sync::watch::Receiver<u64>,
    pub(super) pin: Arc<Pin>,
}

impl Watcher {
    pub(super) fn new(stop: DropGuard, pin: Arc<Pin>) -> Self {
        Self {
            _stop: Arc::new(stop),
            moves: pin.1.subscribe(),
            pin,
        }
    }
}

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

    #[test]
    fn a_split_brain_lasts_while_more_than_one_server_may_accept_writes() {
        let p = Primary::new(
            servers("postgres://app@a:1,b:2,c:3/orders").expect("url"),
            PgConnectOptions::new(),
            Duration::from_secs(1),
        );
        let former = |timeline| {
            Visit::Former(
                Identity {
                    cluster: 7,
                    timeline,
                },
                "refused".into(),
            )
        };
        let standby = || Visit::Not("a standby (in recovery)".into());
        let silent = || Visit::Silent("no answer within the connect timeout".into());
        // Two servers of the cluster accept writes (a refused former primary counts).
        p.split_note(&[former(1), former(2), standby()], None);
        assert_eq!(
            p.pin.split_brain().as_deref(),
            Some("a:1 (timeline 1), b:2 (timeline 2)")
        );
        // One cannot be asked while the other writes: not known to be over.
        p.split_note(&[silent(), former(2), standby()], None);
        assert!(p.pin.split_brain().is_some());
        // A server that was not in the split cannot be asked either: still one that may.
        p.split_note(&[silent(), standby(), silent()], None);
        assert_eq!(p.pin.split_brain(), None, "at most one may accept writes");
        assert_eq!(p.pin.looks(), 3);
    }

    #[test]
    fn only_a_refused_connection_says_a_server_is_down() {
        let refused = sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert!(matches!(unreached(&refused), Visit::Not(_)));
        for unknown in [
            sqlx::Error::Io(std::io::ErrorKind::HostUnreachable.into()),
            sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()),
            sqlx::Error::Protocol("too many clients".into()),
        ] {
            assert!(matches!(unreached(&unknown), Visit::Silent(_)), "{unknown}");
        }
    }

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
