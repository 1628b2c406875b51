//! The checks of one run, over what [`super::read`] read: the history as a path of the
//! transition tables (invariant 1) and the order of a step's attempts (invariant 4). The
//! checks of the run's state (invariants 2, 3 and 5) are in `states.rs`. Pure code.

use std::collections::{HashMap, HashSet};

use sagaflow_engine::migration::MIGRATED;
use sagaflow_engine::transition::{RUN_RULES, STEP_RULES, Trigger};

use super::read::{RunRec, StepRec};
use super::report::{HistoryLine, Invariant, Violation};
use super::states;
use crate::{RunState, StepState, WorkflowDescription};

/// The edges of the engine's own tables.
#[derive(Debug)]
pub(super) struct Tables {
    run: HashSet<(RunState, RunState)>,
    step: HashSet<(StepState, StepState)>,
    /// The claims' edges, which write no history line.
    claim: HashSet<(StepState, StepState)>,
}

impl Tables {
    pub(super) fn new() -> Self {
        let run = RUN_RULES
            .iter()
            .flat_map(|r| r.from.iter().map(move |&f| (f, r.to)))
            .collect();
        let step = STEP_RULES.iter().map(|r| (r.from, r.to)).collect();
        let claim = STEP_RULES
            .iter()
            .filter(|r| r.on == Trigger::Claimed)
            .map(|r| (r.from, r.to))
            .collect();
        Self { run, step, claim }
    }

    /// Whether a step left in `before` may next be seen leaving `from`: the same state, or
    /// one a claim leads to.
    pub(super) fn follows(&self, before: StepState, from: StepState) -> bool {
        before == from || self.claim.contains(&(before, from))
    }
}

/// One run and what belongs to it.
#[derive(Debug)]
pub(super) struct RunData<'a> {
    pub(super) run: &'a RunRec,
    pub(super) steps: &'a [StepRec],
    pub(super) lines: &'a [HistoryLine],
    pub(super) open_alerts: usize,
    pub(super) definition: Option<&'a WorkflowDescription>,
}

/// Collects the violations of one run.
pub(super) struct Found<'a, 'o> {
    pub(super) d: &'a RunData<'a>,
    out: &'o mut Vec<Violation>,
}

impl Found<'_, '_> {
    pub(super) fn push(
        &mut self,
        invariant: Invariant,
        step: Option<&str>,
        message: String,
        lines: &[&HistoryLine],
    ) {
        self.out.push(Violation {
            run_id: self.d.run.id,
            workflow: self.d.run.workflow_key.clone(),
            state: self.d.run.state.clone(),
            invariant,
            step: step.map(str::to_owned),
            message,
            lines: lines.iter().map(|&l| l.clone()).collect(),
        });
    }
}

/// Checks one run against every invariant.
pub(super) fn check_run(t: &Tables, d: &RunData<'_>, out: &mut Vec<Violation>) {
    let mut found = Found { d, out };
    run_path(t, &mut found);
    step_paths(t, &mut found);
    attempts(&mut found);
    states::check(&mut found);
}

/// `line`, after `before` when there is one.
fn pair<'l>(before: Option<&'l HistoryLine>, line: &'l HistoryLine) -> Vec<&'l HistoryLine> {
    before.into_iter().chain([line]).collect()
}

