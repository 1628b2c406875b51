//! `sagaflow alerts list` and `sagaflow alerts ack`.

use clap::Subcommand;
use comfy_table::Table;
use sagaflow::{Alert, Engine, Uuid};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output::{self, ago, or_dash};

/// What `sagaflow alerts` does.
#[derive(Debug, Subcommand)]
pub(crate) enum AlertsCommand {
    /// Lists the open alerts, oldest first (of every engine sharing the database).
    List {
        /// Resolved alerts too.
        #[arg(long)]
        all: bool,
        /// Only the alerts of this run.
        #[arg(long, value_name = "ID")]
        run: Option<Uuid>,
    },
    /// Acknowledges (resolves) an open alert.
    Ack {
        /// The alert's id (the first column of `alerts list`).
        id: i64,
        /// Why it needs no more attention (printed with the confirmation and in --json).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who acknowledges; default: SAGAFLOW_OPERATOR, else the OS user.
        #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
        operator: Option<String>,
    },
}

/// `alerts list --json`: the answer of `GET /api/v1/alerts`.
#[derive(Debug, Serialize)]
struct AlertsAnswer {
    alerts: Vec<Alert>,
}

/// `alerts ack --json`: the answer of `POST /api/v1/alerts/{id}/resolve`, with who and why.
#[derive(Debug, Serialize)]
struct AckAnswer {
    id: i64,
    resolved: bool,
    actor: String,
    reason: String,
}

/// The alerts as a table.
pub(crate) fn table<'a>(alerts: impl Iterator<Item = &'a Alert>) -> Table {
    let mut t = output::table(&["ALERT", "KIND", "RUN", "STEP", "AGE", "STATUS", "REASON"]);
    for a in alerts {
        t.add_row([
            a.id.to_string(),
            a.kind.to_string(),
            a.run_id.map_or_else(|| "-".to_owned(), |r| r.to_string()),
            or_dash(a.step.as_deref()),
            ago(a.created_at),
            if a.resolved_at.is_some() {
                "resolved".to_owned()
            } else {
                "open".to_owned()
            },
            a.reason.clone(),
        ]);
    }
    t
}

pub(crate) async fn alerts(engine: &Engine, command: AlertsCommand, json: bool) -> Outcome {
    match command {
        AlertsCommand::List { all, run } => {
            let mut alerts = match run {
                Some(id) => {
                    crate::runs::find(engine, id).await?;
                    engine.run_alerts(id).await?
                }
                None if all => engine.all_alerts().await?,
                None => engine.open_alerts().await?,
            };
            if !all {
                alerts.retain(|a| a.resolved_at.is_none());
            }
            if json {
                return output::json(&AlertsAnswer { alerts });
            }
            if alerts.is_empty() {
                output::line(if all { "no alerts" } else { "no open alerts" });
            } else {
                output::print_table(&table(alerts.iter()));
            }
            Ok(())
        }
        AlertsCommand::Ack {
            id,
            reason,
            operator,
        } => {
            let reason = crate::act::reason(&reason)?;
            let actor = crate::act::actor(operator.as_deref())?;
            if !engine.operator().resolve_alert(id).await? {
                return Err(Failure::not_found(format!("no open alert {id}")));
            }
            if json {
                return output::json(&AckAnswer {
                    id,
                    resolved: true,
                    actor,
                    reason,
                });
            }
            output::line(format!("alert {id} resolved by {actor}: {reason}"));
            Ok(())
        }
    }
}
