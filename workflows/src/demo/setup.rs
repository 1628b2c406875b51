//! Setting the demo up from its arguments: the fault-injecting services, the saga settings,
//! the header that describes them, and the engine.

use std::time::Duration;

use sagaflow::{DeadlinePolicy, Engine, WebhookSink, Workflow};
use sagaflow_testkit::services::{FaultPlan, Scripted, ServicePlans, Services};
use sagaflow_workflows::order::OrderSettings;

use super::cli::Args;
use super::database::Database;
use super::text::pct;

/// The simulated services, every one with the fault plan of the arguments.
pub(crate) fn services(args: &Args) -> Services {
    let plan = FaultPlan {
        transient: args.transient,
        hang: args.hang,
        lose_reply: args.lose_reply,
        permanent: args.permanent,
        seed: args.seed,
        latency: Duration::from_millis(args.latency_ms),
    };
    let services = Services::new(ServicePlans::uniform(plan));
    // Guarantee the operator act has something to show: the first refund is refused once.
    services.script("refund", vec![Scripted::Permanent]);
    services
}

/// The order saga's settings: the step deadline, extended by the supervisor up to 4x.
pub(crate) fn order_settings(args: &Args) -> OrderSettings {
    let deadline = Duration::from_millis(args.deadline_ms);
    OrderSettings {
        deadline: DeadlinePolicy::new(deadline, deadline * 4),
        ..OrderSettings::default()
    }
}

/// Prints what the demo is about to run, on what, with which faults.
pub(crate) fn print_header(args: &Args, db: &Database, settings: &OrderSettings) {
    let max_failures = settings
        .retry
        .max_failures
        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
    println!(
        "sagaflow demo · {} order sagas: reserve stock → charge card → ship",
        args.orders
    );
    println!("  database   {}", db.label);
    println!(
        "  faults     {} transient · {} hung · {} lost replies · {} permanent (forward calls only), on every service · seed {}",
        pct(args.transient),
        pct(args.hang),
        pct(args.lose_reply),
        pct(args.permanent),
        args.seed
    );
    println!(
        "  steps      deadline {} ms (up to {} ms after timeouts) · {max_failures} failures max · {} in flight",
        args.deadline_ms,
        args.deadline_ms * 4,
        args.concurrency
    );
    if let Some(url) = &args.webhook {
        println!(
            "  webhook    alerts to {} · signed with ${}",
            sagaflow::redact_url(url),
            args.webhook_secret_env
        );
    }
    if args.no_operator {
        println!("  operator   off: the refund refused on purpose stays refused");
    } else {
        println!(
            "  operator   the first refund is refused on purpose; the operator fixes it at the end"
        );
    }
}

/// Starts the engine on `db` with the order saga, delivering alerts to `webhook` too when
/// given; the error says which database failed.
pub(crate) async fn start_engine(
    args: &Args,
    db: &Database,
    workflow: Workflow,
    webhook: Option<WebhookSink>,
) -> Result<Engine, sagaflow_workflows::Error> {
    let mut builder = Engine::builder()
        .with_database_url(db.url.clone())
        .with_workflow(workflow)
        .with_max_in_flight(args.concurrency as usize)
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(200))
        .with_delivery_interval(Duration::from_millis(200))
        .with_lease(Duration::from_secs(3), Duration::from_secs(1))
        .with_retention(None);
    if let Some(sink) = webhook {
        builder = builder.with_notice_sink(sink);
    }
    builder.start().await.map_err(|e| {
        let which = if db.own {
            "the demo database"
        } else {
            "that database"
        };
        sagaflow_workflows::Error::engine(format!("cannot start the engine on {which}"), e)
    })
}
