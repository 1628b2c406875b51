//! sagaflow's integration suite. Every scenario runs on SQLite and on PostgreSQL (see
//! `sagaflow_tests::backends`); requirement IDs are explained in
//! `docs/requirements.md`.

mod ambiguous;
mod bad_input;
mod business_key;
mod chaos;
mod claim;
mod crash;
mod definitions;
mod demo;
mod failover;
mod failures;
mod fixtures;
mod flow;
mod frozen;
mod interruption;
mod operator;
mod secrets;
mod shutdown;
mod submission;
mod supervisor;