/// Invariant 1 for the run's own lines: each is an edge of the run table, follows the one
/// before, and the last is the stored state.
fn run_path(t: &Tables, f: &mut Found<'_, '_>) {
    let d = f.d;
    let mut current: Option<RunState> = None;
    let mut before: Option<&HistoryLine> = None;
    for l in d.lines.iter().filter(|l| l.step.is_none()) {
        let Some(to_text) = &l.to else { continue };
        let Ok(to) = to_text.parse::<RunState>() else {
            let msg = format!(
                "line #{} moves the run to `{to_text}`, not a run state",
                l.id
            );
            f.push(Invariant::Path, None, msg, &[l]);
            (current, before) = (None, Some(l));
            continue;
        };
        match l.from.as_deref().map(str::parse::<RunState>) {
            // A start (`submitted`, `scheduled`, `child_started`), or a run set aside whose
            // own state could not be read: nothing to follow.
            None => {}
            Some(Err(_)) => {
                let from = l.from.as_deref().unwrap_or_default();
                let msg = format!(
                    "line #{} moves the run from `{from}`, not a run state",
                    l.id
                );
                f.push(Invariant::Path, None, msg, &[l]);
            }
            Some(Ok(from)) => {
                if let Some(cur) = current
                    && cur != from
                {
                    let msg = format!(
                        "line #{} moves the run from {from}, but the line before left it {cur}",
                        l.id
                    );
                    f.push(Invariant::Path, None, msg, &pair(before, l));
                }
                // A line that changes nothing (an operator's `extend`) is no edge.
                if from != to && !t.run.contains(&(from, to)) {
                    let msg = format!(
                        "{from} -> {to} ({}, line #{}) is not an edge of the run table",
                        l.event, l.id
                    );
                    f.push(Invariant::Path, None, msg, &pair(before, l));
                }
            }
        }
        (current, before) = (Some(to), Some(l));
    }
    let (Some(cur), Some(last)) = (current, before) else {
        return;
    };
    if let Ok(stored) = d.run.state.parse::<RunState>()
        && stored != cur
    {
        let msg = format!("the history leaves the run {cur}, but its row says {stored}");
        f.push(Invariant::Path, None, msg, &[last]);
    }
}

/// Invariant 1 for each step's lines: each is an edge of the step table, follows the step's
/// line before (across a claim), and the last agrees with the step's row.
fn step_paths(t: &Tables, f: &mut Found<'_, '_>) {
    let d = f.d;
    // The last line with a state of each step, since the last migration.
    let mut last: HashMap<&str, &HistoryLine> = HashMap::new();
    for l in d.lines {
        let Some(step) = l.step.as_deref() else {
            if l.event == MIGRATED {
                // A migration rewrites step states without lines.
                last.clear();
            }
            continue;
        };
        let Some(to_text) = &l.to else { continue };
        let before = last.insert(step, l);
        let Ok(to) = to_text.parse::<StepState>() else {
            let msg = format!(
                "line #{} moves the step to `{to_text}`, not a step state",
                l.id
            );
            f.push(Invariant::Path, Some(step), msg, &[l]);
            last.remove(step);
            continue;
        };
        let Some(from_text) = &l.from else { continue };
        let Ok(from) = from_text.parse::<StepState>() else {
            let msg = format!(
                "line #{} moves the step from `{from_text}`, not a step state",
                l.id
            );
            f.push(Invariant::Path, Some(step), msg, &[l]);
            continue;
        };
        if let Some(b) = before
            && let Some(Ok(was)) = b.to.as_deref().map(str::parse::<StepState>)
            && !t.follows(was, from)
        {
            let msg = format!(
                "line #{} moves the step from {from}, but the line before left it {was}",
                l.id
            );
            f.push(Invariant::Path, Some(step), msg, &[b, l]);
        }
        if !t.step.contains(&(from, to)) {
            let msg = format!(
                "{from} -> {to} ({}, line #{}) is not an edge of the step table",
                l.event, l.id
            );
            f.push(Invariant::Path, Some(step), msg, &pair(before, l));
        }
    }
    for s in d.steps {
        let Some(l) = last.get(s.name.as_str()) else {
            continue;
        };
        let (Some(Ok(was)), Ok(stored)) = (
            l.to.as_deref().map(str::parse::<StepState>),
            s.state.parse::<StepState>(),
        ) else {
            continue;
        };
        if !t.follows(was, stored) {
            let msg = format!("the history leaves the step {was}, but its row says {stored}");
            f.push(Invariant::Path, Some(&s.name), msg, &[l]);
        }
    }
}

