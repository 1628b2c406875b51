//! `sagaflow`: operating a sagaflow database from a shell, without any workflow code.
//!
//! Finds and inspects runs, takes the operator's actions on them (recorded in their history
//! as `cli:<operator>`), acknowledges alerts, reads and overrides the limits of remote
//! resources, watches the queue, lists the published
//! definitions and the engine instances with what they run, applies the schema migrations on purpose, purges finished runs and
//! checks the stored history against the engine's invariants (`check`); and
//! `sagaflow serve` serves the console and the HTTP API. It runs no step and no workflow
//! code: it opens the database as a client-only engine, which never registers as a worker
//! instance. Every command but `migrate` (and `serve`, which migrates as an engine start
//! does) leaves the schema as it is and refuses one that is not this release's. The exit
//! codes are in `exit.rs` and docs/cli.md.

mod act;
mod alerts;
mod check;
mod db;
mod exit;
mod input;
mod instances;
mod output;
mod overview;
mod purge;
mod resources;
mod runs;
mod schedules;
mod schema;
mod serve;
mod versions;
mod waits;

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use sagaflow::{OperatorAction, Uuid};

use crate::act::Audit;
use crate::exit::{Failure, Outcome};

/// Operate a sagaflow database: find, inspect and fix runs, acknowledge alerts, tune the
/// limits of remote resources, watch the queue, migrate the schema, purge finished runs, or
/// serve the console and HTTP API.
#[derive(Debug, Parser)]
#[command(
    name = "sagaflow",
    version,
    after_help = "\
Exit codes: 0 done; 1 failure (database unreachable, ...); 2 usage; 3 run, step, alert or \
resource not found; 4 action refused in the run's state; 5 schema not this release's (`sagaflow migrate`); \
6 `check` found violations.

Examples:
  sagaflow runs list --state error --database-url ./orders.db
  sagaflow runs show 0190c0de-... 
  sagaflow retry 0190c0de-... --reason \"card service is back\""
)]
struct Cli {
    /// The database: an SQLite file's path (never created), an `sqlite:` URL, or a
    /// `postgres://` URL. Default: SAGAFLOW_DATABASE_URL, else DATABASE_URL.
    #[arg(
        long,
        global = true,
        env = db::DATABASE_URL_ENV,
        value_name = "URL",
        hide_env_values = true
    )]
    database_url: Option<String>,

    /// A PostgreSQL read replica of the database (a streaming standby, or a load balancer in
    /// front of several) to read lists, counts and overviews from: `serve`'s console and API
    /// reads, and the reading commands. They may lag; writes and operator actions go to the
    /// database.
    #[arg(
        long,
        global = true,
        env = db::READ_REPLICA_ENV,
        value_name = "URL",
        hide_env_values = true
    )]
    read_replica: Option<String>,

    /// Machine output: one JSON document on standard output (shapes in docs/cli.md).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists runs, or shows one.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Shows a run's history, oldest first: every transition, attempt and operator action.
    History {
        /// The run's id.
        run: Uuid,
    },
    /// Follows a run: its history, then each new event and each step's progress as they
    /// come, until it finishes (`--json`: one JSON object a line).
    #[command(after_help = "\
Examples:
  sagaflow follow 0190c0de-...
  sagaflow follow 0190c0de-... --after 41.0    # resume after the event at 41.0")]
    Follow {
        /// The run's id.
        run: Uuid,
        /// Resume after this position (the first column of a line printed before).
        #[arg(long, value_name = "POSITION")]
        after: Option<String>,
    },
    /// Retries a failed step (or failed compensation) of a run in `error`.
    Retry {
        #[command(flatten)]
        audit: Audit,
        /// The step; default: the run's failed step, when it has exactly one.
        #[arg(long, value_name = "STEP")]
        step: Option<String>,
    },
    /// Resumes a run in `error` or `paused`, retrying the failed steps of its phase.
    Resume(Audit),
    /// Compensates a run that is not finished: undoes what its steps did, in reverse order
    /// (`--dry-run`: shows what it would undo, and writes nothing).
    Compensate(act::UndoArgs),
    /// Cancels a run that is not finished: stops its attempts and compensates it
    /// (`--dry-run`: shows what it would undo, and writes nothing).
    Cancel(act::UndoArgs),
    /// Gives the run's attempts in flight more time (e.g. `--by 30m`).
    Extend {
        #[command(flatten)]
        audit: Audit,
        /// How much more time: `90s`, `30m`, `2h` (at most a day).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        by: Duration,
    },
    /// Pauses a pending, running or compensating run: it starts no new step until resumed.
    Pause(Audit),
    /// Releases a run set aside for a damaged row, once the row is repaired.
    Release(Audit),
    /// Records that a step's effect was undone by hand after its compensation failed.
    MarkCompensated {
        #[command(flatten)]
        audit: Audit,
        /// The step undone by hand.
        #[arg(long, value_name = "STEP")]
        step: String,
    },
    /// Rolls a run that has not passed its pivot back to a step: the steps after it are
    /// compensated in reverse order, then run again from there (`--input`: with a new input).
    #[command(after_help = "\
