//! `sagaflow-demo`: runs a batch of order sagas against simulated, fault-injecting remote
//! services on an embedded SQLite file (or the database you point it at), lets an operator
//! rescue the run that needs one, and proves from the services' ledger that no effect was
//! applied twice and every saga ended net-consistent.
//!
//! ```text
//! cargo run --release -p sagaflow-workflows --bin sagaflow-demo -- --orders 200
//! ```

mod demo;

use std::fmt::Display;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use sagaflow::Engine;
use sagaflow_testkit::services::Services;
use sagaflow_workflows::order::{Order, OrderApis, order_saga};

use demo::DemoResult;
use demo::cli::Args;
use demo::database::prepare_database;
use demo::logging::{LogWriter, init_logging};
use demo::operator::operator_act;
use demo::running::{report_end, run_orders};
use demo::setup;
use demo::summary::{gather, print_report};
use demo::text::{rule, runs};
use demo::tracker::Tracker;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.transient + args.hang > 1.0 {
        eprintln!("error: --transient plus --hang must not exceed 1");
        return ExitCode::from(2);
    }
    // Checked before the database is prepared (the demo's own file is recreated then).
    let webhook = match demo::webhook::webhook_sink(&args) {
        Ok(sink) => sink,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let logs = LogWriter::default();
    init_logging(&args, logs.clone());

    let db = match prepare_database(args.database_url.as_deref()) {
        Ok(db) => db,
        Err(e) => return fail(e),
    };
    // With --serve, the API also serves /metrics: the recorder is installed before the
    // engine starts, so that the demo's runs are counted.
    if args.serve.is_some()
        && let Err(e) = sagaflow::metrics::install_prometheus()
    {
        return fail(e);
    }
    let services = setup::services(&args);
    let settings = setup::order_settings(&args);
    setup::print_header(&args, &db, &settings);
    let workflow = match order_saga(OrderApis::from(&services), settings) {
        Ok(wf) => wf,
        Err(e) => return fail(e),
    };
    let engine = match setup::start_engine(&args, &db, workflow, webhook).await {
        Ok(engine) => engine,
        Err(e) => return fail(e),
    };

    // A lost database (the SQLite file deleted or replaced under the engine) stops the demo
    // at once with the reason, rather than leaving it waiting for runs that cannot finish.
    let code = tokio::select! {
        r = run(&args, &engine, &services, &logs) => match r {
            Ok(code) => code,
            Err(e) => {
                logs.set_bar(None);
                fail(e)
            }
        },
        e = engine.fatal_error() => {
            logs.set_bar(None);
            fail(e)
        }
    };
    engine.shutdown().await;
    code
}

/// Prints `error: …` and gives the failure exit code.
fn fail(e: impl Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// The demo proper: run the orders, let the operator act, then report and check.
async fn run(
    args: &Args,
    engine: &Engine,
    services: &Services,
    logs: &LogWriter,
) -> DemoResult<ExitCode> {
    let n = args.orders as usize;
    let orders: Vec<Order> = (1..=n).map(Order::sample).collect();
    let timeout = Duration::from_secs(args.timeout_secs.unwrap_or(120 + n as u64 / 10));
    let mut tracker = Tracker::default();

    println!();
    println!("{}", rule("Running"));
    let started = Instant::now();
    let end = run_orders(engine, orders, timeout, logs, &mut tracker).await?;
    let elapsed = started.elapsed();
    if let Some(code) = report_end(end, engine, &tracker, elapsed, n).await {
        return Ok(code);
    }

    if args.no_operator {
        let waiting = tracker.tally().error;
        if waiting > 0 {
            println!();
            println!("  (--no-operator: {} left in error)", runs(waiting));
        }
    } else {
        operator_act(
            engine,
            services,
            &mut tracker,
            Duration::from_millis(args.deadline_ms * 4),
        )
        .await?;
    }

    let mut figures = gather(engine, &tracker).await?;
    if args.webhook.is_some() {
        figures.webhook = Some(demo::webhook::drain(engine).await?);
    }
    let ok = print_report(&figures, &tracker, engine, services, elapsed);
    println!();
    if let Some(addr) = args.serve {
        demo::serve::serve(engine, addr).await?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
