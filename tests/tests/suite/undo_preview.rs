//! The preview of an undo, on both backends: what it shows of a run is what the cancel then
//! does, group by group, and a finished run's preview is refused as its cancel is.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sagaflow::{
    Engine, Error, RunState, StepContext, StepError, StepState, Undo, UndoOutcome, UndoPreview,
    Uuid, Workflow,
};
use sagaflow_testkit::{backends, eventually, expect_state, fast_builder};

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, e: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e.to_owned());
    }

    fn has(&self, e: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|x| x == e)
    }
}

/// `fanout@1`: `reserve`, then `charge` and `notify` side by side, then `hold`, which waits
/// a minute unless its cancellation token fires. Every step but `hold` has a compensation.
fn fanout(log: &Log) -> Workflow {
    let step = |name: &'static str| {
        let log = log.clone();
        move |_: StepContext| {
            log.push(name);
            async move { Ok::<_, StepError>(serde_json::json!({ "done": name })) }
        }
    };
    Workflow::builder("fanout", 1)
        .step("reserve", step("reserve"))
        .compensate(step("unreserve"))
        .step("charge", step("charge"))
        .after(["reserve"])
        .compensate(step("refund"))
        .step("notify", step("notify"))
        .after(["reserve"])
        .compensate(step("retract"))
        .step_using("hold", log.clone(), |log, _: StepContext| async move {
            log.push("hold started");
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, StepError>(())
        })
        .after(["charge", "notify"])
        .deadline(Duration::from_secs(120))
        .build()
        .expect("valid")
}

/// The steps whose compensation was queued, in the order the history records it (a group is
/// queued by one evaluation, the next once the group has finished).
async fn compensations_begun(engine: &Engine, id: Uuid) -> Vec<String> {
    engine
        .history(id)
        .await
        .expect("history")
        .iter()
        .filter_map(|h| {
            let step = h.step.as_deref()?;
            h.step_entered(step, StepState::CompensationReady)
                .then(|| step.to_owned())
        })
        .collect()
}

/// Whether `begun` is the preview's groups in order (any order within a group).
fn follows(preview: &UndoPreview, begun: &[String]) -> bool {
    let mut at = 0;
    for group in &preview.groups {
        let Some(slice) = begun.get(at..at + group.len()) else {
            return false;
        };
        let mut want: Vec<&str> = group.iter().map(|s| s.step.as_str()).collect();
        let mut got: Vec<&str> = slice.iter().map(String::as_str).collect();
        want.sort_unstable();
        got.sort_unstable();
        if want != got {
            return false;
        }
        at += group.len();
    }
    at == begun.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_of_a_cancel_is_what_the_cancel_then_does() {
    for db in backends().await {
        let b = db.backend;
        let log = Log::default();
        let engine = fast_builder(&db)
            .with_workflow(fanout(&log))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let input = serde_json::json!({ "order": "o-1" });
        let id = engine.start("fanout", &input).await.expect("start");
        eventually(Duration::from_secs(20), "hold to start", || async {
            log.has("hold started")
        })
        .await;

        let preview = engine
            .preview_undo(id, Undo::Cancel)
            .await
            .unwrap_or_else(|e| panic!("[{b}] preview: {e}"));
        assert_eq!(
            preview.outcome,
            UndoOutcome::Compensated,
            "[{b}] {preview:?}"
        );
        assert_eq!(preview.run_state, RunState::Running, "[{b}]");
        assert_eq!(
            preview.input, input,
            "[{b}] the input every compensation reads"
        );
        let names: Vec<Vec<&str>> = preview
            .groups
            .iter()
            .map(|g| {
                let mut n: Vec<&str> = g.iter().map(|s| s.step.as_str()).collect();
                n.sort_unstable();
                n
            })
            .collect();
        assert_eq!(names, [vec!["charge", "notify"], vec!["reserve"]], "[{b}]");
        let charge = &preview.groups[0]
            .iter()
            .find(|s| s.step == "charge")
            .expect("charge");
        assert_eq!(
            charge.output,
            Some(serde_json::json!({ "done": "charge" })),
            "[{b}] the output its compensation reads"
        );
        let hold = preview
            .kept
            .iter()
            .find(|k| k.step == "hold")
            .expect("hold");
        assert!(hold.reason.contains("no compensation"), "[{b}] {hold:?}");
        assert!(
            preview.in_flight.iter().any(|s| s.contains("`hold`")),
            "[{b}] {:?}",
            preview.in_flight
        );
        // The preview wrote nothing.
        let run = engine.run(id).await.expect("read").expect("run");
        assert_eq!(run.state, RunState::Running, "[{b}]");

        engine.operator().cancel(id).await.expect("cancel");
        expect_state(&engine, id, RunState::Compensated, b).await;
        let begun = compensations_begun(&engine, id).await;
        assert!(
            follows(&preview, &begun),
            "[{b}] preview {:?}, history {begun:?}",
            preview.groups
        );

        // A finished run: the preview is refused as the cancel is.
        let err = engine
            .preview_undo(id, Undo::Cancel)
            .await
            .expect_err("a compensated run");
        assert!(matches!(err, Error::ActionNotAllowed { .. }), "[{b}] {err}");
        let err = engine
            .preview_undo(Uuid::now_v7(), Undo::Compensate)
            .await
            .expect_err("no such run");
        assert!(matches!(err, Error::RunNotFound(_)), "[{b}] {err}");
        engine.shutdown().await;
    }
}
