//! `sagaflow-chaos`: one bounded command that throws crashes and faults at a fleet of engine
//! processes and then proves nothing was lost, doubled or left half-done (SAS-10, AT-8).
//!
//! ```text
//! cargo run --release -p sagaflow-tools --bin sagaflow-chaos -- --orders 1000
//! ```
//!
//! The coordinator (this process) serves the simulated remote services over loopback HTTP
//! with seeded fault injection, starts `--processes` engine processes (this same binary with
//! the hidden `--worker` flag), submits `--orders` order sagas, SIGKILLs and restarts a random
//! engine process every `--kill-every-ms`, restarts PostgreSQL once mid-run (`pg_ctl restart
//! -m immediate`), and stops when every run is terminal or `--timeout-secs` is up. It then
//! checks the invariants (every run terminal, no run lost, every effect applied once, every
//! saga net-consistent, every run in `Error` alerted) and exits non-zero if one fails.
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
