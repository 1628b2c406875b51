//! The supervisor's rescue decisions: timeouts below and at the threshold, interruptions.

use crate::StepState;
use crate::rows::ExpiredStep;
use crate::transition::{Counters, Trigger, rescue};

fn expired(failure_count: i32, max_failures: i32, deadline_ms: i64, dead: bool) -> ExpiredStep {
    ExpiredStep {
        id: 1,
        run_id: Default::default(),
        workflow_key: "w@1".into(),
        name: "s".into(),
        state: StepState::Running,
        attempt: 1,
        locked_by: "a".into(),
        counters: Counters {
            failure_count,
            max_failures,
            interruptions: 0,
            max_interruptions: 1,
            deadline_ms,
            deadline_cap_ms: 3000,
            phase_attempt: 1,
        },
        owner_dead: dead,
    }
}

#[test]
fn below_the_threshold_requeues_with_a_doubled_capped_deadline() {
    let r = rescue(&expired(0, 3, 1000, false));
    assert_eq!(
        (r.change.to, r.change.deadline_ms),
        (StepState::Ready, 2000)
    );
    assert_eq!(r.change.failure_count, 1);
    assert_eq!(rescue(&expired(1, 3, 2000, false)).change.deadline_ms, 3000);
}

#[test]
fn at_the_threshold_gives_up() {
    assert_eq!(
        rescue(&expired(2, 3, 1000, false)).change.to,
        StepState::Failed
    );
    assert_eq!(
        rescue(&expired(0, 1, 1000, false)).change.to,
        StepState::Failed
    );
}

#[test]
fn a_dead_owner_is_an_interruption_not_a_failure() {
    let r = rescue(&expired(2, 3, 1000, true));
    assert_eq!(r.change.on, Trigger::Interrupted);
    assert_eq!((r.change.to, r.change.failure_count), (StepState::Ready, 2));
    assert_eq!((r.change.interruptions, r.change.deadline_ms), (1, 1000));
    let mut again = expired(0, 3, 1000, true);
    again.counters.interruptions = 1;
    assert_eq!(rescue(&again).change.to, StepState::Failed);
}
