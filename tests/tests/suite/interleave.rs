//! Two writers meeting on one run, on both backends: the interleaving matrix and the defects
//! it was built to catch.
//!
//! A unit of work of one engine (an evaluation, an operator's action, a version migration, a
//! retention purge, a rescue, a completion batch, an event delivery, the timer pass, a
//! resource claim) is held at a pause point (after its reads, before its commit) while a
//! competing writer (a claim, a supervisor rescue, another evaluation, an operator's cancel,
//! a migration, a purge, a late completion, an event, the timer pass) runs against the same
//! run; then the held unit goes on. Whatever order the database let
//! them in, the rows they leave must keep the promise (see [`check`]). A writer that blocks
//! behind the held unit's locks is given [`BLOCKED_AFTER`] to show it, then the held unit is
//! released; either way both finish, and the outcome is checked, not the timing.
//!
//! A new unit of work joins the matrix by being listed in `Unit::ALL` (with a setup here), a
//! new competing writer by being listed in [`Writer::ALL`]; a new pause point by being listed
//! in `Point::ALL` (and in `Unit::points` of the units that stop there).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sagaflow::check::Invariant;
use sagaflow::internals::Registry;
use sagaflow::internals::deliver::{send_event, wake_due_steps};
use sagaflow::internals::interleave::{PauseHook, Point, Unit};
use sagaflow::internals::rescue::rescue_steps;
use sagaflow::internals::scheduler::{finish_batch, plan_and_apply};
use sagaflow::internals::store::{self, ClaimedStep, Store};
use sagaflow::internals::transition::{self, Counters, Trigger};
use sagaflow::sea_orm::{ConnectionTrait, Statement, Value};
use sagaflow::{
    Engine, EngineBuilder, Resource, StepContext, StepError, StepState, Uuid, Workflow,
};
use sagaflow_testkit::{TestDb, backends, fast_builder, postgres_db, sqlite_db};

/// How long a competing writer may take before it counts as blocked behind the held unit.
const BLOCKED_AFTER: Duration = Duration::from_millis(300);
/// The bound on every other wait of these tests.
const LIMIT: Duration = Duration::from_secs(20);

/// `pair@v`: three roots, `a`, `b` and `c`, each undone by its compensation; `c` calls the
/// remote resource `api`, so it is claimed apart, within the resource's limits. Nothing
/// runs them here: the tests move their rows.
fn pair(version: i32) -> Workflow {
    let ok = |_: StepContext| async { Ok::<_, StepError>(()) };
    Workflow::builder("pair", version)
        .step("a", ok)
        .compensate(ok)
        .step("b", ok)
        .compensate(ok)
        .step("c", ok)
        .resource("api")
        .compensate(ok)
        .build()
        .expect("valid")
}

/// A passive engine (no claims, no supervisor) of the matrix's database, with `pair`'s
/// resource declared.
fn passive(db: &TestDb) -> EngineBuilder {
    fast_builder(db)
        .with_workers(false)
        .with_supervisor(false)
        .with_resource(Resource::new("api").max_in_flight(8))
}

/// The workflow keys the claims take.
fn pair_keys() -> Vec<String> {
    vec!["pair@1".to_owned(), "pair@2".to_owned()]
}

/// The event a waiting `b` waits for.
const EVENT: &str = "go";
/// A due time far ahead (year 2100, in milliseconds).
const FAR: i64 = 4_102_444_800_000;

/// How a competing writer met the held unit of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Meeting {
    /// It ran to its end while the unit was held.
    Ran,
    /// It waited for the held unit's locks.
    Blocked,
    /// The unit ended without reaching its point (it had nothing to write), the writer ran
    /// after it.
    After,
}

/// A step row as the checks read it: name, state, owner, due time.
type StepLine = (String, String, Option<String>, Option<i64>);

/// A competing writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    /// The claims of an instance (`intruder`): the plain claim (lock-free, one statement),
    /// then the claim of `api`'s steps (a transaction holding the resource's row).
    Claim,
    /// The supervisor's rescue of `b`, held by an instance past its deadline.
    Rescue,
    /// Another evaluation of the run.
    Evaluate,
    /// An operator's cancel of the run.
    Cancel,
    /// A migration of the runs of `pair@1` to `pair@2`.
    Migrate,
    /// The retention purge, with a retention of zero.
    Purge,
    /// The completion batch of `b`'s attempt (succeeded), held by `ghost`: live when the
    /// writer set it up, a late one when the held unit rescues it.
    Complete,
    /// The event `b` waits for, sent to the run.
    Deliver,
    /// The timer pass, with `b` waiting on a timer that is due.
    Wake,
    /// The end of a child run `b` waits for: its evaluation completes it and wakes `b`.
    ChildEnd,
    /// An operator's rollback of the run to `a` (completed by the setup when it was
    /// queued), then two evaluations: the steps after `a` are undone or dropped, and start
    /// afresh when nothing is left to undo.
    Rollback,
    /// An operator's pause of the run.
    Pause,
}

impl Writer {
    const ALL: [Writer; 12] = [
        Self::Claim,
        Self::Rescue,
        Self::Evaluate,
        Self::Cancel,
        Self::Migrate,
        Self::Purge,
        Self::Complete,
        Self::Deliver,
        Self::Wake,
        Self::ChildEnd,
        Self::Rollback,
        Self::Pause,
    ];
}

/// One database with a passive engine (no claims, no supervisor) whose units of work stop
/// where `hook` holds them, and the plain store the competing writers use.
struct Rig {
    db: TestDb,
    engine: Engine,
    /// Starts runs of `pair@1` (an engine starts a workflow's newest version it has).
    intake: Engine,
    /// Another passive engine, without pause points: the competing operator.
    peer: Engine,
    hook: Arc<PauseHook>,
    plain: Store,
    registry: Registry,
    /// The child run of the triple in progress, if its writer made one.
    child: std::sync::Mutex<Option<Uuid>>,
    /// Triples whose child ended and woke `b`.
    woken_by_child: std::sync::atomic::AtomicUsize,
}

/// A passive engine that has `pair@1` only: what it starts is a run of version 1.
async fn v1_intake(db: &TestDb) -> Engine {
    passive(db)
        .with_workflow(pair(1))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] intake: {e}", db.backend))
}

async fn rig(db: TestDb) -> Rig {
    sagaflow_testkit::init_logging();
    let hook = Arc::new(PauseHook::new());
    let engine = passive(&db)
        .with_workflow(pair(1))
        .with_workflow(pair(2))
        .with_pause_hook(hook.clone())
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] start: {e}", db.backend));
    let intake = v1_intake(&db).await;
    let peer = passive(&db)
        .with_workflow(pair(1))
        .with_workflow(pair(2))
        .start()
        .await
        .unwrap_or_else(|e| panic!("[{}] peer: {e}", db.backend));
    let plain = Store::open(&db.url, &Default::default())
        .await
        .expect("plain store");
    let mut registry = Registry::new();
    registry.register(pair(1)).expect("register");
    registry.register(pair(2)).expect("register");
    Rig {
        db,
        engine,
        intake,
        peer,
        hook,
        plain,
        registry,
        child: std::sync::Mutex::new(None),
        woken_by_child: std::sync::atomic::AtomicUsize::new(0),
    }
}

impl Rig {
    async fn shutdown(&self) {
        self.intake.shutdown().await;
        self.peer.shutdown().await;
        self.engine.shutdown().await;
    }

    /// `b` claimed by an instance (by hand, as the claim writes it) whose deadline passed.
    async fn claim_b_expired(&self, run: Uuid) {
        self.claim_b(run, 1).await;
    }

    /// `b` claimed by `ghost` (by hand, as the claim writes it), due to end by `complete_by`.
    async fn claim_b(&self, run: Uuid, complete_by: i64) {
        let n = self
            .sql(
                &format!(
                    "UPDATE sagaflow_steps SET state = 'running', locked_by = 'ghost', \
                     attempt = attempt + 1, forward_attempts = forward_attempts + 1, \
                     complete_by = {complete_by}, available_at = NULL WHERE run_id = $1 \
                     AND name = 'b' AND state = 'ready'"
                ),
                run,
            )
            .await;
        assert_eq!(n, 1, "[{}] setup claim", self.db.backend);
    }

