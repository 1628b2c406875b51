//! The page shell and the small pieces every page uses. Every value goes through maud,
//! which escapes it.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use serde_json::Value;

use super::ASSET_VERSION;
use super::session::Session;
use crate::Timestamp;

/// Which tab of the navigation is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tab {
    Overview,
    Runs,
    Alerts,
    Definitions,
    Resources,
    Schedules,
    Instances,
    None,
}

/// A page: what it is, where its live updates come from, and its body.
pub(super) struct Page<'a> {
    pub(super) title: String,
    pub(super) tab: Tab,
    /// The event stream that says when the live regions should be fetched again.
    pub(super) events: Option<String>,
    pub(super) session: &'a Session,
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            meta name="referrer" content="no-referrer";
            title { (title) " · sagaflow" }
            link rel="stylesheet" href={ "/console/assets/console.css?v=" (ASSET_VERSION) };
            script src={ "/console/assets/console.js?v=" (ASSET_VERSION) } defer {}
        }
    }
}

impl Page<'_> {
    /// The whole document around `body`.
    pub(super) fn render(&self, body: Markup) -> Html<String> {
        let s = self.session;
        let tab = |t: Tab, href: &str, label: &str| {
            html! { a href=(href) .current[self.tab == t] { (label) } }
        };
        let page = html! {
            (DOCTYPE)
            html lang="en" {
                (head(&self.title))
                body data-events=[self.events.as_deref()] {
                    header.top {
                        a.brand href="/console/" { "sagaflow" }
                        nav {
                            (tab(Tab::Overview, "/console/", "Overview"))
                            (tab(Tab::Runs, "/console/runs", "Runs"))
                            (tab(Tab::Alerts, "/console/alerts", "Alerts"))
                            (tab(Tab::Definitions, "/console/definitions", "Definitions"))
                            (tab(Tab::Resources, "/console/resources", "Resources"))
                            (tab(Tab::Schedules, "/console/schedules", "Schedules"))
                            (tab(Tab::Instances, "/console/instances", "Instances"))
                        }
                        div.who {
                            span.live-status #live-status title="live updates" {}
                            span { (s.name) " · " (role_name(s)) }
                            form method="post" action="/console/logout" {
                                input type="hidden" name="csrf" value=(s.csrf);
                                button.link type="submit" { "Log out" }
                            }
                        }
                    }
                    @if let Some(lag) = s.replica_lag {
                        p.replica-note role="status" {
                            @if lag == std::time::Duration::MAX {
                                "Read from a replica whose lag is unknown: what this page shows may be behind."
                            } @else {
                                "Read from a replica " (lag_text(lag))
                                " behind the primary."
                            }
                        }
                    }
                    main { (body) }
                }
            }
        };
        Html(page.into_string())
    }
}

/// A replica's lag as a page says it: `120 ms`, `4.2 s`.
pub(super) fn lag_text(lag: std::time::Duration) -> String {
    if lag < std::time::Duration::from_secs(1) {
        format!("{} ms", lag.as_millis())
    } else {
        format!("{:.1} s", lag.as_secs_f64())
    }
}

fn role_name(s: &Session) -> &'static str {
    if s.is_operator() {
        "operator"
    } else {
        "read-only"
    }
}

/// The login form, with a refusal message after a failed attempt.
pub(super) fn login_page(error: Option<&str>) -> Html<String> {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            (head("Log in"))
            body.login {
                main.login-box {
                    h1 { "sagaflow console" }
                    p.muted { "Log in with an API token (the one given to the HTTP API)." }
                    @if let Some(e) = error {
                        p.flash.error role="alert" { (e) }
                    }
                    form method="post" action="/console/login" {
                        label for="token" { "Token" }
                        input #token type="password" name="token" autocomplete="off"
                            required autofocus;
                        button type="submit" { "Log in" }
                    }
                }
            }
        }
    };
    Html(page.into_string())
}

/// A page that only says what went wrong.
pub(super) fn error_page(s: &Session, status: StatusCode, message: &str) -> Response {
    let page = Page {
        title: "Error".into(),
        tab: Tab::None,
        events: None,
        session: s,
    };
    let body = html! {
        h1 { "Cannot do that" }
        p.flash.error role="alert" { (message) }
        p { a href="/console/" { "Back to the overview" } }
    };
    (status, page.render(body)).into_response()
}

/// A message box: `ok` or `error`.
pub(super) fn flash(kind: &str, message: &str) -> Markup {
    html! { p class={ "flash " (kind) } role=[(kind == "error").then_some("alert")] { (message) } }
}

/// A state as a coloured badge (`st-<state>`).
pub(super) fn badge(state: &str) -> Markup {
    html! { span class={ "badge st-" (state) } { (state.replace('_', " ")) } }
}

/// A database time, to the millisecond, in UTC.
pub(super) fn time(t: &Timestamp) -> Markup {
    html! {
        time datetime=(t.to_rfc3339()) { (t.format("%Y-%m-%d %H:%M:%S%.3f")) }
    }
}

/// A duration in milliseconds, in the largest unit that keeps it readable.
pub(super) fn duration_ms(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1_000.0)
    } else if ms < 3_600_000 {
        format!("{:.1} min", ms as f64 / 60_000.0)
    } else {
        format!("{:.1} h", ms as f64 / 3_600_000.0)
    }
}

/// JSON, pretty-printed in a scrollable block.
pub(super) fn json_block(v: &Value) -> Markup {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    html! { pre.json { (text) } }
}

/// JSON on one line, cut at `max` characters (for table cells).
pub(super) fn json_short(v: &Value, max: usize) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > max {
        let cut: String = text.chars().take(max).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// The `code: message` of an error envelope.
pub(super) fn error_text(e: &Value) -> String {
    match (e.get("code").and_then(Value::as_str), e.get("message")) {
        (Some(code), Some(Value::String(m))) => format!("{code}: {m}"),
        (Some(code), _) => code.to_owned(),
        _ => json_short(e, 300),
    }
}

/// Percent-encodes a query-string value.
pub(super) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query string from its non-empty pairs (with the leading `?`, or empty).
pub(super) fn query_string(pairs: &[(&str, Option<&str>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.filter(|v| !v.is_empty())
                .map(|v| format!("{k}={}", url_encode(v)))
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// A run id shortened to its last 12 digits (the random part; the first ones are a time and
/// shared by runs started together).
pub(super) fn short_id(id: &uuid::Uuid) -> String {
    let text = id.simple().to_string();
    format!("…{}", &text[text.len() - 12..])
}

/// A fragment answer (a live region's new content).
pub(super) fn fragment(m: Markup) -> Html<String> {
    Html(m.into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_and_encoded() {
        let m = html! { p { ("<script>alert(1)</script>") } };
        assert_eq!(
            m.into_string(),
            "<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>"
        );
        assert_eq!(url_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(
            query_string(&[
                ("workflow", Some("order")),
                ("state", None),
                ("key", Some(""))
            ]),
            "?workflow=order"
        );
        assert_eq!(duration_ms(1_500), "1.5 s");
        assert_eq!(duration_ms(90_000), "1.5 min");
    }
}
