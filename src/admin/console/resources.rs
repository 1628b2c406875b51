//! The resources page: each remote resource's limits, override and load, and the operator's
//! form to override its limits or clear the override.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::error_message;
use super::session::Session;
use super::view::{self, Page, Tab, flash};
use super::{Console, PageSession, check_post};
use crate::admin::actions::{REASON_MAX_CHARS, action_reason};
use crate::admin::auth::Role;
use crate::{Error, ResourceLimits, ResourceView, describe_limits, describe_state};

/// What a redirect after a change says.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Notice {
    #[serde(default)]
    done: String,
    #[serde(default)]
    resource: String,
}

/// `GET /console/resources`.
pub(super) async fn page(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Query(notice): Query<Notice>,
) -> Response {
    let resources = match c.admin.engine.resources().await {
        Ok(r) => r,
        Err(e) => {
            return view::error_page(&s, StatusCode::SERVICE_UNAVAILABLE, &error_message(&e));
        }
    };
    // The name in the link is shown only when it names a resource.
    let known = resources.iter().any(|r| r.name == notice.resource);
    let message = match notice.done.as_str() {
        _ if !known => None,
        "set" => Some(format!(
            "Done: the limits of {} are overridden.",
            notice.resource
        )),
        "cleared" => Some(format!(
            "Done: the override of {} is cleared; its code's limits apply.",
            notice.resource
        )),
        _ => None,
    };
    Page {
        title: "Resources".into(),
        tab: Tab::Resources,
        events: None,
        session: &s,
    }
    .render(html! {
        h1 { "Resources" }
        @if let Some(m) = message { div #notice { (flash("ok", &m)) } }
        p.muted {
            "The remote services steps call, with the limits every instance obeys when it claims their steps. "
            "An override replaces the limits the code declares until it is cleared."
        }
        (table(&resources, s.is_operator().then_some(&s)))
    })
    .into_response()
}

fn table(resources: &[ResourceView], operator: Option<&Session>) -> Markup {
    html! {
        @if resources.is_empty() {
            p.muted { "No engine of this database declared a resource." }
        } @else {
            div.scroll {
                table #resources {
                    thead { tr {
                        th { "resource" } th { "limits in force" } th { "breaker" } th { "override" }
                        th.num { "in flight" } th.num { "waiting" }
                        @if operator.is_some() { th { "" } }
                    } }
                    tbody {
                        @for r in resources {
                            tr data-resource=(r.name) {
                                td { code { (r.name) } }
                                td.limits {
                                    (describe_limits(&r.limits))
                                    @if r.override_limits.is_some() {
                                        div.muted.small { "code's: " (describe_limits(&r.defaults)) }
                                    }
                                }
                                td.state { (describe_state(r)) }
                                td.override {
                                    @if r.override_limits.is_some() {
                                        span.badge.st-paused { "override" }
                                        @if let Some(by) = &r.override_by { " by " code { (by) } }
                                        @if let Some(why) = &r.override_reason { div.reason { "“" (why) "”" } }
                                    } @else {
                                        span.muted { "code's limits" }
                                    }
                                }
                                td.num.in-flight { (r.in_flight) (undoing(r.compensations_in_flight)) }
                                td.num.waiting { (r.waiting) (undoing(r.compensations_waiting)) }
                                @if let Some(s) = operator { td { (forms(r, s)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The compensations among a count, when there are any.
fn undoing(n: i64) -> Markup {
    html! {
        @if n > 0 { div.muted.small.undoing { (n) " undoing" } }
    }
}

/// The operator's forms of one resource: override its limits, clear the override.
fn forms(r: &ResourceView, s: &Session) -> Markup {
    let action = format!("/console/resources/{}/limits", view::url_encode(&r.name));
    let current = serde_json::to_string_pretty(&r.limits).unwrap_or_default();
    html! {
        div.action-list {
            details.action data-action="set-limits" {
                summary { "Override" }
                form method="post" action=(action) {
                    input type="hidden" name="csrf" value=(s.csrf);
                    input type="hidden" name="op" value="set";
                    label { "Limits (JSON; a limit left out is unlimited)"
                        textarea.mono name="limits" required rows="6" { (current) }
                    }
                    p.muted.small {
                        code { "max_in_flight" } ", " code { "max_in_flight_per_key" } ", "
                        code { "rate" } ": " code { "{\"limit\": 20, \"period_ms\": 1000, \"burst\": 1}" } ", "
                        code { "compensation_share" } " (kept for undo): " code { "{\"in_flight\": 2, \"rate\": 5}" }
                    }
                    label { "Reason (stored with the override)"
                        textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                    }
                    button.confirm type="submit" { "Confirm: override" }
                }
            }
            @if r.override_limits.is_some() {
                details.action data-action="clear-limits" {
                    summary { "Clear override" }
                    form method="post" action=(action) {
                        input type="hidden" name="csrf" value=(s.csrf);
                        input type="hidden" name="op" value="clear";
                        label { "Reason (logged)"
                            textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                        }
                        button.confirm type="submit" { "Confirm: clear override" }
                    }
                }
            }
        }
    }
}

/// The fields of a resource's forms.
#[derive(Deserialize)]
pub(super) struct LimitsForm {
    #[serde(default)]
    csrf: String,
    /// `set` or `clear`.
    #[serde(default)]
    op: String,
    /// The limits as `ResourceLimits` JSON, for `set`.
    #[serde(default)]
    limits: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/resources/{name}/limits`: overrides the resource's limits (`op=set`) or
/// clears the override (`op=clear`), as `console:<token name>` for the given reason.
pub(super) async fn change(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(name): Path<String>,
    Form(form): Form<LimitsForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let refuse = |status, message: &str| view::error_page(&s, status, message);
    let Some(reason) = action_reason(&form.reason) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "Changing a resource's limits needs a reason of 1 to {REASON_MAX_CHARS} characters."
            ),
        );
    };
    let limits = match form.op.as_str() {
        "set" => match serde_json::from_str::<ResourceLimits>(&form.limits) {
            Ok(l) => match l.check() {
                Ok(()) => Some(l),
                Err(why) => {
                    return refuse(
                        StatusCode::BAD_REQUEST,
                        &format!("These limits are not valid: {why}."),
                    );
                }
            },
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &format!("These limits cannot be read: {e}."),
                );
            }
        },
        "clear" => None,
        _ => return refuse(StatusCode::BAD_REQUEST, "Set or clear the override."),
    };
    let done = if limits.is_some() { "set" } else { "cleared" };
    let op = c
        .admin
        .engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), reason);
    match op.set_resource_limits(&name, limits).await {
        Ok(true) => Redirect::to(&format!(
            "/console/resources{}",
            view::query_string(&[("done", Some(done)), ("resource", Some(&name))])
        ))
        .into_response(),
        Ok(false) => refuse(StatusCode::NOT_FOUND, &format!("No resource {name}.")),
        Err(Error::Config(why)) => refuse(StatusCode::BAD_REQUEST, &why),
        Err(e) => refuse(StatusCode::SERVICE_UNAVAILABLE, &error_message(&e)),
    }
}
