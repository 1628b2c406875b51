//! The verdict of a chaos run: each invariant it checks, with its counts, whether it held and
//! what broke it ([`InvariantReport`]). `sagaflow-chaos` prints it and, with `--report-json`,
//! writes it as JSON for tests to read back.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Violations printed per failed invariant; the report keeps them all.
const DETAILS_SHOWN: usize = 10;

/// The invariants a chaos run checks, in the order they are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum InvariantKind {
    /// Every run is `completed`, `compensated` or `error` (child runs included).
    EveryRunTerminal,
    /// Every run was accepted, every accepted id has a row or was seen finished before
    /// retention purged it, one run per business key.
    NoLostRuns,
    /// No idempotency key applied twice, no operation applied twice for one order, every
    /// effect under a key of its order's own run.
    ExactlyOnce,
    /// No step attempt has two results in the history: no late or stale answer got through.
    FencedResults,
    /// Every settled run is net-consistent and agrees with the ledger.
    NetConsistency,
    /// Every run in `error` has an alert.
    Alerts,
    /// Every planned kill happened, no engine process exited on its own, and the PostgreSQL
    /// restart (when asked for) worked.
    ChaosAsPlanned,
    /// The history checker (`sagaflow::check`) found no run breaking the engine's
    /// invariants: every history a path of the transition tables, nothing in flight in a
    /// finished run, every compensation done, no overlapping attempts, no stuck run.
    History,
    /// Every run met its planned fate: no pair with a root refused for good and no flow
    /// whose event was never sent completed, and every child run ended as its parent.
    Fates,
}

impl InvariantKind {
    /// Every invariant, in the order they are checked and printed.
    pub const ALL: [InvariantKind; 9] = [
        Self::EveryRunTerminal,
        Self::NoLostRuns,
        Self::ExactlyOnce,
        Self::FencedResults,
        Self::NetConsistency,
        Self::Alerts,
        Self::ChaosAsPlanned,
        Self::History,
        Self::Fates,
    ];
}

/// What happened to the mid-run PostgreSQL restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PgRestart {
    /// Every restart asked for happened and the server came back.
    Done,
    /// A restart was attempted and failed.
    Failed,
    /// A restart asked for never happened.
    Missing,
    /// None was asked for.
    Skipped,
}

impl fmt::Display for PgRestart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Done => "done",
            Self::Failed => "failed",
            Self::Missing => "missing",
            Self::Skipped => "skipped",
        })
    }
}

/// The counts one invariant was judged on, by invariant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "invariant", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Finding {
    /// [`InvariantKind::EveryRunTerminal`].
    EveryRunTerminal {
        /// Runs submitted (orders, pairs, flows).
        runs: usize,
        /// Runs `completed`.
        completed: usize,
        /// Runs `compensated`.
        compensated: usize,
        /// Runs in `error`.
        error: usize,
        /// Child runs not finished.
        #[serde(default)]
        children_unfinished: usize,
    },
    /// [`InvariantKind::NoLostRuns`].
    NoLostRuns {
        /// Runs whose submission was accepted.
        accepted: usize,
        /// Accepted runs whose row was found.
        rows_found: usize,
        /// Accepted runs whose row retention purged after they were seen finished.
        #[serde(default)]
        purged: usize,
        /// Submitted runs in the database, children apart (-1 when they could not be
        /// counted).
        rows_total: i64,
    },
    /// [`InvariantKind::ExactlyOnce`].
    ExactlyOnce {
        /// Effects in the ledger.
        effects: usize,
        /// Idempotency keys applied more than once.
        keys_applied_twice: usize,
        /// (order, operation) pairs applied more than once.
        operations_applied_twice: usize,
        /// Effects under a key of another run than their order's.
        foreign_keys: usize,
    },
    /// [`InvariantKind::FencedResults`].
    FencedResults {
        /// Step results recorded in the history.
        step_results: usize,
        /// Attempts with more than one result.
        doubled_attempts: usize,
    },
    /// [`InvariantKind::NetConsistency`].
    NetConsistency {
        /// Completed and compensated orders checked against the ledger.
        settled: usize,
        /// Runs in `error` (reported apart: they may be half-way).
        error_runs: usize,
    },
    /// [`InvariantKind::Alerts`].
    Alerts {
        /// Runs in `error`.
        error_runs: usize,
        /// Of those, runs with an alert.
        alerted: usize,
    },
    /// [`InvariantKind::ChaosAsPlanned`].
    ChaosAsPlanned {
        /// Engine processes SIGKILLed.
        kills: u64,
        /// Engine processes that exited on their own.
        unexpected_exits: usize,
        /// PostgreSQL restarts that happened.
        #[serde(default)]
        pg_restarts: u64,
        /// The PostgreSQL restarts, all together.
        pg_restart: PgRestart,
    },
    /// [`InvariantKind::History`].
    History {
        /// Runs the checker read.
        runs_checked: usize,
        /// Violations it reported.
        violations: usize,
    },
    /// [`InvariantKind::Fates`].
    Fates {
        /// Pairs with a root refused for good.
        refused_pairs: usize,
        /// Flows whose event was never sent.
        withheld_events: usize,
        /// Runs that broke their fate: a doomed run completed, or a child run ended
        /// otherwise than its parent.
        violations: usize,
    },
}

