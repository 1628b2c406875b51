//! Commands that measure and torture sagaflow, apart from the workflows and the demo:
//!
//! - `sagaflow-bench` (`src/bin/sagaflow-bench.rs`): throughput, latency percentiles and peak
//!   memory of the order-shaped saga, on SQLite or PostgreSQL, in one or several processes;
//! - `sagaflow-chaos` (`src/bin/sagaflow-chaos.rs`, `src/bin/chaos/`): several engine processes
//!   under faults, SIGKILLs and a database restart, then invariant checks.
//!
//! This library holds what both share: the [`Error`] of both commands, the chaos run's typed
//! verdict ([`invariants::InvariantReport`]), latency figures, the machine description, CPU
//! times read from `/proc` and the cost model's arithmetic.

pub mod cost;
pub mod cpu;
mod error;
pub mod invariants;
pub mod machine;
pub mod measure;

pub use error::{Error, Result};
