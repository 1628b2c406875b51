//! Small text helpers shared by every printed section: percentages, durations, counts,
//! section rules, short ids and step errors.

use std::time::{Duration, Instant};

use sagaflow::StepError;
use serde::Deserialize;
use uuid::Uuid;

/// `0.1` → `10%`; keeps the decimals a share needs.
pub(crate) fn pct(x: f64) -> String {
    let p = x * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        format!("{p}%")
    }
}

/// Seconds with one decimal: `1.6 s`.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// How long ago, readable at any scale.
pub(crate) fn since(t: Instant) -> String {
    let d = t.elapsed();
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        secs(d)
    }
}

/// `1 alert`, `2 alerts`.
pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `1 run`, `2 runs`.
pub(crate) fn runs(n: usize) -> String {
    plural(n, "run", "runs")
}

/// A section heading drawn across the line: `── Title ─────…`.
pub(crate) fn rule(title: &str) -> String {
    let width: usize = 72;
    let head = format!("── {title} ");
    let fill = width.saturating_sub(head.chars().count());
    format!("{head}{}", "─".repeat(fill))
}

/// The last 8 hex digits of an id, for a glance.
pub(crate) fn short_id(id: Uuid) -> String {
    let s = id.simple().to_string();
    format!("{}…", &s[s.len().saturating_sub(8)..])
}

/// A step error stored as JSON, as `code: message` (the code not repeated when the message
/// already starts with it); `None` when `json` is not a step error.
pub(crate) fn step_error_text(json: &serde_json::Value) -> Option<String> {
    let e = StepError::deserialize(json).ok()?;
    Some(if e.message.starts_with(&e.code) {
        e.message
    } else {
        format!("{}: {}", e.code, e.message)
    })
}
