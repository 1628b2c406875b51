//! `sagaflow runs set-input`: an operator's corrected input for a run that is paused or in
//! error, through the engine's `Operator::replace_input` (the rules the API and the console
//! follow), recorded in the run's history with the old input and the new one; and
//! `sagaflow runs restart`, a new run from a step of a stopped or finished one
//! (`Operator::restart_from`), which may take a new input too.

use clap::Args;
use sagaflow::{Error, RunState, Uuid};
use serde::Serialize;

use crate::act::{Audit, on_behalf};
use crate::exit::{Failure, Outcome};
use crate::output;

/// `runs set-input`: the run, the new input and the audit.
#[derive(Debug, Args)]
pub(crate) struct SetInputArgs {
    #[command(flatten)]
    audit: Audit,
    /// The new input: JSON, or `@FILE` to read it from a file (`@-`: standard input).
    #[arg(long, value_name = "JSON|@FILE")]
    input: String,
}

/// `--json`: the answer of `PUT /api/v1/runs/{id}/input`.
#[derive(Debug, Serialize)]
struct InputAnswer<'a> {
    id: Uuid,
    state: RunState,
    actor: &'a str,
    reason: &'a str,
}

/// The input `--input` gives: JSON text, or the JSON in the file after `@`.
pub(crate) fn read_input(arg: &str) -> Result<serde_json::Value, Failure> {
    let (text, from) = match arg.strip_prefix('@') {
        Some("-") => {
            let text = std::io::read_to_string(std::io::stdin())
                .map_err(|e| Failure::usage(format!("cannot read the input from stdin: {e}")))?;
            (text, "standard input".to_owned())
        }
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::usage(format!("cannot read the input from {path}: {e}")))?;
            (text, path.to_owned())
        }
        None => (arg.to_owned(), "--input".to_owned()),
    };
    serde_json::from_str(&text)
        .map_err(|e| Failure::usage(format!("the input in {from} is not JSON: {e}")))
}

/// Replaces the run's input and resumes it; prints the run's new state.
pub(crate) async fn set_input(
    engine: &sagaflow::Engine,
    args: &SetInputArgs,
    json: bool,
) -> Outcome {
    let input = read_input(&args.input)?;
    let (op, actor, reason) =
        on_behalf(engine, &args.audit.reason, args.audit.operator.as_deref())?;
    let id = args.audit.run;
    let state = op.replace_input(id, input).await.map_err(|e| match e {
        Error::InvalidInput { .. } | Error::PayloadTooLarge { .. } => Failure::usage(e),
        Error::VersionNotFound { .. } => Failure::failed(format!(
            "{e}: the input is checked against the run's published definition (start an \
             engine with the workflow once to publish it)"
        )),
        e => Failure::from(e),
    })?;
    if json {
        return output::json(&InputAnswer {
            id,
            state,
            actor: &actor,
            reason: &reason,
        });
    }
    output::line(format!(
        "run {id}: input replaced, recorded as {actor}; the run is now {state}"
    ));
    Ok(())
}

/// `runs restart`: the source run, the step, the audit and an optional new input.
#[derive(Debug, Args)]
pub(crate) struct RestartArgs {
    #[command(flatten)]
    audit: Audit,
    /// The step the new run runs from; the steps it depends on are taken over as done.
    #[arg(long = "from", value_name = "STEP")]
    step: String,
    /// The new run's input: JSON, or `@FILE` (`@-`: standard input); default: the source's.
    #[arg(long, value_name = "JSON|@FILE")]
    input: Option<String>,
}

/// `--json`: the answer of `POST /api/v1/runs/{id}/restart`.
#[derive(Debug, Serialize)]
struct RestartAnswer<'a> {
    id: Uuid,
    source: Uuid,
    step: &'a str,
    reused: &'a [String],
    actor: &'a str,
    reason: &'a str,
}

/// Restarts the run from the step; prints the new run and what it took over.
pub(crate) async fn restart(engine: &sagaflow::Engine, args: &RestartArgs, json: bool) -> Outcome {
    let input = args.input.as_deref().map(read_input).transpose()?;
    let (op, actor, reason) =
        on_behalf(engine, &args.audit.reason, args.audit.operator.as_deref())?;
    let source = args.audit.run;
    let restarted = op
        .restart_from(source, &args.step, input)
        .await
        .map_err(|e| match e {
            Error::InvalidInput { .. } | Error::PayloadTooLarge { .. } => Failure::usage(e),
            Error::VersionNotFound { .. } => Failure::failed(format!(
                "{e}: the new run is built from the run's published definition (start an \
                 engine with the workflow once to publish it)"
            )),
            e => Failure::from(e),
        })?;
    if json {
        return output::json(&RestartAnswer {
            id: restarted.id,
            source,
            step: &restarted.step,
            reused: &restarted.reused,
            actor: &actor,
            reason: &reason,
        });
    }
    let reused = if restarted.reused.is_empty() {
        "nothing".to_owned()
    } else {
        restarted.reused.join(", ")
    };
    output::line(format!(
        "run {source} restarted from `{}` as run {}, recorded as {actor}; taken over as done: {reused}",
        restarted.step, restarted.id
    ));
    Ok(())
}
