//! Printing: JSON documents for programs, borderless tables for people (no colours).

use std::io::Write;
use std::time::SystemTime;

use comfy_table::{ContentArrangement, Table, presets};
use sagaflow::Timestamp;
use serde::Serialize;
use serde_json::Value;

use crate::exit::Failure;

/// Writes `text` and a newline to standard output. A closed pipe (`| head`) ends the output
/// quietly.
pub(crate) fn line(text: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

/// Prints `value` as pretty JSON.
pub(crate) fn json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::failed(format!("cannot write JSON: {e}")))?;
    line(text);
    Ok(())
}

/// A table with these column titles (none: no title row): columns separated by spaces, no
/// borders, no wrapping.
pub(crate) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled);
    if !header.is_empty() {
        t.set_header(header.iter().copied());
    }
    t
}

/// Prints a table, its lines without trailing spaces.
pub(crate) fn print_table(t: &Table) {
    for l in t.lines() {
        line(l.trim_end().strip_prefix(' ').unwrap_or(l.trim_end()));
    }
}

/// A time as people read it: UTC, to the second.
pub(crate) fn time(t: Timestamp) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// How long ago `t` was, in its largest unit (`42s`, `5m`, `3h`, `2d`).
pub(crate) fn ago(t: Timestamp) -> String {
    let secs = (Timestamp::from(SystemTime::now()) - t)
        .num_seconds()
        .max(0);
    span(secs)
}

/// A span of seconds in its largest unit.
pub(crate) fn span(secs: i64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3_600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3_600),
        s => format!("{}d", s / 86_400),
    }
}

/// The `code` of an error envelope, or `-`.
pub(crate) fn error_code(error: Option<&Value>) -> String {
    error
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .unwrap_or("-")
        .to_owned()
}

/// An optional text, or `-`.
pub(crate) fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_owned()
}

/// An optional text someone typed (a reason, a name), or `-`; control characters (an escape
/// sequence that would drive the terminal, a line break that would split the row) are shown
/// escaped.
pub(crate) fn printable(v: Option<&str>) -> String {
    match v {
        Some(text) => text
            .chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
        None => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{printable, span};

    #[test]
    fn typed_text_is_shown_without_control_characters() {
        assert_eq!(printable(Some("known outage")), "known outage");
        assert_eq!(printable(Some("a\nb\u{1b}[2J")), "a\\nb\\u{1b}[2J");
        assert_eq!(printable(None), "-");
    }

    #[test]
    fn spans_use_their_largest_unit() {
        assert_eq!(span(0), "0s");
        assert_eq!(span(59), "59s");
        assert_eq!(span(60), "1m");
        assert_eq!(span(3_599), "59m");
        assert_eq!(span(7_200), "2h");
        assert_eq!(span(86_400 * 3), "3d");
    }
}
