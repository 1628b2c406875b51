//! Transition table tests of the planner, pair by pair.

use uuid::Uuid;

use super::writes::PlanWrite;
use super::*;
use crate::Error;
use crate::definition::Workflow;
use crate::rows::{RunRow, StepRow};
use crate::{RunState, StepState};
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
        failed_attempts: 0,
        notify: false,
        trace_parent: None,
        trace_state: None,
        parent_step: None,
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
            forward_attempts: 1,
            compensation_attempts: 0,
            failure_count: 0,
            max_failures: 3,
            interruptions: 0,
            max_interruptions: 5,
            maybe_applied: false,
            deadline_ms: 1000,
            idempotency_key: format!("k-{name}"),
            output: (*state == StepState::Completed).then(|| "1".to_string()),
            error: (*state == StepState::Failed).then(|| "{\"code\":\"x\"}".to_string()),
            progress: None,
        })
        .collect()
}

/// Sets a row's counters: `forward` and `compensation` attempts, claims their sum.
fn tried(row: &mut StepRow, forward: i32, compensation: i32) {
    row.forward_attempts = forward;
    row.compensation_attempts = compensation;
    row.attempt = forward + compensation;
}

fn moves(p: &PlanWrite) -> Vec<(String, StepState)> {
    let mut v: Vec<_> = p.steps.iter().map(|s| (s.name.clone(), s.to)).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

use StepState::*;

#[test]
fn pending_run_readies_roots_and_starts_running() {
    let p = planned(
        RunState::Pending,
        &[
            ("a", NotStarted),
            ("b", NotStarted),
            ("d", NotStarted),
            ("c", NotStarted),
        ],
    );
    assert_eq!(moves(&p), vec![("a".into(), Ready)]);
    assert_eq!(p.run_state, Some(RunState::Running));
}

#[test]
fn completed_dependency_readies_parallel_branches_and_join_waits_for_both() {
    let wf = saga();
    let p = plan(
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
    let p = plan(
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
    let p = planned(
        RunState::Running,
        &[
            ("a", Completed),
            ("b", Completed),
            ("d", Completed),
            ("c", Completed),
        ],
    );
    assert_eq!(p.run_state, Some(RunState::Completed));
    let out: serde_json::Value =
        serde_json::from_str(p.run_output.as_deref().expect("output")).expect("json");
    assert_eq!(out["c"], 1);
}

#[test]
fn failure_compensates_in_reverse_topological_order() {
    let wf = saga();
    // c failed after b and d completed: b and d are undone first, a waits for both.
    let p = plan(
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
    let p = plan(
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
    let p = plan(
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
    let p = plan(
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
    let p = plan(
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
    let p = plan(
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
    let mut r = rows(&[
        ("a", Completed),
        ("b", CompensationFailed),
        ("d", Compensated),
        ("c", Failed),
    ]);
    // b ran forward twice, then its compensation failed at its third attempt.
    tried(&mut r[1], 2, 3);
    let p = plan(&wf, &run(RunState::Compensating), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    let alert = p.alert.expect("alert");
    assert_eq!(alert.step.as_deref(), Some("b"));
    assert!(alert.actions.contains(&"retry".to_string()));
    assert_eq!(alert.attempts, 3, "the compensation's attempts");
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
    let mut r = rows(&[
        ("reserve", Completed),
        ("charge", Completed),
        ("ship", Failed),
    ]);
    tried(&mut r[2], 4, 0);
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    assert!(p.steps.is_empty());
    let alert = p.alert.expect("alert");
    assert!(alert.reason.contains("point of no return"));
    assert_eq!(alert.attempts, 4, "the forward attempts");
    // The pivot itself failing still compensates what came before.
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Failed),
        ("ship", NotStarted),
    ]);
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
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
fn a_failure_beside_a_pivot_in_flight_waits_for_the_pivot_to_settle() {
    // `hold` (which has nothing to undo, so it may run beside the pivot) and `charge` (the
    // pivot) run side by side after `reserve`.
    let wf = Workflow::builder("p", 1)
        .step("reserve", noop())
        .compensate(noop())
        .step("hold", noop())
        .after(["reserve"])
        .step("charge", noop())
        .after(["reserve"])
        .pivot()
        .step("ship", noop())
        .after(["hold", "charge"])
        .retriable()
        .build()
        .expect("valid");
    for pivot in [Running, Waiting] {
        let mut r = rows(&[
            ("reserve", Completed),
            ("hold", Failed),
            ("charge", pivot),
            ("ship", NotStarted),
        ]);
        tried(&mut r[1], 3, 0);
        let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
        assert_eq!(
            p.run_state, None,
            "the run waits while the pivot is {pivot}"
        );
        assert!(
            p.steps.is_empty(),
            "nothing is undone under a pivot {pivot}: {p:?}"
        );
    }
    // The pivot completed: the failure came after the point of no return.
    let mut r = rows(&[
        ("reserve", Completed),
        ("hold", Failed),
        ("charge", Completed),
        ("ship", NotStarted),
    ]);
    tried(&mut r[1], 3, 0);
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    // The pivot failed: what came before is undone.
    let mut r = rows(&[
        ("reserve", Completed),
        ("hold", Failed),
        ("charge", Failed),
        ("ship", NotStarted),
    ]);
    tried(&mut r[1], 3, 0);
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Compensating));
}

/// reserve (undone by a compensation) → charge (the pivot) → ship (retriable).
fn order_with_pivot() -> Workflow {
    Workflow::builder("p", 1)
        .step("reserve", noop())
        .compensate(noop())
        .step("charge", noop())
        .after(["reserve"])
        .pivot()
        .step("ship", noop())
        .after(["charge"])
        .retriable()
        .build()
        .expect("valid")
}

/// A run an operator cancelled: compensating, with the cancel's error envelope.
/// The three steps with the pivot `charge` ready after an attempt whose outcome is unknown,
/// and `reserve` in `reserve`.
fn pivot_maybe_applied(reserve: StepState) -> Vec<StepRow> {
    let mut r = rows(&[
        ("reserve", reserve),
        ("charge", StepState::Ready),
        ("ship", StepState::NotStarted),
    ]);
    r[1].maybe_applied = true;
    r
}

/// Plans the cancelled run over `r` and asserts it stops in `Error` with an alert whose
/// reason holds `reason`.
fn stops_for_an_operator(wf: &Workflow, r: &[StepRow], reason: &str) {
    let p = plan(wf, &cancelled(), r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error), "{p:?}");
    let alert = p.alert.expect("alert");
    assert!(alert.reason.contains(reason), "{}", alert.reason);
}

fn cancelled() -> RunRow {
    let mut r = run(RunState::Compensating);
    r.error = Some(
        r#"{"code":"cancelled","message":"cancelled by an operator","retryable":false}"#.into(),
    );
    r
}

#[test]
fn a_cancel_that_meets_the_pivot_in_flight_waits_and_then_goes_forward() {
    let wf = order_with_pivot();
    // The pivot runs: nothing is dropped or undone under it.
    for pivot in [Running, Waiting] {
        let r = rows(&[
            ("reserve", Completed),
            ("charge", pivot),
            ("ship", NotStarted),
        ]);
        let p = plan(&wf, &cancelled(), &r).expect("plan");
        assert_eq!(p.run_state, None, "pivot {pivot}");
        assert!(p.steps.is_empty(), "pivot {pivot}: {p:?}");
    }
    // The pivot completed: the cancel came too late, the run goes forward and `ship` is due.
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Completed),
        ("ship", NotStarted),
    ]);
    let p = plan(&wf, &cancelled(), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Running));
    assert_eq!(p.trigger, Some(RunTrigger::CancelTooLate));
    assert!(p.clear_error && p.run_error.is_none());
    assert_eq!(moves(&p), vec![("ship".into(), Ready)]);
    // The pivot was the last step to run: the run completes.
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Completed),
        ("ship", Completed),
    ]);
    let p = plan(&wf, &cancelled(), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Completed));
    // The pivot's outcome is unknown: an operator decides, alerted.
    stops_for_an_operator(
        &wf,
        &pivot_maybe_applied(Completed),
        "pivot `charge` ran, and the pivot may have taken effect",
    );
    // A claim met the cancel's unwinding, and the pivot's attempt was then interrupted: with
    // a step already undone, the run still stops for an operator instead of compensating
    // past a pivot that may have acted.
    let r = pivot_maybe_applied(CompensationReady);
    let p = plan(&wf, &cancelled(), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    assert!(
        !moves(&p).iter().any(|(s, _)| s == "charge"),
        "{:?}",
        moves(&p)
    );
    // The same with the pivot completed under the unwinding.
    let r = rows(&[
        ("reserve", Compensated),
        ("charge", Completed),
        ("ship", NotStarted),
    ]);
    stops_for_an_operator(&wf, &r, "while the steps before it");
    // An operator's `compensate` of such a run is the decision to undo past the pivot: it
    // drops the cancel's envelope, and the unwinding that follows compensates.
    let r = pivot_maybe_applied(CompensationReady);
    let mut stopped = cancelled();
    stopped.state = RunState::Error;
    let c = super::operator::compensate(&stopped, &r).expect("compensate");
    assert!(c.clear_error, "the cancel's envelope is dropped");
    let p = plan(&wf, &run(RunState::Compensating), &r).expect("plan");
    assert_ne!(p.run_state, Some(RunState::Error));
    assert_eq!(
        moves(&p),
        vec![("charge".into(), Skipped), ("ship".into(), Skipped)]
    );
    // The pivot never acted: the cancel undoes what came before it.
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Ready),
        ("ship", NotStarted),
    ]);
    let p = plan(&wf, &cancelled(), &r).expect("plan");
    assert_eq!(p.run_state, None);
    assert_eq!(
        moves(&p),
        vec![
            ("charge".into(), Skipped),
            ("reserve".into(), CompensationReady),
            ("ship".into(), Skipped)
        ]
    );
    // An operator's `compensate` past the pivot undoes what can be undone, as documented.
    let r = rows(&[
        ("reserve", Completed),
        ("charge", Completed),
        ("ship", Failed),
    ]);
    let p = plan(&wf, &run(RunState::Compensating), &r).expect("plan");
    assert_eq!(moves(&p), vec![("reserve".into(), CompensationReady)]);
}