impl Finding {
    /// The invariant these counts belong to.
    pub fn kind(&self) -> InvariantKind {
        match self {
            Self::EveryRunTerminal { .. } => InvariantKind::EveryRunTerminal,
            Self::NoLostRuns { .. } => InvariantKind::NoLostRuns,
            Self::ExactlyOnce { .. } => InvariantKind::ExactlyOnce,
            Self::FencedResults { .. } => InvariantKind::FencedResults,
            Self::NetConsistency { .. } => InvariantKind::NetConsistency,
            Self::Alerts { .. } => InvariantKind::Alerts,
            Self::ChaosAsPlanned { .. } => InvariantKind::ChaosAsPlanned,
            Self::History { .. } => InvariantKind::History,
            Self::Fates { .. } => InvariantKind::Fates,
        }
    }
}

/// The one-line statement of the invariant with its counts.
impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::EveryRunTerminal {
                runs,
                completed,
                compensated,
                error,
                children_unfinished,
            } => write!(
                f,
                "every run terminal: {}/{runs} (completed {completed}, compensated {compensated}, error {error}), {children_unfinished} child runs unfinished",
                completed + compensated + error
            ),
            Self::NoLostRuns {
                accepted,
                rows_found,
                purged,
                rows_total,
            } => write!(
                f,
                "no lost runs: {accepted} accepted, {rows_found} rows found, {purged} seen finished and purged by retention, {rows_total} runs in the database (children apart)"
            ),
            Self::ExactlyOnce {
                effects,
                keys_applied_twice,
                operations_applied_twice,
                foreign_keys,
            } => write!(
                f,
                "exactly once: {effects} effects, {keys_applied_twice} keys applied twice, {operations_applied_twice} operations applied twice per business key, {foreign_keys} under foreign keys"
            ),
            Self::FencedResults {
                step_results,
                doubled_attempts,
            } => write!(
                f,
                "fenced results: {step_results} step results in the history, {doubled_attempts} attempts with two results"
            ),
            Self::NetConsistency {
                settled,
                error_runs,
            } => write!(
                f,
                "net consistency: {settled} completed/compensated runs consistent with the ledger ({error_runs} error runs reported above)"
            ),
            Self::Alerts {
                error_runs,
                alerted,
            } => write!(f, "alerts: {alerted}/{error_runs} error runs have an alert"),
            Self::ChaosAsPlanned {
                kills,
                unexpected_exits,
                pg_restarts,
                pg_restart,
            } => write!(
                f,
                "chaos as planned: {kills} kills, {unexpected_exits} engine processes exited on their own, postgres restarts {pg_restarts} ({pg_restart})"
            ),
            Self::History {
                runs_checked,
                violations,
            } => write!(
                f,
                "history: {runs_checked} runs checked against the transition tables and the engine's invariants, {violations} violations"
            ),
            Self::Fates {
                refused_pairs,
                withheld_events,
                violations,
            } => write!(
                f,
                "fates: {refused_pairs} pairs with a root refused for good and {withheld_events} flows without their event, {violations} runs completed against their fate or child runs ended otherwise than their parent"
            ),
        }
    }
}

