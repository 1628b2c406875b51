//! Exploring a user's saga: every place where a crash or an operator can stop it, one case
//! each, with the user's own invariant checked at the end of every case.
//!
//! For each step of the saga's workflow, [`Explore`] runs one case per stop:
//!
//! - the engine crashes before the step's call, after its effect but before the reply is
//!   stored, and after the write but before its commit ([`CrashPoint`]), then restarts;
//! - an operator cancels the run while the step's forward attempt is in flight (its effect
//!   happened, its answer is held before it is written: [`SagaTest::hold_answer`]);
//! - the same cancel, held inside its transaction (after its reads, then before its commit:
//!   [`Point`]) while the attempt's answer is let go and its write waits for the cancel's
//!   locks; then the cancel is let go: the two writers meet as they do in production;
//! - an operator pauses the run while the attempt is in flight, then resumes it once the
//!   attempt's end was written;
//! - for a step with a compensation: the same three crashes during its compensation (an
//!   operator cancels the run while the step's answer is held, so the step completes into
//!   a run that unwinds it).
//!
//! Each case runs on a fresh database with a fresh copy of the saga and whatever the user's
//! `make` returns with it (typically a loopback remote with its ledger), waits until the run
//! finished (`completed`, `compensated` or `error`), runs the history checker
//! ([`sagaflow::check`]) on the database, and hands the run and that state to the user's
//! check. A case whose stop was never reached (a step after one that always fails)
//! is reported as such, not as a pass.
//!
//! ```no_run
//! use sagaflow::{StepContext, StepError, Workflow};
//! use sagaflow_testkit::explore::Explore;
//!
//! # async fn example() {
//! let report = Explore::new("order", &())
//!     .run(
//!         || async {
//!             let wf = Workflow::builder("order", 1)
//!                 .step("charge", |_: StepContext| async { Ok::<_, StepError>(()) })
//!                 .build()
//!                 .expect("valid");
//!             (vec![wf], ())
//!         },
//!         |_case, run, _state: &()| {
//!             if run.state.is_final() { Ok(()) } else { Err(format!("ended {}", run.state)) }
//!         },
//!     )
//!     .await;
//! report.assert_held();
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::time::Duration;

use sagaflow::testing::CrashPoint;
use sagaflow::testing::interleave::{Held, Point, Unit};
use sagaflow::{Run, RunState, StepState, Workflow};

use crate::db::{TestDb, postgres_db, sqlite_db};
use crate::harness::{HARNESS_WAIT, SagaTest};

/// The crash points a case stops at, in the order they are explored.
const POINTS: [CrashPoint; 3] = [
    CrashPoint::BeforeCall,
    CrashPoint::AfterEffect,
    CrashPoint::BeforeCommit,
];

/// Where one case stops the saga.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// The engine crashes at `point` of the step's forward attempt, then restarts.
    Crash {
        /// The step.
        step: String,
        /// Where in its attempt.
        point: CrashPoint,
    },
    /// The engine crashes at `point` of the step's compensation, then restarts.
    CrashCompensating {
        /// The step.
        step: String,
        /// Where in its compensation attempt.
        point: CrashPoint,
    },
    /// An operator cancels the run while the step's forward attempt is in flight: its
    /// action returned and its answer is held before it is written.
    CancelDuring {
        /// The step.
        step: String,
    },
    /// An operator cancels the run while the step's forward attempt is in flight, and the
    /// cancel is held at `point` of its transaction (with the run's locks) while the
    /// attempt's answer is let go, for [`HELD_FOR`]: its write waits for those locks.
    CancelHeld {
        /// The step.
        step: String,
        /// Where in the operator's unit of work.
        point: Point,
    },
    /// An operator pauses the run while the step's forward attempt is in flight (its answer
    /// held), and resumes it once the attempt's end was written.
    PauseDuring {
        /// The step.
        step: String,
    },
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Crash { step, point } => write!(f, "crash {point} of `{step}`"),
            Self::CrashCompensating { step, point } => {
                write!(f, "crash {point} of `{step}`'s compensation")
            }
            Self::CancelDuring { step } => write!(f, "cancel while `{step}` runs"),
            Self::CancelHeld { step, point } => {
                write!(
                    f,
                    "cancel held {point} while `{step}` runs",
                    point = point.as_str()
                )
            }
            Self::PauseDuring { step } => write!(f, "pause and resume while `{step}` runs"),
        }
    }
}

/// One case: where it stopped the saga, on which backend, and what came of it.
#[derive(Debug, Clone)]
pub struct Case {
    /// The stop.
    pub stop: Stop,
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Whether the run reached the stop (a crash fired, a cancel found the step running).
    pub reached: bool,
    /// How the run ended.
    pub ended: RunState,
    /// The user's check: `Err` with its reason when the invariant did not hold.
    pub check: Result<(), String>,
}

/// Every case an [`Explore`] ran.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The cases, in the order they ran.
    pub cases: Vec<Case>,
}