    /// `b` waiting (as a park writes it): for the event [`EVENT`] until far ahead, or on a
    /// timer that is due.
    async fn park_b(&self, run: Uuid, on_event: bool) {
        let (wait, due) = if on_event {
            (
                format!(r#"{{"for":"event","name":"{EVENT}","timeout_ms":60000}}"#),
                FAR,
            )
        } else {
            (r#"{"for":"timer","timeout_ms":0}"#.to_owned(), 1)
        };
        let n = self
            .sql(
                &format!(
                    "UPDATE sagaflow_steps SET state = 'waiting', wait = '{wait}', \
                     available_at = {due} WHERE run_id = $1 AND name = 'b' AND state = 'ready'"
                ),
                run,
            )
            .await;
        assert_eq!(n, 1, "[{}] setup park", self.db.backend);
    }

    /// A child run of `run`'s step `b` (a run of `pair@1` whose steps all completed, so its
    /// next evaluation completes it), with `b` waiting for it.
    async fn child_of_b(&self, run: Uuid) -> Uuid {
        let child = self.run().await;
        let conn = self.plain.connection();
        let n = conn
            .execute_raw(Statement::from_sql_and_values(
                conn.get_database_backend(),
                "UPDATE sagaflow_runs SET parent_step = (SELECT id FROM sagaflow_steps \
                 WHERE run_id = $1 AND name = 'b') WHERE id = $2",
                [Value::from(run), Value::from(child)],
            ))
            .await
            .expect("link the child")
            .rows_affected();
        assert_eq!(n, 1, "[{}] setup child", self.db.backend);
        self.sql(
            "UPDATE sagaflow_steps SET state = 'completed', available_at = NULL, output = 'null' \
             WHERE run_id = $1",
            child,
        )
        .await;
        let wait =
            format!(r#"{{"for":"child","run_id":"{child}","workflow":"pair","timeout_ms":60000}}"#);
        let n = self
            .sql(
                &format!(
                    "UPDATE sagaflow_steps SET state = 'waiting', wait = '{wait}', \
                     available_at = {FAR} WHERE run_id = $1 AND name = 'b' AND state = 'ready'"
                ),
                run,
            )
            .await;
        assert_eq!(n, 1, "[{}] setup park", self.db.backend);
        *self.child.lock().expect("child") = Some(child);
        child
    }

    /// `b`'s attempt held by `ghost`, ended as succeeded (fenced by the attempt it has now).
    async fn b_succeeded(&self, run: Uuid) -> store::StepFinish {
        let conn = self.plain.connection();
        let row = conn
            .query_one_raw(Statement::from_sql_and_values(
                conn.get_database_backend(),
                "SELECT id, attempt FROM sagaflow_steps WHERE run_id = $1 AND name = 'b'",
                [Value::from(run)],
            ))
            .await
            .expect("read b");
        // A finished run has no `b`: the attempt's end then meets no row, as a late one does.
        let (id, attempt) = row.map_or((0, 0), |r| {
            (
                r.try_get::<i64>("", "id").expect("id"),
                r.try_get::<i32>("", "attempt").expect("attempt"),
            )
        });
        let counters = Counters {
            failure_count: 0,
            max_failures: 3,
            interruptions: 0,
            max_interruptions: 3,
            deadline_ms: 1_000,
            deadline_cap_ms: 1_000,
            phase_attempt: 1,
        };
        store::StepFinish {
            id,
            run_id: run,
            workflow_key: "pair@1".into(),
            name: "b".into(),
            attempt,
            owner: "ghost".into(),
            change: transition::decide(StepState::Running, Trigger::Succeeded, &counters, false, 0)
                .expect("edge"),
            output: Some("null".into()),
            error: None,
            guard: store::DeadlineGuard::Live,
            elapsed: None,
            wait: store::WaitWrite::Clear,
        }
    }

    /// The claim of `api`'s steps on `store` for `owner`; the ids it claimed.
    async fn claim_api(&self, store: &Store, owner: &str) -> Vec<i64> {
        let no_outputs = |_: &ClaimedStep| false;
        store
            .resource_claim(
                &store::ResourceAsk {
                    owner,
                    resource: "api",
                    workflow_keys: &pair_keys(),
                    limit: 8,
                    busy: true,
                },
                &no_outputs,
            )
            .await
            .expect("resource claim")
            .claimed
            .into_iter()
            .map(|c| c.id)
            .collect()
    }

    /// The supervisor's rescue (listing, then the fenced writes) on `store`.
    async fn rescue(&self, store: &Store) {
        let expired = store.step_list_rescuable(60_000, 16).await.expect("list");
        let items: Vec<_> = expired.iter().map(transition::rescue).collect();
        rescue_steps(store, None, &items).await.expect("rescue");
    }

    /// Ends `b`'s attempt as succeeded on `store` (a completion batch); a fenced miss is an
    /// answer.
    async fn complete_b(&self, store: &Store, run: Uuid) {
        let done = self.b_succeeded(run).await;
        finish_batch(store, &self.registry, &[done], "test")
            .await
            .expect("completion batch");
    }

    /// Runs `sql` with `$1` bound to `run`.
    async fn sql(&self, sql: &str, run: Uuid) -> u64 {
        let conn = self.plain.connection();
        conn.execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            sql,
            [Value::from(run)],
        ))
        .await
        .unwrap_or_else(|e| panic!("[{}] {sql}: {e}", self.db.backend))
        .rows_affected()
    }

    /// A fresh run of `pair@1`: `a` and `b` ready.
    /// A run of `pair` whose steps all completed: its next evaluation ends it.
    async fn run_done_but_not_ended(&self) -> Uuid {
        let run = self.run().await;
        self.complete_all(run).await;
        run
    }

    /// Completes every step of `run` (written, not evaluated).
    async fn complete_all(&self, run: Uuid) {
        self.sql(
            "UPDATE sagaflow_steps SET state = 'completed', available_at = NULL, output = 'null' \
             WHERE run_id = $1",
            run,
        )
        .await;
    }

    async fn run(&self) -> Uuid {
        self.intake
            .start("pair", &serde_json::json!(null))
            .await
            .expect("start")
    }

    /// Evaluates `run` on `store`, as the evaluation loop does.
    async fn evaluate(&self, store: &Store, run: Uuid) {
        self.evaluate_runs(store, &[run]).await;
    }

    /// Evaluates `runs` on `store` in one unit of work, as the evaluation loop does a batch.
    async fn evaluate_runs(&self, store: &Store, runs: &[Uuid]) {
        let mut tx = store.begin().await.expect("begin");
        let runs = tx.runs_lock(runs, false).await.expect("lock");
        plan_and_apply(&mut tx, &self.registry, runs, HashMap::new(), "test")
            .await
            .expect("evaluate");
        tx.pause_point(Unit::Evaluate, Point::BeforeCommit).await;
        // A test's own write: nothing for the metrics to count.
        let _uncounted = tx.commit().await.expect("commit");
    }

    /// The held unit's setup and action: what `unit` does to `run`.
    async fn prepare(&self, unit: Unit, run: Uuid) {
        match unit {
            // `a` failed for good without acting: the evaluation unwinds the run, drops `b`
            // and (with nothing else to undo) ends it compensated.
            Unit::Evaluate => {
                self.sql(
                    "UPDATE sagaflow_steps SET state = 'failed', failure_count = max_failures \
                     WHERE run_id = $1 AND name = 'a'",
                    run,
                )
                .await;
            }
            // A run that completed long ago: its steps are gone, its finish time is old.
            Unit::Purge => {
                self.sql("DELETE FROM sagaflow_steps WHERE run_id = $1", run)
                    .await;
                self.sql(
                    "UPDATE sagaflow_runs SET state = 'completed', finished_at = 1 WHERE id = $1",
                    run,
                )
                .await;
            }
            Unit::Rescue => self.claim_b_expired(run).await,
            Unit::Complete => self.claim_b(run, FAR).await,
            Unit::Deliver => self.park_b(run, true).await,
            Unit::Wake => self.park_b(run, false).await,
            _ => {}
        }
    }

    /// What `unit` does to `run`; the steps it claimed (ids), with the owner they must keep.
    async fn act(&self, unit: Unit, run: Uuid) -> Vec<(i64, &'static str)> {
        match unit {
            Unit::Evaluate => {
                let held = self.engine.store().clone();
                self.evaluate(&held, run).await;
            }
            Unit::Operator => {
                // Refused when the competitor finished the run first: that is an answer.
                let _ = self.engine.operator().cancel(run).await;
            }
            Unit::Migrate => {
                self.engine
                    .operator()
                    .migrate("pair", 1, 2)
                    .await
                    .expect("migrate");
            }
            Unit::Purge => {
                self.engine
                    .purge_finished(Duration::ZERO)
                    .await
                    .expect("purge");
            }
            Unit::Rescue => {
                let held = self.engine.store().clone();
                self.rescue(&held).await;
            }
            Unit::Complete => {
                let held = self.engine.store().clone();
                self.complete_b(&held, run).await;
            }
            Unit::Deliver => {
                // Refused when the competitor finished the run first: that is an answer.
                let _ = send_event(
                    self.engine.store(),
                    run,
                    EVENT,
                    &serde_json::json!(1),
                    "test",
                )
                .await;
            }
            Unit::Wake => {
                wake_due_steps(self.engine.store(), 16, "test")
                    .await
                    .expect("timer pass");
            }
            Unit::Claim => {
                let held = self.engine.store().clone();
                let ids = self.claim_api(&held, "held").await;
                // `c` was due and nothing else claims it before the held unit.
                assert_eq!(
                    ids.len(),
                    1,
                    "[{}] the resource claim took {ids:?}",
                    self.db.backend
                );
                return ids.into_iter().map(|id| (id, "held")).collect();
            }
            _ => unreachable!("a unit without a setup: add it to `prepare` and `act`"),
        }
        Vec::new()
    }

    /// The competing writer's setup (before the held unit starts). Units that set `b` up
    /// themselves (a rescue, a completion, a delivery, a wake) leave it as it is: the writer
    /// meets the unit's `b` (rescues its attempt, completes it late, sends an event nobody
    /// waits for, finds no timer due).
    async fn prepare_writer(&self, unit: Unit, w: Writer, run: Uuid) {
        if matches!(
            unit,
            Unit::Rescue | Unit::Complete | Unit::Deliver | Unit::Wake
        ) {
            return;
        }
        match w {
            Writer::Rescue => self.claim_b_expired(run).await,
            Writer::Complete => self.claim_b(run, FAR).await,
            Writer::Deliver => self.park_b(run, true).await,
            Writer::Wake => self.park_b(run, false).await,
            Writer::ChildEnd => {
                self.child_of_b(run).await;
            }
            Writer::Rollback => {
                self.sql(
                    "UPDATE sagaflow_steps SET state = 'completed', available_at = NULL \
                     WHERE run_id = $1 AND name = 'a' AND state = 'ready'",
                    run,
                )
                .await;
            }
            _ => {}
        }
    }

    /// The competing writer; returns the steps it claimed (ids).
    async fn write(&self, w: Writer, run: Uuid) -> Vec<i64> {
        match w {
            Writer::Claim => {
                let mut ids: Vec<i64> = self
                    .plain
                    .step_claim("intruder", &pair_keys(), 8)
                    .await
                    .expect("claim")
                    .into_iter()
                    .filter(|c| c.run_id == run)
                    .map(|c| c.id)
                    .collect();
                ids.extend(self.claim_api(&self.plain, "intruder").await);
                ids
            }
            Writer::Rescue => {
                self.rescue(&self.plain).await;
                Vec::new()
            }
            Writer::Evaluate => {
                self.evaluate(&self.plain, run).await;
                Vec::new()
            }
            Writer::Cancel => {
                // Refused when the run finished meanwhile: that is an answer.
                let _ = self.peer.operator().cancel(run).await;
                Vec::new()
            }
            Writer::Migrate => {
                self.peer
                    .operator()
                    .migrate("pair", 1, 2)
                    .await
                    .expect("migrate");
                Vec::new()
            }
            Writer::Purge => {
                self.peer
                    .purge_finished(Duration::ZERO)
                    .await
                    .expect("purge");
                Vec::new()
            }
            Writer::Complete => {
                self.complete_b(&self.plain, run).await;
                Vec::new()
            }
            Writer::Deliver => {
                // Refused when the run finished meanwhile: that is an answer.
                let _ = send_event(&self.plain, run, EVENT, &serde_json::json!(2), "test").await;
                Vec::new()
            }
            Writer::Wake => {
                wake_due_steps(&self.plain, 16, "test")
                    .await
                    .expect("timer pass");
                Vec::new()
            }
            Writer::ChildEnd => {
                // A unit that set `b` up itself leaves no child: nothing ends.
                let child = *self.child.lock().expect("child");
                if let Some(child) = child {
                    self.evaluate(&self.plain, child).await;
                }
                Vec::new()
            }
            Writer::Rollback => {
                // Refused when `a` is not completed, a step is in flight, or the run is
                // undoing or finished: that is an answer.
                if self.peer.operator().rollback(run, "a", None).await.is_ok() {
                    self.evaluate(&self.plain, run).await;
                    self.evaluate(&self.plain, run).await;
                }
                Vec::new()
            }
            Writer::Pause => {
                // Refused when the run finished meanwhile: that is an answer.
                let _ = self.peer.operator().pause(run).await;
                Vec::new()
            }
        }
    }

    /// The run's state and its step rows (name, state, locked_by, available_at).
    async fn rows(&self, run: Uuid) -> (Option<String>, Vec<StepLine>) {
        let conn = self.plain.connection();
        let b = conn.get_database_backend();
        let state = conn
            .query_one_raw(Statement::from_sql_and_values(
                b,
                "SELECT state FROM sagaflow_runs_all WHERE id = $1",
                [Value::from(run)],
            ))
            .await
            .expect("run")
            .map(|r| r.try_get::<String>("", "state").expect("state"));
        let steps = conn
            .query_all_raw(Statement::from_sql_and_values(
                b,
                "SELECT name, state, locked_by, available_at FROM sagaflow_steps WHERE run_id = $1 \
                 ORDER BY name",
                [Value::from(run)],
            ))
            .await
            .expect("steps")
            .iter()
            .map(|r| {
                (
                    r.try_get("", "name").expect("name"),
                    r.try_get("", "state").expect("state"),
                    r.try_get("", "locked_by").expect("locked_by"),
                    r.try_get("", "available_at").expect("available_at"),
                )
            })
            .collect();
        (state, steps)
    }

    /// Evaluates `held` in one unit of work on the hooked store, held at `point`, while
    /// `others` are evaluated in one on the plain store; then releases it. Returns whether
    /// the others waited for the held unit ([`BLOCKED_AFTER`]); panics when the two never
    /// both finish.
    async fn evaluate_beside_held(&self, held: &[Uuid], point: Point, others: &[Uuid]) -> bool {
        let b = self.db.backend;
        let hold = self.hook.hold(Unit::Evaluate, point);
        let hooked = self.engine.store().clone();
        let held_end = self.evaluate_runs(&hooked, held);
        let other_end = async {
            tokio::time::timeout(LIMIT, hold.reached())
                .await
                .unwrap_or_else(|_| panic!("[{b}] the held unit reached its point"));
            let ending = self.evaluate_runs(&self.plain, others);
            tokio::pin!(ending);
            let blocked = tokio::time::timeout(BLOCKED_AFTER, &mut ending)
                .await
                .is_err();
            hold.release();
            if blocked {
                ending.await;
            }
            blocked
        };
        let ((), blocked) =
            tokio::time::timeout(LIMIT, async { tokio::join!(held_end, other_end) })
                .await
                .unwrap_or_else(|_| panic!("[{b}] deadlocked"));
        blocked
    }

    /// Asserts that each of `runs` (named) completed for good: no step left and, on
    /// PostgreSQL, moved to the finished runs' table. `order` says how the test met them.
    async fn assert_completed_for_good(&self, order: &str, runs: &[(&str, Uuid)]) {
        let b = self.db.backend;
        for &(what, run) in runs {
            let (state, steps) = self.rows(run).await;
            assert_eq!(
                (state.as_deref(), steps.len()),
                (Some("completed"), 0),
                "[{b}] {order}: the {what} ended and its steps went: {steps:?}"
            );
            if b == "postgres" {
                assert_eq!(
                    self.tables_of(run).await,
                    (0, 1),
                    "[{b}] {order}: the {what} moved to the finished runs"
                );
            }
        }
    }

    /// Asserts that `child` completed and that its end woke `parent`'s step `b`, due, in a
    /// parent still running.
    async fn assert_child_ended_and_woke(&self, parent: Uuid, child: Uuid) {
        let b = self.db.backend;
        assert_eq!(
            self.rows(child).await.0.as_deref(),
            Some("completed"),
            "[{b}] the child {child} ended"
        );
        let (state, steps) = self.rows(parent).await;
        let woken = steps.iter().find(|s| s.0 == "b").expect("b");
        assert!(
            state.as_deref() == Some("running") && woken.1 == "ready" && woken.3.is_some(),
            "[{b}] the child's end woke the parent's step, due: {state:?} {steps:?}"
        );
    }

    /// How many rows of `run` the runs table and the finished runs' table hold (PostgreSQL).
    async fn tables_of(&self, run: Uuid) -> (i64, i64) {
        let conn = self.plain.connection();
        let row = conn
            .query_one_raw(Statement::from_sql_and_values(
                conn.get_database_backend(),
                "SELECT (SELECT COUNT(*) FROM sagaflow_runs WHERE id = $1) AS live, \
                 (SELECT COUNT(*) FROM sagaflow_runs_done WHERE id = $1) AS done",
                [Value::from(run)],
            ))
            .await
            .expect("where is the run")
            .expect("a row");
        let n = |c: &str| row.try_get::<i64>("", c).expect("a count");
        (n("live"), n("done"))
    }

    /// Holds `unit` at `point` while `writer` runs against one fresh run, then checks what
    /// they left. Returns how the two met.
    async fn triple(&self, unit: Unit, point: Point, writer: Writer) -> Meeting {
        let run = self.run().await;
        self.prepare(unit, run).await;
        if unit != Unit::Purge {
            // A finished run has nothing a writer could hold.
            self.prepare_writer(unit, writer, run).await;
        }
        let held = self.hook.hold(unit, point);
        let what = format!(
            "[{}] {} at {} against {writer:?}",
            self.db.backend,
            unit.as_str(),
            point.as_str()
        );
        // A unit that decides to write nothing may end without reaching its point (a
        // migration refused, a purge with nothing to take): the writer then runs after it.
        let finished = tokio_util::sync::CancellationToken::new();
        let unit_done = async {
            let claimed = self.act(unit, run).await;
            finished.cancel();
            claimed
        };
        let both = async {
            tokio::time::timeout(LIMIT, async {
                tokio::select! {
                    () = held.reached() => {}
                    () = finished.cancelled() => {}
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{what}: the unit neither reached its point nor ended"));
            let writing = self.write(writer, run);
            tokio::pin!(writing);
            let outcome = match tokio::time::timeout(BLOCKED_AFTER, &mut writing).await {
                Ok(c) => (c, Meeting::Ran),
                Err(_) => {
                    held.release();
                    (writing.await, Meeting::Blocked)
                }
            };
            held.release();
            outcome
        };
        let (mut claimed, (intruded, mut meeting)) =
            tokio::time::timeout(LIMIT, async { tokio::join!(unit_done, both) })
                .await
                .unwrap_or_else(|_| panic!("{what}: deadlocked"));
        if !held.has_reached() {
            meeting = Meeting::After;
        }
        claimed.extend(intruded.into_iter().map(|id| (id, "intruder")));
        self.check(&what, run, &claimed).await;
        // The history checker's row invariants (its history ones would flag the setups'
        // hand-made moves, which write no history).
        let report = sagaflow::check::check(self.plain.connection())
            .await
            .expect("history check");
        for v in &report.violations {
            assert!(
                !matches!(
                    v.invariant,
                    Invariant::InFlightAfterFinish | Invariant::Stuck
                ),
                "{what}: {v}"
            );
        }
        // The next triple's units must meet their own run only (a migration takes every run
        // of its version, oldest first).
        let child = self.child.lock().expect("child").take();
        if let Some(child) = child {
            // A child that ended woke the parent's step that waited for it.
            let (child_state, _) = self.rows(child).await;
            let (_, steps) = self.rows(run).await;
            let b = steps.iter().find(|s| s.0 == "b").map(|s| s.1.as_str());
            assert!(
                !(matches!(child_state.as_deref(), Some("completed")) && b == Some("waiting")),
                "{what}: the child completed and `b` still waits for it"
            );
            if matches!(child_state.as_deref(), Some("completed")) && b == Some("ready") {
                self.woken_by_child
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        for id in std::iter::once(run).chain(child) {
            self.sql("DELETE FROM sagaflow_steps WHERE run_id = $1", id)
                .await;
            self.sql("DELETE FROM sagaflow_runs WHERE id = $1", id)
                .await;
        }
        meeting
    }

    /// What every interleaving must leave behind: a run in a final state has no step rows
    /// (none in flight, none queued); a step the held unit or the competing writer claimed is
    /// still that attempt in flight (nobody moved it under its feet, nobody deleted it) and
    /// its run is not final; a run that is not final has no step the writers left without a
    /// way on.
    async fn check(&self, what: &str, run: Uuid, claimed: &[(i64, &str)]) {
        let (state, steps) = self.rows(run).await;
        let final_state = matches!(state.as_deref(), Some("completed" | "compensated") | None);
        if final_state {
            assert!(
                steps.is_empty(),
                "{what}: the run is {state:?} but has step rows {steps:?}"
            );
        }
        for (id, owner) in claimed {
            let row = self.step_row(*id).await;
            assert_eq!(
                row.as_ref().map(|(s, l)| (s.as_str(), l.as_deref())),
                Some(("running", Some(*owner))),
                "{what}: the claimed step {id} was moved under its attempt (run {state:?}, steps {steps:?})"
            );
            assert!(
                !final_state,
                "{what}: the run ended {state:?} with a claimed step in flight"
            );
        }
        for (name, s, _, due) in &steps {
            // A queued step the writers left must be due, or parked in a paused run; a
            // paused run's queued steps are all parked (a due one starts a new attempt in a
            // run the operator stopped).
            if s == "ready" || s == "compensation_ready" {
                assert_eq!(
                    state.as_deref() == Some("paused"),
                    due.is_none(),
                    "{what}: step `{name}` is {s} with due time {due:?} in a run that is {state:?}"
                );
            }
        }
    }

    async fn step_row(&self, id: i64) -> Option<(String, Option<String>)> {
        let conn = self.plain.connection();
        conn.query_one_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            "SELECT state, locked_by FROM sagaflow_steps WHERE id = $1",
            [Value::from(id)],
        ))
        .await
        .expect("step")
        .map(|r| {
            (
                r.try_get("", "state").expect("state"),
                r.try_get("", "locked_by").expect("locked_by"),
            )
        })
    }
}

/// Every (unit of work × pause point × competing writer) on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_matrix_every_unit_point_and_writer_on_sqlite() {
    matrix(sqlite_db()).await;
}

/// Every (unit of work × pause point × competing writer) on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_matrix_every_unit_point_and_writer_on_postgres() {
    // Without PostgreSQL (not configured, not required) `postgres_db` says it skips.
    if let Some(db) = postgres_db().await {
        matrix(db).await;
    }
}

/// The matrix on one backend (a test each, so that the two run side by side).
async fn matrix(db: TestDb) {
    let mut ran = 0;
    let mut met: HashMap<Meeting, usize> = HashMap::new();
    let r = rig(db).await;
    for unit in Unit::ALL {
        for &point in unit.points() {
            for writer in Writer::ALL {
                *met.entry(r.triple(unit, point, writer).await).or_default() += 1;
                ran += 1;
            }
        }
    }
    // The child-end writer is real: where nothing else moved `b`, the child woke it.
    assert!(
        r.woken_by_child.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "[{}] no child end woke its parent's step",
        r.db.backend
    );
    let backend = r.db.backend;
    r.shutdown().await;
    let pairs: usize = Unit::ALL.iter().map(|u| u.points().len()).sum();
    println!(
        "[{backend}] interleavings: {ran} triples run ({} units, {pairs} (unit, point) pairs x {} writers); \
         the writer ran while the unit was held in {}, waited for its locks in {}, ran after a unit \
         that had nothing to write in {}",
        Unit::ALL.len(),
        Writer::ALL.len(),
        met.get(&Meeting::Ran).unwrap_or(&0),
        met.get(&Meeting::Blocked).unwrap_or(&0),
        met.get(&Meeting::After).unwrap_or(&0),
    );
}

/// Defect 1: an evaluation that read `b` ready and decided to drop it and end the run
/// `compensated` must not do so when a claim took `b` meanwhile: the run would end with an
/// attempt in flight whose effect nothing undoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_claim_during_an_evaluation_never_ends_the_run_under_it() {
    for db in backends().await {
        let r = rig(db).await;
        r.triple(Unit::Evaluate, Point::AfterReads, Writer::Claim)
            .await;
        r.shutdown().await;
    }
}

/// Defect 1, through an operator: a cancel that read `b` ready must not drop it under a
/// claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_claim_during_a_cancel_keeps_the_attempt() {
    for db in backends().await {
        let r = rig(db).await;
        r.triple(Unit::Operator, Point::AfterReads, Writer::Claim)
            .await;
        r.shutdown().await;
    }
}

