//! The tables as Markdown, for `docs/state-machines.md` (a test keeps the two equal).

use std::fmt::Write as _;

use super::run_rules::RUN_RULES;
use super::step::{Due, Effects, Maybe, STEP_RULES};

fn effects_text(e: &Effects) -> String {
    let mut parts: Vec<&str> = Vec::new();
    if e.count_failure {
        parts.push("failures + 1");
    }
    if e.count_interruption {
        parts.push("interruptions + 1");
    }
    if e.extend_deadline {
        parts.push("deadline doubled (capped)");
    }
    if e.reset {
        parts.push("counters and deadline reset");
    }
    if e.rekey {
        parts.push("new idempotency key, output, error and maybe applied cleared");
    }
    match e.maybe {
        Maybe::Keep => {}
        Maybe::IfUnknown => parts.push("maybe applied if the outcome is unknown"),
        Maybe::Set => parts.push("maybe applied"),
    }
    match e.due {
        Due::Now => parts.push("due now"),
        Due::AfterBackoff => parts.push("due after backoff"),
        Due::AfterAskedDelay => parts.push("due after the asked delay (capped)"),
        Due::Never => {}
    }
    if e.store_output {
        parts.push("output stored");
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// The step table as Markdown.
pub fn step_table() -> String {
    let mut s =
        String::from("| From | Trigger | To | Moved by | Effects |\n|---|---|---|---|---|\n");
    for r in STEP_RULES {
        let _ = writeln!(
            s,
            "| `{}` | `{}` | `{}` | {} | {} |",
            r.from,
            r.on.as_str(),
            r.to,
            r.by,
            effects_text(&r.effects)
        );
    }
    s
}

/// The run table as Markdown.
pub fn run_table() -> String {
    let mut s = String::from("| From | Trigger | To | Alert |\n|---|---|---|---|\n");
    for r in RUN_RULES {
        let from: Vec<String> = r.from.iter().map(|f| format!("`{f}`")).collect();
        let _ = writeln!(
            s,
            "| {} | `{}` | `{}` | {} |",
            from.join(", "),
            r.on.as_str(),
            r.to,
            r.alert
                .map_or_else(|| "none".to_owned(), |a| format!("`{a}`"))
        );
    }
    s
}