impl Report {
    /// The cases whose check failed.
    pub fn failures(&self) -> impl Iterator<Item = &Case> {
        self.cases.iter().filter(|c| c.check.is_err())
    }

    /// Panics with the report when a check failed, or when no case reached its stop.
    ///
    /// # Panics
    /// As said.
    pub fn assert_held(&self) {
        assert!(
            self.failures().next().is_none() && self.cases.iter().any(|c| c.reached),
            "{self}"
        );
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reached = self.cases.iter().filter(|c| c.reached).count();
        let failed = self.failures().count();
        writeln!(
            f,
            "explored {} cases ({reached} reached their stop), {failed} broke the invariant",
            self.cases.len()
        )?;
        for c in &self.cases {
            let verdict = match &c.check {
                Ok(()) => "held".to_owned(),
                Err(why) => format!("BROKEN: {why}"),
            };
            let reached = if c.reached { "" } else { " (not reached)" };
            writeln!(
                f,
                "  [{}] {}{reached}: ended {}, {verdict}",
                c.backend, c.stop, c.ended
            )?;
        }
        Ok(())
    }
}

/// The exploration of one saga (see the module documentation).
#[derive(Debug, Clone)]
#[must_use]
pub struct Explore {
    workflow: String,
    input: serde_json::Value,
    postgres: bool,
}

impl Explore {
    /// Explores runs of `workflow` (its newest version among those `make` returns) started
    /// with `input`, on SQLite.
    ///
    /// # Panics
    /// When `input` does not serialize.
    pub fn new(workflow: impl Into<String>, input: &impl serde::Serialize) -> Self {
        Self {
            workflow: workflow.into(),
            input: serde_json::to_value(input).expect("the input serializes"),
            postgres: false,
        }
    }

    /// Runs every case on PostgreSQL too (a fresh database per case on the server named by
    /// `SAGAFLOW_PG_URL`; skipped with a note when it is not set and not required).
    pub fn on_postgres(mut self) -> Self {
        self.postgres = true;
        self
    }

    /// Runs every case: `make` builds the saga's workflows and the state the check reads
    /// (a fresh remote, a ledger), once per case; `check` judges each finished run.
    ///
    /// # Panics
    /// When the workflow is not among those `make` returns, or a run does not finish within
    /// [`HARNESS_WAIT`].
    pub async fn run<T, M, MF, C>(&self, make: M, check: C) -> Report
    where
        M: Fn() -> MF,
        MF: Future<Output = (Vec<Workflow>, T)>,
        C: Fn(&Stop, &Run, &T) -> Result<(), String>,
    {
        let (wfs, _) = make().await;
        let stops = self.stops(&wfs);
        let mut report = Report::default();
        for stop in stops {
            for db in self.databases().await {
                let (wfs, state) = make().await;
                let (reached, run, history) = self.case(&db, wfs, &stop).await;
                // The engine's own promise first (the history checker), then the user's.
                let check = history.and_then(|()| check(&stop, &run, &state));
                report.cases.push(Case {
                    stop: stop.clone(),
                    backend: db.backend,
                    reached,
                    ended: run.state,
                    check,
                });
            }
        }
        report
    }

    async fn databases(&self) -> Vec<TestDb> {
        let mut dbs = vec![sqlite_db()];
        if self.postgres {
            dbs.extend(postgres_db().await);
        }
        dbs
    }

    /// Every stop of the saga, step by step.
    fn stops(&self, wfs: &[Workflow]) -> Vec<Stop> {
        let wf = wfs
            .iter()
            .filter(|w| w.name() == self.workflow)
            .max_by_key(|w| w.version())
            .unwrap_or_else(|| panic!("no workflow `{}` to explore", self.workflow));
        let mut stops = Vec::new();
        for step in wf.describe().steps {
            for point in POINTS {
                stops.push(Stop::Crash {
                    step: step.name.clone(),
                    point,
                });
            }
            stops.push(Stop::CancelDuring {
                step: step.name.clone(),
            });
            for &point in Unit::Operator.points() {
                stops.push(Stop::CancelHeld {
                    step: step.name.clone(),
                    point,
                });
            }
            stops.push(Stop::PauseDuring {
                step: step.name.clone(),
            });
            if step.compensates {
                for point in POINTS {
                    stops.push(Stop::CrashCompensating {
                        step: step.name.clone(),
                        point,
                    });
                }
            }
        }
        stops
    }