/// Defect 2: a migration that read `b` ready (and ran its mapping) must not write it back
/// to `ready` with no due time after a claim took it: the result would be dropped and the
/// run would hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_claim_during_a_migration_keeps_the_attempt() {
    for db in backends().await {
        let r = rig(db).await;
        r.triple(Unit::Migrate, Point::AfterReads, Writer::Claim)
            .await;
        r.shutdown().await;
    }
}

/// Defect 4: a mapping that marks a step of a run going forward `skipped` is refused with
/// its reason (the run could never complete, and a resume would read it as unwinding); the
/// run stays on its version, untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleave_a_migration_may_not_skip_a_step_of_a_run_going_forward() {
    use sagaflow::StepState;
    use sagaflow::migration::{MigratingRun, Migration};
    for db in backends().await {
        let engine = passive(&db)
            .with_workflow(pair(1))
            .with_workflow(pair(2))
            .with_migration(
                Migration::new("pair", 1, 2)
                    .map(|run: &mut MigratingRun| run.set_state("b", StepState::Skipped)),
            )
            .start()
            .await
            .expect("engine");
        let intake = v1_intake(&db).await;
        let run = intake.start("pair", &()).await.expect("start");
        let plan = engine
            .operator()
            .migrate("pair", 1, 2)
            .await
            .expect("migrate");
        assert_eq!(plan.refused(), 1, "[{}] {plan:?}", db.backend);
        let reason = plan.runs[0].reason.clone().unwrap_or_default();
        assert!(
            reason.contains("step `b` is skipped") && reason.contains("going forward"),
            "[{}] {reason}",
            db.backend
        );
        let view = engine.run(run).await.expect("read").expect("run");
        assert_eq!(view.version, 1, "[{}] the run stays", db.backend);
        intake.shutdown().await;
        engine.shutdown().await;
    }
}

