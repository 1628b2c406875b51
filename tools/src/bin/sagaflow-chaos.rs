//! `sagaflow-chaos`: one bounded command that throws crashes and faults at a fleet of engine
//! processes and then proves nothing was lost, doubled or left half-done (SAS-10, AT-8).
//!
//! ```text
//! cargo run --release -p sagaflow-tools --bin sagaflow-chaos -- --orders 1000
//! ```
//!
//! The coordinator (this process) serves the simulated remote services over loopback HTTP
//! with seeded fault injection, starts `--processes` engine processes (this same binary with
//! the hidden `--worker` flag), submits a mixed workload (`--orders` order sagas, `--pairs`
//! runs with two parallel roots, some refused for good at once, `--flows` runs with an event
//! wait, a timer and a child run, migrated automatically from version 1 to 2 while they run),
//! sends the flows' events, and, spread over the run by its progress, SIGKILLs and restarts
//! random engine processes (`--kills`), freezes them (`--pauses`) and the supervisor leader
//! (`--leader-pauses`), cancels runs one by one (`--cancels`) and in bulk (`--bulk-cancels`),
//! and restarts PostgreSQL (`--pg-restarts`, `pg_ctl restart -m immediate`), while the engine
//! processes purge finished runs after a short retention window (`--retention-ms`). It stops
//! when every run is terminal or `--timeout-secs` is up, then checks the invariants (every run
//! terminal, no run lost, every effect applied at most once per key, every settled run
//! net-consistent with the ledger, every run in `Error` alerted, the history checker clean,
//! every run's planned fate met) and exits non-zero if one fails.
//!
//! Without `--database-url` it starts its own throwaway PostgreSQL cluster through
//! `scripts/pg.sh` and deletes it at the end. Either way it works in a fresh database it
//! creates on that server (`sagaflow_chaos_<id>`), so runs from earlier attempts never mix in.

mod chaos;

use std::process::ExitCode;

use clap::Parser;

use chaos::cli::Args;

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = if args.worker {
        runtime.block_on(chaos::worker::worker_main(&args))
    } else {
        runtime.block_on(chaos::coordinator::run(args))
    };
    // Hung HTTP handlers and blocking stdin readers must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    ExitCode::from(code)
}
