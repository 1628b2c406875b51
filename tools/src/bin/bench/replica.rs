//! `--read-replica URL`: what a console left open costs the primary, with and without a
//! read replica. Over a history of `--prefill-finished` runs (100,000 by default here), three
//! phases of `--console-secs` each, measured by the primary's own counters
//! (`pg_stat_database`: tuples returned and fetched, buffer blocks, transactions) and the
//! replica's:
//!
//! 1. an idle engine (its polling, heartbeat and lease), no console;
//! 2. a console open on an engine reading the primary;
//! 3. the same console on an engine given the replica (`with_read_replica`).
//!
//! "A console open" is an operator's tab following the overview (its event stream, which
//! makes the server re-read the overview every second) who also loads, once a second, the
//! overview, the runs list, a filtered list and a run's page: busier than an idle tab.

use std::time::{Duration, Instant};

use sagaflow::admin::{AdminConfig, AdminToken, Role};
use sagaflow::sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};
use sagaflow::{Engine, RunQuery, RunState};
use sagaflow_tools::Error;
use uuid::Uuid;

use super::workload::workflow;

/// Counters of one database on one server.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    tuples: i64,
    blocks: i64,
    xacts: i64,
}

impl Counters {
    async fn read(db: &DatabaseConnection) -> Result<Self, Error> {
        // A fresh snapshot: the statistics of a transaction are otherwise frozen.
        db.execute_unprepared("SELECT pg_stat_clear_snapshot()")
            .await
            .map_err(sagaflow::Error::from)?;
        let row = db
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT (tup_returned + tup_fetched)::bigint AS tuples, \
                        (blks_hit + blks_read)::bigint AS blocks, \
                        (xact_commit + xact_rollback)::bigint AS xacts \
                 FROM pg_stat_database WHERE datname = current_database()",
            ))
            .await
            .map_err(sagaflow::Error::from)?
            .ok_or_else(|| Error::Usage("pg_stat_database has no row for the database".into()))?;
        let get = |c: &str| row.try_get::<i64>("", c).map_err(sagaflow::Error::from);
        Ok(Self {
            tuples: get("tuples")?,
            blocks: get("blocks")?,
            xacts: get("xacts")?,
        })
    }

    fn per_second(self, before: Self, secs: f64) -> [f64; 3] {
        #[allow(clippy::cast_precision_loss)] // counters far below 2^52
        let rate = |a: i64, b: i64| (a - b) as f64 / secs;
        [
            rate(self.tuples, before.tuples),
            rate(self.blocks, before.blocks),
            rate(self.xacts, before.xacts),
        ]
    }
}

