//! The schedules page: each recurring schedule with its next tick and last firing, and the
//! operator's forms to pause or resume it.

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
use crate::{Error, ScheduleView};

/// What a redirect after a change says.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Notice {
    #[serde(default)]
    done: String,
    #[serde(default)]
    schedule: String,
}

/// `GET /console/schedules`.
pub(super) async fn page(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Query(notice): Query<Notice>,
) -> Response {
    let schedules = match c.admin.engine.schedules().await {
        Ok(r) => r,
        Err(e) => {
            return view::error_page(&s, StatusCode::SERVICE_UNAVAILABLE, &error_message(&e));
        }
    };
    // The name in the link is shown only when it names a schedule.
    let known = schedules.iter().any(|r| r.name == notice.schedule);
    let message = match notice.done.as_str() {
        _ if !known => None,
        "paused" => Some(format!("Done: {} is paused.", notice.schedule)),
        "resumed" => Some(format!("Done: {} is resumed.", notice.schedule)),
        _ => None,
    };
    Page {
        title: "Schedules".into(),
        tab: Tab::Schedules,
        events: None,
        session: &s,
    }
    .render(html! {
        h1 { "Schedules" }
        @if let Some(m) = message { div #notice { (flash("ok", &m)) } }
        p.muted {
            "Workflows started on the ticks of a cron expression, each tick once across the fleet by the supervisor leader. "
            "A paused schedule fires no tick until it is resumed, at its first tick after then."
        }
        (table(&schedules, s.is_operator().then_some(&s)))
    })
    .into_response()
}

fn table(schedules: &[ScheduleView], operator: Option<&Session>) -> Markup {
    html! {
        @if schedules.is_empty() {
            p.muted { "No engine of this database declared a schedule." }
        } @else {
            div.scroll {
                table #schedules {
                    thead { tr {
                        th { "schedule" } th { "workflow" } th { "expression" } th { "next tick" }
                        th { "last fired" } th { "missed ticks" } th { "state" }
                        @if operator.is_some() { th { "" } }
                    } }
                    tbody {
                        @for r in schedules {
                            tr data-schedule=(r.name) {
                                td { code { (r.name) } }
                                td { code { (r.workflow) } }
                                td { code { (r.expression) } " " span.muted.small { (r.zone) } }
                                td.next-tick {
                                    @if r.paused { span.muted { "—" } }
                                    @else { (view::time(&r.next_tick_at)) }
                                }
                                td.last-fired {
                                    @match (r.last_fired_at, r.last_run_id) {
                                        (Some(at), Some(id)) => {
                                            (view::time(&at)) " "
                                            a href={ "/console/runs/" (id) } { "run" }
                                        }
                                        (Some(at), None) => { (view::time(&at)) }
                                        _ => { span.muted { "never" } }
                                    }
                                }
                                td { (r.missed.to_string()) }
                                td.state {
                                    @if r.paused {
                                        span.badge.st-paused { "paused" }
                                        @if let Some(by) = &r.paused_by { " by " code { (by) } }
                                        @if let Some(why) = &r.paused_reason { div.reason { "“" (why) "”" } }
                                    } @else {
                                        span.muted { "active" }
                                    }
                                }
                                @if let Some(s) = operator { td { (form(r, s)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The operator's form of one schedule: pause it, or resume it.
fn form(r: &ScheduleView, s: &Session) -> Markup {
    let (op, label) = if r.paused {
        ("resume", "Resume")
    } else {
        ("pause", "Pause")
    };
    let action = format!("/console/schedules/{}/{op}", view::url_encode(&r.name));
    html! {
        div.action-list {
            details.action data-action=(op) {
                summary { (label) }
                form method="post" action=(action) {
                    input type="hidden" name="csrf" value=(s.csrf);
                    label { "Reason (recorded with the change)"
                        textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                    }
                    button.confirm type="submit" { "Confirm: " (op) }
                }
            }
        }
    }
}

/// The fields of a schedule's form.
#[derive(Deserialize)]
pub(super) struct PauseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/schedules/{name}/{op}`: pauses (`pause`) or resumes (`resume`) the
/// schedule as `console:<token name>` for the given reason.
pub(super) async fn change(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path((name, op)): Path<(String, String)>,
    Form(form): Form<PauseForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let refuse = |status, message: &str| view::error_page(&s, status, message);
    let Some(reason) = action_reason(&form.reason) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            &format!(
                "Pausing or resuming a schedule needs a reason of 1 to {REASON_MAX_CHARS} characters."
            ),
        );
    };
    let operator = c
        .admin
        .engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), reason);
    let (done, result) = match op.as_str() {
        "pause" => ("paused", operator.pause_schedule(&name).await),
        "resume" => ("resumed", operator.resume_schedule(&name).await),
        _ => return refuse(StatusCode::NOT_FOUND, "Pause or resume a schedule."),
    };
    match result {
        Ok(_) => Redirect::to(&format!(
            "/console/schedules{}",
            view::query_string(&[("done", Some(done)), ("schedule", Some(&name))])
        ))
        .into_response(),
        Err(Error::ScheduleNotFound(_)) => {
            refuse(StatusCode::NOT_FOUND, &format!("No schedule {name}."))
        }
        Err(e) => refuse(StatusCode::SERVICE_UNAVAILABLE, &error_message(&e)),
    }
}
