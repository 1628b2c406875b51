//! `sagaflow alerts list` and `sagaflow alerts ack`.

use clap::Subcommand;
use comfy_table::Table;
use sagaflow::{Alert, Engine, Uuid};
use serde::Serialize;

use crate::exit::{Failure, Outcome};
use crate::output::{self, ago, or_dash, printable};

/// What `sagaflow alerts` does.
#[derive(Debug, Subcommand)]
pub(crate) enum AlertsCommand {
    /// Lists the open alerts, oldest first (of every engine sharing the database).
    List {
        /// Resolved alerts too, with who resolved each and why.
        #[arg(long)]
        all: bool,
        /// Only the alerts of this run.
        #[arg(long, value_name = "ID")]
        run: Option<Uuid>,
    },
    /// Acknowledges (resolves) an open alert, storing who and why with it.
    Ack {
        /// The alert's id (the first column of `alerts list`).
        id: i64,
        /// Why it needs no more attention (stored with the alert as its resolution; 1 to
        /// 2,000 characters).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who acknowledges; default: SAGAFLOW_OPERATOR, else the OS user.
        #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
        operator: Option<String>,
    },
    /// Lists the deliveries of notices (alerts, run notifications) to the sinks, most
    /// recently changed first: `--dead` for the dead letters a sink gave up on.
    Deliveries {
        /// Only the dead-lettered ones.
        #[arg(long)]
        dead: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
    },
    /// Sends a dead-lettered notice again to the sinks that gave up on it (the supervisor
    /// leader of a running engine delivers it).
    Redeliver {
        /// The notice (the first column of `alerts deliveries`).
        notice: i64,
        /// Why (logged with the operator).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Who; default: SAGAFLOW_OPERATOR, else the OS user.
        #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
        operator: Option<String>,
    },
}

/// `alerts deliveries --json`: the answer of `GET /api/v1/deliveries`.
#[derive(Debug, Serialize)]
struct DeliveriesAnswer {
    deliveries: Vec<sagaflow::Delivery>,
}

/// `alerts redeliver --json`.
#[derive(Debug, Serialize)]
struct RedeliverAnswer {
    notice_id: i64,
    redelivered: bool,
    actor: String,
    reason: String,
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

/// The alerts as a table; with `resolved`, who resolved each and why.
pub(crate) fn table<'a>(alerts: impl Iterator<Item = &'a Alert>, resolved: bool) -> Table {
    let mut header = vec!["ALERT", "KIND", "RUN", "STEP", "AGE", "STATUS", "REASON"];
    if resolved {
        header.extend(["RESOLVED BY", "RESOLUTION"]);
    }
    let mut t = output::table(&header);
    for a in alerts {
        let mut row = vec![
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
        ];
        if resolved {
            row.push(printable(a.resolved_by.as_deref()));
            row.push(printable(a.resolution.as_deref()));
        }
        t.add_row(row);
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
                output::print_table(&table(alerts.iter(), all));
            }
            Ok(())
        }
        AlertsCommand::Ack {
            id,
            reason,
            operator,
        } => {
            let (op, actor, reason) = crate::act::on_behalf(engine, &reason, operator.as_deref())?;
            if !op.resolve_alert(id).await? {
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
        AlertsCommand::Deliveries { dead, limit } => {
            let state = dead.then_some(sagaflow::DeliveryState::Dead);
            let deliveries = engine.deliveries(state, limit).await?;
            if json {
                return output::json(&DeliveriesAnswer { deliveries });
            }
            if deliveries.is_empty() {
                output::line(if dead {
                    "no dead letters"
                } else {
                    "no deliveries"
                });
                return Ok(());
            }
            let mut t = output::table(&[
                "NOTICE",
                "TOPIC",
                "ALERT",
                "RUN",
                "SINK",
                "STATE",
                "TRIES",
                "CHANGED",
                "LAST ERROR",
            ]);
            for d in &deliveries {
                t.add_row([
                    d.notice_id.to_string(),
                    d.topic.to_string(),
                    d.alert_id.map_or_else(|| "-".to_owned(), |a| a.to_string()),
                    d.run_id.map_or_else(|| "-".to_owned(), |r| r.to_string()),
                    d.sink.clone(),
                    d.state.to_string(),
                    d.attempts.to_string(),
                    ago(d.updated_at),
                    or_dash(d.last_error.as_deref()),
                ]);
            }
            output::print_table(&t);
            Ok(())
        }
        AlertsCommand::Redeliver {
            notice,
            reason,
            operator,
        } => {
            let (op, actor, reason) = crate::act::on_behalf(engine, &reason, operator.as_deref())?;
            if !op.redeliver(notice).await? {
                return Err(Failure::not_found(format!(
                    "notice {notice} has no dead-lettered delivery"
                )));
            }
            if json {
                return output::json(&RedeliverAnswer {
                    notice_id: notice,
                    redelivered: true,
                    actor,
                    reason,
                });
            }
            output::line(format!(
                "notice {notice} is pending again ({actor}: {reason}); the supervisor leader delivers it"
            ));
            Ok(())
        }
    }
}
