//! `sagaflow instances`: the engine instances registered on the database and the workflows
//! each of them runs.

use sagaflow::{Engine, InstanceInfo};
use serde::Serialize;

use crate::exit::Outcome;
use crate::output::{self, printable, span, time};

/// `instances --json`: the answer of `GET /api/v1/instances`.
#[derive(Debug, Serialize)]
struct InstancesAnswer {
    instances: Vec<InstanceInfo>,
}

pub(crate) async fn instances(engine: &Engine, json: bool) -> Outcome {
    let instances = engine.instances().await?;
    if json {
        return output::json(&InstancesAnswer { instances });
    }
    if instances.is_empty() {
        output::line(
            "no engine instance registered (instances with workers register when they start)",
        );
        return Ok(());
    }
    let mut t = output::table(&["INSTANCE", "STATE", "STARTED", "SILENT", "WORKFLOWS"]);
    for i in &instances {
        let state = match (i.live, i.stopped_at) {
            (true, _) => "live",
            (false, Some(_)) => "stopped",
            (false, None) => "silent",
        };
        let workflows = i
            .workflows
            .as_ref()
            .map_or_else(|| "?".to_owned(), |w| w.join(", "));
        t.add_row([
            printable(Some(&i.id)),
            state.to_owned(),
            time(i.started_at),
            span(i.silent_ms / 1000),
            printable(Some(&workflows)),
        ]);
    }
    output::print_table(&t);
    Ok(())
}