/// `slow@1`: one step, `hold`. On instance `a` its first attempt waits for its cancellation
/// token (logging when it fires) and a later one completes; on `b` it completes at once.
fn slow(log: &crate::fixtures::Log, hangs: bool) -> Workflow {
    let log = log.clone();
    Workflow::builder("slow", 1)
        .step("hold", move |ctx: StepContext| {
            let log = log.clone();
            async move {
                if !hangs {
                    log.push("b ran");
                    return Ok::<_, StepError>(());
                }
                if ctx.attempt() > 1 {
                    // Claiming again once its heartbeat landed.
                    log.push("a ran");
                    return Ok(());
                }
                let token = ctx.cancellation().clone();
                let seen = log.clone();
                tokio::spawn(async move {
                    token.cancelled().await;
                    seen.push("a stopped");
                });
                log.push("a started");
                std::future::pending::<()>().await;
                Ok(())
            }
        })
        .deadline(Duration::from_secs(120))
        .build()
        .expect("valid")
}

/// Defect 6: an instance whose heartbeat cannot land (here: its instance row is locked by
/// another transaction, as a database under load or a lost connection would leave it) stops
/// its own attempts before the supervisor may count it dead and another instance take its
/// steps over; once a heartbeat lands again it claims again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_late_heartbeat_stops_the_instance_attempts_before_a_takeover() {
    use crate::fixtures::Log;
    use sagaflow::sea_orm::TransactionTrait;
    for db in backends().await {
        sagaflow_testkit::init_logging();
        let log = Log::default();
        let a = fast_builder(&db)
            .with_instance_id("a")
            .with_supervisor(false)
            .with_workflow(slow(&log, true))
            .start()
            .await
            .expect("a");
        let run = a.start("slow", &()).await.expect("start");
        sagaflow_testkit::eventually(LIMIT, "a started", || async {
            log.entries().iter().any(|e| e == "a started")
        })
        .await;
        let b = fast_builder(&db)
            .with_instance_id("b")
            .with_workflow(slow(&log, false))
            .start()
            .await
            .expect("b");
        // From now on no heartbeat of `a` lands.
        let blocker = sagaflow::sea_orm::Database::connect(db.url.as_str())
            .await
            .expect("connect");
        let txn = blocker.begin().await.expect("begin");
        txn.execute_unprepared(
            "UPDATE sagaflow_instances SET heartbeat_at = heartbeat_at WHERE id = 'a'",
        )
        .await
        .expect("lock the instance row");
        sagaflow_testkit::eventually(LIMIT, "a stopped its attempt", || async {
            log.entries().iter().any(|e| e == "a stopped")
        })
        .await;
        let order = log.entries();
        assert!(
            !order.iter().any(|e| e == "b ran"),
            "[{}] another instance took the step over before `a` stopped: {order:?}",
            db.backend
        );
        txn.rollback().await.expect("release");
        let _ = blocker.close().await;
        // `a` heartbeats again, releases the stopped attempt's step and claims again; either
        // instance completes it.
        sagaflow_testkit::expect_state(&b, run, sagaflow::RunState::Completed, db.backend).await;
        let report = sagaflow_testkit::check_engine_history(&b).await;
        assert!(report.is_clean(), "[{}] {report}", db.backend);
        let order = log.entries();
        let stopped = order.iter().position(|e| e == "a stopped");
        let ran = order.iter().position(|e| e == "b ran" || e == "a ran");
        assert!(
            stopped.is_some() && stopped < ran,
            "[{}] `a` stopped before `b` ran: {order:?}",
            db.backend
        );
        a.shutdown().await;
        b.shutdown().await;
    }
}