#[test]
fn nothing_to_undo_compensates_at_once() {
    let p = planned(
        RunState::Running,
        &[
            ("a", Failed),
            ("b", NotStarted),
            ("d", NotStarted),
            ("c", NotStarted),
        ],
    );
    assert_eq!(p.run_state, Some(RunState::Compensated));
}

#[test]
fn final_and_error_runs_do_not_move() {
    let wf = saga();
    for st in [RunState::Completed, RunState::Compensated, RunState::Error] {
        let p = plan(
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
        plan(&wf, &run(RunState::Running), &rows(&[("zzz", Completed)])).expect_err("corrupt");
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
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
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
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
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
    let p = plan(&wf, &run(RunState::Running), &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error));
    assert!(p.steps.is_empty(), "nothing compensated: {:?}", moves(&p));
    assert!(
        p.alert
            .expect("alert")
            .reason
            .contains("may have taken effect")
    );
}

/// The plan of the sample saga for a run in `state` with these step states.
fn planned(state: RunState, steps: &[(&str, StepState)]) -> PlanWrite {
    plan(&saga(), &run(state), &rows(steps)).expect("plan")
}

mod table {
    use super::super::{RUN_RULES, STEP_RULES, Trigger, decide, run_table, step_rule, step_table};
    use crate::transition::{Counters, Due, Maybe, RunTrigger, run_rule};
    use crate::{RunState, StepState};
    use StepState::*;

    /// The whole step matrix, written out: every (state, trigger) pair not listed here must
    /// have no edge.
    const EXPECTED: &[(StepState, Trigger, StepState)] = &[
        (NotStarted, Trigger::DependenciesMet, Ready),
        (NotStarted, Trigger::Dropped, Skipped),
        (Ready, Trigger::Claimed, Running),
        (Ready, Trigger::Dropped, Skipped),
        (Ready, Trigger::CompensationDue, CompensationReady),
        (Ready, Trigger::OperatorRelease, Ready),
        (Ready, Trigger::Paused, Ready),
        (Running, Trigger::Succeeded, Completed),
        (Running, Trigger::FailedWillRetry, Ready),
        (Running, Trigger::FailedForGood, Failed),
        (Running, Trigger::Deferred, Ready),
        (Running, Trigger::Parked, Waiting),
        (Waiting, Trigger::Woken, Ready),
        (Waiting, Trigger::Dropped, Skipped),
        (Waiting, Trigger::CompensationDue, CompensationReady),
        (Running, Trigger::TimedOut, Ready),
        (Running, Trigger::TimedOutForGood, Failed),
        (Running, Trigger::Interrupted, Ready),
        (Running, Trigger::InterruptedTooOften, Failed),
        (Running, Trigger::SetAside, Ready),
        (Completed, Trigger::CompensationDue, CompensationReady),
        (Failed, Trigger::CompensationDue, CompensationReady),
        (Failed, Trigger::OperatorRetry, Ready),
        (CompensationReady, Trigger::Claimed, Compensating),
        (
            CompensationReady,
            Trigger::OperatorRelease,
            CompensationReady,
        ),
        (CompensationReady, Trigger::Paused, CompensationReady),
        (Compensating, Trigger::SetAside, CompensationReady),
        (Compensating, Trigger::Succeeded, Compensated),
        (Compensating, Trigger::FailedWillRetry, CompensationReady),
        (Compensating, Trigger::FailedForGood, CompensationFailed),
        (Compensating, Trigger::Deferred, CompensationReady),
        (Compensating, Trigger::TimedOut, CompensationReady),
        (Compensating, Trigger::TimedOutForGood, CompensationFailed),
        (Compensating, Trigger::Interrupted, CompensationReady),
        (
            Compensating,
            Trigger::InterruptedTooOften,
            CompensationFailed,
        ),
        (
            CompensationFailed,
            Trigger::OperatorRetry,
            CompensationReady,
        ),
        (
            CompensationFailed,
            Trigger::OperatorMarkCompensated,
            Compensated,
        ),
        (Compensated, Trigger::RolledBack, NotStarted),
        (Skipped, Trigger::RolledBack, NotStarted),
        (Failed, Trigger::RolledBack, NotStarted),
        (Completed, Trigger::RolledBack, NotStarted),
        (Compensated, Trigger::RolledBackDue, Ready),
        (Skipped, Trigger::RolledBackDue, Ready),
        (Failed, Trigger::RolledBackDue, Ready),
        (Completed, Trigger::RolledBackDue, Ready),
        (NotStarted, Trigger::RolledBackDue, Ready),
        (Ready, Trigger::RolledBack, NotStarted),
        (Ready, Trigger::RolledBackDue, Ready),
    ];

    fn counters() -> Counters {
        Counters {
            failure_count: 1,
            max_failures: 3,
            interruptions: 1,
            max_interruptions: 2,
            deadline_ms: 1000,
            deadline_cap_ms: 3000,
            phase_attempt: 3,
        }
    }

    #[test]
    fn every_state_and_trigger_pair_is_decided_as_listed() {
        for from in StepState::ALL {
            for on in Trigger::ALL {
                let want = EXPECTED
                    .iter()
                    .find(|(f, t, _)| *f == from && *t == on)
                    .map(|e| e.2);
                let got = step_rule(from, on).map(|r| r.to);
                assert_eq!(got, want, "{from} on {}", on.as_str());
                let c = counters();
                assert_eq!(
                    decide(from, on, &c, true, 50).map(|d| d.to),
                    want,
                    "decide {from} on {}",
                    on.as_str()
                );
            }
        }
        assert_eq!(STEP_RULES.len(), EXPECTED.len(), "no duplicate rows");
    }

    #[test]
    fn effects_follow_the_rules_of_the_model() {
        for r in STEP_RULES {
            // A set-aside or paused step is queued but parked: never due until an operator
            // releases or resumes its run.
            // A waiting step is due at its timeout, when the timer pass wakes it.
            let queued = (matches!(r.to, Ready | CompensationReady)
                && !matches!(r.on, Trigger::SetAside | Trigger::Paused))
                || r.to == Waiting;
            assert_eq!(
                r.effects.due != Due::Never,
                queued,
                "{} on {}: due iff queued",
                r.from,
                r.on.as_str()
            );
            if r.from == Compensating || r.from.is_compensation() {
                assert_eq!(r.effects.maybe, Maybe::Keep, "compensations never mark");
            }
            assert!(
                !(r.effects.count_failure && r.effects.count_interruption),
                "an interruption is never a failure"
            );
            if r.effects.count_interruption {
                assert!(
                    !r.effects.extend_deadline,
                    "interruptions keep the deadline"
                );
            }
        }
    }

    #[test]
    fn counters_move_as_the_effects_say() {
        let c = counters();
        let t = decide(Running, Trigger::TimedOut, &c, false, 0).expect("edge");
        assert_eq!(
            (t.failure_count, t.deadline_ms, t.maybe_applied),
            (2, 2000, true)
        );
        let i = decide(Running, Trigger::Interrupted, &c, false, 0).expect("edge");
        assert_eq!(
            (i.failure_count, i.interruptions, i.deadline_ms),
            (1, 2, 1000)
        );
        assert!(i.maybe_applied);
        let r = decide(Running, Trigger::FailedWillRetry, &c, false, 70).expect("edge");
        assert_eq!((r.due_in_ms, r.maybe_applied), (Some(70), false));
        let u = decide(Running, Trigger::FailedWillRetry, &c, true, 70).expect("edge");
        assert!(u.maybe_applied, "an unknown outcome marks the step");
        let cu = decide(Compensating, Trigger::FailedForGood, &c, true, 0).expect("edge");
        assert!(
            !cu.maybe_applied,
            "a compensation never marks the forward step"
        );
        assert_eq!(super::super::on_failure(true, &c), Trigger::FailedWillRetry);
        let at = Counters {
            failure_count: 2,
            ..c
        };
        assert_eq!(super::super::on_failure(true, &at), Trigger::FailedForGood);
        assert_eq!(super::super::on_failure(false, &c), Trigger::FailedForGood);
        assert_eq!(super::super::on_timeout(&at), Trigger::TimedOutForGood);
        // A deferral counts nothing, marks nothing, and is due after the asked delay.
        let d = decide(Running, Trigger::Deferred, &c, false, 2000).expect("edge");
        assert_eq!(
            (d.to, d.failure_count, d.interruptions, d.deadline_ms),
            (Ready, 1, 1, 1000)
        );
        assert_eq!((d.due_in_ms, d.maybe_applied), (Some(2000), false));
        let cd = decide(Compensating, Trigger::Deferred, &c, false, 5).expect("edge");
        assert_eq!((cd.to, cd.due_in_ms), (CompensationReady, Some(5)));
        // Within the cap (the third attempt of the phase, cap 3) a deferral; past it, the
        // failure path: a retry below the threshold, a failure at it.
        assert_eq!(super::super::on_deferral(&c, 3), Trigger::Deferred);
        assert_eq!(super::super::on_deferral(&c, 2), Trigger::FailedWillRetry);
        assert_eq!(super::super::on_deferral(&at, 2), Trigger::FailedForGood);
        assert_eq!(super::super::on_deferral(&c, u32::MAX), Trigger::Deferred);
        assert!(!Trigger::Deferred.ends_attempt_unsuccessfully());
        let cap = Counters {
            interruptions: 2,
            ..c
        };
        assert_eq!(super::super::on_interruption(&c), Trigger::Interrupted);
        assert_eq!(
            super::super::on_interruption(&cap),
            Trigger::InterruptedTooOften
        );
    }

    #[test]
    fn every_run_state_and_trigger_pair_is_decided_once() {
        for from in RunState::ALL {
            for r in RUN_RULES {
                let hits = RUN_RULES
                    .iter()
                    .filter(|x| x.on == r.on && x.from.contains(&from))
                    .count();
                assert!(hits <= 1, "{from} on {} is ambiguous", r.on.as_str());
            }
        }
        assert!(
            RUN_RULES
                .iter()
                .all(|r| !r.from.contains(&RunState::Compensated)),
            "a compensated run never moves"
        );
        assert!(
            RUN_RULES
                .iter()
                .all(|r| !r.from.contains(&RunState::Completed)
                    || r.on == RunTrigger::ParentCompensates),
            "a completed run moves only when its parent compensates it"
        );
        assert_eq!(
            run_rule(RunState::Error, RunTrigger::OperatorRetryForward).map(|r| r.to),
            Some(RunState::Running)
        );
        assert!(run_rule(RunState::Running, RunTrigger::OperatorRetryForward).is_none());
        assert_eq!(
            run_rule(RunState::Running, RunTrigger::PoisonStep).and_then(|r| r.alert),
            Some("poison_step")
        );
    }

    /// `cargo test -p sagaflow-engine print_transition_tables -- --ignored --nocapture`
    /// prints the tables to paste into `docs/state-machines.md`.
    #[test]
    #[ignore = "prints the tables for the documentation"]
    fn print_transition_tables() {
        println!("{}\n{}", step_table(), run_table());
    }

    #[test]
    fn the_documentation_shows_the_tables_of_the_code() {
        let doc = include_str!("../../../docs/state-machines.md");
        for (name, table) in [("step", step_table()), ("run", run_table())] {
            assert!(
                doc.contains(&table),
                "docs/state-machines.md does not show the current {name} table; paste:\n{table}"
            );
        }
    }
}

/// A run stopped in `Error` because its pivot may have acted, then cancelled (the chaos run
/// found it: a cancel kept the run's failure as its error, so the unwinding did not know a
/// cancel from an operator's `compensate` and undid past the pivot). The cancel's envelope
/// now holds the failure as its cause, and the unwinding stops at the pivot again.
#[test]
fn a_cancel_of_a_run_stopped_at_an_uncertain_pivot_does_not_undo_past_it() {
    let wf = order_with_pivot();
    let mut r = rows(&[
        ("reserve", Completed),
        ("charge", Failed),
        ("ship", NotStarted),
    ]);
    r[1].maybe_applied = true;
    let failure = r#"{"code":"timeout","message":"no answer within 3s","retryable":true}"#;
    let mut stopped = run(RunState::Error);
    stopped.error = Some(failure.into());
    let c = super::operator::cancel(&stopped, &r, Some("customer left")).expect("cancel");
    assert_eq!(c.run_state, Some(RunState::Compensating));
    let envelope = c.run_error.expect("the cancel's envelope");
    assert!(super::operator::is_cancelled(&envelope), "{envelope}");
    let e: serde_json::Value = serde_json::from_str(&envelope).expect("JSON");
    assert_eq!(e["details"]["cause"]["code"], "timeout", "{envelope}");

    let mut cancelled = run(RunState::Compensating);
    cancelled.error = Some(envelope.clone());
    let p = plan(&wf, &cancelled, &r).expect("plan");
    assert_eq!(p.run_state, Some(RunState::Error), "{p:?}");
    assert!(moves(&p).is_empty(), "nothing is undone: {:?}", moves(&p));

    // Cancelled again: the first envelope stays, not nested in a second one.
    let again = super::operator::cancel(&cancelled, &r, None).expect("cancel");
    assert_eq!(again.run_error.as_deref(), Some(envelope.as_str()));
}

/// The preview of `undo` of a running run over `r`.
fn previewed(wf: &Workflow, r: &[StepRow], undo: crate::model::Undo) -> crate::model::UndoPreview {
    preview_undo(wf, &run(RunState::Running), r, undo).expect("preview")
}

/// The steps of each group of a preview, by name, sorted within the group.
fn groups(p: &crate::model::UndoPreview) -> Vec<Vec<String>> {
    p.groups
        .iter()
        .map(|g| {
            let mut names: Vec<String> = g.iter().map(|s| s.step.clone()).collect();
            names.sort();
            names
        })
        .collect()
}

fn kept<'a>(p: &'a crate::model::UndoPreview, step: &str) -> &'a str {
    p.kept
        .iter()
        .find(|k| k.step == step)
        .map_or("", |k| k.reason.as_str())
}

