//! The overview, runs list, alerts and definitions pages.

use std::collections::{BTreeMap, BTreeSet};

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::graph::{self, Node};
use super::session::{CsrfForm, Session};
use super::view::{self, Page, Tab, badge, duration_ms, flash, time};
use super::{Console, LiveSession, PageSession, check_post};
use crate::admin::actions::{REASON_MAX_CHARS, action_reason};
use crate::admin::auth::Role;
use crate::{Alert, Engine, Error, RunOrder, RunPage, RunQuery, RunState, Stats};

/// An engine error as a message on the page; internal details stay in the log.
pub(super) fn error_message(e: &Error) -> String {
    match e {
        Error::ActionNotAllowed { .. }
        | Error::RunNotFound(_)
        | Error::CorruptRow { .. }
        | Error::Shutdown => e.to_string(),
        _ => {
            tracing::error!(error = %e, "console request failed");
            "The engine could not answer; see its logs.".into()
        }
    }
}

fn failed(s: &Session, e: &Error) -> Response {
    view::error_page(s, StatusCode::SERVICE_UNAVAILABLE, &error_message(e))
}

// ---------------------------------------------------------------- overview

/// `GET /console/`.
pub(super) async fn overview(State(c): State<Console>, PageSession(s): PageSession) -> Response {
    match overview_body(&c.admin.engine).await {
        Ok(body) => Page {
            title: "Overview".into(),
            tab: Tab::Overview,
            events: Some("/console/events?page=overview".into()),
            session: &s,
        }
        .render(html! {
            h1 { "Overview" }
            div data-live="/console/fragments/overview" { (body) }
        })
        .into_response(),
        Err(e) => failed(&s, &e),
    }
}

/// `GET /console/fragments/overview`.
pub(super) async fn overview_fragment(State(c): State<Console>, _s: LiveSession) -> Response {
    match overview_body(&c.admin.engine).await {
        Ok(body) => view::fragment(body).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, error_message(&e)).into_response(),
    }
}