/// Defect 7: a claim pass measures each attempt's local deadline from before its first claim
/// statement, so an attempt whose resource claim waited (here: held before its commit while
/// the database clock moves on by two seconds) is stopped no later than the `complete_by` the
/// claim stored. Measured from after the claim, the attempt would believe it had the two
/// seconds the claim waited on top of what the database gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_slow_resource_claim_never_lets_an_attempt_outlive_its_stored_deadline() {
    const HELD_MS: i64 = 2_000;
    for db in backends().await {
        let b = db.backend;
        sagaflow_testkit::init_logging();
        let plain = Store::open(&db.url, &Default::default())
            .await
            .expect("plain store");
        // What the attempt believes is left, and what the database says is left, at its start.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(i64, i64)>();
        let reader = plain.clone();
        let metered = Workflow::builder("metered", 1)
            .step("m", move |ctx: StepContext| {
                let (tx, reader) = (tx.clone(), reader.clone());
                async move {
                    let local = i64::try_from(ctx.remaining().as_millis()).unwrap_or(i64::MAX);
                    let conn = reader.connection();
                    let row = conn
                        .query_one_raw(Statement::from_sql_and_values(
                            conn.get_database_backend(),
                            "SELECT complete_by FROM sagaflow_steps WHERE run_id = $1 AND name = 'm'",
                            [Value::from(ctx.run_id())],
                        ))
                        .await
                        .expect("read")
                        .expect("row");
                    let complete_by: i64 = row.try_get("", "complete_by").expect("complete_by");
                    let now = reader.now_ms().await.expect("now");
                    let _ = tx.send((local, complete_by - now));
                    Ok::<_, StepError>(())
                }
            })
            .resource("meter")
            .deadline(Duration::from_secs(60))
            .build()
            .expect("valid");
        let hook = Arc::new(PauseHook::new());
        let held = hook.hold(Unit::Claim, Point::BeforeCommit);
        let engine = fast_builder(&db)
            .with_workflow(metered)
            .with_resource(Resource::new("meter").max_in_flight(4))
            .with_pause_hook(hook.clone())
            .start()
            .await
            .unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        let run = engine.start("metered", &()).await.expect("start");
        tokio::time::timeout(LIMIT, held.reached())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the claim never reached its point"));
        // The claim is held after its statement read the database clock; let that clock move.
        let from = plain.now_ms().await.expect("now");
        sagaflow_testkit::eventually(LIMIT, "the database clock moved on", || async {
            plain.now_ms().await.expect("now") >= from + HELD_MS
        })
        .await;
        held.release();
        let (local, stored) = tokio::time::timeout(LIMIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the attempt never started"))
            .expect("attempt");
        // The attempt's own reads take a moment (a fraction of the hold); a deadline measured
        // from after the claim is off by the whole hold.
        assert!(
            local <= stored + HELD_MS / 2,
            "[{b}] the attempt believes {local} ms are left, the stored deadline leaves {stored} ms"
        );
        sagaflow_testkit::expect_state(&engine, run, sagaflow::RunState::Completed, b).await;
        engine.shutdown().await;
    }
}

/// The restart, a writer of two runs: held after its reads of a source in error, it meets an
/// operator's resume of the source, another restart of it, and a purge; held in its turn by
/// a resume, it is refused. Whatever the order, one of them wins and the other is refused
/// with its reason: never a source resumed under the run that took over its effects, never
/// two runs restarted from one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_restart_and_another_action_on_its_source_never_both_win() {
    use sagaflow::{Error, RunState};
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        // A run stopped in error: `a` done, `b` failed for good.
        let stopped = || async {
            let run = r.run().await;
            r.sql(
                "UPDATE sagaflow_steps SET state = 'completed' WHERE run_id = $1 AND name = 'a'",
                run,
            )
            .await;
            r.sql(
                "UPDATE sagaflow_steps SET state = 'failed', failure_count = max_failures \
                 WHERE run_id = $1 AND name = 'b'",
                run,
            )
            .await;
            r.sql(
                "UPDATE sagaflow_runs SET state = 'error' WHERE id = $1",
                run,
            )
            .await;
            run
        };
        let refused = |what: &str, e: sagaflow::Result<()>, needle: &str| {
            assert!(
                matches!(&e, Err(Error::ActionNotAllowed { reason, .. }) if reason.contains(needle)),
                "[{b}] {what}: {e:?}"
            );
        };

        for point in [Point::AfterReads, Point::BeforeCommit] {
            // The held restart wins; a resume and a second restart wait for its lock and are
            // refused by what it wrote.
            for competitor in ["resume", "restart"] {
                let run = stopped().await;
                let held = r.hook.hold(Unit::Operator, point);
                let op = r.engine.operator();
                let restart = op.restart_from(run, "b", None);
                let other = async {
                    tokio::time::timeout(LIMIT, held.reached())
                        .await
                        .unwrap_or_else(|_| panic!("[{b}] the restart reached its point"));
                    let peer = r.peer.operator();
                    let acting = async {
                        match competitor {
                            "resume" => peer.resume(run).await.map(|_| ()),
                            _ => peer.restart_from(run, "b", None).await.map(|_| ()),
                        }
                    };
                    tokio::pin!(acting);
                    if let Ok(done) = tokio::time::timeout(BLOCKED_AFTER, &mut acting).await {
                        panic!("[{b}] {competitor} ran under the held restart: {done:?}");
                    }
                    held.release();
                    acting.await
                };
                let (restarted, other) = tokio::join!(restart, other);
                let restarted = restarted.unwrap_or_else(|e| panic!("[{b}] restart: {e}"));
                let needle = match competitor {
                    "resume" => "restarted as run",
                    _ => "restarted already",
                };
                refused(competitor, other, needle);
                let source = r.peer.run(run).await.expect("read").expect("source");
                assert_eq!(source.state, RunState::Error, "[{b}] {competitor}");
                assert_eq!(source.restarted_as, Some(restarted.id), "[{b}]");
            }
        }

        // A resume held after its reads wins; the restart waits for it and is refused: the
        // source is running again.
        let run = stopped().await;
        let held = r.hook.hold(Unit::Operator, Point::AfterReads);
        let op = r.engine.operator();
        let resume = op.resume(run);
        let restart = async {
            tokio::time::timeout(LIMIT, held.reached())
                .await
                .unwrap_or_else(|_| panic!("[{b}] the resume reached its point"));
            let peer = r.peer.operator();
            let acting = peer.restart_from(run, "b", None);
            tokio::pin!(acting);
            if let Ok(done) = tokio::time::timeout(BLOCKED_AFTER, &mut acting).await {
                panic!("[{b}] the restart ran under the held resume: {done:?}");
            }
            held.release();
            acting.await
        };
        let (resumed, restarted) = tokio::join!(resume, restart);
        assert_eq!(resumed.expect("resume"), RunState::Running, "[{b}]");
        refused(
            "restart after a resume",
            restarted.map(|_| ()),
            "the run is running",
        );
        r.shutdown().await;
    }
}