Examples:
  sagaflow rollback 0190c0de-... --to reserve_stock --reason \"charged the wrong amount\"
  sagaflow rollback 0190c0de-... --to reserve_stock --input @fixed.json --reason \"amount fixed\"")]
    Rollback {
        #[command(flatten)]
        audit: Audit,
        /// The step to go back to: it and the steps it depends on stay done.
        #[arg(long = "to", value_name = "STEP")]
        step: String,
        /// The input the run goes forward with: JSON, or `@FILE` (`@-`: standard input);
        /// default: its own.
        #[arg(long, value_name = "JSON|@FILE")]
        input: Option<String>,
    },
    /// Lists or acknowledges alerts.
    #[command(subcommand)]
    Alerts(alerts::AlertsCommand),
    /// Lists the remote resources and their limits (the default), or changes a resource's
    /// limits: `set` overrides them for every instance, `reset` clears the override.
    Resources {
        #[command(subcommand)]
        command: Option<resources::ResourcesCommand>,
    },
    /// Sends an event to a run (by id, or by business key): the step waiting for it takes
    /// it; if none waits yet, it is kept for the first that will.
    SendEvent(waits::SendArgs),
    /// Lists the steps waiting for a timer, an event, a callback or a child run, with when
    /// their time comes.
    Waiting {
        /// Only this run's.
        #[arg(long, value_name = "ID")]
        run: Option<Uuid>,
    },
    /// Lists the recurring schedules with their next tick (the default), or pauses or
    /// resumes one on every instance.
    Schedules {
        #[command(subcommand)]
        command: Option<schedules::SchedulesCommand>,
    },
    /// The queue: steps ready, scheduled and running and the oldest wait, in all and per
    /// workflow; runs per workflow and state; recent throughput.
    Queue,
    /// The workflow definitions engines published: name, version, steps.
    Definitions,
    /// The engine instances registered on the database: live or not, and the workflows
    /// (`name@version`) each of them runs.
    Instances,
    /// Applies the schema migrations the database lacks, under the engines' migration lock.
    #[command(after_help = "\
Other commands never migrate: on a database that lacks migrations they exit with code 5.")]
    Migrate {
        /// Print the SQL the pending migrations would execute, and change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Deletes finished runs (with their history and alerts) older than an age, as the
    /// supervisor's retention does.
    Purge {
        /// The age: runs that finished longer ago go (`30d`, `12h`).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Duration,
        /// Count them, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Checks every run against the engine's invariants: its history is a path of the
    /// transition tables, no finished run has a step in flight, a compensated run undid every
    /// step that may have acted, no two attempts of a step overlap, and no unfinished run is
    /// stuck. Reads only; prints each violation with its history lines.
    #[command(after_help = "\
Exits with code 6 when it finds a violation, 0 when none.")]
    Check,
    /// Prints a completion script for a shell (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Serve the console and the HTTP API of a database, without any workflow code.
    ///
    /// Reads runs, definitions, alerts and statistics, acts as operator, and starts runs of
    /// the workflows that the application's engines published to the database (their newest
    /// version, the input checked against the published JSON Schema); those engines execute
    /// them. Runs no step itself. Applies the schema migrations the database lacks, as any
    /// engine start does. Every route but /healthz needs a bearer token: give a token file,
    /// or an operator token in SAGAFLOW_ADMIN_TOKEN; there is no anonymous mode.
    #[command(after_help = "\
Token file: one token per line, `name role secret`; role `read-only` or `operator`; \
secrets of 16 characters at least; `#` starts a comment line.

Examples:
  sagaflow serve --database-url ./orders.db --token-file /etc/sagaflow/tokens
  SAGAFLOW_ADMIN_TOKEN=... sagaflow serve --database-url postgres://app@db/orders \\
      --listen 0.0.0.0:8080")]
    Serve(serve::ServeArgs),
}

/// A duration as people write it (`30m`, `2h 30m`, `7d`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 90s, 30m, 2h, 7d)"))?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve(_));
    // The commands log only warnings (on standard error, never mixed with their output);
    // the server logs what it does.
    let default_filter = if serving {
        "info,sqlx=warn,sea_orm=warn"
    } else {
        "warn,sqlx=error,sea_orm=error"
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .init();
    if let Command::Completions { shell } = cli.command {
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "sagaflow", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return Failure::failed(format!("cannot start the runtime: {e}")).report(),
    };
    if let Command::Serve(args) = cli.command {
        return runtime.block_on(serve::serve(args, cli.database_url, cli.read_replica));
    }
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(f) => f.report(),
    }
}

