//! `sagaflow migrate`: the schema migrations, applied on purpose, or shown as SQL.

use sagaflow::redact_url;
use serde::Serialize;

use crate::db;
use crate::exit::{Failure, Outcome, SCHEMA};
use crate::output;

/// `migrate --dry-run --json`.
#[derive(Debug, Serialize)]
struct PlanAnswer {
    dry_run: bool,
    pending: Vec<Planned>,
}

/// One pending migration and its SQL.
#[derive(Debug, Serialize)]
struct Planned {
    name: String,
    statements: Vec<String>,
}

/// `migrate --json`.
#[derive(Debug, Serialize)]
struct ApplyAnswer {
    dry_run: bool,
    applied: Vec<String>,
}

pub(crate) async fn migrate(url: &str, dry_run: bool, json: bool) -> Outcome {
    let conn = db::connection(url).await?;
    let target = redact_url(url);
    let failed = |e: sagaflow::sea_orm::DbErr| Failure::failed(format!("{target}: {e}"));
    let status = sagaflow_migrations::status(&conn).await.map_err(failed)?;
    if !status.unknown.is_empty() {
        return Err(Failure::new(
            SCHEMA,
            format!(
                "{target} was migrated by a newer release of sagaflow ({} unknown here): use \
                 the sagaflow command of that release",
                status.unknown.join(", ")
            ),
        ));
    }
    let result = if dry_run {
        let plan = sagaflow_migrations::plan(&conn).await.map_err(failed)?;
        print_plan(plan, json)
    } else {
        let applied = sagaflow_migrations::apply(&conn).await.map_err(failed)?;
        if json {
            output::json(&ApplyAnswer {
                dry_run: false,
                applied,
            })
        } else {
            if applied.is_empty() {
                output::line("the schema is up to date: nothing to apply");
            } else {
                for name in &applied {
                    output::line(format!("applied {name}"));
                }
                output::line(format!(
                    "the schema is up to date ({} migration(s) applied)",
                    applied.len()
                ));
            }
            Ok(())
        }
    };
    conn.close().await.map_err(failed)?;
    result
}

fn print_plan(plan: Vec<sagaflow_migrations::PlannedMigration>, json: bool) -> Outcome {
    if json {
        return output::json(&PlanAnswer {
            dry_run: true,
            pending: plan
                .into_iter()
                .map(|m| Planned {
                    name: m.name,
                    statements: m.statements,
                })
                .collect(),
        });
    }
    if plan.is_empty() {
        output::line("-- the schema is up to date: nothing to apply");
        return Ok(());
    }
    for m in &plan {
        output::line(format!("-- {}", m.name));
        for s in &m.statements {
            let s = s.trim();
            if s.ends_with(';') {
                output::line(s);
            } else {
                output::line(format!("{s};"));
            }
        }
        output::line("");
    }
    output::line(format!(
        "-- {} migration(s) pending; dry run: nothing was changed",
        plan.len()
    ));
    Ok(())
}
