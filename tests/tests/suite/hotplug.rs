//! Workflow definitions registered and unregistered on running engines, on both backends:
//! a type registered on one instance runs there and never on an instance that lacks it; runs
//! of a type no live instance runs wait (alerted) until one registers it; unregistering hands
//! new work to the instances that still run the type while an attempt in flight finishes and
//! is recorded; a definition that conflicts with the registered or published one is refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sagaflow::{
    AlertKind, Engine, EngineBuilder, Error, RunState, StepContext, StepError, Uuid, Workflow,
};
use sagaflow_testkit::{TestDb, backends, eventually, expect_state, fast_builder};
use serde_json::json;
use tokio::sync::Semaphore;

/// What the steps ran: `instance:step:run` (`instance/started:step:run` when a held step
/// begins).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, entry: String) {
        self.0.lock().expect("log").push(entry);
    }

    /// The instances that ran `step` of `run`.
    fn ran(&self, step: &str, run: Uuid) -> Vec<String> {
        let suffix = format!(":{step}:{run}");
        self.0
            .lock()
            .expect("log")
            .iter()
            .filter_map(|e| e.strip_suffix(&suffix).map(str::to_owned))
            .collect()
    }
}

/// `name@1`: one step, `only`, that records which instance ran it.
fn tagged(name: &str, instance: &str, log: &Log) -> Workflow {
    let (instance, log) = (instance.to_owned(), log.clone());
    Workflow::builder(name, 1)
        .step("only", move |ctx: StepContext| {
            let entry = format!("{instance}:only:{}", ctx.run_id());
            let log = log.clone();
            async move {
                log.push(entry);
                Ok::<_, StepError>(())
            }
        })
        .build()
        .expect("valid")
}

/// `shared@1`: `first` (held by `gate` when one is given), then `second`, each recording the
/// instance that ran it.
fn two_steps(instance: &str, log: &Log, gate: Option<Arc<Semaphore>>) -> Workflow {
    let (first_tag, first_log) = (instance.to_owned(), log.clone());
    let (second_tag, second_log) = (instance.to_owned(), log.clone());
    Workflow::builder("shared", 1)
        .step("first", move |ctx: StepContext| {
            let started = format!("{first_tag}/started:first:{}", ctx.run_id());
            let entry = format!("{first_tag}:first:{}", ctx.run_id());
            let (log, gate) = (first_log.clone(), gate.clone());
            async move {
                log.push(started);
                let hold = ctx.input::<serde_json::Value>()?["hold"] == json!(true);
                if hold && let Some(gate) = gate {
                    gate.acquire().await.expect("gate").forget();
                }
                log.push(entry);
                Ok::<_, StepError>(())
            }
        })
        .step("second", move |ctx: StepContext| {
            let entry = format!("{second_tag}:second:{}", ctx.run_id());
            let log = second_log.clone();
            async move {
                log.push(entry);
                Ok::<_, StepError>(())
            }
        })
        .after(["first"])
        .build()
        .expect("valid")
}

/// `only` of `run` ran, and only under the code tagged `tag`. Steps run at least once: an
/// instance whose heartbeat is late on a loaded machine stops its attempts and runs them
/// again, which is not what these tests are about.
fn ran_only_by(log: &Log, run: Uuid, tag: &str, backend: &str) {
    let ran = log.ran("only", run);
    assert!(
        !ran.is_empty() && ran.iter().all(|t| t == tag),
        "[{backend}] `only` of {run} ran under {ran:?}, not under `{tag}` alone"
    );
}

/// An instance `id` with the workflow `base@1` (an engine starts with one at least), whose
/// supervisor checks the queues often.
fn instance(db: &TestDb, id: &str, log: &Log) -> EngineBuilder {
    fast_builder(db)
        .with_instance_id(id)
        .with_backlog_interval(Duration::from_millis(50))
        .with_workflow(tagged("base", id, log))
}

/// What the instance `id` records that it runs.
async fn recorded(engine: &Engine, id: &str) -> Vec<String> {
    engine
        .instances()
        .await
        .expect("instances")
        .into_iter()
        .find(|i| i.id == id)
        .and_then(|i| i.workflows)
        .unwrap_or_else(|| panic!("instance {id} records its workflows"))
}

