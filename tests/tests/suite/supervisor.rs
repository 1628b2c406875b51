//! The supervisor: one leader at a time, fenced writes, late results dropped (SAS-3, SAS-4,
//! SAS-6, LE-1..3), a leader whose sweeps hang gives up its lease (LE-3), and versions an
//! engine does not have (SAS-5).

use sagaflow::AlertKind;
use sagaflow::HistoryKind;
use sagaflow::internals::store::Store;
use std::time::Duration;

use sagaflow::internals::rescue::rescue_steps;
use sagaflow::internals::scheduler::finish_batch;
use sagaflow::internals::{SweepGate, store, transition};
use sagaflow::{Alert, Engine, Error, RunState, StepContext, StepError, StepState, Workflow};
use sagaflow_testkit::{TestDb, backends, eventually, eventually_some, fast_builder};
use tokio::time::Instant;
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
        priority: 0,
        retry_priority: 0,
        notify: false,
        start: store::RunStart::Now,
        trace: None,
        flow_key: None,
        steps: vec![store::NewStep {
            name: "only".into(),
            max_failures: 3,
            max_interruptions: 5,
            deadline_ms: 100,
            deadline_cap_ms: 400,
            idempotency_key: format!("{id}:only"),
            ready: true,
            resource: None,
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
        let mut registry = sagaflow::internals::Registry::new();
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
        let rescues: Vec<_> = expired
            .iter()
            .map(sagaflow::internals::transition::rescue)
            .collect();
        let counts = rescue_steps(&store, Some(&fence), &rescues)
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
            workflow_key: lease.workflow_key.clone(),
            name: "only".into(),
            attempt: 1,
            owner: "ghost-1".into(),
            change: success,
            output: Some("\"late\"".into()),
            error: None,
            guard: store::DeadlineGuard::Live,
            elapsed: None,
            wait: store::WaitWrite::Clear,
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
        let err = rescue_steps(&store, Some(&old), &[])
            .await
            .expect_err("fenced");
        assert!(
            matches!(err, Error::LeaseLost { .. }),
            "[{}] {err}",
            db.backend
        );
        assert!(rescue_steps(&store, Some(&new), &[]).await.is_ok());
        // The leader's alert writes are fenced too: the old term raises nothing, and does not
        // resolve what the new one raised.
        let alert = |leader: &str| store::NewAlert {
            run_id: None,
            step: None,
            kind: AlertKind::Other("fence_test".into()),
            reason: format!("raised by {leader}"),
            attempts: 0,
            actions: Vec::new(),
            open_key: Some("fence_test".into()),
        };
        let err = store
            .alert_insert_fenced(&alert("a"), &old)
            .await
            .expect_err("fenced");
        assert!(
            matches!(err, Error::LeaseLost { .. }),
            "[{}] {err}",
            db.backend
        );
        assert!(
            store
                .alert_insert_fenced(&alert("b"), &new)
                .await
                .expect("raise")
                .is_some(),
            "[{}] the leader raises",
            db.backend
        );
        assert!(
            !store
                .alert_resolve_key_fenced("fence_test", "stale", &old)
                .await
                .expect("resolve"),
            "[{}] the old term resolved the new one's alert",
            db.backend
        );
        let open: Vec<String> = store
            .alert_list(None, true)
            .await
            .expect("alerts")
            .into_iter()
            .filter(|a| a.reason.starts_with("raised by"))
            .map(|a| a.reason)
            .collect();
        assert_eq!(open, ["raised by b"], "[{}]", db.backend);
        assert!(
            store
                .alert_resolve_key_fenced("fence_test", "gone", &new)
                .await
                .expect("resolve"),
            "[{}] the leader resolves",
            db.backend
        );
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
        let fs = follower.supervisor_internals().expect("supervisor");
        assert!(!fs.is_leader(), "[{}] both lead", db.backend);
        assert!(
            fs.sweep_once().await.expect("sweep").is_none(),
            "a follower does not sweep"
        );
        assert!(
            leader
                .supervisor_internals()
                .expect("s")
                .sweep_once()
                .await
                .expect("sweep")
                .is_some()
        );
        // Runs finish whichever engine claims them.
        let id = follower.start("pair", &()).await.expect("start");
        sagaflow_testkit::expect_state(&follower, id, RunState::Completed, db.backend).await;
        // LE-2: the leader shuts down and releases its lease; the follower takes over.
        let old_term = leader
            .supervisor_internals()
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
                    .any(|a| a.kind == AlertKind::UnknownVersion && a.reason.contains("ver@1"))
            },
        )
        .await;
        let run = e2.run(id).await.expect("run").expect("exists");
        assert_eq!(
            (run.state, run.version),
            (RunState::Running, 1),
            "[{}] untouched",
            db.backend
        );
        e2.shutdown().await;
    }
}