/// A child run ends while an operator resumes its paused parent: the child's unit of work
/// wakes the parent's step that waited for it, and must not decide when that step is due
/// from the parent as it was before the resume. Held after the resume's reads and before its
/// commit, the resume keeps the parent's rows; the child's end waits for them and then finds
/// the parent running, so the woken step is due. (Read as paused, the step was ready but
/// never due in a running run, which nothing claims, evaluates or resumes: a silent hang.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_child_ending_during_its_parents_resume_leaves_the_woken_step_due() {
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        for point in [Point::AfterReads, Point::BeforeCommit] {
            let run = r.run().await;
            let child = r.child_of_b(run).await;
            r.peer.operator().pause(run).await.expect("pause");
            let held = r.hook.hold(Unit::Operator, point);
            let op = r.engine.operator();
            let resume = op.resume(run);
            let child_end = async {
                tokio::time::timeout(LIMIT, held.reached())
                    .await
                    .unwrap_or_else(|_| panic!("[{b}] the resume reached its point"));
                let ending = r.evaluate(&r.plain, child);
                tokio::pin!(ending);
                if tokio::time::timeout(BLOCKED_AFTER, &mut ending)
                    .await
                    .is_err()
                {
                    held.release();
                    ending.await;
                }
                held.release();
            };
            let (resumed, ()) =
                tokio::time::timeout(LIMIT, async { tokio::join!(resume, child_end) })
                    .await
                    .unwrap_or_else(|_| panic!("[{b}] deadlocked"));
            resumed.unwrap_or_else(|e| panic!("[{b}] resume: {e}"));
            let (state, steps) = r.rows(run).await;
            assert_eq!(state.as_deref(), Some("running"), "[{b}] {steps:?}");
            let woken = steps.iter().find(|s| s.0 == "b").expect("b");
            assert!(
                woken.1 == "ready" && woken.3.is_some(),
                "[{b}] at {}: the woken step must be ready and due: {woken:?}",
                point.as_str()
            );
        }
        r.shutdown().await;
    }
}

/// The timer pass meets a pause of the run whose step it wakes, committed while the pass
/// runs: a transaction has paused the run (its row written and locked) and not yet committed,
/// and locks none of its steps, as a pause committing between the pass's snapshot and its
/// step locks looks to the pass. The pass must not wake the step from a snapshot that still
/// shows the run running (the step would be due in a paused run, for any claim to start an
/// attempt the operator stopped); it passes over the run, and the step waits. (An operator's
/// pause also locks the run's steps, which the pass skips: the matrix's pause writer meets the
/// held timer pass, the other order.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_the_timer_pass_during_a_pause_wakes_nothing_in_the_paused_run() {
    use sagaflow::sea_orm::TransactionTrait;
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let run = r.run().await;
        r.park_b(run, false).await;
        let conn = r.plain.connection();
        let pausing = conn.begin().await.expect("begin");
        pausing
            .execute_raw(Statement::from_sql_and_values(
                conn.get_database_backend(),
                "UPDATE sagaflow_runs SET state = 'paused' WHERE id = $1",
                [Value::from(run)],
            ))
            .await
            .expect("pause the run");
        let wake = wake_due_steps(&r.plain, 16, "test");
        tokio::pin!(wake);
        let (woken, pausing) = match tokio::time::timeout(BLOCKED_AFTER, &mut wake).await {
            Ok(woken) => (woken, Some(pausing)),
            Err(_) => {
                // SQLite: the pass waits for the pausing transaction's write lock, then reads
                // the run paused.
                pausing.commit().await.expect("commit");
                (
                    tokio::time::timeout(LIMIT, wake)
                        .await
                        .unwrap_or_else(|_| panic!("[{b}] the timer pass finishes")),
                    None,
                )
            }
        };
        if let Some(pausing) = pausing {
            pausing.commit().await.expect("commit");
        }
        let woken = woken.unwrap_or_else(|e| panic!("[{b}] timer pass: {e}"));
        let (state, steps) = r.rows(run).await;
        assert_eq!(state.as_deref(), Some("paused"), "[{b}] {steps:?}");
        let step = steps.iter().find(|s| s.0 == "b").expect("b");
        assert_eq!(
            (woken, step.1.as_str()),
            (0, "waiting"),
            "[{b}] the timer pass woke `b` in the run being paused: {step:?}"
        );
        // Running again, the run's timer fires at the next pass.
        r.sql(
            "UPDATE sagaflow_runs SET state = 'running' WHERE id = $1",
            run,
        )
        .await;
        let woken = wake_due_steps(&r.plain, 16, "test")
            .await
            .expect("timer pass");
        assert_eq!(woken, 1, "[{b}] the running run's timer fires");
        r.shutdown().await;
    }
}

/// A run's page (the console's and the HTTP API's run) is read while the run completes: it
/// must show the run as of one moment. Held after the run's row, the page read meets the
/// run's last evaluation (its steps deleted, its completion appended to its history); the
/// page must show the running run with its steps and its history as they were, not a
/// running run with no steps and a history that says it completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_run_page_read_during_the_runs_end_shows_one_moment() {
    use sagaflow::RunState;
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let run = r.run_done_but_not_ended().await;
        let before = r.plain.run_history(run).await.expect("history").len();
        let steps_before = r.rows(run).await.1.len();
        let held = r.hook.hold(Unit::Page, Point::AfterReads);
        let store = r.engine.store().clone();
        let page = tokio::spawn(async move { store.run_page(run).await });
        tokio::time::timeout(LIMIT, held.reached())
            .await
            .unwrap_or_else(|_| panic!("[{b}] the page read reached its point"));
        r.evaluate(&r.plain, run).await;
        let (state, steps) = r.rows(run).await;
        assert_eq!(
            (state.as_deref(), steps.len()),
            (Some("completed"), 0),
            "[{b}] the run completed meanwhile"
        );
        held.release();
        let page = tokio::time::timeout(LIMIT, page)
            .await
            .unwrap_or_else(|_| panic!("[{b}] the page read finishes"))
            .expect("page task")
            .unwrap_or_else(|e| panic!("[{b}] page: {e}"))
            .expect("the run's page");
        assert_eq!(
            (page.run.run.state, page.steps.len(), page.history.len()),
            (RunState::Running, steps_before, before),
            "[{b}] the page mixed two moments: {:?}",
            page.history
                .iter()
                .map(|h| (&h.step, &h.kind, &h.to))
                .collect::<Vec<_>>()
        );
        r.shutdown().await;
    }
}

/// One completion batch carries two answers for one step: a stale one of attempt 1 (its
/// instance was fenced and claimed the step again before its writers drained) and the live
/// one of attempt 2. Only attempt 2's fenced write applies, and the batch must say so: the
/// stale answer is not applied, and the history records attempt 2's end, not attempt 1's.
/// (Counted by step alone, the batch recorded the stale answer's end, an attempt that the
/// rescue had already ended, and reported it applied to what follows a write.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleave_a_stale_answer_in_the_batch_of_the_next_attempt_is_not_recorded() {
    use sagaflow::{EntityState, HistoryKind};
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let run = r.run().await;
        r.claim_b(run, FAR).await;
        let stale = r.b_succeeded(run).await;
        // The rescue ends attempt 1 (as the supervisor writes it), then `b` is claimed again.
        let n = r
            .sql(
                "UPDATE sagaflow_steps SET state = 'ready', locked_by = NULL, complete_by = NULL \
                 WHERE run_id = $1 AND name = 'b' AND state = 'running'",
                run,
            )
            .await;
        assert_eq!(n, 1, "[{b}] setup rescue");
        r.claim_b(run, FAR).await;
        let live = r.b_succeeded(run).await;
        assert_eq!((stale.attempt, live.attempt), (1, 2), "[{b}]");
        let outcome = finish_batch(&r.plain, &r.registry, &[stale, live], "test")
            .await
            .expect("completion batch");
        assert_eq!(outcome.applied, vec![false, true], "[{b}]");
        let ends: Vec<Option<i32>> = r
            .plain
            .run_history(run)
            .await
            .expect("history")
            .into_iter()
            .filter(|e| {
                e.step.as_deref() == Some("b")
                    && e.kind != HistoryKind::State
                    && e.to == Some(EntityState::Step(StepState::Completed))
            })
            .map(|e| e.attempt)
            .collect();
        assert_eq!(ends, vec![Some(2)], "[{b}] the ends of `b` recorded");
        r.shutdown().await;
    }
}

/// An action prepared for the version a run had when it was read (its definition looked up,
/// its input checked against that version's schema) while a migration moved the run to the
/// next version before the action locked it: under the lock the action is refused, nothing
/// changed, rather than planned on the old version's steps or writing an input the new
/// version never checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleave_an_action_prepared_for_the_version_a_migration_left_is_refused() {
    use sagaflow::internals::operator::{self, Audit};
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let run = r.run().await;
        // `a` done (a rollback's target); `b` and `c` not started.
        r.sql(
            "UPDATE sagaflow_steps SET state = 'completed', output = 'null', available_at = NULL \
             WHERE run_id = $1 AND name = 'a'",
            run,
        )
        .await;
        r.peer
            .operator()
            .migrate("pair", 1, 2)
            .await
            .expect("migrate");
        let before = r.rows(run).await;
        let audit = Audit::default();
        let refused = |what: &str, e: sagaflow::Result<_>| match e {
            Err(sagaflow::Error::ActionNotAllowed { reason, .. })
                if reason.contains("moved to version 2") && reason.contains("version 1") => {}
            other => panic!("[{b}] {what}: {:?}", other.map(|_| ())),
        };
        refused(
            "rollback",
            operator::rollback(&r.plain, run, &pair(1), "a", Some("{\"n\":1}"), &audit).await,
        );
        refused(
            "replace input",
            operator::replace_input(&r.plain, run, &pair(1), "{\"n\":2}", &audit).await,
        );
        assert_eq!(r.rows(run).await, before, "[{b}] nothing changed");
        let input: String = r
            .plain
            .run_get(run)
            .await
            .expect("read")
            .expect("run")
            .input;
        assert_eq!(input, "null", "[{b}] the input is the run's own");
        r.shutdown().await;
    }
}

