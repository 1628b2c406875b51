//! The operator actions: `retry`, `resume`, `compensate`, `cancel`, `extend`, `pause`,
//! `release` and `mark-compensated`, each through the engine's `Operator` (the rules the API
//! and the console follow), recorded in the run's history as done by `cli:<operator>`.

use std::time::Duration;

use clap::Args;
use sagaflow::{
    ActionArgs, Engine, Error, OperatorAction, RunState, StepState, Undo, UndoOutcome, Uuid,
};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output;

/// Environment variable naming the operator when `--as` is not given.
pub(crate) const OPERATOR_ENV: &str = "SAGAFLOW_OPERATOR";
/// Longest reason an action records (as over the API).
const REASON_MAX_CHARS: usize = sagaflow::Operator::REASON_MAX_CHARS;

/// What every action takes: the run, why, and who.
#[derive(Debug, Args)]
pub(crate) struct Audit {
    /// The run's id.
    pub(crate) run: Uuid,
    /// Why, in your words (recorded in the run's history; 1 to 2,000 characters).
    #[arg(long, value_name = "TEXT")]
    pub(crate) reason: String,
    /// Who acts, as recorded (`cli:NAME`); default: SAGAFLOW_OPERATOR, else the OS user.
    #[arg(long = "as", value_name = "NAME", env = OPERATOR_ENV)]
    pub(crate) operator: Option<String>,
}

/// What `cancel` and `compensate` take: the run, why and who, or `--dry-run` to see first
/// what the action would undo.
#[derive(Debug, Args)]
pub(crate) struct UndoArgs {
    /// The run's id.
    pub(crate) run: Uuid,
    /// Why, in your words (recorded in the run's history; 1 to 2,000 characters). Not
    /// needed with --dry-run.
    #[arg(long, value_name = "TEXT", required_unless_present = "dry_run")]
    pub(crate) reason: Option<String>,
    /// Who acts, as recorded (`cli:NAME`); default: SAGAFLOW_OPERATOR, else the OS user.
    #[arg(long = "as", value_name = "NAME", env = OPERATOR_ENV)]
    pub(crate) operator: Option<String>,
    /// Show what the action would undo, in order, and how the run would end; write
    /// nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `cancel` or `compensate`: the action, or with `--dry-run` its preview.
pub(crate) async fn undo(engine: &Engine, args: UndoArgs, undo: Undo, json: bool) -> Outcome {
    let action = match undo {
        Undo::Compensate => OperatorAction::Compensate,
        _ => OperatorAction::Cancel,
    };
    if !args.dry_run {
        let audit = Audit {
            run: args.run,
            reason: args.reason.unwrap_or_default(),
            operator: args.operator,
        };
        return act(engine, &audit, action, None, None, None, json).await;
    }
    crate::runs::find(engine, args.run).await?;
    let preview = engine.preview_undo(args.run, undo).await?;
    if json {
        return output::json(&preview);
    }
    output::line(format!(
        "run {} ({}): {action} would, if every compensation succeeds:",
        preview.run_id, preview.run_state
    ));
    for (i, group) in preview.groups.iter().enumerate() {
        let steps: Vec<String> = group
            .iter()
            .map(|s| {
                let mut text = output::printable(Some(&s.step));
                if s.maybe_applied {
                    text.push_str(" (may have taken effect)");
                }
                if let Some(r) = &s.resource {
                    text.push_str(&format!(" [resource {}]", output::printable(Some(r))));
                }
                text
            })
            .collect();
        let side = if group.len() > 1 {
            ", side by side"
        } else {
            ""
        };
        output::line(format!("  {}. undo {}{side}", i + 1, steps.join(", ")));
    }
    if preview.groups.is_empty() {
        output::line("  undo nothing");
    }
    for k in &preview.kept {
        output::line(format!(
            "  leave {} ({}): {}",
            output::printable(Some(&k.step)),
            k.state,
            k.reason
        ));
    }
    for assumed in &preview.in_flight {
        output::line(format!("  assuming {assumed}"));
    }
    let end = match preview.outcome {
        UndoOutcome::Compensated => "end compensated".to_owned(),
        UndoOutcome::StopsInError => "stop in error for an operator".to_owned(),
        UndoOutcome::GoesForward => "go forward and complete".to_owned(),
        _ => "wait".to_owned(),
    };
    match &preview.reason {
        Some(r) => output::line(format!("  and {end}: {r}")),
        None => output::line(format!("  and {end}")),
    }
    output::line("nothing was written (--dry-run)");
    Ok(())
}

/// `--json` of an action: the answer of `POST /api/v1/runs/{id}/actions/{action}`, with the
/// step acted on and the actor recorded.
#[derive(Debug, Serialize)]
struct ActionAnswer<'a> {
    id: Uuid,
    action: OperatorAction,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a str>,
    state: RunState,
    actor: &'a str,
}

