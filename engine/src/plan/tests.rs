//! Transition table tests of the planner, pair by pair.

use uuid::Uuid;

use super::*;
use crate::{StepContext, StepError};

fn noop()
-> impl Fn(StepContext) -> std::future::Ready<Result<(), StepError>> + Send + Sync + 'static {
    |_| std::future::ready(Ok(()))
}

/// a → b → c, where a and b have compensations; d runs parallel to b (after a), with one.
fn saga() -> Workflow {
    Workflow::builder("t", 1)
        .step("a", noop())
        .compensate(noop())
        .step("b", noop())
        .after(["a"])
        .compensate(noop())
        .step("d", noop())
        .after(["a"])
        .compensate(noop())
        .step("c", noop())
        .after(["b", "d"])
        .build()
        .expect("valid")
}

fn run(state: RunState) -> RunRow {
    RunRow {
        id: Uuid::nil(),
        workflow: "t".into(),
        version: 1,
        business_key: None,
        state,
        input: "{}".into(),
        output: None,
        error: None,
        created_at: 0,
        updated_at: 0,
        finished_at: None,
    }
}

fn rows(states: &[(&str, StepState)]) -> Vec<StepRow> {
    states
        .iter()
        .enumerate()
        .map(|(i, (name, state))| StepRow {
            id: i as i64,
            run_id: Uuid::nil(),
            name: (*name).into(),
            state: *state,
            locked_by: None,
            complete_by: None,
            available_at: None,
            attempt: 1,
            failure_count: 0,
            max_failures: 3,
            maybe_applied: false,
            deadline_ms: 1000,
            idempotency_key: format!("k-{name}"),
            output: (*state == StepState::Completed).then(|| "1".to_string()),
            error: (*state == StepState::Failed).then(|| "{\"code\":\"x\"}".to_string()),
        })
        .collect()
}

fn moves(p: &PlanWrite) -> Vec<(String, StepState)> {
    let mut v: Vec<_> = p.steps.iter().map(|s| (s.name.clone(), s.to)).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

use StepState::*;

#[test]
fn pending_run_readies_roots_and_starts_running() {
    let wf = saga();
    let p = evaluate(
        &wf,
        &run(RunState::Pending),
        &rows(&[
            ("a", NotStarted),
            ("b", NotStarted),
            ("d", NotStarted),
            ("c", NotStarted),
        ]),
    )
    .expect("plan");
    assert_eq!(moves(&p), vec![("a".into(), Ready)]);
    assert_eq!(p.run_state, Some(RunState::Running));
}

#[test]
fn completed_dependency_readies_parallel_branches_and_join_waits_for_both() {
    let wf = saga();
    let p = evaluate(
        &wf,
        &run(RunState::Running),
        &rows(&[
            ("a", Completed),
            ("b", NotStarted),
            ("d", NotStarted),
            ("c", NotStarted),
        ]),
    )
    .expect("plan");
    assert_eq!(moves(&p), vec![("b".into(), Ready), ("d".into(), Ready)]);
    let p = evaluate(
        &wf,
        &run(RunState::Running),
        &rows(&[
            ("a", Completed),
            ("b", Completed),
            ("d", Running),
            ("c", NotStarted),
        ]),
    )
    .expect("plan");
    assert!(p.steps.is_empty(), "join must wait: {:?}", moves(&p));
    assert_eq!(p.run_state, None);
}

#[test]
fn all_completed_completes_the_run_with_outputs() {
    let wf = saga();
    let p = evaluate(
        &wf,
        &run(RunState::Running),
        &rows(&[
            ("a", Completed),
            ("b", Completed),
            ("d", Completed),
            ("c", Completed),
        ]),
    )
    .expect("plan");
    assert_eq!(p.run_state, Some(RunState::Completed));
    let out: serde_json::Value =
        serde_json::from_str(p.run_output.as_deref().expect("output")).expect("json");
    assert_eq!(out["c"], 1);
}

#[test]
fn failure_compensates_in_reverse_topological_order() {
    let wf = saga();
    // c failed after b and d completed: b and d are undone first, a waits for both.
    let p = evaluate(
        &wf,
        &run(RunState::Running),
        &rows(&[
            ("a", Completed),
            ("b", Completed),
            ("d", Completed),
            ("c", Failed),
        ]),
    )
    .expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensating));
    assert_eq!(
        moves(&p),
        vec![
            ("b".into(), CompensationReady),
            ("d".into(), CompensationReady)
        ]
    );
    assert!(p.run_error.is_some());
    let p = evaluate(
        &wf,
        &run(RunState::Compensating),
        &rows(&[
            ("a", Completed),
            ("b", Compensated),
            ("d", Compensating),
            ("c", Failed),
        ]),
    )
    .expect("plan");
    assert!(p.steps.is_empty());
    let p = evaluate(
        &wf,
        &run(RunState::Compensating),
        &rows(&[
            ("a", Completed),
            ("b", Compensated),
            ("d", Compensated),
            ("c", Failed),
        ]),
    )
    .expect("plan");
    assert_eq!(moves(&p), vec![("a".into(), CompensationReady)]);
    let p = evaluate(
        &wf,
        &run(RunState::Compensating),
        &rows(&[
            ("a", Compensated),
            ("b", Compensated),
            ("d", Compensated),
            ("c", Failed),
        ]),
    )
    .expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensated));
}

