//! The measured saga: the order saga's shape (reserve → charge → ship) with no-op steps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::{DeadlinePolicy, Resource, RetryPolicy, StepContext, StepError, Workflow};
use uuid::Uuid;

/// When each run's first step began, by run id.
pub(crate) type Starts = Arc<Mutex<HashMap<Uuid, Instant>>>;

/// The remote resource every step names when the benchmark runs with `--resource-limit`.
pub(crate) const RESOURCE: &str = "bench-remote";

/// The resource the steps call, limited to `limit` attempts in flight, when one is given:
/// flow control's cost on the claim path, with a limit the load never reaches.
pub(crate) fn resource(limit: Option<u32>) -> Option<Resource> {
    limit.map(|n| Resource::new(RESOURCE).max_in_flight(n))
}

/// The measured saga: three no-op steps in a row, the first noting when it began; with
/// `limited`, every step calls [`RESOURCE`].
pub(crate) fn workflow(starts: Starts, limited: bool) -> sagaflow::Result<Workflow> {
    let calls = |b: sagaflow::WorkflowBuilder| if limited { b.resource(RESOURCE) } else { b };
    let noop = |name: &'static str| {
        move |_ctx: StepContext| async move {
            Ok::<_, StepError>(serde_json::json!({ "step": name, "ok": true }))
        }
    };
    let wf = Workflow::builder("bench", 1)
        .default_retry(
            RetryPolicy::default()
                .with_backoff(Duration::from_millis(10), Duration::from_millis(100)),
        )
        .default_deadline(DeadlinePolicy::new(
            Duration::from_secs(30),
            Duration::from_secs(120),
        ))
        .step("reserve", move |ctx: StepContext| {
            let starts = starts.clone();
            async move {
                starts
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(ctx.run_id())
                    .or_insert_with(Instant::now);
                Ok::<_, StepError>(serde_json::json!({ "step": "reserve", "ok": true }))
            }
        });
    let wf = calls(wf);
    let wf = calls(wf.step("charge", noop("charge")).after(["reserve"]));
    calls(wf.step("ship", noop("ship")).after(["charge"])).build()
}