/// One checked invariant: its counts, whether it held, and what broke it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invariant {
    /// The counts it was judged on (also names the invariant).
    #[serde(flatten)]
    pub finding: Finding,
    /// Whether it held.
    pub passed: bool,
    /// Every violation found; empty when it held.
    pub details: Vec<String>,
}

impl Invariant {
    /// An invariant that held when `details` is empty and `holds` is true.
    pub fn judge(finding: Finding, holds: bool, details: Vec<String>) -> Self {
        Self {
            finding,
            passed: holds && details.is_empty(),
            details,
        }
    }

    /// The invariant this is.
    pub fn kind(&self) -> InvariantKind {
        self.finding.kind()
    }
}

/// What the chaos did to the fleet, as measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChaosTally {
    /// Engine processes SIGKILLed.
    pub kills: u64,
    /// Kills that hit a process with steps in flight, whose release time was measured.
    pub rescues_measured: usize,
    /// Kills that hit a process holding no step.
    pub idle_kills: u64,
    /// Engine processes that did not stop within the grace period at the end.
    pub forced_stops: usize,
    /// SIGSTOPs of an engine process for 1 to 3 s (its heartbeat late, its attempts fenced).
    #[serde(default)]
    pub pauses: u64,
    /// Operators' cancels sent to runs in flight.
    #[serde(default)]
    pub cancels: u64,
    /// Order sagas submitted.
    #[serde(default)]
    pub orders: usize,
    /// Pairs (two parallel roots) submitted.
    #[serde(default)]
    pub pairs: usize,
    /// Flows (an event wait, a timer, a child run; two versions) submitted.
    #[serde(default)]
    pub flows: usize,
    /// Pairs with a root refused for good at once.
    #[serde(default)]
    pub refused_pairs: usize,
    /// Child runs started by flows.
    #[serde(default)]
    pub children: usize,
    /// Flows migrated from version 1 to 2 while they ran.
    #[serde(default)]
    pub migrated: usize,
    /// Events sent to flows (taken by their run).
    #[serde(default)]
    pub events_sent: u64,
    /// Flows whose event was withheld.
    #[serde(default)]
    pub events_withheld: usize,
    /// Flows whose event wait timed out (withheld and compensated, not cancelled).
    #[serde(default)]
    pub wait_timeouts: usize,
    /// Bulk cancels taken.
    #[serde(default)]
    pub bulk_cancels: u64,
    /// Runs the bulk cancels cancelled.
    #[serde(default)]
    pub bulk_cancelled: u64,
    /// SIGSTOPs of the supervisor leader.
    #[serde(default)]
    pub leader_pauses: u64,
    /// Finished runs retention purged during the run (seen finished before).
    #[serde(default)]
    pub purged: usize,
}

/// How the run ended overall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every invariant held.
    Pass,
    /// At least one invariant failed.
    Fail,
    /// Ctrl-C stopped the run before it ended.
    Interrupted,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Interrupted => "INTERRUPTED",
        })
    }
}

/// Every invariant of a chaos run, and how the run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InvariantReport {
    /// The invariants, in the order of [`InvariantKind::ALL`].
    pub invariants: Vec<Invariant>,
    /// What the chaos did.
    pub chaos: ChaosTally,
    /// Whether the run was interrupted before it ended.
    pub interrupted: bool,
}

impl InvariantReport {
    /// The verdict on `kind`, if it was checked.
    pub fn get(&self, kind: InvariantKind) -> Option<&Invariant> {
        self.invariants.iter().find(|i| i.kind() == kind)
    }