/// The actor recorded: `cli:` and the operator's name (`--as`, `SAGAFLOW_OPERATOR`, else the
/// OS user: `USER`, `LOGNAME`, else the account's name).
pub(crate) fn actor(operator: Option<&str>) -> Result<String, Failure> {
    let name = operator
        .map(str::to_owned)
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .or_else(|| whoami::username().ok())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty());
    match name {
        Some(n) if n.chars().all(|c| !c.is_control()) && n.chars().count() <= 100 => {
            Ok(format!("cli:{n}"))
        }
        Some(_) => Err(Failure::usage(
            "the operator's name (--as) must be 1 to 100 printable characters",
        )),
        None => Err(Failure::usage(format!(
            "who acts? give --as NAME (or {OPERATOR_ENV}); no OS user name is set"
        ))),
    }
}

/// The operator's engine handle for an action: `engine.operator()` on behalf of the actor
/// (see [`actor`]) for the reason (see [`reason`]); also returns both, as recorded.
pub(crate) fn on_behalf<'e>(
    engine: &'e Engine,
    reason_text: &str,
    operator: Option<&str>,
) -> Result<(sagaflow::Operator<'e>, String, String), Failure> {
    let reason = reason(reason_text)?;
    let actor = actor(operator)?;
    let op = engine
        .operator()
        .on_behalf_of(actor.clone(), reason.clone());
    Ok((op, actor, reason))
}

/// The reason, trimmed, if an action can record it.
pub(crate) fn reason(text: &str) -> Result<String, Failure> {
    let r = text.trim();
    if r.is_empty() || r.chars().count() > REASON_MAX_CHARS {
        return Err(Failure::usage(format!(
            "--reason takes 1 to {REASON_MAX_CHARS} characters; it is recorded with the action"
        )));
    }
    Ok(r.to_owned())
}

/// Takes `action` on the run (`step` for the actions that name one: for `retry`, default the
/// run's only failed step; `by` for `extend`), prints the run's new state.
pub(crate) async fn act(
    engine: &Engine,
    audit: &Audit,
    action: OperatorAction,
    step: Option<String>,
    by: Option<Duration>,
    input: Option<serde_json::Value>,
    json: bool,
) -> Outcome {
    let reason = reason(&audit.reason)?;
    let actor = actor(audit.operator.as_deref())?;
    let id = audit.run;
    let mut args = ActionArgs::default();
    if action.needs_step() {
        let step = match (action, step) {
            (OperatorAction::Retry, step) => step_to_retry(engine, id, step.as_deref()).await?,
            (_, Some(step)) => known_step(engine, id, &step).await?,
            (_, None) => return Err(Failure::usage(format!("`{action}` needs --step"))),
        };
        args = args.with_step(step);
    }
    args.extension = by;
    args.input = input;
    let op = engine.operator().on_behalf_of(actor.clone(), reason);
    let state = op.perform(action, id, &args).await.map_err(|e| match e {
        Error::InvalidInput { .. } | Error::PayloadTooLarge { .. } => Failure::usage(e),
        e => Failure::from(e),
    })?;
    let step = args.step.as_deref();
    if json {
        return output::json(&ActionAnswer {
            id,
            action,
            step,
            state,
            actor: &actor,
        });
    }
    let what = match step {
        Some(s) => format!("{action} of step {s}"),
        None => action.to_string(),
    };
    output::line(format!(
        "run {id}: {what} recorded as {actor}; the run is now {state}"
    ));
    Ok(())
}

/// The run's steps, or exit 3 when the run does not exist.
async fn steps(engine: &Engine, id: Uuid) -> Result<Vec<sagaflow::Step>, Failure> {
    crate::runs::find(engine, id).await?;
    Ok(engine.steps(id).await?)
}

/// `step` when the run has it (exit 3 otherwise; a finished run keeps no steps, and the
/// engine says why it refuses then).
async fn known_step(engine: &Engine, id: Uuid, step: &str) -> Result<String, Failure> {
    let steps = steps(engine, id).await?;
    if !steps.is_empty() && !steps.iter().any(|s| s.name == step) {
        let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        return Err(Failure::not_found(format!(
            "run {id} has no step `{step}`; its steps are {}",
            names.join(", ")
        )));
    }
    Ok(step.to_owned())
}

/// The step to retry: the one named, else the run's only failed step.
async fn step_to_retry(engine: &Engine, id: Uuid, step: Option<&str>) -> Result<String, Failure> {
    if let Some(step) = step {
        return known_step(engine, id, step).await;
    }
    let steps = steps(engine, id).await?;
    let failed: Vec<&str> = steps
        .iter()
        .filter(|s| matches!(s.state, StepState::Failed | StepState::CompensationFailed))
        .map(|s| s.name.as_str())
        .collect();
    match failed.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err(Failure::refused(format!(
            "cannot retry run {id}: it has no failed step"
        ))),
        several => Err(Failure::usage(format!(
            "run {id} has several failed steps ({}): name one with --step",
            several.join(", ")
        ))),
    }
}
