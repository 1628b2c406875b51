//! `sagaflow runs list`, `sagaflow runs show` and `sagaflow history`: reading runs.

use clap::{Args, Subcommand};
use sagaflow::{
    Alert, Engine, HistoryEvent, Run, RunOrder, RunQuery, RunState, RunSummary, Step, Uuid,
};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output::{self, ago, error_code, or_dash, time};

/// What `sagaflow runs` does.
#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// Lists runs, newest first: filter by workflow, state and business key.
    #[command(after_help = "\
Examples:
  sagaflow runs list --state error --state paused      # runs waiting for an operator
  sagaflow runs list --workflow order --key o-1
  sagaflow runs list --sort attempts --limit 20        # most failed attempts first")]
    List(ListArgs),
    /// Shows one run: its fields, its steps and its open alerts.
    Show {
        /// The run's id.
        run: Uuid,
    },
    /// Replaces the input of a run that is paused or in error and resumes it (its failed
    /// steps are retried with the new input).
    #[command(after_help = "\
Examples:
  sagaflow runs set-input 0190c0de-... --input '{\"sku\": \"A-1\"}' --reason \"sku corrected\"
  sagaflow runs set-input 0190c0de-... --input @fixed.json --reason \"address corrected\"")]
    SetInput(crate::input::SetInputArgs),
    /// Starts a new run from a step of a run in error, compensated or completed: the steps
    /// that step depends on are taken over as done (not applied again), the rest run again.
    #[command(after_help = "\
Examples:
  sagaflow runs restart 0190c0de-... --from ship --reason \"parcel lost: ship again\"
  sagaflow runs restart 0190c0de-... --from charge_card --input @fixed.json --reason \"card fixed\"")]
    Restart(crate::input::RestartArgs),
    /// Moves the unfinished runs of one version of a workflow to another: a dry run unless
    /// `--apply`.
    Migrate(crate::versions::MigrateArgs),
}

/// The filters of `runs list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only runs of this workflow.
    #[arg(long, value_name = "NAME")]
    workflow: Option<String>,
    /// Only runs in this state; repeat for several (pending, running, compensating,
    /// completed, compensated, error, paused).
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    state: Vec<RunState>,
    /// Only runs started with this business key.
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// Rows per page (at most 500).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
    limit: u32,
    /// Go on after a previous page: the cursor it printed.
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
    /// `created` (newest first) or `attempts` (most failed attempts first).
    #[arg(long, value_name = "ORDER", default_value = "created", value_parser = parse_order)]
    sort: RunOrder,
}

fn parse_state(s: &str) -> Result<RunState, String> {
    s.parse::<RunState>().map_err(|_| {
        let all: Vec<&str> = RunState::ALL.iter().map(|s| s.as_str()).collect();
        format!("no state `{s}`; the states are {}", all.join(", "))
    })
}

fn parse_order(s: &str) -> Result<RunOrder, String> {
    s.parse::<RunOrder>().map_err(|e| e.to_string())
}

/// `runs list --json`: the answer of `GET /api/v1/runs`.
#[derive(Debug, Serialize)]
struct RunsAnswer {
    runs: Vec<RunSummary>,
    damaged: Vec<String>,
    next: Option<String>,
}

/// `runs show --json`: the answer of `GET /api/v1/runs/{id}`.
#[derive(Debug, Serialize)]
struct RunAnswer {
    run: Run,
    steps: Vec<Step>,
    history: Vec<HistoryEvent>,
    alerts: Vec<Alert>,
}

/// `history --json`.
#[derive(Debug, Serialize)]
struct HistoryAnswer {
    run_id: Uuid,
    history: Vec<HistoryEvent>,
}

pub(crate) async fn runs(engine: &Engine, command: RunsCommand, json: bool) -> Outcome {
    match command {
        RunsCommand::List(args) => list(engine, args, json).await,
        RunsCommand::Show { run } => show(engine, run, json).await,
        RunsCommand::SetInput(args) => crate::input::set_input(engine, &args, json).await,
        RunsCommand::Restart(args) => crate::input::restart(engine, &args, json).await,
        RunsCommand::Migrate(args) => crate::versions::migrate(engine, &args, json).await,
    }
}

async fn list(engine: &Engine, args: ListArgs, json: bool) -> Outcome {
    let mut query = RunQuery::new()
        .states(args.state)
        .limit(args.limit)
        .order(args.sort);
    if let Some(w) = args.workflow {
        query = query.workflow(w);
    }
    if let Some(k) = args.key {
        query = query.business_key(k);
    }
    if let Some(c) = args.after {
        query = query.after(c);
    }
    let page = engine.list_runs(&query).await?;
    let damaged: Vec<String> = page.damaged.iter().map(ToString::to_string).collect();
    if json {
        return output::json(&RunsAnswer {
            runs: page.runs,
            damaged,
            next: page.next,
        });
    }
    if page.runs.is_empty() && damaged.is_empty() {
        output::line("no runs");
    } else {
        let mut t = output::table(&["ID", "WORKFLOW", "STATE", "KEY", "AGE", "ERROR"]);
        for r in &page.runs {
            t.add_row([
                r.id.to_string(),
                r.workflow.clone(),
                r.state.to_string(),
                or_dash(r.business_key.as_deref()),
                ago(r.created_at),
                error_code(r.error.as_ref()),
            ]);
        }
        output::print_table(&t);
    }
    for d in &damaged {
        output::line(format!("damaged row: {d}"));
    }
    if let Some(next) = page.next {
        output::line(format!("more: --after {next}"));
    }
    Ok(())
}