/// A bulk action chooses its runs from a list read before it locks each one. A run listed in
/// `error` that a colleague resumed meanwhile is left running: the bulk `compensate` is
/// refused for it under its lock, rather than undoing a run that no longer matches the
/// filter it was chosen by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleave_a_bulk_action_leaves_a_run_that_left_its_listed_state() {
    use sagaflow::RunState;
    use sagaflow::internals::operator::{self, Audit};
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let run = r.run().await;
        r.sql(
            "UPDATE sagaflow_steps SET state = 'failed', failure_count = max_failures \
             WHERE run_id = $1 AND name = 'b'",
            run,
        )
        .await;
        r.sql(
            "UPDATE sagaflow_runs SET state = 'error' WHERE id = $1",
            run,
        )
        .await;
        // Listed in `error` by the bulk action; resumed by a colleague before it acts.
        assert_eq!(
            r.peer.operator().resume(run).await.expect("resume"),
            RunState::Running,
            "[{b}]"
        );
        let audit = Audit {
            listed_as: Some(RunState::Error),
            ..Audit::new("api:bulk", "undo the failed orders")
        };
        match operator::compensate(&r.plain, run, &audit).await {
            Err(sagaflow::Error::ActionNotAllowed { reason, .. })
                if reason.contains("was error when it was listed") => {}
            other => panic!("[{b}] {:?}", other.map(|_| ())),
        }
        let (state, _) = r.rows(run).await;
        assert_eq!(state.as_deref(), Some("running"), "[{b}]");
        r.shutdown().await;
    }
}

/// A run's end meets an operator's action, an event and a restart that wait for its lock:
/// on PostgreSQL the end moves the run's row into the finished runs' table, so the waiting
/// unit finds no row where it waited and must read the run again there. It does, and is
/// refused as for any finished run (the cancel and the event) or acts on it (a restart from
/// a completed run, linked in the finished row), never "no such run", never a write lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_an_action_waiting_for_a_runs_end_finds_the_run_it_moved() {
    use sagaflow::{Error, RunState};
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        for competitor in ["cancel", "event", "restart"] {
            let run = r.run_done_but_not_ended().await;
            let held = r.hook.hold(Unit::Evaluate, Point::BeforeCommit);
            let hooked = r.engine.store().clone();
            let end = r.evaluate(&hooked, run);
            let other = async {
                tokio::time::timeout(LIMIT, held.reached())
                    .await
                    .unwrap_or_else(|_| panic!("[{b}] the end reached its point"));
                let peer = r.peer.operator();
                let acting = async {
                    match competitor {
                        "cancel" => peer.cancel(run).await.map(|_| None),
                        "event" => r
                            .peer
                            .send_event(run, EVENT, &serde_json::json!(1))
                            .await
                            .map(|_| None),
                        _ => peer.restart_from(run, "b", None).await.map(|s| Some(s.id)),
                    }
                };
                tokio::pin!(acting);
                if let Ok(done) = tokio::time::timeout(BLOCKED_AFTER, &mut acting).await {
                    panic!("[{b}] the {competitor} ran under the held end: {done:?}");
                }
                held.release();
                acting.await
            };
            let ((), acted) = tokio::join!(end, other);
            let source = r
                .peer
                .run(run)
                .await
                .expect("read")
                .expect("the run is found");
            assert_eq!(source.state, RunState::Completed, "[{b}] {competitor}");
            match (competitor, acted) {
                ("restart", Ok(Some(new))) => {
                    assert_eq!(source.restarted_as, Some(new), "[{b}] the link was written");
                }
                ("cancel" | "event", Err(Error::ActionNotAllowed { reason, .. })) => {
                    assert!(reason.contains("completed"), "[{b}] {competitor}: {reason}");
                }
                (_, other) => panic!("[{b}] {competitor} after the run's end: {other:?}"),
            }
        }
        r.shutdown().await;
    }
}

const DAY_MS: i64 = 24 * 3_600_000;

/// A rig with `n` finished runs filled at `ages` milliseconds ago, in their days' partitions:
/// PostgreSQL only (`None` on SQLite, which has no partitions).
async fn rig_with_past_days(db: TestDb, n: u64, ages: std::ops::Range<i64>) -> Option<Rig> {
    if db.backend != "postgres" {
        return None;
    }
    let r = rig(db).await;
    r.plain.run_fill_finished(n, ages).await.expect("fill");
    Some(r)
}

/// The retention's drop of a past day meets a unit of work that has just ended a run (moved
/// its row into the finished runs' table) and not yet committed (its history is written at
/// its commit). The drop takes the tables' locks in the writers' order (finished runs, then
/// history): it waits for the unit, the unit commits, the day goes. (Taken the other way
/// round, each waited for the other until the drop's lock timeout: the day was left "busy"
/// and the unit's commit stalled half a second, at every pass under load.) The run ending is
/// a parent whose two completed children (of one step) its end frees: they move in the same
/// unit, and the drop waits for all three. PostgreSQL only: SQLite has no partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_days_drop_during_a_runs_end_waits_for_it_and_goes() {
    for db in backends().await {
        let Some(r) = rig_with_past_days(db, 50, 7 * DAY_MS + 3_600_000..10 * DAY_MS).await else {
            continue;
        };
        let run = r.run().await;
        let child = r.child_of_b(run).await;
        r.evaluate(&r.plain, child).await;
        assert!(
            !r.rows(child).await.1.is_empty(),
            "a completed child keeps its steps while its parent's step may undo it"
        );
        // A second child of the same step (as a retry after a child that released its key
        // starts another): it moves too.
        let second = r.run_done_but_not_ended().await;
        let conn = r.plain.connection();
        conn.execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            "UPDATE sagaflow_runs SET parent_step = (SELECT parent_step FROM sagaflow_runs \
             WHERE id = $1) WHERE id = $2",
            [Value::from(child), Value::from(second)],
        ))
        .await
        .expect("link the second child");
        r.evaluate(&r.plain, second).await;
        r.complete_all(run).await;
        let held = r.hook.hold(Unit::Evaluate, Point::BeforeCommit);
        let hooked = r.engine.store().clone();
        let end = r.evaluate(&hooked, run);
        let drop = async {
            tokio::time::timeout(LIMIT, held.reached())
                .await
                .expect("the end reached its point");
            let dropping = r.plain.history_partitions_maintain(7 * DAY_MS);
            tokio::pin!(dropping);
            if let Ok(done) = tokio::time::timeout(BLOCKED_AFTER, &mut dropping).await {
                panic!("the drop ran under the held end: {done:?}");
            }
            held.release();
            dropping.await
        };
        let ((), pass) = tokio::join!(end, drop);
        let pass = pass.expect("the pass");
        assert_eq!(
            (pass.busy, pass.runs_dropped),
            (0, 50),
            "every filled day went, none was left busy: {pass:?}"
        );
        assert_eq!(
            r.rows(run).await.0.as_deref(),
            Some("completed"),
            "the run ended"
        );
        for child in [child, second] {
            let (state, steps) = r.rows(child).await;
            assert_eq!(
                (state.as_deref(), steps.len()),
                (Some("completed"), 0),
                "the child reads completed and its steps left with its parent's"
            );
            assert_eq!(r.tables_of(child).await, (0, 1), "the child {child} moved");
        }
        r.shutdown().await;
    }
}