/// What the lines say of one step's attempts.
#[derive(Debug, Default)]
struct Attempts<'l> {
    /// The highest attempt whose end is recorded, with its line.
    last: Option<(i32, &'l HistoryLine)>,
    /// Whether the step's lines are all read from its first attempt on (no migration since
    /// the first of them).
    from_first: bool,
}

/// Invariant 4: per step, the ends of attempts come in order 1, 2, 3 …, none twice, none
/// missing; the row's counter is the last end, or one more with an attempt in flight.
fn attempts(f: &mut Found<'_, '_>) {
    let d = f.d;
    let mut migrated = false;
    let mut seen: HashMap<&str, Attempts<'_>> = HashMap::new();
    for l in d.lines {
        let Some(step) = l.step.as_deref() else {
            if l.event == MIGRATED {
                // A step of the new version may be a new row, counting from zero again.
                migrated = true;
                seen.clear();
            }
            continue;
        };
        let Some(a) = l.attempt else { continue };
        let track = seen.entry(step).or_insert_with(|| Attempts {
            last: None,
            from_first: !migrated,
        });
        match track.last {
            Some((n, before)) if a == n => {
                let msg = format!(
                    "attempt {a} ended twice (lines #{} and #{})",
                    before.id, l.id
                );
                f.push(
                    Invariant::OverlappingAttempts,
                    Some(step),
                    msg,
                    &[before, l],
                );
            }
            Some((n, before)) if a < n => {
                let msg = format!(
                    "attempt {a} ended (line #{}) after attempt {n} had ended (line #{}): \
                     attempt {n} started before attempt {a} ended",
                    l.id, before.id
                );
                f.push(
                    Invariant::OverlappingAttempts,
                    Some(step),
                    msg,
                    &[before, l],
                );
            }
            Some((n, before)) if a > n + 1 => {
                let msg = format!(
                    "{}, yet a later one (attempt {a}) was claimed",
                    no_end(n + 1, a - 1)
                );
                f.push(
                    Invariant::OverlappingAttempts,
                    Some(step),
                    msg,
                    &[before, l],
                );
            }
            None if track.from_first && a > 1 => {
                let msg = format!(
                    "{}, yet a later one (attempt {a}) was claimed",
                    no_end(1, a - 1)
                );
                f.push(Invariant::OverlappingAttempts, Some(step), msg, &[l]);
            }
            _ => {}
        }
        if track.last.is_none_or(|(n, _)| a > n) {
            track.last = Some((a, l));
        }
    }
    for s in d.steps {
        let track = seen.get(s.name.as_str());
        let in_flight = s
            .state
            .parse::<StepState>()
            .is_ok_and(StepState::is_in_flight);
        // The attempts that must have ended: all of them, but the one in flight.
        let ended = if in_flight { s.attempt - 1 } else { s.attempt };
        let last = track.and_then(|t| t.last);
        match last {
            Some((n, l)) if n > ended => {
                let msg = format!(
                    "the history records the end of attempt {n}, but the step's row is {} at \
                     attempt {}",
                    s.state, s.attempt
                );
                f.push(Invariant::OverlappingAttempts, Some(&s.name), msg, &[l]);
            }
            Some((n, l)) if n < ended => {
                let msg = format!(
                    "{}, yet the step's row is {} at attempt {}",
                    no_end(n + 1, ended),
                    s.state,
                    s.attempt
                );
                f.push(Invariant::OverlappingAttempts, Some(&s.name), msg, &[l]);
            }
            None if !migrated && ended > 0 => {
                let msg = format!(
                    "{}, yet the step's row is {} at attempt {}",
                    no_end(1, ended),
                    s.state,
                    s.attempt
                );
                f.push(Invariant::OverlappingAttempts, Some(&s.name), msg, &[]);
            }
            _ => {}
        }
    }
}

/// `attempt 3 has no recorded end`, or `attempts 3 to 5 have …`.
fn no_end(first: i32, last: i32) -> String {
    if first == last {
        format!("attempt {first} has no recorded end")
    } else {
        format!("attempts {first} to {last} have no recorded end")
    }
}
