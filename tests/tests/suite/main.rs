//! sagaflow's integration suite. A scenario runs on SQLite and on PostgreSQL (see
//! `sagaflow_testkit::backends`), except the few that test what exists on one backend only;
//! docs/architecture.md lists them and says why. Requirement IDs are explained in
//! `docs/requirements.md`.

mod ambiguous;
mod api;
mod bad_input;
mod business_key;
mod cancel;
mod chaos;
mod claim;
mod cli;
mod console;
mod crash;
mod deferral;
mod definitions;
mod demo;
mod extend;
mod failover;
mod failures;
mod first_start;
mod fixtures;
mod flow;
mod flow_control;
mod flow_control_gates;
mod frozen;
mod hotplug;
mod http_agent;
mod interruption;
mod list;
mod metrics;
mod openapi;
mod operator;
mod pause;
mod priority;
mod published;
mod resource_limits;
mod schedule;
mod secrets;
mod serve;
mod shutdown;
mod submission;
mod supervisor;
mod trace;
mod travel;
mod wakeups;
mod webhook;
