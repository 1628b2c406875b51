//! The migration page: the dry run of moving the unfinished runs of one version of a
//! workflow to another (what would happen to each run, changing nothing), and for an
//! operator the form that applies it, recorded with each migrated run as done by
//! `console:<token name>` for the reason (see
//! [`Operator::migration_plan`](crate::Operator::migration_plan)).

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::pages::error_message;
use super::session::Session;
use super::view::{self, Page, Tab, badge, flash};
use super::{Console, PageSession, check_post};
use crate::admin::actions::{REASON_MAX_CHARS, action_reason};
use crate::admin::auth::Role;
use crate::migration::{MigrationOutcome, MigrationPlan};

/// The page's query: the migration to show, and what was just done.
#[derive(Deserialize, Default)]
pub(super) struct PlanQuery {
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    from: Option<i32>,
    #[serde(default)]
    to: Option<i32>,
    /// The page of the dry run starts after this run.
    #[serde(default)]
    after: Option<uuid::Uuid>,
    #[serde(default)]
    migrated: Option<usize>,
    #[serde(default)]
    refused: Option<usize>,
}

/// Runs one page of the console's dry run shows.
const PLAN_PAGE: u32 = 100;

/// `GET /console/migrations`: the form, and with a workflow and two versions, a page of the
/// dry run.
pub(super) async fn page(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Query(q): Query<PlanQuery>,
) -> Response {
    let engine = &c.admin.engine;
    let workflow = q.workflow.trim();
    let plan = match (workflow.is_empty(), q.from, q.to) {
        (false, Some(from), Some(to)) => {
            let page = engine
                .operator()
                .migration_plan_page(workflow, from, to, q.after, PLAN_PAGE)
                .await;
            match page {
                Ok(p) => Some(Ok(p)),
                Err(e) => Some(Err(error_message(&e))),
            }
        }
        _ => None,
    };
    let done = match (q.migrated, q.refused) {
        (Some(m), Some(r)) => Some(format!(
            "Done: {m} run(s) migrated, {r} refused (they stay on their version)."
        )),
        _ => None,
    };
    Page {
        title: "Migrations".into(),
        tab: Tab::Definitions,
        events: None,
        session: &s,
    }
    .render(html! {
        h1 { "Migrate runs to another version" }
        @if let Some(m) = done { div #notice { (flash("ok", &m)) } }
        p.muted {
            "Runs stay on the version they started with. Moving the unfinished runs of one "
            "version to another maps their steps by name (or by the migration the application "
            "registered for these versions); a run with an attempt in flight, or one that cannot "
            "be mapped, is refused and stays as it is. The dry run below changes nothing."
        }
        form.inline #plan-form method="get" action="/console/migrations" {
            label { "Workflow " input type="text" name="workflow" value=(workflow) required; }
            label { "from version " input type="number" name="from" value=[q.from] required; }
            label { "to version " input type="number" name="to" value=[q.to] required; }
            button type="submit" { "Show the dry run" }
        }
        @match &plan {
            Some(Ok(p)) => {
                // One page of a longer plan: its counts are the page's, and applying moves
                // every unfinished run of the version, not only those shown.
                @let paged = q.after.is_some() || p.next_after.is_some();
                (plan_table(p, paged))
                @if s.is_operator() && (paged || p.migrating() > 0) { (apply_form(p, paged, &s)) }
            }
            Some(Err(message)) => { (flash("error", message)) }
            None => {}
        }
    })
    .into_response()
}

fn plan_table(p: &MigrationPlan, paged: bool) -> Markup {
    html! {
        section #plan {
            h2 { (p.workflow) "@" (p.from) " → " (p.workflow) "@" (p.to) ": "
                @if paged { "on this page, " }
                (p.migrating()) " would migrate, " (p.refused()) " refused" }
            @if let Some(after) = p.next_after {
                p.muted {
                    "Showing " (p.runs.len()) " runs. "
                    a #plan-next href={ "/console/migrations?workflow=" (view::url_encode(&p.workflow))
                        "&from=" (p.from) "&to=" (p.to) "&after=" (after) } { "Next runs" }
                }
            }
            @if p.runs.is_empty() {
                p.muted { "No unfinished run of this version." }
            } @else {
                div.scroll {
                    table #plan-runs {
                        thead { tr { th { "run" } th { "state" } th { "outcome" } th { "steps / reason" } } }
                        tbody {
                            @for r in &p.runs {
                                tr data-run=(r.run_id) data-outcome=(outcome(r.outcome)) {
                                    td { a href={ "/console/runs/" (r.run_id) } { code { (r.run_id) } } }
                                    td { (badge(r.state.as_str())) }
                                    td { (outcome(r.outcome)) }
                                    td {
                                        @if let Some(reason) = &r.reason { (reason) }
                                        @for st in r.steps.iter().filter(|st| st.before != st.after || st.output_changed) {
                                            code { (st.step) } " "
                                            (st.before.map_or("—", |x| x.as_str())) " → "
                                            (st.after.map_or("—", |x| x.as_str())) " "
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
}

fn outcome(o: MigrationOutcome) -> &'static str {
    match o {
        MigrationOutcome::Migrates => "migrates",
        MigrationOutcome::Migrated => "migrated",
        MigrationOutcome::Refused => "refused",
    }
}

fn apply_form(p: &MigrationPlan, paged: bool, s: &Session) -> Markup {
    html! {
        details.action data-action="migrate" {
            @if paged {
                summary { "Apply: migrate every unfinished run of " (p.workflow) "@" (p.from)
                    " that can move (all pages, not only this one)" }
            } @else {
                summary { "Apply: migrate " (p.migrating()) " run(s)" }
            }
            form method="post" action="/console/migrations" {
                input type="hidden" name="csrf" value=(s.csrf);
                input type="hidden" name="workflow" value=(p.workflow);
                input type="hidden" name="from" value=(p.from);
                input type="hidden" name="to" value=(p.to);
                label { "Reason (recorded in each migrated run's history)"
                    textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                }
                button.confirm type="submit" { "Confirm: migrate to version " (p.to) }
            }
        }
    }
}

/// The apply form's fields.
#[derive(Deserialize)]
pub(super) struct ApplyForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    workflow: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    #[serde(default)]
    reason: String,
}

/// `POST /console/migrations`: applies the migration, each run decided afresh; then back to
/// the page, which says how many runs moved.
pub(super) async fn apply(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Form(form): Form<ApplyForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let (Ok(from), Ok(to)) = (
        form.from.trim().parse::<i32>(),
        form.to.trim().parse::<i32>(),
    ) else {
        return view::error_page(&s, StatusCode::BAD_REQUEST, "Versions are whole numbers.");
    };
    let Some(reason) = action_reason(&form.reason) else {
        return view::error_page(
            &s,
            StatusCode::BAD_REQUEST,
            &format!("A migration needs a reason of 1 to {REASON_MAX_CHARS} characters."),
        );
    };
    let workflow = form.workflow.trim();
    let op = c
        .admin
        .engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), reason);
    match op.migrate(workflow, from, to).await {
        Ok(report) => {
            let (from, to) = (from.to_string(), to.to_string());
            let (migrated, refused) =
                (report.migrating().to_string(), report.refused().to_string());
            let query = view::query_string(&[
                ("workflow", Some(workflow)),
                ("from", Some(&from)),
                ("to", Some(&to)),
                ("migrated", Some(&migrated)),
                ("refused", Some(&refused)),
            ]);
            Redirect::to(&format!("/console/migrations{query}")).into_response()
        }
        Err(e) => view::error_page(&s, StatusCode::CONFLICT, &error_message(&e)),
    }
}
