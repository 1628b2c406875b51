//! Reading a run's history: which business operation undoes a step, which events are
//! finished compensations, and the readable timeline of one run (its story).

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
    history
        .iter()
        .map(|h| {
            let at = format!("{:>7.2} s", (h.at - t0) as f64 / 1000.0);
            let step = h.step.as_deref().unwrap_or("run");
            format!("{at}  {step:<14} {}", event_text(h, step))
        })
        .collect()
}

/// What one history event means, in words.
fn event_text(h: &HistoryRow, step: &str) -> String {
    let err = h
        .detail
        .as_deref()
        .and_then(step_error_text)
        .map(|e| format!(" — {e}"))
        .unwrap_or_default();
    let from = h.from_state.as_deref().unwrap_or("");
    let to = h.to_state.as_deref().unwrap_or("");
    let undo = undo_of(step);
    let attempt = h.attempt.unwrap_or(0);
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