async fn open_coverage_alerts(engine: &Engine, key: &str) -> usize {
    engine
        .open_alerts()
        .await
        .expect("alerts")
        .iter()
        .filter(|a| a.kind == AlertKind::NoInstanceForWorkflow && a.reason.contains(key))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hotplug_a_type_registered_at_run_time_runs_on_its_instance_and_never_on_others() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let a = instance(&db, "a", &log).start().await.expect("a");
        let other = instance(&db, "b", &log).start().await.expect("b");
        assert!(matches!(
            a.start("fresh", &json!({})).await,
            Err(Error::WorkflowNotFound(_))
        ));
        a.register(tagged("fresh", "a", &log))
            .await
            .unwrap_or_else(|e| panic!("[{b}] register: {e}"));
        assert_eq!(a.workflows(), ["base@1", "fresh@1"], "[{b}]");
        assert_eq!(other.workflows(), ["base@1"], "[{b}]");
        assert_eq!(recorded(&a, "a").await, ["base@1", "fresh@1"], "[{b}]");
        assert_eq!(recorded(&a, "b").await, ["base@1"], "[{b}]");
        assert!(
            a.definitions()
                .await
                .expect("definitions")
                .iter()
                .any(|d| d.key == "fresh@1"),
            "[{b}] registering publishes the definition"
        );
        let mut runs = Vec::new();
        for n in 0..8 {
            runs.push(a.start("fresh", &json!({ "n": n })).await.expect("start"));
        }
        // Both instances poll for work all along; only the one that runs the type claims it.
        for id in &runs {
            expect_state(&a, *id, RunState::Completed, b).await;
            assert_eq!(log.ran("only", *id), ["a"], "[{b}] run {id}");
        }
        assert!(matches!(
            other.start("fresh", &json!({})).await,
            Err(Error::WorkflowNotFound(_))
        ));
        a.shutdown().await;
        other.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hotplug_runs_of_a_type_no_instance_runs_wait_alerted_until_one_registers_it() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let a = instance(&db, "a", &log).start().await.expect("a");
        // A client that knows the workflow starts a run of it; no worker runs it.
        let client = fast_builder(&db)
            .with_workers(false)
            .with_workflow(tagged("orphan", "client", &log))
            .start()
            .await
            .expect("client");
        let id = client.start("orphan", &json!({})).await.expect("start");
        eventually(
            Duration::from_secs(10),
            "the leader alerts that no instance runs orphan@1",
            || async { open_coverage_alerts(&a, "orphan@1").await == 1 },
        )
        .await;
        let run = a.run(id).await.expect("read").expect("the run is kept");
        assert!(!run.state.is_terminal(), "[{b}] the run waits: {run:?}");
        assert!(log.ran("only", id).is_empty(), "[{b}]");
        // One alert per workflow, however many passes see it.
        let second = client.start("orphan", &json!({})).await.expect("start");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(open_coverage_alerts(&a, "orphan@1").await, 1, "[{b}]");
        a.register(tagged("orphan", "a", &log))
            .await
            .unwrap_or_else(|e| panic!("[{b}] register: {e}"));
        for run in [id, second] {
            expect_state(&a, run, RunState::Completed, b).await;
            assert_eq!(log.ran("only", run), ["a"], "[{b}]");
        }
        eventually(
            Duration::from_secs(10),
            "the alert resolves once an instance runs orphan@1",
            || async { open_coverage_alerts(&a, "orphan@1").await == 0 },
        )
        .await;
        let resolved = a
            .all_alerts()
            .await
            .expect("alerts")
            .into_iter()
            .find(|a| a.kind == AlertKind::NoInstanceForWorkflow)
            .expect("the alert");
        assert_eq!(
            resolved.resolved_by.as_deref(),
            Some(sagaflow::RESOLVED_BY_ENGINE),
            "[{b}]"
        );
        client.shutdown().await;
        a.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hotplug_unregistering_hands_new_runs_to_other_instances_and_lets_attempts_in_flight_finish()
 {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let gate = Arc::new(Semaphore::new(0));
        let a = instance(&db, "a", &log)
            .with_workflow(two_steps("a", &log, Some(gate.clone())))
            .start()
            .await
            .expect("a");
        let other = instance(&db, "b", &log).start().await.expect("b");
        // The first step of this run is held on `a` while `a` unregisters the type.
        let held = a
            .start("shared", &json!({ "hold": true }))
            .await
            .expect("start");
        eventually(Duration::from_secs(10), "a holds the first step", || {
            let log = log.clone();
            async move { log.ran("first", held).iter().any(|e| e == "a/started") }
        })
        .await;
        other
            .register(two_steps("b", &log, None))
            .await
            .unwrap_or_else(|e| panic!("[{b}] register on b: {e}"));
        a.unregister("shared", 1)
            .await
            .unwrap_or_else(|e| panic!("[{b}] unregister: {e}"));
        assert_eq!(a.workflows(), ["base@1"], "[{b}]");
        assert_eq!(recorded(&a, "a").await, ["base@1"], "[{b}]");
        assert_eq!(recorded(&a, "b").await, ["base@1", "shared@1"], "[{b}]");
        assert!(matches!(
            a.start("shared", &json!({})).await,
            Err(Error::WorkflowNotFound(_))
        ));
        assert!(matches!(
            a.unregister("shared", 1).await,
            Err(Error::WorkflowNotFound(_))
        ));
        let mut runs = Vec::new();
        for n in 0..6 {
            runs.push(
                other
                    .start("shared", &json!({ "n": n }))
                    .await
                    .expect("start"),
            );
        }
        gate.add_permits(1);
        // The attempt in flight on `a` finishes and is recorded; the run's next step goes
        // to the instance that still runs the type.
        let run = expect_state(&a, held, RunState::Completed, b).await;
        assert_eq!(log.ran("first", held), ["a/started", "a"], "[{b}]");
        assert_eq!(log.ran("second", held), ["b"], "[{b}]");
        assert!(run.error.is_none(), "[{b}]");
        for id in &runs {
            expect_state(&other, *id, RunState::Completed, b).await;
            assert_eq!(log.ran("first", *id), ["b/started", "b"], "[{b}] run {id}");
            assert_eq!(log.ran("second", *id), ["b"], "[{b}] run {id}");
        }
        a.shutdown().await;
        other.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hotplug_a_definition_conflicting_with_the_registered_or_published_one_is_refused() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let a = instance(&db, "a", &log)
            .with_workflow(tagged("shape", "a", &log))
            .start()
            .await
            .expect("a");
        let other = instance(&db, "b", &log).start().await.expect("b");
        // The same name and version with another step graph.
        let changed = || {
            Workflow::builder("shape", 1)
                .step("only", |_: StepContext| async { Ok::<_, StepError>(()) })
                .step("more", |_: StepContext| async { Ok::<_, StepError>(()) })
                .after(["only"])
                .build()
                .expect("valid")
        };
        let e = a.register(changed()).await.expect_err("refused");
        assert!(
            matches!(&e, Error::InvalidDefinition { workflow, .. } if workflow == "shape")
                && e.to_string().contains("registered on this instance")
                && e.to_string().contains("new version"),
            "[{b}] {e}"
        );
        let e = other.register(changed()).await.expect_err("refused");
        assert!(
            e.to_string().contains("published") && e.to_string().contains("new version"),
            "[{b}] {e}"
        );
        // Nothing changed: what each instance runs and records, and the published graph.
        assert_eq!(a.workflows(), ["base@1", "shape@1"], "[{b}]");
        assert_eq!(other.workflows(), ["base@1"], "[{b}]");
        assert_eq!(recorded(&a, "b").await, ["base@1"], "[{b}]");
        let published = a
            .definitions()
            .await
            .expect("definitions")
            .into_iter()
            .find(|d| d.key == "shape@1")
            .expect("published");
        let steps = published.description.expect("decodes").steps.len();
        assert_eq!(steps, 1, "[{b}]");
        let id = a.start("shape", &json!({})).await.expect("start");
        expect_state(&a, id, RunState::Completed, b).await;
        ran_only_by(&log, id, "a", b);
        // The same graph is accepted (and its code put in place of the old one).
        a.register(tagged("shape", "a2", &log))
            .await
            .unwrap_or_else(|e| panic!("[{b}] same graph: {e}"));
        let id = a.start("shape", &json!({})).await.expect("start");
        expect_state(&a, id, RunState::Completed, b).await;
        ran_only_by(&log, id, "a2", b);
        // A definition rebuilt from its description has no code to run.
        let rebuilt =
            Workflow::from_description(&tagged("other", "a", &log).describe()).expect("rebuilt");
        assert!(matches!(
            a.register(rebuilt).await,
            Err(Error::InvalidDefinition { .. })
        ));
        assert_eq!(a.workflows(), ["base@1", "shape@1"], "[{b}]");
        a.shutdown().await;
        other.shutdown().await;
    }
}
