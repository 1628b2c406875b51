//! The coordinator's client-only engine: it submits the runs, sends the flows' events and
//! takes the operators' cancels, but runs no step.
//!
//! It registers the same workflows as the fleet (to resolve and check the inputs of the runs
//! it starts), except version 2 of the flow: `start` takes the highest version it knows, so
//! every flow starts on version 1 and the fleet migrates it while it runs.
//!
//! It is started before the fleet, and its start is retried: engines that start at the same
//! time on one database can fail with a deadlock while they publish their workflows'
//! definitions (each publishes its workflows in one transaction, in its registry's hash
//! order, so two engines can upsert the same rows in opposite orders). The engine processes
//! retry their start for the same reason (and because PostgreSQL may be restarting).

use std::time::{Duration, Instant};

use sagaflow::Engine;
use sagaflow_testkit::services::HttpServices;
use sagaflow_tools::Error;
use sagaflow_workflows::order::{OrderApis, order_saga};

use super::mix;
use super::worker;

/// How long the coordinator keeps trying to start its client.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// Starts the client on `database_url`, for the services at `services_url`.
pub(crate) async fn start(database_url: &str, services_url: &str) -> Result<Engine, Error> {
    let http = HttpServices::new(services_url);
    let started = Instant::now();
    loop {
        let mut client = Engine::builder()
            .with_database_url(database_url)
            .with_instance_id("chaos-submitter")
            .with_workflow_result(order_saga(OrderApis::from(&http), worker::order_settings()));
        for wf in mix::workflows(&mix::Apis::from(&http), &[1])? {
            client = client.with_workflow(wf);
        }
        let attempt = client
            .with_workers(false)
            .with_pool_size(8)
            .with_retention(None)
            .start()
            .await;
        match attempt {
            Ok(engine) => return Ok(engine),
            Err(e) if started.elapsed() < START_PATIENCE => {
                println!("  the client engine did not start ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