/// Runs a command other than `serve` and `completions`.
async fn run(cli: Cli) -> Outcome {
    let url = db::url(cli.database_url.as_deref())?;
    let json = cli.json;
    if let Command::Migrate { dry_run } = cli.command {
        return schema::migrate(&url, dry_run, json).await;
    }
    let engine = db::client(&url, cli.read_replica.as_deref()).await?;
    let outcome = command(&engine, cli.command, json).await;
    engine.shutdown().await;
    outcome
}

async fn command(engine: &sagaflow::Engine, command: Command, json: bool) -> Outcome {
    match command {
        Command::Runs(c) => runs::runs(engine, c, json).await,
        Command::History { run } => runs::history(engine, run, json).await,
        Command::Follow { run, after } => runs::follow(engine, run, after.as_deref(), json).await,
        Command::Retry { audit, step } => {
            act::act(
                engine,
                &audit,
                OperatorAction::Retry,
                step,
                None,
                None,
                json,
            )
            .await
        }
        Command::Resume(a) => {
            act::act(engine, &a, OperatorAction::Resume, None, None, None, json).await
        }
        Command::Compensate(a) => act::undo(engine, a, sagaflow::Undo::Compensate, json).await,
        Command::Cancel(a) => act::undo(engine, a, sagaflow::Undo::Cancel, json).await,
        Command::Extend { audit, by } => {
            act::act(
                engine,
                &audit,
                OperatorAction::Extend,
                None,
                Some(by),
                None,
                json,
            )
            .await
        }
        Command::Pause(a) => {
            act::act(engine, &a, OperatorAction::Pause, None, None, None, json).await
        }
        Command::Release(a) => {
            act::act(engine, &a, OperatorAction::Release, None, None, None, json).await
        }
        Command::MarkCompensated { audit, step } => {
            act::act(
                engine,
                &audit,
                OperatorAction::MarkCompensated,
                Some(step),
                None,
                None,
                json,
            )
            .await
        }
        Command::Rollback { audit, step, input } => {
            let input = input.as_deref().map(crate::input::read_input).transpose()?;
            act::act(
                engine,
                &audit,
                OperatorAction::Rollback,
                Some(step),
                None,
                input,
                json,
            )
            .await
        }
        Command::Alerts(c) => alerts::alerts(engine, c, json).await,
        Command::Resources { command } => resources::resources(engine, command, json).await,
        Command::SendEvent(args) => waits::send_event(engine, args, json).await,
        Command::Waiting { run } => waits::waiting(engine, run, json).await,
        Command::Schedules { command } => schedules::schedules(engine, command, json).await,
        Command::Queue => overview::queue(engine, json).await,
        Command::Definitions => overview::definitions(engine, json).await,
        Command::Instances => instances::instances(engine, json).await,
        Command::Check => check::check(engine, json).await,
        Command::Purge {
            older_than,
            dry_run,
        } => purge::purge(engine, older_than, dry_run, json).await,
        Command::Migrate { .. } | Command::Completions { .. } | Command::Serve(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
