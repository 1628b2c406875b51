//! The supervisor: one leader at a time, fenced writes, late results dropped (SAS-3, SAS-4,
//! SAS-6, LE-1..3), and versions an engine does not have (SAS-5).

use std::time::Duration;

use sagaflow::advanced::scheduler::finish_batch;
use sagaflow::advanced::{store, transition};
use sagaflow::{Error, RunState, StepContext, StepError, StepState, Store, Workflow};
use sagaflow_tests::{TestDb, backends, eventually, fast_builder};
use uuid::Uuid;

fn one_step(name: &str, version: i32, deadline: Duration) -> Workflow {
    Workflow::builder(name, version)
        .default_deadline(sagaflow::DeadlinePolicy::new(deadline, deadline * 4))
        .step("only", |_ctx: StepContext| async { Ok::<_, StepError>(1) })
        .build()
        .expect("valid")
}

/// Inserts a run directly through the store and makes its first step ready, without any
/// engine running: the test then plays scheduler and supervisor by hand.
async fn ready_run(store: &Store, wf: &Workflow) -> Uuid {
    let id = Uuid::now_v7();
    let run = store::NewRun {
        id,
        workflow: wf.name().into(),
        version: wf.version(),
        business_key: None,
        input: "null".into(),
        steps: vec![store::NewStep {
            name: "only".into(),
            max_failures: 3,
            max_interruptions: 5,
            deadline_ms: 100,
            deadline_cap_ms: 400,
            idempotency_key: format!("{id}:only"),
            ready: true,
        }],
    };
    store
        .run_insert(store.connection(), &run)
        .await
        .expect("insert");
    assert_eq!(
        store.step_queue_depth().await.expect("depth"),
        1,
        "the root step is queued at insert"
    );
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_result_after_a_requeue_is_fenced_out() {
    for db in backends().await {
        let wf = one_step("fence", 1, Duration::from_millis(100));
        let store = Store::connect(&db.url, Some(4)).await.expect("connect");
        let run_id = ready_run(&store, &wf).await;
        let mut registry = sagaflow::advanced::Registry::new();
        registry.register(wf.clone()).expect("register");
        let keys = vec![wf.key()];
        let first = store.step_claim("ghost-1", &keys, 10).await.expect("claim");
        assert_eq!(first.len(), 1);
        let lease = &first[0];
        assert_eq!((lease.state, lease.attempt), (StepState::Running, 1));
        assert!(
            lease.complete_by - lease.db_now >= 100,
            "CompleteBy from the DB clock"
        );

        let fence = store
            .leader_try_elect("t-lease", "sup-1", Duration::from_secs(5))
            .await
            .expect("elect")
            .expect("won");
        eventually(Duration::from_secs(5), "the step to expire", || async {
            !store
                .step_list_rescuable(60_000, 10)
                .await
                .expect("list")
                .is_empty()
        })
        .await;
        let expired = store.step_list_rescuable(60_000, 10).await.expect("list");
        let rescues: Vec<_> = expired.iter().map(sagaflow::advanced::decide).collect();
        let counts = store
            .step_rescue(Some(&fence), &rescues)
            .await
            .expect("rescue");
        assert_eq!((counts.requeued, counts.failed), (1, 0), "[{}]", db.backend);

        // The first agent answers late: its write matches no row.
        let success = transition::decide(
            StepState::Running,
            transition::Trigger::Succeeded,
            &lease.counters,
            false,
            0,
        )
        .expect("edge");
        let late = store::StepFinish {
            id: lease.id,
            run_id,
            name: "only".into(),
            attempt: 1,
            owner: "ghost-1".into(),
            change: success,
            output: Some("\"late\"".into()),
            error: None,
            guard: store::DeadlineGuard::Live,
        };
        assert_eq!(
            finish_batch(&store, &registry, std::slice::from_ref(&late), "test")
                .await
                .expect("write")
                .applied,
            vec![false]
        );
        let steps = store.run_steps(run_id).await.expect("steps");
        assert_eq!(
            steps[0].state,
            StepState::Ready,
            "[{}] the late result changed nothing",
            db.backend
        );
        assert_eq!(
            (steps[0].failure_count, steps[0].deadline_ms),
            (1, 200),
            "FailureCount+1, deadline doubled"
        );

        // The second attempt owns the step now; only its write lands.
        let second = store.step_claim("ghost-2", &keys, 10).await.expect("claim");
        assert_eq!(second[0].attempt, 2);
        assert_eq!(
            finish_batch(&store, &registry, std::slice::from_ref(&late), "test")
                .await
                .expect("write")
                .applied,
            vec![false]
        );
        let good = store::StepFinish {
            attempt: 2,
            owner: "ghost-2".into(),
            ..late.clone()
        };
        assert_eq!(
            finish_batch(&store, &registry, &[good], "test")
                .await
                .expect("write")
                .applied,
            vec![true]
        );
        // The same transaction advanced the run: its only step done, it completed.
        let run = store.run_get(run_id).await.expect("run").expect("exists");
        assert_eq!(run.state, RunState::Completed, "[{}]", db.backend);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_fences_the_old_leaders_writes() {
    for db in backends().await {
        let store = Store::connect(&db.url, Some(4)).await.expect("connect");
        let ttl = Duration::from_millis(300);
        let old = store
            .leader_try_elect("l", "a", ttl)
            .await
            .expect("elect")
            .expect("a leads");
        assert!(
            store
                .leader_try_elect("l", "b", ttl)
                .await
                .expect("elect")
                .is_none(),
            "one leader at a time"
        );
        eventually(Duration::from_secs(5), "a's lease to expire", || async {
            store.leader_current("l").await.expect("current").is_none()
        })
        .await;
        assert!(
            !store.leader_renew(&old, ttl).await.expect("renew"),
            "an expired lease cannot be renewed"
        );
        let new = store
            .leader_try_elect("l", "b", Duration::from_secs(5))
            .await
            .expect("elect")
            .expect("b leads");
        assert_eq!(new.term, old.term + 1, "terms increase");
        let err = store
            .step_rescue(Some(&old), &[])
            .await
            .expect_err("fenced");
        assert!(
            matches!(err, Error::LeaseLost { .. }),
            "[{}] {err}",
            db.backend
        );
        assert!(store.step_rescue(Some(&new), &[]).await.is_ok());
    }
}

async fn two_engines(db: &TestDb) -> (sagaflow::Engine, sagaflow::Engine) {
    let wf = || one_step("pair", 1, Duration::from_secs(5));
    let a = fast_builder(db)
        .with_workflow(wf())
        .with_instance_id("engine-a")
        .start()
        .await
        .expect("a");
    let b = fast_builder(db)
        .with_workflow(wf())
        .with_instance_id("engine-b")
        .start()
        .await
        .expect("b");
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_supervisors_only_the_leader_acts_and_the_other_takes_over() {
    for db in backends().await {
        let (a, b) = two_engines(&db).await;
        eventually(Duration::from_secs(10), "a leader", || async {
            a.supervisor().is_some_and(|s| s.is_leader())
                || b.supervisor().is_some_and(|s| s.is_leader())
        })
        .await;
        let (leader, follower) = if a.supervisor().is_some_and(|s| s.is_leader()) {
            (a, b)
        } else {
            (b, a)
        };
        let fs = follower.supervisor().expect("supervisor");
        assert!(!fs.is_leader(), "[{}] both lead", db.backend);
        assert!(
            fs.sweep_once().await.expect("sweep").is_none(),
            "a follower does not sweep"
        );
        assert!(
            leader
                .supervisor()
                .expect("s")
                .sweep_once()
                .await
                .expect("sweep")
                .is_some()
        );
        // Runs finish whichever engine claims them.
        let id = follower.start("pair", &()).await.expect("start");
        sagaflow_tests::expect_state(&follower, id, RunState::Completed, db.backend).await;
        // LE-2: the leader shuts down and releases its lease; the follower takes over.
        let old_term = leader
            .supervisor()
            .and_then(|s| s.fence())
            .expect("fence")
            .term;
        leader.shutdown().await;
        eventually(
            Duration::from_secs(10),
            "the follower to take over",
            || async { fs.is_leader() },
        )
        .await;
        assert!(fs.fence().expect("fence").term > old_term);
        follower.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_an_unknown_version_is_left_alone_and_alerted() {
    for db in backends().await {
        // Engine 1 knows v1 only, with a deadline long enough for nothing to finish…
        let v1 = Workflow::builder("ver", 1)
            .step("only", |_ctx: StepContext| async {
                std::future::pending::<()>().await;
                Ok::<_, StepError>(())
            })
            .build()
            .expect("v1");
        let e1 = fast_builder(&db)
            .with_workflow(v1)
            .with_supervisor(false)
            .start()
            .await
            .expect("e1");
        let id = e1.start("ver", &()).await.expect("start");
        eventually(Duration::from_secs(10), "the v1 step to start", || async {
            e1.steps(id)
                .await
                .expect("steps")
                .iter()
                .any(|s| s.state == StepState::Running)
        })
        .await;
        e1.shutdown().await;
        // …engine 2 only has v2: it raises an alert and does not touch the v1 run.
        let e2 = fast_builder(&db)
            .with_workflow(one_step("ver", 2, Duration::from_secs(1)))
            .start()
            .await
            .expect("e2");
        eventually(
            Duration::from_secs(10),
            "an unknown_version alert",
            || async {
                e2.open_alerts()
                    .await
                    .expect("alerts")
                    .iter()
                    .any(|a| a.kind == "unknown_version" && a.reason.contains("ver@1"))
            },
        )
        .await;
        let run = e2.run(id).await.expect("run").expect("exists");
        assert_eq!(
            (run.state, run.version),
            (RunState::Pending, 1),
            "[{}] untouched",
            db.backend
        );
        e2.shutdown().await;
    }
}
