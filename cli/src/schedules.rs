//! `sagaflow schedules`: the recurring schedules with their next tick, and an operator's
//! pause and resume of one (`pause`, `resume`), recorded as done by `cli:<operator>`.

use clap::{Args, Subcommand};
use sagaflow::{Engine, Error, ScheduleView};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output::{self, printable};

/// What `sagaflow schedules` does (`list` without a subcommand).
#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// Lists the schedules the engines declared: workflow, expression, next tick, pause.
    List,
    /// Pauses a schedule on every instance: no tick fires until `resume`.
    #[command(after_help = "\
Example:
  sagaflow schedules pause nightly-report --reason \"warehouse closed for inventory\"")]
    Pause(Target),
    /// Resumes a paused schedule at its first tick after now (the ticks it missed while
    /// paused are not fired).
    Resume(Target),
}

/// The schedule, why, and who.
#[derive(Debug, Args)]
pub(crate) struct Target {
    /// The schedule's name (the first column of `sagaflow schedules`).
    name: String,
    /// Why, in your words (stored with a pause; 1 to 2,000 characters).
    #[arg(long, value_name = "TEXT")]
    reason: String,
    /// Who acts, as recorded (`cli:NAME`); default: SAGAFLOW_OPERATOR, else the OS user.
    #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
    operator: Option<String>,
}

/// `schedules --json`: the answer of `GET /api/v1/schedules`.
#[derive(Debug, Serialize)]
struct SchedulesAnswer {
    schedules: Vec<ScheduleView>,
}

/// `schedules pause --json` and `schedules resume --json`: the answer of the API's `POST
/// /api/v1/schedules/{name}/pause` and `/resume`.
#[derive(Debug, Serialize)]
struct PauseAnswer {
    schedule: ScheduleView,
    actor: String,
    reason: String,
}

pub(crate) async fn schedules(
    engine: &Engine,
    command: Option<SchedulesCommand>,
    json: bool,
) -> Outcome {
    match command.unwrap_or(SchedulesCommand::List) {
        SchedulesCommand::List => list(engine, json).await,
        SchedulesCommand::Pause(t) => change(engine, &t, true, json).await,
        SchedulesCommand::Resume(t) => change(engine, &t, false, json).await,
    }
}

async fn list(engine: &Engine, json: bool) -> Outcome {
    let schedules = engine.schedules().await?;
    if json {
        return output::json(&SchedulesAnswer { schedules });
    }
    if schedules.is_empty() {
        output::line("no schedules: no engine of this database declared one");
        return Ok(());
    }
    let mut t = output::table(&[
        "SCHEDULE",
        "WORKFLOW",
        "EXPRESSION",
        "ZONE",
        "NEXT TICK",
        "LAST FIRED",
        "MISSED",
        "PAUSED BY",
        "REASON",
    ]);
    for s in &schedules {
        t.add_row([
            s.name.clone(),
            s.workflow.clone(),
            s.expression.clone(),
            s.zone.clone(),
            if s.paused {
                "paused".to_owned()
            } else {
                output::time(s.next_tick_at)
            },
            s.last_fired_at.map_or_else(|| "-".to_owned(), output::time),
            s.missed.to_string(),
            printable(s.paused_by.as_deref()),
            printable(s.paused_reason.as_deref()),
        ]);
    }
    output::print_table(&t);
    Ok(())
}

async fn change(engine: &Engine, t: &Target, paused: bool, json: bool) -> Outcome {
    let (op, actor, reason) = crate::act::on_behalf(engine, &t.reason, t.operator.as_deref())?;
    let done = if paused {
        op.pause_schedule(&t.name).await
    } else {
        op.resume_schedule(&t.name).await
    };
    let schedule = match done {
        Ok(s) => s,
        Err(Error::ScheduleNotFound(_)) => {
            let names: Vec<String> = engine
                .schedules()
                .await?
                .into_iter()
                .map(|s| s.name)
                .collect();
            return Err(Failure::not_found(if names.is_empty() {
                format!(
                    "no schedule `{}`: no engine of this database declared one",
                    t.name
                )
            } else {
                format!(
                    "no schedule `{}`; the schedules are {}",
                    t.name,
                    names.join(", ")
                )
            }));
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        return output::json(&PauseAnswer {
            schedule,
            actor,
            reason,
        });
    }
    output::line(if paused {
        format!("schedule {}: paused by {actor}", t.name)
    } else {
        format!(
            "schedule {}: resumed by {actor}; next tick {}",
            t.name,
            output::time(schedule.next_tick_at)
        )
    });
    Ok(())
}
