//! What a check found: the [`CheckReport`], its [`Violation`]s, and the history lines that
//! show each.

use std::fmt;

use serde::Serialize;
use uuid::Uuid;

use crate::Timestamp;

/// The invariant a [`Violation`] breaks (see the [module documentation](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Invariant {
    /// The history is not a path of the transition tables: an edge neither table has, a
    /// line that does not follow the one before, or a history that does not end in the
    /// stored state.
    Path,
    /// A finished run has a step in flight.
    InFlightAfterFinish,
    /// A compensated run left a step that may have acted without a compensation.
    Uncompensated,
    /// Two attempts of one step overlap: one ended twice, out of order, or never.
    OverlappingAttempts,
    /// An unfinished run that nothing will move: nothing due, in flight or waiting, no
    /// scheduled start, no evaluation asked for, no open alert.
    Stuck,
}

impl Invariant {
    /// The name used in reports and in `--json`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Path => "path",
            Self::InFlightAfterFinish => "in_flight_after_finish",
            Self::Uncompensated => "uncompensated",
            Self::OverlappingAttempts => "overlapping_attempts",
            Self::Stuck => "stuck",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stored history line, as read (states as stored text, so that a line holding no
/// state can be shown too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HistoryLine {
    /// The line's id (its order within the run).
    pub id: i64,
    /// The step it is about; `None` for the run.
    pub step: Option<String>,
    /// The event (`state`, `completed`, `retry`, `woken`, `operator_resume`, …).
    pub event: String,
    /// The state before.
    pub from: Option<String>,
    /// The state after.
    pub to: Option<String>,
    /// The attempt (fencing token) whose end it records.
    pub attempt: Option<i32>,
    /// Who wrote it.
    pub actor: String,
    /// Its detail (an error envelope, a note), as JSON; text that is not JSON as a string.
    /// Not shown by `Display`.
    pub detail: Option<serde_json::Value>,
    /// When (the database clock).
    pub at: Timestamp,
}

impl fmt::Display for HistoryLine {
    /// `#id time event [step] [from -> to] [attempt n] by actor`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} {} {}",
            self.id,
            self.at.format("%Y-%m-%d %H:%M:%S%.3f"),
            self.event
        )?;
        if let Some(step) = &self.step {
            write!(f, " {step}")?;
        }
        match (&self.from, &self.to) {
            (Some(from), Some(to)) => write!(f, " {from} -> {to}")?,
            (None, Some(to)) => write!(f, " -> {to}")?,
            (Some(from), None) => write!(f, " {from} ->")?,
            (None, None) => {}
        }
        if let Some(a) = self.attempt {
            write!(f, " attempt {a}")?;
        }
        write!(f, " by {}", self.actor)
    }
}

/// One broken invariant of one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Violation {
    /// The run.
    pub run_id: Uuid,
    /// Its workflow's `name@version`.
    pub workflow: String,
    /// The run's stored state.
    pub state: String,
    /// What is broken.
    pub invariant: Invariant,
    /// The step concerned, if one is.
    pub step: Option<String>,
    /// What was found, in a sentence.
    pub message: String,
    /// The history lines that show it (a few, oldest first).
    pub lines: Vec<HistoryLine>,
}

impl fmt::Display for Violation {
    /// A heading line, then the history lines indented.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "run {} ({}, {}) [{}]",
            self.run_id, self.workflow, self.state, self.invariant
        )?;
        if let Some(step) = &self.step {
            write!(f, " step `{step}`")?;
        }
        write!(f, ": {}", self.message)?;
        if self.lines.is_empty() {
            write!(f, "\n    (no history line)")?;
        }
        for line in &self.lines {
            write!(f, "\n    {line}")?;
        }
        Ok(())
    }
}

/// What [`check`](super::check) found: how many runs it read, and each violation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CheckReport {
    /// Runs read.
    pub runs_checked: u64,
    /// Violations, by run (in id order), then as found.
    pub violations: Vec<Violation>,
}

impl CheckReport {
    /// Whether no violation was found.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many violations break `invariant`.
    pub fn count(&self, invariant: Invariant) -> usize {
        self.violations
            .iter()
            .filter(|v| v.invariant == invariant)
            .count()
    }

    /// The summary line: runs checked and violations per invariant.
    pub fn summary(&self) -> String {
        if self.is_clean() {
            return format!("checked {} run(s): no violation", self.runs_checked);
        }
        let mut per: std::collections::BTreeMap<Invariant, usize> =
            std::collections::BTreeMap::new();
        for v in &self.violations {
            *per.entry(v.invariant).or_default() += 1;
        }
        let parts: Vec<String> = per.iter().map(|(i, n)| format!("{i} {n}")).collect();
        format!(
            "checked {} run(s): {} violation(s) ({})",
            self.runs_checked,
            self.violations.len(),
            parts.join(", ")
        )
    }
}

impl fmt::Display for CheckReport {
    /// Each violation with its lines, a blank line between them, then the summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for v in &self.violations {
            writeln!(f, "{v}\n")?;
        }
        write!(f, "{}", self.summary())
    }
}