    /// The invariants that failed.
    pub fn failed(&self) -> impl Iterator<Item = &Invariant> {
        self.invariants.iter().filter(|i| !i.passed)
    }

    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.failed().next().is_none()
    }

    /// Writes the report as JSON to `path` (what `sagaflow-chaos --report-json` does).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be created, [`Error::Report`] when it cannot be
    /// written.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let file = std::fs::File::create(path)
            .map_err(Error::io(format!("cannot create {}", path.display())))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), self).map_err(|source| {
            Error::Report {
                path: path.to_owned(),
                source,
            }
        })
    }

    /// Reads a report written by [`InvariantReport::write_json`].
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read, [`Error::Report`] when it is not such a
    /// report.
    pub fn read_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(Error::io(format!("cannot read {}", path.display())))?;
        serde_json::from_str(&text).map_err(|source| Error::Report {
            path: path.to_owned(),
            source,
        })
    }

    /// Pass, fail, or interrupted (whatever the invariants say).
    pub fn outcome(&self) -> Outcome {
        match (self.interrupted, self.passed()) {
            (true, _) => Outcome::Interrupted,
            (false, true) => Outcome::Pass,
            (false, false) => Outcome::Fail,
        }
    }
}

/// The `invariants` section and the `result` line, as `sagaflow-chaos` prints them.
impl fmt::Display for InvariantReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\ninvariants")?;
        for i in &self.invariants {
            if i.passed {
                writeln!(f, "  [ok]   {}", i.finding)?;
                continue;
            }
            writeln!(f, "  [FAIL] {}", i.finding)?;
            for d in i.details.iter().take(DETAILS_SHOWN) {
                writeln!(f, "           - {d}")?;
            }
            if i.details.len() > DETAILS_SHOWN {
                writeln!(
                    f,
                    "           … and {} more",
                    i.details.len() - DETAILS_SHOWN
                )?;
            }
        }
        if self.chaos.forced_stops > 0 {
            writeln!(
                f,
                "  note: {} engine processes did not shut down within 10 s and were killed",
                self.chaos.forced_stops
            )?;
        }
        write!(
            f,
            "\nresult: {} ({} of {} invariants failed)",
            self.outcome(),
            self.failed().count(),
            self.invariants.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(alerted: usize) -> InvariantReport {
        let alerts = Finding::Alerts {
            error_runs: 2,
            alerted,
        };
        let details = (alerted..2).map(|n| format!("order-{n}")).collect();
        InvariantReport {
            invariants: vec![
                Invariant::judge(
                    Finding::FencedResults {
                        step_results: 30,
                        doubled_attempts: 0,
                    },
                    true,
                    Vec::new(),
                ),
                Invariant::judge(alerts, true, details),
            ],
            chaos: ChaosTally::default(),
            interrupted: false,
        }
    }

    #[test]
    fn a_violation_fails_the_invariant_and_the_run() {
        let ok = report(2);
        assert_eq!(ok.outcome(), Outcome::Pass);
        let bad = report(1);
        assert_eq!(bad.outcome(), Outcome::Fail);
        let failed: Vec<InvariantKind> = bad.failed().map(Invariant::kind).collect();
        assert_eq!(failed, vec![InvariantKind::Alerts]);
        let text = bad.to_string();
        assert!(text.contains("  [ok]   fenced results: 30 step results in the history"));
        assert!(
            text.contains("  [FAIL] alerts: 1/2 error runs have an alert\n           - order-1")
        );
        assert!(text.ends_with("result: FAIL (1 of 2 invariants failed)"));
    }

    #[test]
    fn json_round_trip() -> Result<(), serde_json::Error> {
        let r = report(1);
        let json = serde_json::to_value(&r)?;
        assert_eq!(json["invariants"][1]["invariant"], "alerts");
        assert_eq!(json["invariants"][1]["alerted"], 1);
        let back: InvariantReport = serde_json::from_value(json)?;
        assert_eq!(back, r);
        Ok(())
    }
}
