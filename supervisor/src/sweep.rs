//! One sweep: decide, for each expired step, to re-queue or to give up.

use sagaflow_engine::store::{ExpiredStep, Rescue};

/// The supervisor's decision for an expired step: `FailureCount + 1`; below the threshold it
/// is re-queued with its deadline doubled (up to the cap); at the threshold it fails.
pub fn decide(step: ExpiredStep) -> Rescue {
    let failures = step.failure_count.saturating_add(1);
    let give_up = failures >= step.max_failures;
    let new_deadline_ms = step
        .deadline_ms
        .saturating_mul(2)
        .min(step.deadline_cap_ms)
        .max(step.deadline_ms.min(step.deadline_cap_ms));
    Rescue {
        step,
        new_deadline_ms,
        give_up,
    }
}

#[cfg(test)]
mod tests {
    use sagaflow_engine::StepState;
    use sagaflow_engine::store::ExpiredStep;

    use super::decide;

    fn expired(failure_count: i32, max_failures: i32, deadline_ms: i64) -> ExpiredStep {
        ExpiredStep {
            id: 1,
            run_id: Default::default(),
            name: "s".into(),
            state: StepState::Running,
            attempt: 1,
            failure_count,
            max_failures,
            deadline_ms,
            deadline_cap_ms: 3000,
        }
    }

    #[test]
    fn below_the_threshold_requeues_with_a_doubled_capped_deadline() {
        let r = decide(expired(0, 3, 1000));
        assert!(!r.give_up);
        assert_eq!(r.new_deadline_ms, 2000);
        assert_eq!(decide(expired(1, 3, 2000)).new_deadline_ms, 3000);
    }

    #[test]
    fn at_the_threshold_gives_up() {
        assert!(decide(expired(2, 3, 1000)).give_up);
        assert!(decide(expired(0, 1, 1000)).give_up);
    }
}
