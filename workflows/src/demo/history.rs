//! Reading a run's history: which business operation undoes a step, which events are
//! finished compensations, and the readable timeline of one run (its story).

use std::collections::HashMap;

use sagaflow::{EntityState, HistoryEvent, HistoryKind, StepState};

use super::text::step_error_text;

/// The business operation a step's compensation calls.
pub(crate) fn undo_of(step: &str) -> &str {
    match step {
        "reserve_stock" => "release",
        "charge_card" => "refund",
        other => other,
    }
}

/// Whether `h` records a compensation that finished.
pub(crate) fn is_compensation_done(h: &HistoryEvent) -> bool {
    h.kind == HistoryKind::Completed && h.to == Some(EntityState::Step(StepState::Compensated))
}

/// A compact, readable timeline of one run's history.
pub(crate) fn story(history: &[HistoryEvent]) -> Vec<String> {
    let t0 = history.first().map(|h| h.at);
    // History records each attempt's fencing token, which grows across both phases; a reader
    // counts forward attempts and undo attempts apart, from 1, as the step itself saw them.
    let mut seen: HashMap<(&str, bool), Vec<i32>> = HashMap::new();
    history
        .iter()
        .map(|h| {
            let since = t0.map_or(0, |t0| (h.at - t0).num_milliseconds());
            let at = format!("{:>7.2} s", since as f64 / 1000.0);
            let step = h.step.as_deref().unwrap_or("run");
            let undoing = h.from == Some(EntityState::Step(StepState::Compensating));
            let attempt = h.attempt.map_or(0, |token| {
                let tokens = seen.entry((step, undoing)).or_default();
                if !tokens.contains(&token) {
                    tokens.push(token);
                }
                tokens.iter().position(|t| *t == token).map_or(0, |i| i + 1)
            });
            format!("{at}  {step:<14} {}", event_text(h, step, attempt))
        })
        .collect()
}

/// What one history event means, in words.
fn event_text(h: &HistoryEvent, step: &str, attempt: usize) -> String {
    use HistoryKind as K;
    use StepState as S;
    let err = h
        .detail
        .as_ref()
        .and_then(step_error_text)
        .map(|e| format!(" — {e}"))
        .unwrap_or_default();
    let undoing = h.from == Some(EntityState::Step(S::Compensating));
    let to = h.to.and_then(EntityState::step);
    let gave_up = matches!(to, Some(S::Failed | S::CompensationFailed));
    let undo = undo_of(step);
    match &h.kind {
        K::Submitted => "submitted".to_owned(),
        K::State => match (h.to, to) {
            (Some(EntityState::Run(run)), _) => format!("→ {run}"),
            (_, Some(S::Ready)) => "queued".to_owned(),
            (_, Some(S::CompensationReady)) => format!("compensation queued: {undo}"),
            (Some(other), _) => other.to_string(),
            (None, _) => "state".to_owned(),
        },
        K::Completed if to == Some(S::Compensated) => format!("compensated: {undo} done"),
        K::Completed => format!("completed (attempt {attempt})"),
        K::Retry if undoing => format!("{undo} attempt {attempt} failed, retry scheduled{err}"),
        K::Retry => format!("attempt {attempt} failed, retry scheduled{err}"),
        K::Timeout if gave_up => {
            format!("attempt {attempt} timed out; the supervisor failed it at the threshold")
        }
        K::Timeout => format!(
            "attempt {attempt} timed out; the supervisor re-queued it with a longer deadline"
        ),
        K::Interrupted if gave_up => format!(
            "attempt {attempt} was lost with its engine instance once too often; treated as poison"
        ),
        K::Interrupted => format!(
            "attempt {attempt} was lost with its engine instance; re-queued, not counted as a failure"
        ),
        K::Failed if to == Some(S::CompensationFailed) => {
            format!("compensation failed: {undo} refused{err}")
        }
        K::Failed => format!("failed{err}"),
        k if k.as_ref().starts_with("operator_") => {
            format!("operator: {}", k.as_ref().trim_start_matches("operator_"))
        }
        other => {
            let state = |s: Option<EntityState>| s.map(|s| s.to_string()).unwrap_or_default();
            format!("{other} {} → {}", state(h.from), state(h.to))
        }
    }
}