/// The run, or exit 3.
pub(crate) async fn find(engine: &Engine, id: Uuid) -> Result<Run, Failure> {
    engine
        .run(id)
        .await?
        .ok_or_else(|| Failure::from(sagaflow::Error::RunNotFound(id)))
}

async fn show(engine: &Engine, id: Uuid, json: bool) -> Outcome {
    // One snapshot: the run, its steps, history and alerts as of one moment.
    let sagaflow::RunDetail {
        run,
        steps,
        history,
        alerts,
        ..
    } = engine
        .run_detail(id)
        .await?
        .ok_or_else(|| Failure::from(sagaflow::Error::RunNotFound(id)))?;
    if json {
        return output::json(&RunAnswer {
            run,
            steps,
            history,
            alerts,
        });
    }
    let mut t = output::table(&[]);
    t.add_row(["id".to_owned(), run.id.to_string()]);
    t.add_row([
        "workflow".to_owned(),
        format!("{}@{}", run.workflow, run.version),
    ]);
    t.add_row(["state".to_owned(), run.state.to_string()]);
    t.add_row(["key".to_owned(), or_dash(run.business_key.as_deref())]);
    if let Some(from) = run.restarted_from {
        t.add_row(["restarted from".to_owned(), from.to_string()]);
    }
    if let Some(newer) = run.restarted_as {
        t.add_row(["restarted as".to_owned(), newer.to_string()]);
    }
    t.add_row([
        "created".to_owned(),
        format!("{} ({} ago)", time(run.created_at), ago(run.created_at)),
    ]);
    t.add_row(["updated".to_owned(), time(run.updated_at)]);
    if let Some(f) = run.finished_at {
        t.add_row(["finished".to_owned(), time(f)]);
    }
    t.add_row([
        "failed attempts".to_owned(),
        run.failed_attempts.to_string(),
    ]);
    if let Some(e) = &run.error {
        t.add_row(["error".to_owned(), error_code(Some(e))]);
        if let Some(m) = e.get("message").and_then(|m| m.as_str()) {
            t.add_row(["error message".to_owned(), m.to_owned()]);
        }
    }
    output::print_table(&t);
    output::line("");
    if steps.is_empty() {
        output::line("steps: none (a finished run keeps none)");
    } else {
        let mut t = output::table(&["STEP", "STATE", "ATTEMPTS", "FAILURES", "ERROR"]);
        for s in &steps {
            t.add_row([
                s.name.clone(),
                s.state.to_string(),
                format!("{}+{}", s.attempts.forward, s.attempts.compensation),
                format!("{}/{}", s.attempts.failures, s.attempts.max_failures),
                error_code(s.error.as_ref()),
            ]);
        }
        output::print_table(&t);
    }
    output::line("");
    let open: Vec<&Alert> = alerts.iter().filter(|a| a.resolved_at.is_none()).collect();
    if open.is_empty() {
        output::line("open alerts: none");
    } else {
        output::print_table(&crate::alerts::table(open.into_iter(), false));
    }
    Ok(())
}

pub(crate) async fn history(engine: &Engine, id: Uuid, json: bool) -> Outcome {
    find(engine, id).await?;
    let history = engine.history(id).await?;
    if json {
        return output::json(&HistoryAnswer {
            run_id: id,
            history,
        });
    }
    let mut t = output::table(&["AT", "EVENT", "STEP", "FROM", "TO", "BY", "DETAIL"]);
    for e in &history {
        t.add_row([
            time(e.at),
            e.kind.to_string(),
            or_dash(e.step.as_deref()),
            e.from.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            e.to.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            e.actor.clone(),
            e.detail
                .as_ref()
                .map_or_else(|| "-".to_owned(), ToString::to_string),
        ]);
    }
    output::print_table(&t);
    Ok(())
}

/// Prints a run's updates as they come, until it finishes: one line each (`--json`: one
/// JSON object each).
pub(crate) async fn follow(engine: &Engine, id: Uuid, after: Option<&str>, json: bool) -> Outcome {
    use futures_util::StreamExt as _;
    let updates = engine.follow(id, after).await.map_err(|e| match e {
        sagaflow::Error::InvalidQuery(_) => Failure::usage(e),
        e => Failure::from(e),
    })?;
    futures_util::pin_mut!(updates);
    while let Some(update) = updates.next().await {
        let update = update?;
        if json {
            output::line(serde_json::to_string(&update).unwrap_or_default());
            continue;
        }
        match update {
            sagaflow::RunUpdate::Event { position, event: e } => {
                let step = e
                    .step
                    .as_deref()
                    .map(|s| format!(" {s}"))
                    .unwrap_or_default();
                let moved = match (e.from, e.to) {
                    (Some(from), Some(to)) => format!(" {from} -> {to}"),
                    (None, Some(to)) => format!(" -> {to}"),
                    _ => String::new(),
                };
                output::line(format!(
                    "{position:<10} {} {}{step}{moved} (by {})",
                    time(e.at),
                    e.kind,
                    e.actor
                ));
            }
            sagaflow::RunUpdate::Progress { step, progress } => {
                output::line(format!("{:<10} progress {step}: {progress}", "-"));
            }
            _ => {}
        }
    }
    Ok(())
}
