//! Invalid definitions fail at build time, naming the offending step (SAS-1).

use sagaflow::{DeadlinePolicy, Engine, Error, StepContext, StepError, Workflow, WorkflowBuilder};
use std::time::Duration;

fn ok() -> impl Fn(StepContext) -> std::future::Ready<Result<(), StepError>> + Send + Sync + 'static
{
    |_| std::future::ready(Ok(()))
}

fn reason(b: WorkflowBuilder) -> String {
    match b.build() {
        Err(Error::InvalidDefinition { reason, .. }) => reason,
        Err(other) => panic!("expected InvalidDefinition, got {other}"),
        Ok(wf) => panic!("expected an error, built {wf:?}"),
    }
}

#[test]
fn invalid_graphs_are_rejected_with_the_step_named() {
    let cases: Vec<(WorkflowBuilder, &str)> = vec![
        (Workflow::builder("w", 1), "no steps"),
        (
            Workflow::builder("w", 1).step("a", ok()).step("a", ok()),
            "duplicate step name `a`",
        ),
        (
            Workflow::builder("w", 1).step("a", ok()).after(["ghost"]),
            "unknown step `ghost`",
        ),
        (
            Workflow::builder("w", 1)
                .step("a", ok())
                .after(["b"])
                .step("b", ok())
                .after(["a"]),
            "dependency cycle",
        ),
        (
            Workflow::builder("w", 1).step("a", ok()).after(["a"]),
            "step `a` is part of a dependency cycle",
        ),
        (
            Workflow::builder("w", 1)
                .step("p", ok())
                .pivot()
                .step("c", ok())
                .after(["p"])
                .compensate(ok()),
            "compensatable step `c` depends on pivot step `p`",
        ),
        (
            Workflow::builder("w", 1)
                .step("r", ok())
                .retriable()
                .step("c", ok())
                .after(["r"]),
            "compensatable step `c` depends on retriable step `r`",
        ),
        (
            Workflow::builder("w", 1)
                .step("p", ok())
                .pivot()
                .compensate(ok()),
            "step `p` is pivot and cannot have a compensation",
        ),
        (
            Workflow::builder("w", 1)
                .step("p", ok())
                .pivot()
                .step("q", ok())
                .pivot(),
            "steps `p` and `q` are both pivots",
        ),
        (
            Workflow::builder("w", 1)
                .step("c", ok())
                .compensate(ok())
                .step("p", ok())
                .pivot(),
            "compensatable step `c` must run before pivot `p`",
        ),
        (
            Workflow::builder("w", 1).step("bad name!", ok()),
            "step name `bad name!`",
        ),
        (
            Workflow::builder("w", 1).compensate(ok()),
            "`compensate` called before any step",
        ),
        (
            Workflow::builder("w", 1)
                .step("a", ok())
                .deadline_policy(DeadlinePolicy::new(Duration::ZERO, Duration::ZERO)),
            "step `a`: the deadline must be positive",
        ),
    ];
    for (builder, expected) in cases {
        let r = reason(builder);
        assert!(r.contains(expected), "expected `{expected}` in `{r}`");
    }
}

#[tokio::test]
async fn an_engine_refuses_to_start_with_a_bad_definition_or_none() {
    let err = Engine::builder()
        .with_database_url("sqlite::memory:")
        .with_workflow_result(Workflow::builder("w", 1).build())
        .start()
        .await
        .expect_err("bad definition");
    assert!(matches!(err, Error::InvalidDefinition { .. }), "{err}");
    let err = Engine::builder()
        .with_database_url("sqlite::memory:")
        .start()
        .await
        .expect_err("nothing registered");
    assert!(matches!(err, Error::Config(_)), "{err}");
    let wf = || {
        Workflow::builder("w", 1)
            .step("a", ok())
            .build()
            .expect("valid")
    };
    let err = Engine::builder()
        .with_workflow(wf())
        .with_workflow(wf())
        .start()
        .await
        .expect_err("twice");
    assert!(err.to_string().contains("registered twice"), "{err}");
    let err = Engine::builder()
        .with_workflow(wf())
        .with_lease(Duration::from_secs(1), Duration::from_secs(2))
        .with_database_url("sqlite::memory:")
        .start()
        .await
        .expect_err("renew >= ttl");
    assert!(matches!(err, Error::Config(_)), "{err}");
    let err = Engine::builder()
        .with_workflow(wf())
        .with_database_url("mysql://x")
        .start()
        .await
        .expect_err("scheme");
    assert!(
        err.to_string().contains("unsupported database URL"),
        "{err}"
    );
}