    /// One case on `db`: returns whether the stop was reached, the finished run, and what
    /// the history checker found on the database.
    async fn case(
        &self,
        db: &TestDb,
        wfs: Vec<Workflow>,
        stop: &Stop,
    ) -> (bool, Run, Result<(), String>) {
        let mut t = SagaTest::new(wfs).on(db).await;
        let (reached, id) = match stop {
            Stop::Crash { step, point } => {
                t.crash_at(step, *point);
                let id = t.start(&self.workflow, &self.input).await;
                (crashed_or_finished(&t, id).await, id)
            }
            Stop::CrashCompensating { step, point } => {
                t.crash_in_compensation_at(step, *point);
                // Unwind the run while the step's forward attempt is in flight (its answer
                // held), so that it completes into a run that compensates it.
                let answer = t.hold_answer(step);
                let id = t.start(&self.workflow, &self.input).await;
                if answer_held(&t, id, &answer).await {
                    let _ = t.engine().operator().cancel(id).await;
                }
                answer.release();
                (crashed_or_finished(&t, id).await, id)
            }
            Stop::CancelDuring { step } => {
                let answer = t.hold_answer(step);
                let id = t.start(&self.workflow, &self.input).await;
                let reached = answer_held(&t, id, &answer).await
                    && t.engine().operator().cancel(id).await.is_ok();
                answer.release();
                (reached, id)
            }
            Stop::CancelHeld { step, point } => {
                let answer = t.hold_answer(step);
                let id = t.start(&self.workflow, &self.input).await;
                let mut reached = false;
                if answer_held(&t, id, &answer).await {
                    let held = t.hold(Unit::Operator, *point);
                    let cancel = async {
                        // Refused when the run ended meanwhile: that is an answer.
                        let _ = t.engine().operator().cancel(id).await;
                    };
                    let meanwhile = async {
                        if tokio::time::timeout(HARNESS_WAIT, held.reached())
                            .await
                            .is_ok()
                        {
                            // The answer goes on; its write waits for the cancel's locks.
                            answer.release();
                            tokio::time::sleep(HELD_FOR).await;
                        }
                        held.release();
                    };
                    tokio::join!(cancel, meanwhile);
                    reached = held.has_reached();
                }
                answer.release();
                (reached, id)
            }
            Stop::PauseDuring { step } => {
                let answer = t.hold_answer(step);
                let id = t.start(&self.workflow, &self.input).await;
                let mut reached = false;
                if answer_held(&t, id, &answer).await
                    && t.engine().operator().pause(id).await.is_ok()
                {
                    reached = true;
                    answer.release();
                    step_leaves(&t, id, step, StepState::Running).await;
                    t.engine()
                        .operator()
                        .resume(id)
                        .await
                        .unwrap_or_else(|e| panic!("[{}] resume of {id}: {e}", t.backend()));
                }
                answer.release();
                (reached, id)
            }
        };
        if t.has_crashed() {
            t.restart().await;
        }
        let run = t.finish(id).await;
        let history = match sagaflow::check::check(t.engine().connection()).await {
            Ok(report) if report.is_clean() => Ok(()),
            Ok(report) => Err(format!("the history checker found:\n{report}")),
            Err(e) => Err(format!("the history checker could not read: {e}")),
        };
        t.shutdown().await;
        (reached, run, history)
    }
}

/// Waits until the engine crashed (`true`) or the run finished without crashing (`false`).
async fn crashed_or_finished(t: &SagaTest, id: sagaflow::Uuid) -> bool {
    let finished = async {
        loop {
            match t.engine().run(id).await {
                Ok(Some(r)) if r.state.is_terminal() => return,
                _ => tokio::time::sleep(POLL).await,
            }
        }
    };
    let waited = tokio::time::timeout(HARNESS_WAIT, async {
        tokio::select! {
            () = t.crashed_quietly() => true,
            () = finished => t.has_crashed(),
        }
    })
    .await;
    waited.unwrap_or_else(|_| {
        panic!(
            "[{}] run {id} neither crashed nor finished within {HARNESS_WAIT:?}",
            t.backend()
        )
    })
}

/// Waits until the held answer reached the engine (`true`), or the run finished or the
/// engine crashed first (`false`: the step was never run).
async fn answer_held(t: &SagaTest, id: sagaflow::Uuid, answer: &Held) -> bool {
    let finished = async {
        loop {
            if t.has_crashed() {
                return;
            }
            if let Ok(Some(r)) = t.engine().run(id).await
                && r.state.is_terminal()
            {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let waited = tokio::time::timeout(HARNESS_WAIT, async {
        tokio::select! {
            () = answer.reached() => true,
            () = finished => answer.has_reached(),
        }
    })
    .await;
    waited.unwrap_or_else(|_| {
        panic!(
            "[{}] run {id}: the step's answer was neither held nor the run finished within {HARNESS_WAIT:?}",
            t.backend()
        )
    })
}

/// Waits, within [`HARNESS_WAIT`], until step `step` of the run is no longer in `state` (or
/// the run is finished).
async fn step_leaves(t: &SagaTest, id: sagaflow::Uuid, step: &str, state: StepState) {
    let probe = async {
        loop {
            let steps = t.engine().steps(id).await.unwrap_or_default();
            if !steps.iter().any(|s| s.name == step && s.state == state) {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    };
    let _ = tokio::time::timeout(HARNESS_WAIT, probe).await;
}

/// How long a held operator's action keeps its transaction open after the attempt's answer
/// was let go: the answer's write meets the action's locks and waits for them.
pub const HELD_FOR: Duration = Duration::from_millis(300);

/// How often the exploration looks at a run.
const POLL: Duration = Duration::from_millis(10);
