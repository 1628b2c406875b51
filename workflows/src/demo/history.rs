//! Reading a run's history: which business operation undoes a step, which events are
//! finished compensations, and the readable timeline of one run (its story).

use std::collections::HashMap;

use sagaflow::HistoryRow;

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
pub(crate) fn is_compensation_done(h: &HistoryRow) -> bool {
    h.event == "completed" && h.to_state.as_deref() == Some("compensated")
}

/// A compact, readable timeline of one run's history.
pub(crate) fn story(history: &[HistoryRow]) -> Vec<String> {
    let t0 = history.first().map_or(0, |h| h.at);
    // History records each attempt's fencing token, which grows across both phases; a reader
    // counts forward attempts and undo attempts apart, from 1, as the step itself saw them.
    let mut seen: HashMap<(&str, bool), Vec<i32>> = HashMap::new();
    history
        .iter()
        .map(|h| {
            let at = format!("{:>7.2} s", (h.at - t0) as f64 / 1000.0);
            let step = h.step.as_deref().unwrap_or("run");
            let undoing = h.from_state.as_deref() == Some("compensating");
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
fn event_text(h: &HistoryRow, step: &str, attempt: usize) -> String {
    let err = h
        .detail
        .as_deref()
        .and_then(step_error_text)
        .map(|e| format!(" — {e}"))
        .unwrap_or_default();
    let from = h.from_state.as_deref().unwrap_or("");
    let to = h.to_state.as_deref().unwrap_or("");
    let undo = undo_of(step);
    match (h.event.as_str(), to) {
        ("submitted", _) => "submitted".to_owned(),
        ("state", _) if h.step.is_none() => format!("→ {to}"),
        ("state", "ready") => "queued".to_owned(),
        ("state", "compensation_ready") => format!("compensation queued: {undo}"),
        ("state", other) => other.to_owned(),
        ("completed", "compensated") => format!("compensated: {undo} done"),
        ("completed", _) => format!("completed (attempt {attempt})"),
        ("retry", _) if from == "compensating" => {
            format!("{undo} attempt {attempt} failed, retry scheduled{err}")
        }
        ("retry", _) => format!("attempt {attempt} failed, retry scheduled{err}"),
        ("timeout", "failed" | "compensation_failed") => {
            format!("attempt {attempt} timed out; the supervisor failed it at the threshold")
        }
        ("timeout", _) => format!(
            "attempt {attempt} timed out; the supervisor re-queued it with a longer deadline"
        ),
        ("interrupted", "failed" | "compensation_failed") => format!(
            "attempt {attempt} was lost with its engine instance once too often; treated as poison"
        ),
        ("interrupted", _) => format!(
            "attempt {attempt} was lost with its engine instance; re-queued, not counted as a failure"
        ),
        ("failed", "compensation_failed") => {
            format!("compensation failed: {undo} refused{err}")
        }
        ("failed", _) => format!("failed{err}"),
        (e, _) if e.starts_with("operator_") => {
            format!("operator: {}", e.trim_start_matches("operator_"))
        }
        (other, _) => format!("{other} {from} → {to}"),
    }
}
