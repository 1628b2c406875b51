//! The raw ceiling of the benchmark's database, measured in the same run, through the same
//! driver and with the same durability as the engine: transactions of one `INSERT` and one
//! `UPDATE` of a single row, back to back from one client, and on PostgreSQL also from 16
//! concurrent clients. Sagaflow's workflows/s is printed as a ratio of it, so a figure means
//! something on any machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use sagaflow::internals::store::{Db, Exec};
use sagaflow::sea_orm::{ConnectOptions, Database, DbBackend, Statement};
use sagaflow::{Backend, Engine};
use sagaflow_tools::Error;

/// The table the ceiling writes to; dropped afterwards.
const TABLE: &str = "sagaflow_bench_ceiling";

/// Concurrent clients of the PostgreSQL ceiling (as many as the engine's pool).
pub(crate) const PG_CLIENTS: usize = 16;

/// One measured ceiling.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ceiling {
    /// Concurrent clients.
    pub(crate) clients: usize,
    /// Committed transactions per second.
    pub(crate) tx_per_sec: f64,
}

/// Measures the ceilings of the engine's database for `duration` each. SQLite is measured on
/// the engine's own connection (its driver and pragmas: WAL, `synchronous`), with one client
/// since SQLite has one writer; PostgreSQL on a pool of its own to the same server, with 1
/// and 16 clients.
///
/// # Errors
/// When the table cannot be created or a transaction fails.
pub(crate) async fn measure(
    engine: &Engine,
    url: &str,
    duration: Duration,
) -> Result<Vec<Ceiling>, Error> {
    let (db, client_counts): (Db, &[usize]) = match engine.backend() {
        Backend::Sqlite => (engine.store().executor().clone(), &[1]),
        Backend::Postgres => {
            let mut options = ConnectOptions::new(url.to_owned());
            options
                .max_connections(PG_CLIENTS as u32)
                .sqlx_logging(false);
            let db = Database::connect(options)
                .await
                .map_err(Error::db("connecting for the ceiling"))?;
            (Db::Pool(db), &[1, PG_CLIENTS])
        }
    };
    // Fresh, in case an interrupted run left it with rows whose ids this one would reuse.
    for sql in [
        format!("DROP TABLE IF EXISTS {TABLE}"),
        format!("CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)"),
    ] {
        db.execute_unprepared(&sql)
            .await
            .map_err(Error::db("creating the ceiling's table"))?;
    }
    let ids = Arc::new(AtomicI64::new(0));
    let mut out = Vec::new();
    for &clients in client_counts {
        let t0 = Instant::now();
        let until = t0 + duration;
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let (db, ids) = (db.clone(), ids.clone());
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    one_transaction(&db, ids.fetch_add(1, Ordering::Relaxed)).await?;
                    n += 1;
                }
                Ok::<_, Error>(n)
            }));
        }
        let mut committed = 0u64;
        for t in tasks {
            committed += t.await.map_err(Error::task("ceiling client"))??;
        }
        out.push(Ceiling {
            clients,
            tx_per_sec: committed as f64 / t0.elapsed().as_secs_f64(),
        });
    }
    db.execute_unprepared(&format!("DROP TABLE {TABLE}"))
        .await
        .map_err(Error::db("dropping the ceiling's table"))?;
    Ok(out)
}

/// One transaction: insert a row, update it, commit.
async fn one_transaction(db: &Db, id: i64) -> Result<(), Error> {
    let backend = db.backend();
    let p = if backend == DbBackend::Postgres {
        "$1"
    } else {
        "?1"
    };
    let txn = db.begin().await.map_err(Error::db("ceiling: begin"))?;
    txn.execute(Statement::from_sql_and_values(
        backend,
        format!("INSERT INTO {TABLE} (id, v) VALUES ({p}, 0)"),
        [id.into()],
    ))
    .await
    .map_err(Error::db("ceiling: insert"))?;
    txn.execute(Statement::from_sql_and_values(
        backend,
        format!("UPDATE {TABLE} SET v = v + 1 WHERE id = {p}"),
        [id.into()],
    ))
    .await
    .map_err(Error::db("ceiling: update"))?;
    txn.commit().await.map_err(Error::db("ceiling: commit"))
}

/// Prints the ceilings.
pub(crate) fn print(ceilings: &[Ceiling], duration: Duration) {
    println!(
        "\nceiling · transactions of one INSERT + one UPDATE, same driver and durability, {:.0} s each",
        duration.as_secs_f64()
    );
    for c in ceilings {
        println!(
            "  {:>2} client{}   {:.0} tx/s",
            c.clients,
            if c.clients == 1 { " " } else { "s" },
            c.tx_per_sec
        );
    }
}

/// `workflows/s` as a ratio of each ceiling: `0.55× the 1-client ceiling · …`.
pub(crate) fn ratios(wps: f64, ceilings: &[Ceiling]) -> String {
    ceilings
        .iter()
        .map(|c| {
            format!(
                "{:.2}× the {}-client ceiling",
                wps / c.tx_per_sec,
                c.clients
            )
        })
        .collect::<Vec<_>>()
        .join(" · ")
}
