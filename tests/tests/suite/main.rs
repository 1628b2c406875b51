//! sagaflow's integration suite. Every scenario runs on SQLite and on PostgreSQL (see
//! `sagaflow_tests::backends`); requirement IDs are explained in
//! `docs/requirements.md`.

mod ambiguous;
mod business_key;
mod chaos;
mod claim;
mod crash;
mod definitions;
mod failover;
mod failures;
mod first_start;
mod fixtures;
mod flow;
mod interruption;
mod operator;
mod shutdown;
mod submission;
mod supervisor;