#[test]
fn a_preview_of_a_cancel_undoes_parallel_branches_together_then_what_they_follow() {
    use crate::model::{Undo, UndoOutcome};
    let wf = saga();
    let r = rows(&[
        ("a", StepState::Completed),
        ("b", StepState::Completed),
        ("d", StepState::Completed),
        ("c", StepState::Ready),
    ]);
    for undo in [Undo::Cancel, Undo::Compensate] {
        let p = previewed(&wf, &r, undo);
        assert_eq!(p.outcome, UndoOutcome::Compensated, "{undo}: {p:?}");
        assert_eq!(groups(&p), [vec!["b", "d"], vec!["a"]], "{undo}");
        assert_eq!(kept(&p, "c"), "queued, never acted: dropped", "{undo}");
        assert_eq!(p.groups[1][0].output, Some(serde_json::json!(1)), "{undo}");
        assert!(
            p.in_flight.is_empty() && p.reason.is_none(),
            "{undo}: {p:?}"
        );
    }
}

#[test]
fn a_preview_says_what_it_assumes_of_an_attempt_in_flight() {
    use crate::model::{Undo, UndoOutcome};
    let wf = saga();
    let r = rows(&[
        ("a", StepState::Completed),
        ("b", StepState::Completed),
        ("d", StepState::Running),
        ("c", StepState::NotStarted),
    ]);
    // A cancel stops `d`, whose outcome is then unknown: it is undone too.
    let p = previewed(&wf, &r, Undo::Cancel);
    assert_eq!(p.outcome, UndoOutcome::Compensated, "{p:?}");
    assert_eq!(groups(&p), [vec!["b", "d"], vec!["a"]]);
    let d = p.groups[0].iter().find(|s| s.step == "d").expect("d");
    assert!(d.maybe_applied && d.output.is_none(), "{d:?}");
    assert!(
        p.in_flight[0].contains("the cancel stops it"),
        "{:?}",
        p.in_flight
    );
    assert_eq!(kept(&p, "c"), "never started: dropped");
    // Under a compensate `d` runs on; the preview takes it to complete.
    let p = previewed(&wf, &r, Undo::Compensate);
    assert_eq!(groups(&p), [vec!["b", "d"], vec!["a"]]);
    assert!(
        p.in_flight[0].contains("taken to complete"),
        "{:?}",
        p.in_flight
    );
}

