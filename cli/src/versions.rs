//! `sagaflow runs migrate`: moves the unfinished runs of one version of a workflow to
//! another. A dry run by default (what would happen to each run); `--apply` migrates them,
//! each recorded as done by `cli:<operator>` for the reason. This command carries no workflow
//! code: it maps steps by name between the two published versions (the default mapping); a
//! migration written in Rust runs where it is registered (`Operator::migrate`, or the HTTP
//! API of an engine that has it).

use clap::Args;
use sagaflow::Engine;
use sagaflow::migration::{MigrationOutcome, MigrationPlan};

use crate::exit::{Failure, Outcome};
use crate::output;

/// The arguments of `runs migrate`.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  sagaflow runs migrate order --from 1 --to 2                    # dry run: what would happen
  sagaflow runs migrate order --from 1 --to 2 --apply --reason \"v2 adds the fraud check\"")]
pub(crate) struct MigrateArgs {
    /// The workflow.
    workflow: String,
    /// The version its runs leave.
    #[arg(long, value_name = "N")]
    from: i32,
    /// The version they move to.
    #[arg(long, value_name = "N")]
    to: i32,
    /// Migrate them (without it, nothing changes).
    #[arg(long, requires = "reason")]
    apply: bool,
    /// Why, in your words (recorded with each migrated run; 1 to 2,000 characters).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    /// Who acts, as recorded (`cli:NAME`); default: SAGAFLOW_OPERATOR, else the OS user.
    #[arg(long = "as", value_name = "NAME", env = crate::act::OPERATOR_ENV)]
    operator: Option<String>,
}

pub(crate) async fn migrate(engine: &Engine, args: &MigrateArgs, json: bool) -> Outcome {
    let plan = if args.apply {
        let (op, _, _) = crate::act::on_behalf(
            engine,
            args.reason.as_deref().unwrap_or_default(),
            args.operator.as_deref(),
        )?;
        op.migrate(&args.workflow, args.from, args.to).await?
    } else {
        engine
            .operator()
            .migration_plan(&args.workflow, args.from, args.to)
            .await?
    };
    if json {
        return output::json(&plan);
    }
    print(&plan, args.apply);
    if args.apply && plan.refused() > 0 {
        return Err(Failure::refused(format!(
            "{} run(s) refused; they stay on version {}",
            plan.refused(),
            plan.from
        )));
    }
    Ok(())
}

fn print(plan: &MigrationPlan, applied: bool) {
    let verb = if applied { "migrated" } else { "would migrate" };
    output::line(format!(
        "{}@{} → {}@{}: {} {verb}, {} refused",
        plan.workflow,
        plan.from,
        plan.workflow,
        plan.to,
        plan.migrating(),
        plan.refused()
    ));
    if plan.runs.is_empty() {
        return;
    }
    let mut t = output::table(&["RUN", "STATE", "OUTCOME", "STEPS / REASON"]);
    for r in &plan.runs {
        let detail = match r.outcome {
            MigrationOutcome::Refused => r.reason.clone().unwrap_or_default(),
            _ => r
                .steps
                .iter()
                .filter(|s| s.before != s.after || s.output_changed)
                .map(|s| {
                    let state = |x: Option<sagaflow::StepState>| {
                        x.map_or_else(|| "-".to_owned(), |s| s.to_string())
                    };
                    format!("{} {}→{}", s.step, state(s.before), state(s.after))
                })
                .collect::<Vec<_>>()
                .join(", "),
        };
        let outcome = match r.outcome {
            MigrationOutcome::Migrates => "migrates",
            MigrationOutcome::Migrated => "migrated",
            MigrationOutcome::Refused => "refused",
        };
        t.add_row([
            r.run_id.to_string(),
            r.state.to_string(),
            outcome.to_owned(),
            output::printable(Some(&detail)),
        ]);
    }
    output::print_table(&t);
}
