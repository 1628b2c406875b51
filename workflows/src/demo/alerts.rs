//! Showing alerts: one line while the runs execute, or a detailed card for the operator.
//! The reason is always the engine's own wording, never restated here.

use sagaflow::Alert;

use super::text::{short_id, step_error_text};
use super::tracker::Tracker;

/// `<order>: <reason> (<last error>); it waits for an operator`.
pub(crate) fn alert_summary(t: &Tracker, a: &Alert) -> String {
    let who = a
        .run_id
        .map_or_else(|| "engine".to_owned(), |id| t.name(id));
    let (head, err) = split_reason(&a.reason);
    let why = err.map(|e| format!(" ({e})")).unwrap_or_default();
    format!("{who}: {head}{why}; it waits for an operator")
}

/// The alert on one line, as raised while the runs execute.
pub(crate) fn alert_line(t: &Tracker, a: &Alert) -> String {
    format!("  ⚠ alert: {}", alert_summary(t, a))
}

/// The alert on one line, numbered, as listed to the operator.
pub(crate) fn numbered_line(t: &Tracker, a: &Alert) -> String {
    format!("  ⚠ #{:<3} {}", a.id, alert_summary(t, a))
}

/// Prints every detail of the alert the operator needs.
pub(crate) fn print_card(t: &Tracker, a: &Alert) {
    let (head, err) = split_reason(&a.reason);
    let run = a.run_id.map_or_else(String::new, |id| {
        format!("{} · run {}", t.name(id), short_id(id))
    });
    println!();
    println!("  ⚠ #{:<3} {run}", a.id);
    if let Some(step) = &a.step {
        println!("        step        {step}");
    }
    println!("        reason      {head}");
    if let Some(err) = err {
        println!("        last error  {err}");
    }
    println!("        attempts    {}", a.attempts);
    println!("        actions     {}", a.actions.join(" · "));
}

/// Splits an alert reason into its headline and the last step error, nicely formatted.
fn split_reason(reason: &str) -> (String, Option<String>) {
    match reason.split_once("; last error: ") {
        Some((head, err)) => {
            let err = serde_json::from_str(err)
                .ok()
                .and_then(|e| step_error_text(&e))
                .unwrap_or_else(|| err.to_owned());
            (head.to_owned(), Some(err))
        }
        None => (reason.to_owned(), None),
    }
}
