//! `sagaflow send-event` and `sagaflow waiting`: events for waiting runs, by run id or
//! business key, recorded as sent by `cli:<operator>`; the steps waiting for a timer, an
//! event, a callback or a child run.

use clap::Args;
use sagaflow::{Engine, EventDelivery, EventTarget, Uuid};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output;

/// The arguments of `send-event`.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  sagaflow send-event manager_approval --run 0190e3c4-… --payload '{\"approved\": true}'
  sagaflow send-event manager_approval --key refund/order-17 --payload @approval.json")]
pub(crate) struct SendArgs {
    /// The event's name, as the waiting step names it.
    name: String,
    /// The run's id (or give --key).
    #[arg(
        long,
        value_name = "ID",
        required_unless_present = "key",
        conflicts_with = "key"
    )]
    run: Option<Uuid>,
    /// The run by business key instead: WORKFLOW/KEY.
    #[arg(long, value_name = "WORKFLOW/KEY")]
    key: Option<String>,
    /// The payload: JSON, or @FILE to read it from a file (default: null).
    #[arg(long, value_name = "JSON|@FILE")]
    payload: Option<String>,
    /// Who sends it, as recorded (`cli:NAME`); default: SAGAFLOW_OPERATOR, else the OS user.
    #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
    operator: Option<String>,
}

/// `send-event --json`: the answer of `POST /api/v1/runs/{id}/events/{name}`.
#[derive(Debug, Serialize)]
struct EventAnswer {
    run_id: Uuid,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    actor: String,
}

pub(crate) async fn send_event(engine: &Engine, args: SendArgs, json: bool) -> Outcome {
    let target = match (&args.run, &args.key) {
        (Some(id), _) => EventTarget::Run(*id),
        (None, Some(k)) => {
            let (workflow, key) = k
                .split_once('/')
                .filter(|(w, k)| !w.is_empty() && !k.is_empty())
                .ok_or_else(|| Failure::usage("--key is WORKFLOW/KEY, e.g. refund/order-17"))?;
            EventTarget::key(workflow, key)
        }
        (None, None) => return Err(Failure::usage("give the run's id or --key WORKFLOW/KEY")),
    };
    let name = args.name;
    let payload = payload(args.payload.as_deref())?;
    let actor = crate::act::actor(args.operator.as_deref())?;
    let delivery = engine
        .send_event_as(target, &name, &payload, &actor)
        .await?;
    let (run_id, outcome, step) = match delivery {
        EventDelivery::Delivered { run_id, step } => (run_id, "delivered", Some(step)),
        EventDelivery::Kept { run_id } => (run_id, "kept", None),
    };
    if json {
        return output::json(&EventAnswer {
            run_id,
            outcome,
            step,
            actor,
        });
    }
    match step {
        Some(step) => output::line(format!("run {run_id}: step {step} took event {name}")),
        None => output::line(format!(
            "run {run_id}: no step waits for {name} yet; the event is kept for the first that will"
        )),
    }
    Ok(())
}

/// The payload given: JSON inline or `@FILE`.
fn payload(arg: Option<&str>) -> Result<serde_json::Value, Failure> {
    let Some(arg) = arg else {
        return Ok(serde_json::Value::Null);
    };
    let text = match arg.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(format!("cannot read {path}: {e}")))?,
        None => arg.to_owned(),
    };
    serde_json::from_str(&text).map_err(|e| Failure::usage(format!("--payload is not JSON: {e}")))
}

/// `waiting --json`: the answer of `GET /api/v1/waiting`.
#[derive(Debug, Serialize)]
struct WaitingAnswer {
    run_id: Uuid,
    step: String,
    waits_for: String,
    due_at: Option<sagaflow::Timestamp>,
}

pub(crate) async fn waiting(engine: &Engine, run: Option<Uuid>, json: bool) -> Outcome {
    let steps = engine.waiting_steps(run, 1000).await?;
    let rows: Vec<WaitingAnswer> = steps
        .into_iter()
        .map(|w| WaitingAnswer {
            run_id: w.run_id,
            step: w.step,
            waits_for: w.wait.on.describe(),
            due_at: w
                .due_at
                .and_then(sagaflow::Timestamp::from_timestamp_millis),
        })
        .collect();
    if json {
        return output::json(&rows);
    }
    if rows.is_empty() {
        output::line("no step waits");
        return Ok(());
    }
    let mut t = output::table(&["RUN", "STEP", "WAITS FOR", "DUE"]);
    for r in &rows {
        t.add_row([
            r.run_id.to_string(),
            r.step.clone(),
            output::printable(Some(&r.waits_for)),
            r.due_at.map_or_else(|| "-".to_owned(), output::time),
        ]);
    }
    output::print_table(&t);
    Ok(())
}
