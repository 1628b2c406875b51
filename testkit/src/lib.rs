//! Test sagas the way sagaflow tests its own: against a real SQLite file and a real
//! PostgreSQL database, with real processes to kill.
//!
//! - [`backends`] gives a fresh database per test on each backend (a temporary SQLite file,
//!   and a new PostgreSQL database on the server named by `SAGAFLOW_PG_URL`), so parallel
//!   tests never see each other's runs;
//! - [`engine`] and [`fast_builder`] start engines with short intervals;
//! - [`eventually`], [`eventually_some`] and [`expect_state`] wait on conditions with a bound;
//! - [`check_history`] ends a test by checking every run of its database against the
//!   engine's invariants ([`sagaflow::check`]), and fails it with the report on a violation;
//! - [`SagaTest`] tests one's own sagas: an engine on a fresh database with a test clock
//!   wired, [`SagaTest::advance`] to let hours pass at once, [`SagaTest::crash_at`] to stop
//!   the engine dead at a named point of a step ([`sagaflow::testing::CrashPoint`]), and
//!   [`SagaTest::restart`] to recover on the same database;
//! - [`ChildTest`] re-runs the test binary as a child engine process, to SIGKILL or SIGSTOP;
//! - [`PgCluster`] starts a private throwaway PostgreSQL cluster (to restart it mid-run
//!   without disturbing other tests);
//! - [`effects`] is a loopback HTTP remote for any saga: operations registered by name,
//!   effects recorded once per idempotency key in a ledger, faults scripted per call, and a
//!   client that answers the step outcomes the engine expects;
//! - [`services`] simulates the remote services the example sagas call (inventory, payments,
//!   shipping, flights, hotels, mailer), in-process or over loopback HTTP: a ledger records
//!   every effect by idempotency key, faults are injected on purpose, and the ledger checks
//!   prove effects exactly-once and sagas net-consistent.
//!
//! ```no_run
//! use sagaflow::{RunState, StepContext, StepError, Workflow};
//! use sagaflow_testkit::{backends, engine, expect_state};
//!
//! # async fn example() {
//! for db in backends().await {
//!     let wf = Workflow::builder("hello", 1)
//!         .step("greet", |_: StepContext| async { Ok::<_, StepError>("hi") })
//!         .build()
//!         .expect("valid");
//!     let engine = engine(&db, vec![wf]).await;
//!     let id = engine.start("hello", &()).await.expect("start");
//!     expect_state(&engine, id, RunState::Completed, db.backend).await;
//!     engine.shutdown().await;
//! }
//! # }
//! ```

mod check;
mod cluster;
mod db;
pub mod effects;
mod engine;
pub mod explore;
mod harness;
mod process;
pub mod services;
mod wait;

pub use check::{check_engine_history, check_history};
pub use cluster::{ClusterError, PgCluster, make_durable, pg_bin, restart_immediate, script_path};
pub use db::{TestDb, backends, postgres_db, sqlite_db};
pub use engine::{engine, fast_builder, init_logging};
pub use harness::{HARNESS_WAIT, SagaTest, SagaTestBuilder, applied_once};
pub use process::{ChildTest, workspace_binary};
pub use wait::{eventually, eventually_some, expect_state};