/// The retention's drop of a past day has adjusted the totals and deleted the alerts, events
/// and keys of the day's runs that go, and has not yet taken the tables' locks, when a parent
/// ends whose completed child started that day: the child moves into the day as it is, with
/// its old `finished_at`. The drop counts the day's children in the runs table again under
/// the locks, finds one gone, and leaves the day for the next pass, which takes the child with
/// the rest. (Without the count, the day went with the child in it, its totals never
/// adjusted.) PostgreSQL only: SQLite has no partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_child_moving_into_a_day_being_dropped_leaves_the_day_for_the_next_pass() {
    for db in backends().await {
        // Older than the retention and a day: the drop moves any straggler aside.
        let Some(r) = rig_with_past_days(db, 20, 9 * DAY_MS + 3_600_000..10 * DAY_MS).await else {
            continue;
        };
        let parent = r.run().await;
        let now = r.plain.now_ms().await.expect("now");
        // A minute into the oldest filled day, the first the pass drops.
        let born = (now - 10 * DAY_MS).div_euclid(DAY_MS) * DAY_MS + 60_000;
        let random = Uuid::new_v4().as_u128() & ((1 << 76) - 1);
        let child = Uuid::from_u128(
            (u128::try_from(born).expect("after 1970") << 80) | (0x7 << 76) | random,
        );
        let conn = r.plain.connection();
        conn.execute_raw(Statement::from_sql_and_values(
            conn.get_database_backend(),
            "INSERT INTO sagaflow_runs (id, workflow, version, workflow_key, state, input, \
             output, created_at, updated_at, finished_at, parent_step) \
             VALUES ($1, 'pair', 1, 'pair@1', 'completed', 'null', 'null', $2, $2, $2, \
             (SELECT id FROM sagaflow_steps WHERE run_id = $3 AND name = 'b'))",
            [Value::from(child), Value::from(born), Value::from(parent)],
        ))
        .await
        .expect("a child of that day, completed");
        r.complete_all(parent).await;
        let held = r.hook.hold(Unit::Purge, Point::AfterReads);
        let hooked = r.engine.store().clone();
        let dropping = hooked.history_partitions_maintain(7 * DAY_MS);
        let end = async {
            tokio::time::timeout(LIMIT, held.reached())
                .await
                .expect("the drop reached its point");
            r.evaluate(&r.plain, parent).await;
            held.release();
        };
        let (first, ()) = tokio::join!(dropping, end);
        let first = first.expect("the first pass");
        assert_eq!(
            r.rows(child).await.0.as_deref(),
            Some("completed"),
            "the child moved in during the pass and is still there: {first:?}"
        );
        let second = r
            .plain
            .history_partitions_maintain(7 * DAY_MS)
            .await
            .expect("the second pass");
        assert_eq!(r.rows(child).await.0, None, "the next pass took the child");
        assert_eq!(
            (first.runs_dropped + second.runs_dropped, second.busy),
            (21, 0),
            "the filled runs and the child went, each counted once: {first:?} {second:?}"
        );
        r.shutdown().await;
    }
}

/// A child run ends while its parent ends (the parent's steps all done: the step that
/// waited for the child gave up on it, or an operator settled it), each unit held before its
/// commit in turn. Whichever commits first, the child does not stay behind in the runs table
/// with its steps, its parent gone: its steps go and, on PostgreSQL, it moves to the finished
/// runs' table. The child's end locks the parent's step, so the two meet there: held first,
/// the child's end holds up the parent's end at its read of its steps, which then reads the
/// child final and takes it along; held first, the parent's end leaves the child's end to
/// find the step gone, and it moves the child itself. (Without the lock each read the other as it was before: the
/// child stayed, completed, with its steps, under a step that no longer existed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_child_and_its_parent_ending_together_leave_no_child_behind() {
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        for child_first in [true, false] {
            let parent = r.run().await;
            let child = r.child_of_b(parent).await;
            r.complete_all(parent).await;
            let (first, second) = if child_first {
                (child, parent)
            } else {
                (parent, child)
            };
            let blocked = r
                .evaluate_beside_held(&[first], Point::BeforeCommit, &[second])
                .await;
            let order = if child_first {
                "the child's end held"
            } else {
                "the parent's end held"
            };
            assert!(
                blocked || b != "postgres",
                "[{b}] {order}: the other end went ahead instead of waiting at the parent's step"
            );
            r.assert_completed_for_good(order, &[("parent", parent), ("child", child)])
                .await;
        }
        r.shutdown().await;
    }
}

/// A grandchild ends while its grandparent ends: the grandparent's end frees its completed
/// child, whose steps it then deletes without having locked them first (they are not its
/// own), and one of them waited for the grandchild. Held first, the grandchild's end (which
/// locks that step) holds up the delete, which returns whether the step has a child at all;
/// a statement after it reads the grandchild final, and it goes along. (The delete's own
/// look, as of its start, saw the grandchild running: it stayed behind with its steps.)
/// Held first, the grandparent's end leaves the grandchild's end to find the step gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_grandchild_ending_while_its_grandparent_ends_is_not_left_behind() {
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        for grandchild_first in [true, false] {
            let top = r.run().await;
            let child = r.child_of_b(top).await;
            // The child's `b` waits for a grandchild; its other steps completed.
            r.sql(
                "UPDATE sagaflow_steps SET state = 'ready', output = NULL WHERE run_id = $1 \
                 AND name = 'b'",
                child,
            )
            .await;
            let grandchild = r.child_of_b(child).await;
            // The child's `b` gave up on it: the child completes, and is kept for its parent.
            r.complete_all(child).await;
            r.evaluate(&r.plain, child).await;
            assert_eq!(
                r.rows(child).await.0.as_deref(),
                Some("completed"),
                "[{b}] setup: the child completed"
            );
            r.complete_all(top).await;
            let (held, other) = if grandchild_first {
                (grandchild, top)
            } else {
                (top, grandchild)
            };
            r.evaluate_beside_held(&[held], Point::BeforeCommit, &[other])
                .await;
            let order = if grandchild_first {
                "the grandchild's end held"
            } else {
                "the grandparent's end held"
            };
            r.assert_completed_for_good(
                order,
                &[("top", top), ("child", child), ("grandchild", grandchild)],
            )
            .await;
        }
        r.shutdown().await;
    }
}

/// A child's end meets a unit of work that holds the parent's run and waits for the child's:
/// a batch evaluating both (runs are locked in id order, and the parent's id is the lower).
/// The child's end, held after its reads (its run and steps locked), goes on once released,
/// and neither waits for the other: it locks the parent's step, which the batch has not
/// reached (a unit locks its runs before their steps), and never the parent's run. (Taking
/// the parent's run shared to wake its step, as the child's end did, closed a cycle with the
/// batch: PostgreSQL found the deadlock after a second and failed one of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_child_ending_under_a_batch_holding_its_parent_is_no_deadlock() {
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let parent = r.run().await;
        let child = r.child_of_b(parent).await;
        assert!(parent < child, "[{b}] the parent's id is the lower");
        let blocked = r
            .evaluate_beside_held(&[child], Point::AfterReads, &[parent, child])
            .await;
        assert!(blocked, "[{b}] the batch waited for the child's run");
        r.assert_child_ended_and_woke(parent, child).await;
        r.shutdown().await;
    }
}

/// Two batches each hold a parent and the other parent's child, ending: the first holds
/// its runs' steps (the first parent's step waiting for its child among them) after its
/// reads; the second's child ends and wakes the first parent's step, while the first's
/// child wakes the second parent's step. Each unit locks the parent's step of its ending
/// child with its own steps, in one statement in id order, so the second waits for the
/// first and both finish. (Locked after the unit's own steps, each waited for a step the
/// other held: PostgreSQL found the deadlock and failed one of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_two_batches_each_ending_the_others_child_are_no_deadlock() {
    for db in backends().await {
        let r = rig(db).await;
        let (first, second) = (r.run().await, r.run().await);
        let first_child = r.child_of_b(first).await;
        let second_child = r.child_of_b(second).await;
        r.evaluate_beside_held(
            &[first, second_child],
            Point::AfterReads,
            &[second, first_child],
        )
        .await;
        for (parent, child) in [(first, first_child), (second, second_child)] {
            r.assert_child_ended_and_woke(parent, child).await;
        }
        r.shutdown().await;
    }
}

/// A keyed start meets the end of the run that holds its key, held before its commit (on
/// PostgreSQL that end moves the run out of the runs table, and the key stays in the key
/// table). Under the default policy a finished run keeps its key: whichever commits first,
/// the start returns the holder and no second run of the key exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleave_a_keyed_start_during_its_holders_end_returns_the_holder() {
    use sagaflow::StartOptions;
    for db in backends().await {
        let r = rig(db).await;
        let b = r.db.backend;
        let holder = r
            .intake
            .start_with(
                "pair",
                &serde_json::json!(null),
                StartOptions::keyed("order-1"),
            )
            .await
            .expect("start")
            .id;
        r.complete_all(holder).await;
        let held = r.hook.hold(Unit::Evaluate, Point::BeforeCommit);
        let hooked = r.engine.store().clone();
        let end = r.evaluate(&hooked, holder);
        let start = async {
            tokio::time::timeout(LIMIT, held.reached())
                .await
                .unwrap_or_else(|_| panic!("[{b}] the end reached its point"));
            let starting = r.peer.start_with(
                "pair",
                &serde_json::json!(null),
                StartOptions::keyed("order-1"),
            );
            tokio::pin!(starting);
            // SQLite's start waits for the write lock; PostgreSQL's finds the key taken.
            let early = tokio::time::timeout(BLOCKED_AFTER, &mut starting).await;
            held.release();
            match early {
                Ok(done) => done,
                Err(_) => starting.await,
            }
        };
        let ((), started) = tokio::join!(end, start);
        let started = started.unwrap_or_else(|e| panic!("[{b}] start: {e}"));
        assert_eq!((started.id, started.created), (holder, false), "[{b}]");
        let conn = r.plain.connection();
        let n = conn
            .query_one_raw(Statement::from_string(
                conn.get_database_backend(),
                "SELECT COUNT(*) AS n FROM sagaflow_runs_all WHERE business_key = 'order-1'",
            ))
            .await
            .expect("count")
            .expect("row")
            .try_get::<i64>("", "n")
            .expect("n");
        assert_eq!(n, 1, "[{b}] one run of the key");
        assert_eq!(
            r.rows(holder).await.0.as_deref(),
            Some("completed"),
            "[{b}]"
        );
        r.shutdown().await;
    }
}