/// LE-3 settings of the stall scenarios: a leader steps down once no sweep has completed for
/// 1 s (checked before each renewal, every 400 ms with `fast_builder`), and followers alert
/// when no leader has completed one for 2 s.
const STALL_AFTER: Duration = Duration::from_secs(1);
/// Lease lifetime set by `fast_builder`.
const FAST_LEASE_TTL: Duration = Duration::from_secs(2);
/// How long after its sweeps are blocked a hung leader may keep the lease at most: the stall
/// threshold, plus the lease TTL (the bound if the lease had to expire rather than be
/// released), plus a 1 s margin for one renewal period, one follower poll and a loaded
/// machine. The leader releases the lease, so the takeover usually comes after about 1.5 s.
const STALL_TAKEOVER_MAX: Duration = STALL_AFTER
    .saturating_add(FAST_LEASE_TTL)
    .saturating_add(Duration::from_secs(1));

/// One step whose first attempt hangs (its agent goes silent at the deadline, so only the
/// supervisor can rescue it) and whose later attempts succeed.
fn hang_first_attempt() -> Workflow {
    let deadline = Duration::from_millis(500);
    Workflow::builder("hang_once", 1)
        .default_deadline(sagaflow::DeadlinePolicy::new(deadline, deadline * 4))
        .step("only", |ctx: StepContext| async move {
            if ctx.attempt() == 1 {
                std::future::pending::<()>().await;
            }
            Ok::<_, StepError>(1)
        })
        .build()
        .expect("valid")
}

async fn stall_engine(db: &TestDb, id: &str, gate: &SweepGate) -> Engine {
    sagaflow_testkit::init_logging();
    fast_builder(db)
        .with_workflow(hang_first_attempt())
        .with_instance_id(id)
        .with_sweep_stall_after(STALL_AFTER)
        .with_sweep_gate(gate.clone())
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] {id}: {e}", db.backend))
}