#[test]
fn a_preview_at_a_pivot_follows_the_cancel_and_the_compensate_apart() {
    use crate::model::{Undo, UndoOutcome};
    let wf = order_with_pivot();
    let r = rows(&[
        ("reserve", StepState::Completed),
        ("charge", StepState::Completed),
        ("ship", StepState::Ready),
    ]);
    // The pivot completed: a cancel comes too late, and the run goes forward.
    let p = previewed(&wf, &r, Undo::Cancel);
    assert_eq!(p.outcome, UndoOutcome::GoesForward, "{p:?}");
    assert!(p.groups.is_empty(), "{p:?}");
    assert!(
        p.reason
            .as_deref()
            .is_some_and(|r| r.contains("point of no return")),
        "{p:?}"
    );
    // A compensate is the operator's decision to undo what can be undone past it.
    let p = previewed(&wf, &r, Undo::Compensate);
    assert_eq!(p.outcome, UndoOutcome::Compensated, "{p:?}");
    assert_eq!(groups(&p), [vec!["reserve"]]);
    assert!(kept(&p, "charge").contains("a pivot"), "{p:?}");
    // The pivot in flight: the undo waits for it, and the preview says what depends on it.
    let r = rows(&[
        ("reserve", StepState::Completed),
        ("charge", StepState::Running),
        ("ship", StepState::NotStarted),
    ]);
    let p = previewed(&wf, &r, Undo::Cancel);
    assert_eq!(p.outcome, UndoOutcome::Waits, "{p:?}");
    assert!(p.groups.is_empty(), "{p:?}");
    assert!(
        p.reason
            .as_deref()
            .is_some_and(|r| r.contains("pivot `charge` is in flight")),
        "{p:?}"
    );
    // Stopped in error at an uncertain pivot: a cancel undoes nothing past it.
    let mut stopped = run(RunState::Error);
    stopped.error = Some(r#"{"code":"x","message":"outcome unknown","retryable":false}"#.into());
    let p = preview_undo(
        &wf,
        &stopped,
        &pivot_maybe_applied(StepState::Completed),
        Undo::Cancel,
    )
    .expect("preview");
    assert_eq!(p.outcome, UndoOutcome::StopsInError, "{p:?}");
    assert!(p.groups.is_empty(), "{p:?}");
}

#[test]
fn a_preview_of_a_finished_run_is_refused_like_the_action() {
    use crate::model::Undo;
    let wf = saga();
    let r = rows(&[
        ("a", StepState::Compensated),
        ("b", StepState::Skipped),
        ("d", StepState::Skipped),
        ("c", StepState::Skipped),
    ]);
    let err = preview_undo(&wf, &run(RunState::Compensated), &r, Undo::Cancel)
        .expect_err("a finished run");
    assert!(matches!(err, Error::ActionNotAllowed { .. }), "{err}");
}

#[test]
fn a_preview_of_a_compensate_in_error_retries_the_failed_compensation_first() {
    use crate::model::{Undo, UndoOutcome};
    let wf = saga();
    // `b`'s compensation failed for good, `d` is undone, `c` was dropped: the run is in
    // error. A compensate retries `b`'s compensation, then undoes `a`.
    let r = rows(&[
        ("a", StepState::Completed),
        ("b", StepState::CompensationFailed),
        ("d", StepState::Compensated),
        ("c", StepState::Skipped),
    ]);
    let p = preview_undo(&wf, &run(RunState::Error), &r, Undo::Compensate).expect("preview");
    assert_eq!(p.outcome, UndoOutcome::Compensated, "{p:?}");
    assert_eq!(groups(&p), [vec!["b"], vec!["a"]]);
    assert_eq!(kept(&p, "d"), "already undone");
    assert_eq!(kept(&p, "c"), "dropped before");
    // Planned by hand, the same: the action queues `b`'s compensation again.
    let action = operator::compensate(&run(RunState::Error), &r).expect("compensate");
    assert_eq!(
        moves(&action),
        [("b".to_owned(), StepState::CompensationReady)]
    );
}

#[test]
fn a_preview_of_a_cancel_of_a_paused_run_drops_its_parked_steps_and_undoes_the_rest() {
    use crate::model::{Undo, UndoOutcome};
    let wf = saga();
    let mut paused = run(RunState::Paused);
    paused.error = Some(
        r#"{"code":"paused","message":"paused by an operator","retryable":false,"details":{"phase":"running","cause":null}}"#
            .into(),
    );
    // `b` is parked (queued with no due time), `d` completed.
    let r = rows(&[
        ("a", StepState::Completed),
        ("b", StepState::Ready),
        ("d", StepState::Completed),
        ("c", StepState::NotStarted),
    ]);
    let p = preview_undo(&wf, &paused, &r, Undo::Cancel).expect("preview");
    assert_eq!(p.outcome, UndoOutcome::Compensated, "{p:?}");
    assert_eq!(groups(&p), [vec!["d"], vec!["a"]]);
    assert_eq!(kept(&p, "b"), "queued, never acted: dropped");
    assert_eq!(kept(&p, "c"), "never started: dropped");
}
