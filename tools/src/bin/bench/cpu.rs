//! CPU per saga over the throughput phase, and the projection it gives (issue 32).
//!
//! The engine's CPU is this process's user + system time and, with `--processes N`, each
//! worker process's, read from `/proc/<pid>/stat` by this process before it kills the
//! workers: the coordinator already knows their pids and when the phase ends, so no worker
//! needs a signal handler or a channel back to report its own time, and a worker's start-up
//! (connecting, migrating) is left out because the first reading is taken as the clock starts.
//! PostgreSQL's CPU is that of its postmaster and all its processes, live and exited
//! ([`sagaflow_tools::cpu::postgres_server`]), when the server runs on this machine.

use std::time::Duration;

use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow::{Backend, Engine};
use sagaflow_tools::cost::{NODE_CORES, SERVER_CORES, UTILISATION, project, shared_machine};
use sagaflow_tools::cpu;

/// Where the database's CPU can be read from.
#[derive(Debug, Clone)]
pub(crate) enum Server {
    /// A PostgreSQL server whose data directory is this one.
    Postgres(String),
    /// Not readable: why.
    Unreadable(String),
    /// SQLite: the database runs inside the engine's process.
    Embedded,
}

impl Server {
    /// The database the engine uses, as far as its CPU goes.
    pub(crate) async fn of(engine: &Engine) -> Self {
        if engine.backend() == Backend::Sqlite {
            return Self::Embedded;
        }
        let conn = engine.connection();
        let dir = conn
            .query_one_raw(Statement::from_string(
                conn.get_database_backend(),
                "SHOW data_directory",
            ))
            .await;
        match dir {
            Ok(Some(row)) => match row.try_get_by_index::<String>(0) {
                Ok(d) => Self::Postgres(d),
                Err(e) => Self::Unreadable(e.to_string()),
            },
            Ok(None) => Self::Unreadable("SHOW data_directory returned nothing".into()),
            Err(e) => Self::Unreadable(format!("SHOW data_directory: {e}")),
        }
    }
}

/// CPU times at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Mark {
    this: Option<Duration>,
    workers: Vec<Option<Duration>>,
    server: Result<Duration, String>,
    machine: Option<(Duration, Duration)>,
}

/// The CPU times now of this process, of the worker processes `workers` and of `server`.
pub(crate) fn mark(server: &Server, workers: &[Option<u32>]) -> Mark {
    Mark {
        this: cpu::this_process(),
        workers: workers
            .iter()
            .map(|p| p.and_then(cpu::of_pid).map(|c| c.own))
            .collect(),
        server: match server {
            Server::Postgres(dir) => cpu::postgres_server(dir).map_err(|e| e.to_string()),
            Server::Unreadable(why) => Err(why.clone()),
            Server::Embedded => Err("embedded".into()),
        },
        machine: cpu::machine(),
    }
}

fn per_saga(d: Duration, runs: usize) -> f64 {
    d.as_secs_f64() * 1e3 / runs.max(1) as f64
}

fn line(what: &str, d: Duration, runs: usize, note: &str) {
    println!(
        "  {what:<18} {:>7.2} CPU-s · {:.3} CPU-ms/saga{note}",
        d.as_secs_f64(),
        per_saga(d, runs)
    );
}

/// Prints the CPU the throughput phase of `runs` sagas cost between `a` and `b`, and the
/// projection it gives when PostgreSQL's share is known.
pub(crate) fn print(a: &Mark, b: &Mark, runs: usize, took: Duration, server: &Server) {
    println!(
        "\ncpu · over the throughput phase (CPU-seconds: what these processes used, whatever else ran)"
    );
    let this = match (a.this, b.this) {
        (Some(x), Some(y)) => y.saturating_sub(x),
        _ => {
            println!("  engine CPU: /proc/self/stat unreadable");
            return;
        }
    };
    let mut engine = this;
    if a.workers.is_empty() {
        line(
            "engine",
            this,
            runs,
            " (one process: the engine and the benchmark client's submitters together)",
        );
    } else {
        let mut workers = Duration::ZERO;
        let mut unread = 0;
        for (x, y) in a.workers.iter().zip(&b.workers) {
            match (x, y) {
                (Some(x), Some(y)) => workers += y.saturating_sub(*x),
                _ => unread += 1,
            }
        }
        let note = if unread > 0 {
            format!(" ({unread} of them unreadable, left out)")
        } else {
            String::new()
        };
        line(
            &format!("engine, {} workers", a.workers.len()),
            workers,
            runs,
            &format!(" (the processes running the steps){note}"),
        );
        line(
            "submitting process",
            this,
            runs,
            " (a client-only engine's starts and the benchmark client)",
        );
        engine += workers;
        line("engine, all", engine, runs, "");
    }
    let server_cpu = match (&a.server, &b.server) {
        (Ok(x), Ok(y)) => {
            let d = y.saturating_sub(*x);
            line("PostgreSQL", d, runs, " (postmaster and all its processes)");
            Some(d)
        }
        (Err(e), _) | (_, Err(e)) => {
            if matches!(server, Server::Embedded) {
                println!("  SQLite runs inside the engine's process: its CPU is in the engine's");
            } else {
                println!("  PostgreSQL CPU: not on this machine ({e})");
            }
            None
        }
    };
    if let (Some((busy0, all0)), Some((busy1, all1))) = (a.machine, b.machine) {
        let (busy, all) = (busy1.saturating_sub(busy0), all1.saturating_sub(all0));
        let ours = engine + server_cpu.unwrap_or_default();
        println!(
            "  {:<18} {:>7.2} of {:.2} core-s busy; {:.2} of them not the above (other \
             work on the machine, the kernel's)",
            "machine",
            busy.as_secs_f64(),
            all.as_secs_f64(),
            busy.saturating_sub(ours).as_secs_f64()
        );
    }
    if let Some(server_cpu) = server_cpu {
        let (server_ms, engine_ms) = (per_saga(server_cpu, runs), per_saga(engine, runs));
        let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
        if let Some(bound) = shared_machine(u32::try_from(cores).unwrap_or(0), server_ms, engine_ms)
        {
            let measured = runs as f64 / took.as_secs_f64();
            println!(
                "  this machine       {cores} cores shared by the engine and PostgreSQL carry \
                 {bound:.0} sagas/s if CPU is the limit; measured {measured:.0} ({:.0}%)",
                measured * 100.0 / bound
            );
        }
        print_projection(server_ms, engine_ms);
    }
}

/// The projection from the measured costs per saga, in CPU milliseconds.
fn print_projection(server_ms: f64, engine_ms: f64) {
    println!(
        "\nprojection · CPU the only limit, {:.0}% of every core used; WAL bandwidth, fsync \
         latency, lock waits and the network not modelled",
        UTILISATION * 100.0
    );
    if server_ms <= 0.0 || engine_ms <= 0.0 {
        println!("  (no CPU measured: too few runs for the 10 ms clock ticks)");
        return;
    }
    println!(
        "  one PostgreSQL core, fully used: {:.0} sagas/s · one engine core: {:.0} sagas/s",
        1000.0 / server_ms,
        1000.0 / engine_ms
    );
    println!("  PostgreSQL cores   sagas/s   engine nodes of {NODE_CORES} cores");
    for k in SERVER_CORES {
        if let Some(p) = project(server_ms, engine_ms, k, NODE_CORES, UTILISATION) {
            println!(
                "  {:>16}   {:>7.0}   {:>5}",
                p.server_cores, p.sagas_per_s, p.engine_nodes
            );
        }
    }
}