fn leads(e: &Engine) -> bool {
    e.supervisor().is_some_and(|s| s.is_leader())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_sweeps_hang_steps_down_and_the_next_leader_rescues_its_steps() {
    for db in backends().await {
        let (gate_a, gate_b) = (SweepGate::new(), SweepGate::new());
        let a = stall_engine(&db, "stall-a", &gate_a).await;
        let b = stall_engine(&db, "stall-b", &gate_b).await;
        eventually(Duration::from_secs(10), "a leader", || async {
            leads(&a) || leads(&b)
        })
        .await;
        let (hung, hung_gate, next) = if leads(&a) {
            (&a, &gate_a, &b)
        } else {
            (&b, &gate_b, &a)
        };
        let hung_sup = hung.supervisor_internals().expect("supervisor");
        let old_term = hung_sup.fence().expect("fence").term;

        // The leader's sweeps block from now on (as on a stuck query) while its lease
        // renewal and heartbeat go on; then a step hangs past its deadline.
        hung_gate.close();
        let blocked_at = Instant::now();
        let id = next.start("hang_once", &()).await.expect("start");

        let new_fence = eventually_some(
            STALL_TAKEOVER_MAX,
            "the other instance to take over from the hung leader",
            || async { next.supervisor_internals().and_then(|s| s.fence()) },
        )
        .await;
        let took = blocked_at.elapsed();
        assert!(
            new_fence.term > old_term,
            "[{}] a new term ({} after {old_term})",
            db.backend,
            new_fence.term
        );
        assert!(
            !hung_sup.is_leader(),
            "[{}] the hung leader's term ended although its sweep never returned",
            db.backend
        );
        assert_eq!(hung_sup.stats().stalls, 1, "[{}]", db.backend);
        eprintln!(
            "[{}] takeover {took:?} after the sweeps blocked",
            db.backend
        );

        // The new leader rescues the step the hung one left: the run completes.
        sagaflow_testkit::expect_state(next, id, RunState::Completed, db.backend).await;
        let history = next.history(id).await.expect("history");
        let timeout = history
            .iter()
            .find(|h| h.kind == HistoryKind::Timeout)
            .unwrap_or_else(|| panic!("[{}] no timeout in {history:?}", db.backend));
        assert_eq!(timeout.actor, new_fence.actor(), "[{}]", db.backend);

        hung_gate.open();
        a.shutdown().await;
        b.shutdown().await;
    }
}

fn stalled_alerts(rows: &[Alert]) -> Vec<&Alert> {
    rows.iter()
        .filter(|a| a.kind == AlertKind::SupervisorStalled)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_raise_one_supervisor_stalled_alert_while_no_leader_sweeps() {
    for db in backends().await {
        // One gate for both instances, closed from the start: no sweep ever completes, so
        // each leader in turn gives up its term and the lease's last sweep keeps ageing.
        let gate = SweepGate::new();
        gate.close();
        let a = stall_engine(&db, "stuck-a", &gate).await;
        let b = stall_engine(&db, "stuck-b", &gate).await;
        let (mut alerts_a, mut alerts_b) = (a.subscribe_alerts(), b.subscribe_alerts());
        let store = a.store();

        let alert = eventually_some(
            Duration::from_secs(15),
            "a supervisor_stalled alert",
            || async {
                let open = store.alert_list(None, true).await.expect("alerts");
                stalled_alerts(&open).first().map(|a| (*a).clone())
            },
        )
        .await;
        assert!(
            alert.reason.contains("no supervisor sweep has completed"),
            "[{}] {}",
            db.backend,
            alert.reason
        );
        assert_eq!((alert.run_id, alert.step.as_deref()), (None, None));

        // The stall goes on for two more stalled terms (many follower polls each)…
        let stalls = || {
            a.supervisor().expect("s").stats().stalls + b.supervisor().expect("s").stats().stalls
        };
        let seen = stalls();
        eventually(
            Duration::from_secs(15),
            "two more stalled terms",
            || async { stalls() >= seen + 2 },
        )
        .await;
        // …and the alert was stored and delivered once.
        let all = store.alert_list(None, false).await.expect("alerts");
        assert_eq!(stalled_alerts(&all).len(), 1, "[{}] {all:?}", db.backend);
        let mut delivered = 0;
        for rx in [&mut alerts_a, &mut alerts_b] {
            while let Ok(row) = rx.try_recv() {
                delivered += usize::from(row.kind == AlertKind::SupervisorStalled);
            }
        }
        assert_eq!(delivered, 1, "[{}] deliveries", db.backend);

        // Sweeps resume: the alert resolves itself.
        gate.open();
        eventually(
            Duration::from_secs(15),
            "the stall alert to resolve",
            || async {
                let open = store.alert_list(None, true).await.expect("alerts");
                stalled_alerts(&open).is_empty()
            },
        )
        .await;
        let all = store.alert_list(None, false).await.expect("alerts");
        assert_eq!(stalled_alerts(&all).len(), 1, "[{}] {all:?}", db.backend);
        // Resolved by the engine itself, saying what went away.
        let resolved = stalled_alerts(&all)[0];
        assert_eq!(
            (
                resolved.resolved_by.as_deref(),
                resolved.resolution.as_deref()
            ),
            (
                Some(sagaflow::RESOLVED_BY_ENGINE),
                Some("supervisor sweeps are completing again")
            ),
            "[{}] {resolved:?}",
            db.backend
        );

        a.shutdown().await;
        b.shutdown().await;
    }
}

/// The retention pass runs as often as `with_retention_interval` says: with a retention of
/// zero and a pass every 200 ms, a finished run is purged within seconds (at the default
/// interval of a minute, the wait below would time out); a zero interval is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_pass_runs_at_its_configured_interval() {
    for db in backends().await {
        let b = db.backend;
        let refused = fast_builder(&db)
            .with_workflow(one_step("kept", 1, Duration::from_secs(30)))
            .with_retention_interval(Duration::ZERO)
            .start()
            .await;
        assert!(
            matches!(refused, Err(Error::Config(ref m)) if m.contains("retention")),
            "[{b}] {:?}",
            refused.err()
        );
        let engine = fast_builder(&db)
            .with_workflow(one_step("kept", 1, Duration::from_secs(30)))
            .with_retention(Some(Duration::ZERO))
            .with_retention_interval(Duration::from_millis(200))
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let id = engine.start("kept", &()).await.expect("start");
        eventually(
            Duration::from_secs(20),
            "the finished run purged",
            || async { matches!(engine.run(id).await, Ok(None)) },
        )
        .await;
        engine.shutdown().await;
    }
}

/// A follower that saw sweeps resume resolves the `supervisor_stalled` alert only while the
/// lease still shows a recent sweep: when the leader stalled again and another follower
/// raised a new alert after the first follower's read, that alert stays open. The resolve
/// reads the lease again in its own write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_alert_raised_after_a_followers_read_is_not_resolved_by_it() {
    use sagaflow::sea_orm::{ConnectionTrait, Statement, Value};
    for db in backends().await {
        let b = db.backend;
        let store = Store::connect(&db.url, Some(2)).await.expect("connect");
        let lease = "stall-probe";
        let key = format!("supervisor_stalled:{lease}");
        let conn = store.connection();
        let sweep_at = |ago_ms: i64| {
            Statement::from_sql_and_values(
                conn.get_database_backend(),
                "INSERT INTO sagaflow_leases (name, holder, term, expires_at, last_sweep_at) \
                 VALUES ($1, NULL, 1, 0, $2) \
                 ON CONFLICT (name) DO UPDATE SET last_sweep_at = excluded.last_sweep_at",
                [
                    Value::from(lease),
                    Value::from(
                        i64::try_from(
                            std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .expect("clock")
                                .as_millis(),
                        )
                        .expect("ms")
                            - ago_ms,
                    ),
                ],
            )
        };
        // The leader stalled (its last sweep a minute ago) and a follower raised the alert.
        conn.execute_raw(sweep_at(60_000)).await.expect("lease");
        let alert = store::NewAlert {
            run_id: None,
            step: None,
            kind: AlertKind::SupervisorStalled,
            reason: "no supervisor sweep has completed for 60 s".into(),
            attempts: 0,
            actions: vec![],
            open_key: Some(key.clone()),
        };
        store.alert_insert(&alert).await.expect("alert");
        let resolve = || async {
            store
                .alert_resolve_stall(
                    &key,
                    lease,
                    10_000,
                    "supervisor sweeps are completing again",
                )
                .await
                .expect("resolve")
        };
        // Another follower, whose read saw sweeps completing, resolves now: refused.
        let resolved = resolve().await;
        assert!(
            !resolved,
            "[{b}] resolved while the lease shows no recent sweep"
        );
        let open = store.alert_list(None, true).await.expect("alerts");
        assert_eq!(stalled_alerts(&open).len(), 1, "[{b}]");
        // Sweeps really resume: resolved.
        conn.execute_raw(sweep_at(0)).await.expect("lease");
        let resolved = resolve().await;
        assert!(resolved, "[{b}] not resolved after a recent sweep");
    }
}