async fn overview_body(engine: &Engine) -> Result<Markup, Error> {
    let stats = engine.stats().await?;
    let alerts = engine.open_alerts().await?;
    Ok(html! {
        div.cards {
            section.card {
                h2 { "Queue" }
                dl.figures {
                    div { dt { "due" } dd #q-ready { (stats.ready) } }
                    div { dt { "scheduled" } dd #q-scheduled { (stats.scheduled) } }
                    div { dt { "running" } dd #q-running { (stats.running) } }
                    div { dt { "oldest due step waits" } dd #q-oldest {
                        @if stats.ready == 0 { "—" } @else { (duration_ms(stats.oldest_ready_ms)) }
                    } }
                }
            }
            section.card {
                h2 { "Finished runs" }
                (throughput(&stats))
            }
            section.card {
                h2 { "Open alerts" }
                p.big { a #open-alerts href="/console/alerts" { (alerts.len()) } }
                @if alerts.is_empty() {
                    p.muted { "Nothing needs an operator." }
                } @else {
                    ul.compact {
                        @for a in alerts.iter().take(5) {
                            li { (alert_kind(a)) " " (alert_subject(a)) }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Runs per workflow and state" }
            (active_table(&stats))
        }
    })
}

/// Runs finished in the last 1, 5 and 15 minutes, as bars.
fn throughput(stats: &Stats) -> Markup {
    let f = stats.finished_last;
    let bars = [("1 min", f.m1), ("5 min", f.m5), ("15 min", f.m15)];
    let max = bars.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    const BAR_W: i64 = 56;
    const GAP: i64 = 24;
    const TOP: i64 = 18;
    const CHART_H: i64 = 90;
    let width = 3 * BAR_W + 2 * GAP + 20;
    let height = TOP + CHART_H + 22;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" class="bars" role="img" id="throughput"
            viewBox={ "0 0 " (width) " " (height) } width=(width) height=(height) {
            title { "Runs finished in the last 1, 5 and 15 minutes: " (f.m1) ", " (f.m5) ", " (f.m15) }
            line.axis x1="8" y1=(TOP + CHART_H) x2=(width - 8) y2=(TOP + CHART_H) {}
            @for (i, (label, n)) in bars.iter().enumerate() {
                @let x = 10 + i as i64 * (BAR_W + GAP);
                @let h = if *n == 0 { 0 } else { (n * CHART_H / max).max(2) };
                rect.bar x=(x) y=(TOP + CHART_H - h) width=(BAR_W) height=(h) {}
                text.value x=(x + BAR_W / 2) y=(TOP + CHART_H - h - 4) text-anchor="middle" { (n) }
                text.label x=(x + BAR_W / 2) y=(TOP + CHART_H + 16) text-anchor="middle" { (label) }
            }
        }
    }
}

/// Runs per workflow (rows) and state (columns), unfinished and retained finished ones, each
/// count a link to the list.
fn active_table(stats: &Stats) -> Markup {
    let states = RunState::ALL;
    let mut by: BTreeMap<&str, BTreeMap<RunState, i64>> = BTreeMap::new();
    for a in stats.active.iter().chain(&stats.finished) {
        *by.entry(&a.workflow)
            .or_default()
            .entry(a.state)
            .or_default() += a.runs;
    }
    html! {
        @if by.is_empty() {
            p.muted { "No runs yet." }
        } @else {
            div.scroll {
                table #active {
                    thead { tr {
                        th { "workflow" }
                        @for s in &states { th.num { (badge(s.as_str())) } }
                        th.num { "total" }
                    } }
                    tbody {
                        @for (wf, counts) in &by {
                            tr {
                                td { a href={ "/console/runs" (view::query_string(&[("workflow", Some(wf))])) } { (wf) } }
                                @for s in &states {
                                    @let n = counts.get(s).copied().unwrap_or(0);
                                    td.num data-state=(s.as_str()) {
                                        @if n > 0 {
                                            a href={ "/console/runs" (view::query_string(&[("workflow", Some(wf)), ("state", Some(s.as_str()))])) } { (n) }
                                        } @else { span.muted { "0" } }
                                    }
                                }
                                td.num { (counts.values().sum::<i64>()) }
                            }
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------- runs list

/// The runs list's filters, from the query string (empty fields are no filter).
#[derive(Debug, Default, Deserialize)]
pub(super) struct RunsFilter {
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    order: String,
    #[serde(default)]
    cursor: String,
    /// Rows per page (no field on the form: a link can set it); 50 when empty.
    #[serde(default)]
    limit: String,
}

impl RunsFilter {
    fn query(&self) -> Result<RunQuery, String> {
        let some = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let state = match some(&self.state) {
            None => None,
            Some(s) => Some(
                s.parse::<RunState>()
                    .map_err(|_| format!("There is no run state “{s}”."))?,
            ),
        };
        let mut q = RunQuery::new();
        q.workflow = some(&self.workflow);
        q.state = state;
        q.business_key = some(&self.key);
        q.order = match self.order.as_str() {
            "attempts" => RunOrder::Attempts,
            _ => RunOrder::Created,
        };
        q.limit = self.limit.trim().parse().unwrap_or(50);
        q.cursor = some(&self.cursor);
        Ok(q)
    }

    /// The query string of these filters, with `cursor` in place of the current one.
    fn link(&self, cursor: Option<&str>) -> String {
        view::query_string(&[
            ("workflow", Some(&self.workflow)),
            ("state", Some(&self.state)),
            ("key", Some(&self.key)),
            ("order", Some(&self.order)),
            ("limit", Some(&self.limit)),
            ("cursor", cursor),
        ])
    }
}

/// `GET /console/runs`.
pub(super) async fn runs(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Query(f): Query<RunsFilter>,
) -> Response {
    let workflows: BTreeSet<String> = match c.admin.engine.definitions().await {
        Ok(defs) => defs.into_iter().map(|d| d.name).collect(),
        Err(e) => return failed(&s, &e),
    };
    let (status, body) = runs_body(&c.admin.engine, &f).await;
    let here = f.link(Some(&f.cursor));
    let page = Page {
        title: "Runs".into(),
        tab: Tab::Runs,
        events: Some("/console/events?page=runs".into()),
        session: &s,
    }
    .render(html! {
        h1 { "Runs" }
        form.filters method="get" action="/console/runs" {
            label { "Workflow"
                select name="workflow" {
                    option value="" { "any" }
                    @for w in &workflows {
                        option value=(w) selected[*w == f.workflow] { (w) }
                    }
                }
            }
            label { "State"
                select name="state" {
                    option value="" { "any" }
                    @for st in RunState::ALL {
                        option value=(st.as_str()) selected[st.as_str() == f.state] { (st.as_str()) }
                    }
                }
            }
            label { "Business key"
                input type="search" name="key" value=(f.key) placeholder="exact key";
            }
            label { "Sort by"
                select name="order" {
                    option value="created" selected[f.order != "attempts"] { "newest first" }
                    option value="attempts" selected[f.order == "attempts"] { "failed attempts" }
                }
            }
            button type="submit" { "Filter" }
            @if !(f.workflow.is_empty() && f.state.is_empty() && f.key.is_empty()) {
                a.clear href="/console/runs" { "clear" }
            }
        }
        div data-live={ "/console/fragments/runs" (here) } { (body) }
    });
    (status, page).into_response()
}

/// `GET /console/fragments/runs`.
pub(super) async fn runs_fragment(
    State(c): State<Console>,
    _s: LiveSession,
    Query(f): Query<RunsFilter>,
) -> Response {
    let (status, body) = runs_body(&c.admin.engine, &f).await;
    (status, view::fragment(body)).into_response()
}

async fn runs_body(engine: &Engine, f: &RunsFilter) -> (StatusCode, Markup) {
    let q = match f.query() {
        Ok(q) => q,
        Err(msg) => return (StatusCode::BAD_REQUEST, flash("error", &msg)),
    };
    match engine.list_runs(&q).await {
        Ok(page) => (StatusCode::OK, runs_table(&page, f)),
        Err(e @ Error::InvalidQuery(_)) => (
            StatusCode::BAD_REQUEST,
            flash(
                "error",
                &format!("This page link is not valid any more ({e}); start from the first page."),
            ),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            flash("error", &error_message(&e)),
        ),
    }
}

fn runs_table(page: &RunPage, f: &RunsFilter) -> Markup {
    html! {
        @for d in &page.damaged {
            (flash("error", &format!("A run of this page cannot be read: {d}")))
        }
        @if page.runs.is_empty() {
            p.muted { "No runs match." }
        } @else {
            div.scroll {
                table #runs {
                    thead { tr {
                        th { "run" } th { "workflow" } th { "business key" } th { "state" }
                        th.num { "failed attempts" } th { "created" } th { "updated" } th { "error" }
                    } }
                    tbody {
                        @for r in &page.runs {
                            tr data-run=(r.id) {
                                td.mono { a href={ "/console/runs/" (r.id) } { (view::short_id(&r.id)) } }
                                td { (r.workflow) "@" (r.version) }
                                td.key { (r.business_key.as_deref().unwrap_or("")) }
                                td { (badge(r.state.as_str())) }
                                td.num { (r.failed_attempts) }
                                td { (time(&r.created_at)) }
                                td { (time(r.finished_at.as_ref().unwrap_or(&r.updated_at))) }
                                td.err { @if let Some(e) = &r.error { (view::json_short(&serde_json::Value::String(view::error_text(e)), 80)) } }
                            }
                        }
                    }
                }
            }
        }
        p.pager {
            @if !f.cursor.is_empty() {
                a href={ "/console/runs" (f.link(None)) } { "« first page" }
            }
            @if let Some(next) = &page.next {
                a #next-page rel="next" href={ "/console/runs" (f.link(Some(next))) } { "next page »" }
            }
        }
    }
}

// ---------------------------------------------------------------- alerts

pub(super) fn alert_kind(a: &Alert) -> Markup {
    html! { span.kind { (a.kind.to_string().replace('_', " ")) } }
}

pub(super) fn alert_subject(a: &Alert) -> Markup {
    html! {
        @if let Some(run) = a.run_id {
            a href={ "/console/runs/" (run) } { "run " (view::short_id(&run)) }
            @if let Some(step) = &a.step { " step " code { (step) } }
        }
    }
}

/// A table of alerts; with `resolve`, each open one has a resolve button.
pub(super) fn alerts_table(alerts: &[Alert], resolve: Option<&Session>) -> Markup {
    html! {
        div.scroll {
            table.alerts {
                thead { tr {
                    th.num { "#" } th { "kind" } th { "about" } th { "reason" } th.num { "attempts" }
                    th { "raised" } th { "status" }
                } }
                tbody {
                    @for a in alerts {
                        tr data-alert=(a.id) {
                            td.num { (a.id) }
                            td { (alert_kind(a)) }
                            td { (alert_subject(a)) }
                            td.reason {
                                (a.reason)
                                @if !a.actions.is_empty() {
                                    div.muted.small { "what to do: " (a.actions.join("; ")) }
                                }
                            }
                            td.num { (a.attempts) }
                            td { (time(&a.created_at)) }
                            td.resolution {
                                @if let Some(t) = &a.resolved_at {
                                    "resolved " (time(t))
                                    @if let Some(by) = &a.resolved_by { " by " code { (by) } }
                                    @if let Some(why) = &a.resolution { div.reason { "“" (why) "”" } }
                                } @else if let Some(s) = resolve {
                                    details.action data-action="resolve" {
                                        summary { "Resolve" }
                                        form method="post" action={ "/console/alerts/" (a.id) "/resolve" } {
                                            input type="hidden" name="csrf" value=(s.csrf);
                                            label { "Reason (stored with the alert)"
                                                textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                                            }
                                            button.confirm type="submit" { "Confirm: resolve" }
                                        }
                                    }
                                } @else {
                                    span.badge.st-error { "open" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /console/alerts`.
pub(super) async fn alerts(State(c): State<Console>, PageSession(s): PageSession) -> Response {
    match alerts_body(&c.admin.engine, &s).await {
        Ok(body) => Page {
            title: "Alerts".into(),
            tab: Tab::Alerts,
            events: Some("/console/events?page=alerts".into()),
            session: &s,
        }
        .render(html! {
            h1 { "Open alerts" }
            div data-live="/console/fragments/alerts" { (body) }
        })
        .into_response(),
        Err(e) => failed(&s, &e),
    }
}

/// `GET /console/fragments/alerts`.
pub(super) async fn alerts_fragment(
    State(c): State<Console>,
    LiveSession(s): LiveSession,
) -> Response {
    match alerts_body(&c.admin.engine, &s).await {
        Ok(body) => view::fragment(body).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, error_message(&e)).into_response(),
    }
}

async fn alerts_body(engine: &Engine, s: &Session) -> Result<Markup, Error> {
    let open = engine.open_alerts().await?;
    let dead = engine
        .deliveries(Some(crate::DeliveryState::Dead), 100)
        .await?;
    Ok(html! {
        @if open.is_empty() {
            p.muted { "No open alert." }
        } @else {
            (alerts_table(&open, s.is_operator().then_some(s)))
        }
        h2 { "Dead-lettered notices" }
        @if dead.is_empty() {
            p.muted { "Every notice reached its sinks, or is still being tried." }
        } @else {
            (dead_letters_table(&dead, s.is_operator().then_some(s)))
        }
    })
}

/// Notices a sink gave up on; with `redeliver`, each has a button to send it again.
fn dead_letters_table(dead: &[crate::Delivery], redeliver: Option<&Session>) -> Markup {
    html! {
        div.scroll {
            table.dead-letters {
                thead { tr {
                    th.num { "notice" } th { "topic" } th { "about" } th { "sink" }
                    th.num { "tries" } th { "last error" } th { "given up" } th { "" }
                } }
                tbody {
                    @for d in dead {
                        tr data-notice=(d.notice_id) {
                            td.num { (d.notice_id) }
                            td { code { (d.topic) } }
                            td {
                                @if let Some(a) = d.alert_id { "alert " (a) " " }
                                @if let Some(run) = d.run_id {
                                    a href={ "/console/runs/" (run) } { "run " (view::short_id(&run)) }
                                }
                            }
                            td { code { (d.sink) } }
                            td.num { (d.attempts) }
                            td.reason { (d.last_error.as_deref().unwrap_or("")) }
                            td { (time(&d.updated_at)) }
                            td {
                                @if let Some(s) = redeliver {
                                    form method="post" action={ "/console/deliveries/" (d.notice_id) "/redeliver" } {
                                        input type="hidden" name="csrf" value=(s.csrf);
                                        button type="submit" { "Send again" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `POST /console/deliveries/{id}/redeliver`.
pub(super) async fn redeliver(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(id): Path<i64>,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let op = c
        .admin
        .engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), "sent again in the console");
    match op.redeliver(id).await {
        Ok(_) => Redirect::to("/console/alerts").into_response(),
        Err(e) => failed(&s, &e),
    }
}

/// The fields of an alert's resolve form.
#[derive(Deserialize)]
pub(super) struct ResolveForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/alerts/{id}/resolve`: resolves the alert, stored as done by
/// `console:<token name>` for the given reason.
pub(super) async fn resolve(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(id): Path<i64>,
    Form(form): Form<ResolveForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let Some(reason) = action_reason(&form.reason) else {
        return view::error_page(
            &s,
            StatusCode::BAD_REQUEST,
            &format!("Resolving an alert needs a reason of 1 to {REASON_MAX_CHARS} characters."),
        );
    };
    let op = c
        .admin
        .engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), reason);
    match op.resolve_alert(id).await {
        Ok(_) => Redirect::to("/console/alerts").into_response(),
        Err(e) => failed(&s, &e),
    }
}

// ---------------------------------------------------------------- definitions

/// `GET /console/definitions`.
pub(super) async fn definitions(State(c): State<Console>, PageSession(s): PageSession) -> Response {
    let defs = match c.admin.engine.definitions().await {
        Ok(d) => d,
        Err(e) => return failed(&s, &e),
    };
    let page = Page {
        title: "Definitions".into(),
        tab: Tab::Definitions,
        events: None,
        session: &s,
    };
    let body = html! {
        h1 { "Definitions" }
        p { a href="/console/migrations" { "Migrate runs to another version" } " (a dry run first)" }
        @if defs.is_empty() { p.muted { "No workflow was published to this database." } }
        nav.toc {
            @for (i, d) in defs.iter().enumerate() {
                a href={ "#def-" (i) } { (d.key) }
            }
        }
        @for (i, d) in defs.iter().enumerate() {
            section.definition id={ "def-" (i) } {
                h2 { (d.key) }
                p.muted { "published by " code { (d.published_by) } " at " (time(&d.published_at)) }
                @match &d.description {
                    Err(e) => { (flash("error", &format!("This description cannot be read: {e}"))) }
                    Ok(desc) => {
                        p { "Business keys: " code { (desc.business_keys) } }
                        @let nodes: Vec<Node<'_>> = desc.steps.iter().map(|st| Node {
                            name: &st.name,
                            after: st.after.iter().map(String::as_str).collect(),
                            compensates: st.compensates,
                            kind: &st.kind,
                            state: None,
                        }).collect();
                        (graph::svg(&format!("d{i}"), &nodes))
                        (graph::legend(&[]))
                        h3 { "Steps and policies" }
                        div.scroll {
                            table.policies {
                                thead { tr {
                                    th { "step" } th { "role" } th { "after" } th { "compensation" }
                                    th.num { "fails for good after" } th { "backoff" } th { "deadline" } th.num { "interruptions" }
                                } }
                                tbody {
                                    @for st in &desc.steps {
                                        tr {
                                            td { code { (st.name) } }
                                            td { (st.kind) }
                                            td { (st.after.join(", ")) }
                                            td { @if st.compensates { "yes" } @else { "—" } }
                                            td.num { @match st.max_failures { Some(n) => { (n) " failures" } None => { "never" } } }
                                            td { (duration_ms(st.initial_backoff_ms)) " → " (duration_ms(st.max_backoff_ms)) }
                                            td { (duration_ms(st.deadline_ms)) " (cap " (duration_ms(st.deadline_cap_ms)) ")" }
                                            td.num { (st.max_interruptions) }
                                        }
                                    }
                                }
                            }
                        }
                        h3 { "Input schema" }
                        @match &desc.input_schema {
                            Some(schema) => { (view::json_block(schema)) }
                            None => { p.muted { "No declared input type: any JSON is accepted." } }
                        }
                    }
                }
            }
        }
    };
    page.render(body).into_response()
}