fn secret() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An operator with the console open on the admin server at `base` for `secs`.
async fn console_open(base: &str, token: &str, runs: &[Uuid], secs: u64) -> Result<u64, Error> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Error::Usage(e.to_string()))?;
    let login = http
        .post(format!("{base}/console/login"))
        // The token is hex: nothing to encode.
        .header(
            reqwest::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(format!("token={token}"))
        .send()
        .await
        .map_err(|e| Error::Usage(format!("console login: {e}")))?;
    let cookie = login
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .ok_or_else(|| Error::Usage("the console gave no session".into()))?
        .to_owned();
    // The overview's event stream, held open for the whole phase.
    let mut events = http
        .get(format!("{base}/console/events"))
        .header("cookie", &cookie)
        .send()
        .await
        .map_err(|e| Error::Usage(format!("console events: {e}")))?;
    let stream = tokio::spawn(async move { while let Ok(Some(_)) = events.chunk().await {} });
    let end = Instant::now() + Duration::from_secs(secs);
    let mut pages = 0;
    let mut k = 0;
    while Instant::now() < end {
        let tick = Instant::now();
        let run = runs[k % runs.len()];
        k += 1;
        for path in [
            "/console/".to_owned(),
            "/console/fragments/overview".to_owned(),
            "/console/runs".to_owned(),
            "/console/runs?state=compensated".to_owned(),
            format!("/console/runs/{run}"),
        ] {
            let r = http
                .get(format!("{base}{path}"))
                .header("cookie", &cookie)
                .send()
                .await
                .map_err(|e| Error::Usage(format!("GET {path}: {e}")))?;
            if !r.status().is_success() {
                return Err(Error::Usage(format!("GET {path}: {}", r.status())));
            }
            let _ = r.bytes().await;
            pages += 1;
        }
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    stream.abort();
    Ok(pages)
}

/// The address the engine's admin server listens on.
fn base(engine: &Engine) -> Result<String, Error> {
    engine
        .admin_addr()
        .map(|a| format!("http://{a}"))
        .ok_or_else(|| Error::Usage("the admin server did not start".into()))
}

/// Runs the three phases on the primary at `url` and the replica at `replica`.
pub(crate) async fn run(url: &str, replica: &str, prefill: u64, secs: u64) -> Result<(), Error> {
    if !url.starts_with("postgres") {
        return Err(Error::Usage(
            "--read-replica needs a PostgreSQL --database-url".into(),
        ));
    }
    let token = secret();
    let config = || -> Result<AdminConfig, Error> {
        Ok(AdminConfig::new().with_token(
            AdminToken::new("viewer", &token, Role::ReadOnly)
                .map_err(|e| Error::Usage(e.to_string()))?,
        ))
    };
    let loopback: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
    let primary = Engine::builder()
        .with_database_url(url.to_owned())
        .with_workflow(workflow(std::sync::Arc::default(), false)?)
        .with_retention(None)
        .with_admin(loopback, config()?)
        .start()
        .await?;
    println!(
        "sagaflow-bench --read-replica · machine: {}",
        sagaflow_tools::machine::describe()
    );
    let have = primary.store().run_count_finished(0).await?;
    if have < prefill {
        let t = Instant::now();
        let n = prefill - have;
        primary
            .store()
            .run_fill_finished(n, 0..i64::try_from(n).unwrap_or(i64::MAX))
            .await?;
        println!(
            "  prefilled {} finished runs with history in {:.1} s",
            prefill - have,
            t.elapsed().as_secs_f64()
        );
    }
    // Vacuumed and analysed, so that no autovacuum pass over the prefill falls into a phase.
    super::figures::settle(&primary).await;
    let reader = Engine::builder()
        .with_database_url(url.to_owned())
        .with_read_replica(replica.to_owned())
        .with_workflow(workflow(std::sync::Arc::default(), false)?)
        .with_workers(false)
        .with_retention(None)
        .with_admin(loopback, config()?)
        .start()
        .await?;
    let caught_up = Instant::now() + Duration::from_secs(600);
    while reader.replica_lag().await? != Some(Duration::ZERO) {
        if Instant::now() > caught_up {
            return Err(Error::Usage(
                "the replica did not catch up in 10 minutes".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let runs: Vec<Uuid> = primary
        .list_runs(&RunQuery::new().state(RunState::Completed))
        .await?
        .runs
        .iter()
        .map(|r| r.id)
        .collect();
    if runs.is_empty() {
        return Err(Error::Usage("no finished run to show".into()));
    }
    let (on_primary, on_replica) = (base(&primary)?, base(&reader)?);
    let p = Database::connect(url)
        .await
        .map_err(sagaflow::Error::from)?;
    let r = Database::connect(replica)
        .await
        .map_err(sagaflow::Error::from)?;
    let total = primary.store().run_count_finished(0).await?;
    println!(
        "  {total} finished runs · {secs} s per phase · counters per second (pg_stat_database)"
    );
    println!(
        "  {:<34} {:>12} {:>12} {:>9} │ {:>12} {:>12}",
        "phase", "primary tup", "primary blk", "xact", "replica tup", "replica blk"
    );
    // Unmeasured: the counters of the settling pass are published late (a session's at most
    // once a second, when it goes idle), and the caches warm up on both servers.
    for b in [&on_primary, &on_replica] {
        console_open(b, &token, &runs, 5).await?;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Two rounds of the three phases, alternating, so that a drift of the server (a
    // checkpoint, an autovacuum) does not fall on one phase only.
    let mut sums = [(0.0, 0.0); 3];
    for round in 1..=2 {
        for (i, (phase, base)) in [
            ("idle engine, no console", None),
            ("console reading the primary", Some(&on_primary)),
            ("console reading the replica", Some(&on_replica)),
        ]
        .into_iter()
        .enumerate()
        {
            let (p0, r0, t0) = (
                Counters::read(&p).await?,
                Counters::read(&r).await?,
                Instant::now(),
            );
            let pages = match base {
                Some(b) => console_open(b, &token, &runs, secs).await?,
                None => {
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                    0
                }
            };
            let took = t0.elapsed().as_secs_f64();
            let (p1, r1) = (Counters::read(&p).await?, Counters::read(&r).await?);
            let [pt, pb, px] = p1.per_second(p0, took);
            let [rt, rb, _] = r1.per_second(r0, took);
            println!(
                "  {round}. {phase:<31} {pt:>12.0} {pb:>12.0} {px:>9.1} │ {rt:>12.0} {rb:>12.0}   ({pages} pages)"
            );
            sums[i].0 += pt / 2.0;
            sums[i].1 += pb / 2.0;
        }
    }
    let [idle, before, after] = sums;
    let share = |x: (f64, f64)| (x.0 - idle.0, x.1 - idle.1);
    let (b, a) = (share(before), share(after));
    println!(
        "  the console's read load on the primary, above the idle engine's (mean of both \
         rounds): {:.0} → {:.0} tuples/s, {:.0} → {:.0} blocks/s",
        b.0, a.0, b.1, a.1
    );
    reader.shutdown().await;
    primary.shutdown().await;
    Ok(())
}