#[test]
fn compensation_skips_queued_steps_and_waits_for_running_ones() {
    let wf = saga();
    let p = evaluate(
        &wf,
        &run(RunState::Running),
        &rows(&[
            ("a", Completed),
            ("b", Failed),
            ("d", Running),
            ("c", NotStarted),
        ]),
    )
    .expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensating));
    assert_eq!(moves(&p), vec![("c".into(), Skipped)]);
    // d completes later: it is compensated, then a.
    let p = evaluate(
        &wf,
        &run(RunState::Compensating),
        &rows(&[
            ("a", Completed),
            ("b", Failed),
            ("d", Completed),
            ("c", Skipped),
        ]),
    )
    .expect("plan");
    assert_eq!(moves(&p), vec![("d".into(), CompensationReady)]);
}

#[test]
fn compensation_failure_puts_the_run_in_error_with_an_alert() {
    let wf = saga();
    let p = evaluate(
        &wf,
        &run(RunState::Compensating),
        &rows(&[
            ("a", Completed),
            ("b", CompensationFailed),
            ("d", Compensated),
            ("c", Failed),
        ]),
    )
    .expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    let alert = p.alert.expect("alert");
    assert_eq!(alert.step.as_deref(), Some("b"));
    assert!(alert.actions.contains(&"retry_step".to_string()));
}

#[test]
fn failure_after_the_pivot_is_an_error_not_a_compensation() {
    let wf = Workflow::builder("p", 1)
        .step("reserve", noop())
        .compensate(noop())
        .step("charge", noop())
        .after(["reserve"])
        .pivot()
        .step("ship", noop())
        .after(["charge"])
        .retriable()
        .build()
        .expect("valid");
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Completed),
        ("ship", Failed),
    ]);
    let p = evaluate(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    assert!(p.steps.is_empty());
    assert!(
        p.alert
            .expect("alert")
            .reason
            .contains("point of no return")
    );
    // The pivot itself failing still compensates what came before.
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Failed),
        ("ship", NotStarted),
    ]);
    let p = evaluate(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensating));
    assert_eq!(
        moves(&p),
        vec![
            ("reserve".into(), CompensationReady),
            ("ship".into(), Skipped)
        ]
    );
}

#[test]
fn nothing_to_undo_compensates_at_once() {
    let wf = saga();
    let p = evaluate(
        &wf,
        &run(RunState::Running),
        &rows(&[
            ("a", Failed),
            ("b", NotStarted),
            ("d", NotStarted),
            ("c", NotStarted),
        ]),
    )
    .expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensated));
}

#[test]
fn final_and_error_runs_do_not_move() {
    let wf = saga();
    for st in [RunState::Completed, RunState::Compensated, RunState::Error] {
        let p = evaluate(
            &wf,
            &run(st),
            &rows(&[
                ("a", Failed),
                ("b", NotStarted),
                ("d", NotStarted),
                ("c", NotStarted),
            ]),
        )
        .expect("plan");
        assert!(p.steps.is_empty() && p.run_state.is_none(), "{st} moved");
    }
}

#[test]
fn a_step_row_unknown_to_the_definition_is_a_corrupt_row() {
    let wf = saga();
    let err =
        evaluate(&wf, &run(RunState::Running), &rows(&[("zzz", Completed)])).expect_err("corrupt");
    assert!(matches!(err, Error::CorruptRow { .. }), "{err}");
}

#[test]
fn a_step_that_timed_out_for_good_is_compensated_because_its_outcome_is_unknown() {
    let wf = saga();
    let mut r = rows(&[
        ("a", Completed),
        ("b", Failed),
        ("d", Skipped),
        ("c", NotStarted),
    ]);
    r[1].maybe_applied = true;
    let p = evaluate(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensating));
    // b first (it may have applied its effect), a only after b is settled.
    assert_eq!(
        moves(&p),
        vec![("b".into(), CompensationReady), ("c".into(), Skipped)]
    );
    // A terminal (known) failure has nothing to undo: a is compensated at once.
    let r = rows(&[
        ("a", Completed),
        ("b", Failed),
        ("d", Skipped),
        ("c", NotStarted),
    ]);
    let p = evaluate(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(
        moves(&p),
        vec![("a".into(), CompensationReady), ("c".into(), Skipped)]
    );
}

#[test]
fn a_pivot_whose_outcome_is_unknown_stops_in_error_instead_of_compensating() {
    let wf = Workflow::builder("p", 1)
        .step("reserve", noop())
        .compensate(noop())
        .step("ship", noop())
        .after(["reserve"])
        .pivot()
        .build()
        .expect("valid");
    let mut r = rows(&[("reserve", Completed), ("ship", Failed)]);
    r[1].maybe_applied = true;
    let p = evaluate(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    assert!(p.steps.is_empty(), "nothing compensated: {:?}", moves(&p));
    assert!(
        p.alert
            .expect("alert")
            .reason
            .contains("may have taken effect")
    );
}
