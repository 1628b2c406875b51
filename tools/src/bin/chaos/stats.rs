//! What the coordinator did to the fleet during a chaos run, for the summary and the checks.

use std::time::Duration;

use super::coordinator::Ending;

/// One mid-run PostgreSQL restart.
#[derive(Debug)]
pub(crate) struct Restart {
    /// When it was started, since the beginning of the run.
    pub(crate) at: Duration,
    /// How long `pg_ctl restart` took, or why it failed.
    pub(crate) result: Result<Duration, sagaflow_tools::Error>,
}

/// What the coordinator did to the fleet.
#[derive(Debug, Default)]
pub(crate) struct ChaosStats {
    /// SIGKILLs.
    pub(crate) kills: u64,
    /// SIGSTOPs (each followed by a SIGCONT 1 to 3 s later).
    pub(crate) pauses: u64,
    /// Runs cancelled one at a time.
    pub(crate) cancels: u64,
    /// SIGSTOPs of the supervisor leader.
    pub(crate) leader_pauses: u64,
    /// Bulk cancels taken, the runs they cancelled, and the runs they picked that the engine
    /// refused to cancel (they moved on meanwhile).
    pub(crate) bulk_cancels: u64,
    pub(crate) bulk_cancelled: u64,
    pub(crate) bulk_refused: u64,
    /// Every run cancelled (single or bulk).
    pub(crate) cancelled: std::collections::HashSet<uuid::Uuid>,
    /// Events sent to flows (taken by the run), refused (the run had finished), failed.
    pub(crate) events_sent: u64,
    pub(crate) events_refused: u64,
    pub(crate) events_failed: u64,
    /// For each SIGKILL that hit a process with steps in flight: the time until all of them
    /// were released to the queue.
    pub(crate) rescues: Vec<Duration>,
    /// SIGKILLs of a process that held no step at that moment.
    pub(crate) idle_kills: u64,
    /// Engine processes started again.
    pub(crate) restarts: u64,
    /// Engine processes that exited on their own.
    pub(crate) unexpected_exits: Vec<String>,
    /// Engine processes that did not stop within the grace period at the end.
    pub(crate) forced_stops: usize,
    /// Progress polls that failed (PostgreSQL down).
    pub(crate) monitor_errors: u64,
    /// PostgreSQL restarts asked for (0 when off or the server is not ours).
    pub(crate) pg_restarts_planned: u64,
    /// The PostgreSQL restarts that happened.
    pub(crate) pg_restarts: Vec<Restart>,
    /// Time from the start of the chaos to the end of the main loop.
    pub(crate) elapsed: Duration,
    /// Why the main loop ended.
    pub(crate) ending: Option<Ending>,
}
