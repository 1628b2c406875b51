//! A run's page: its step graph, steps, alerts, history and the operator's actions.

use std::collections::{BTreeSet, HashMap};

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::graph::{self, Node};
use super::pages::{alerts_table, error_message};
use super::session::Session;
use super::view::{self, Page, Tab, badge, duration_ms, flash, time};
use super::{Console, LiveSession, PageSession, check_post};
use crate::admin::actions::{REASON_MAX_CHARS, action_reason, extension};
use crate::admin::auth::Role;
use crate::{
    ActionArgs, Engine, EntityState, Error, HistoryEvent, OperatorAction, Run, RunState, Step,
    StepState, Undo, UndoOutcome, UndoPreview,
};
use sagaflow_engine::transition::operator::EXTEND_MAX;

/// What a redirect after an action says.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Notice {
    #[serde(default)]
    done: String,
}

/// `GET /console/runs/{id}`.
pub(super) async fn page(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path(id): Path<String>,
    Query(notice): Query<Notice>,
) -> Response {
    let message = notice
        .done
        .parse::<OperatorAction>()
        .ok()
        .map(|a| flash("ok", &format!("Done: {}.", a.as_str().replace('_', " "))))
        .or_else(|| {
            (notice.done == super::input::DONE).then(|| flash("ok", "Done: input replaced."))
        })
        .or_else(|| {
            (notice.done == super::restart::DONE)
                .then(|| flash("ok", "Done: restarted from a step; this is the new run."))
        });
    render(&c.admin.engine, &s, &id, message, StatusCode::OK).await
}

/// The page of run `id` with `message` above it, answered with `status`.
pub(super) async fn render(
    engine: &Engine,
    s: &Session,
    id: &str,
    message: Option<Markup>,
    status: StatusCode,
) -> Response {
    let Ok(uuid) = id.parse::<Uuid>() else {
        return view::error_page(s, StatusCode::NOT_FOUND, "A run id is a UUID.");
    };
    let body = match body(engine, uuid, s).await {
        Ok(Some(b)) => b,
        Ok(None) => {
            return view::error_page(s, StatusCode::NOT_FOUND, &format!("No run {uuid}."));
        }
        Err(e) => {
            return view::error_page(s, StatusCode::SERVICE_UNAVAILABLE, &error_message(&e));
        }
    };
    let page = Page {
        title: format!("Run {}", view::short_id(&uuid)),
        tab: Tab::Runs,
        events: Some(format!("/console/events?run={uuid}")),
        session: s,
    }
    .render(html! {
        h1 { "Run " span.mono { (uuid) } }
        @if let Some(m) = message { div #notice { (m) } }
        div data-live={ "/console/fragments/runs/" (uuid) } { (body) }
    });
    (status, page).into_response()
}

/// `GET /console/fragments/runs/{id}`.
pub(super) async fn fragment(
    State(c): State<Console>,
    LiveSession(s): LiveSession,
    Path(id): Path<Uuid>,
) -> Response {
    match body(&c.admin.engine, id, &s).await {
        Ok(Some(b)) => view::fragment(b).into_response(),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, error_message(&e)).into_response(),
    }
}

/// Each step's latest state: the stored steps of an unfinished run, else its history.
fn step_states(steps: &[Step], history: &[HistoryEvent]) -> HashMap<String, StepState> {
    if !steps.is_empty() {
        return steps.iter().map(|s| (s.name.clone(), s.state)).collect();
    }
    let mut states = HashMap::new();
    for h in history {
        if let (Some(step), Some(EntityState::Step(to))) = (&h.step, h.to) {
            states.insert(step.clone(), to);
        }
    }
    states
}

async fn body(engine: &Engine, id: Uuid, s: &Session) -> Result<Option<Markup>, Error> {
    let Some(crate::RunDetail {
        run,
        steps,
        history,
        alerts,
    }) = engine.run_detail(id).await?
    else {
        return Ok(None);
    };
    let waiting = engine.waiting_steps(Some(id), 50).await?;
    let key = format!("{}@{}", run.workflow, run.version);
    let description = engine
        .inner
        .store
        .definition_get(&run.workflow, run.version)
        .await?
        .and_then(|d| d.description.ok());
    let states = step_states(&steps, &history);
    let nodes: Vec<Node<'_>> = match &description {
        Some(desc) => desc
            .steps
            .iter()
            .map(|st| Node {
                name: &st.name,
                after: st.after.iter().map(String::as_str).collect(),
                compensates: st.compensates,
                kind: &st.kind,
                state: Some(states.get(&st.name).map_or("not_started", |s| s.as_str())),
            })
            .collect(),
        None => steps
            .iter()
            .map(|st| Node {
                name: &st.name,
                after: Vec::new(),
                compensates: false,
                kind: "step",
                state: Some(st.state.as_str()),
            })
            .collect(),
    };
    // What a cancel or a compensate would undo, shown in its form before the operator
    // confirms (an error reads as "no preview": the action itself still answers).
    let previews: Vec<Result<UndoPreview, String>> = if s.is_operator() && !run.state.is_final() {
        match engine
            .preview_undos(id, &[Undo::Compensate, Undo::Cancel])
            .await
        {
            Ok(each) => each
                .into_iter()
                .map(|p| p.map_err(|e| e.to_string()))
                .collect(),
            Err(e) => vec![Err(e.to_string()), Err(e.to_string())],
        }
    } else {
        Vec::new()
    };
    let step_names: Vec<&str> = nodes.iter().map(|n| n.name).collect();
    let legend: BTreeSet<&str> = nodes.iter().filter_map(|n| n.state).collect();
    let legend: Vec<&str> = StepState::ALL
        .iter()
        .map(|s| s.as_str())
        .filter(|s| legend.contains(s))
        .collect();
    Ok(Some(html! {
        section.summary {
            dl.facts {
                div { dt { "state" } dd #run-state data-state=(run.state.as_str()) { (badge(run.state.as_str())) } }
                div { dt { "workflow" } dd { a href={ "/console/definitions" } { (key) } } }
                div { dt { "business key" } dd.key { (run.business_key.as_deref().unwrap_or("—")) } }
                div { dt { "created" } dd { (time(&run.created_at)) } }
                div { dt { "updated" } dd { (time(&run.updated_at)) } }
                div { dt { "finished" } dd { @if let Some(t) = &run.finished_at { (time(t)) } @else { "—" } } }
                @if let Some(from) = run.restarted_from {
                    div { dt { "restarted from" } dd.mono { a #restarted-from href={ "/console/runs/" (from) } { (from) } } }
                }
                @if let Some(newer) = run.restarted_as {
                    div { dt { "restarted as" } dd.mono { a #restarted-as href={ "/console/runs/" (newer) } { (newer) } } }
                }
            }
            @if let Some(e) = run.error.as_ref().filter(|_| run.state != RunState::Completed) {
                (flash("error", &view::error_text(e)))
            }
        }
        section {
            h2 { "Steps" }
            (graph::svg("run", &nodes))
            (graph::legend(&legend))
        }
        (super::waits::section(id, &waiting, s))
        @if s.is_operator() && !run.state.is_final() && run.restarted_as.is_none() {
            (actions(&run, &steps, &previews, s))
        }
        @if s.is_operator() && super::restart::applies(&run) {
            (super::restart::section(&run, &step_names, s))
        }
        section {
            @if steps.is_empty() {
                p.muted { "A finished run keeps its history only; each step's last state is drawn above." }
            } @else {
                (steps_table(&steps))
            }
        }
        @if !alerts.is_empty() {
            section {
                h2 { "Alerts" }
                (alerts_table(&alerts, None))
            }
        }
        section.payloads {
            div { h2 { "Input" } (view::json_block(&run.input)) }
            @if let Some(out) = &run.output {
                div { h2 { "Output" } (view::json_block(out)) }
            }
            @if let Some(e) = &run.error {
                div {
                    h2 { @if run.state == RunState::Completed { "Last error (overcome)" } @else { "Error" } }
                    (view::json_block(e))
                }
            }
        }
        section {
            h2 { "History" }
            (timeline(&history))
        }
    }))
}

fn steps_table(steps: &[Step]) -> Markup {
    html! {
        div.scroll {
            table #steps {
                thead { tr {
                    th { "step" } th { "state" } th.num { "attempts" } th.num { "failures" }
                    th { "deadline" } th { "maybe applied" } th { "progress" } th { "output / error" }
                } }
                tbody {
                    @for st in steps {
                        tr data-step=(st.name) {
                            td { code { (st.name) } }
                            td { (badge(st.state.as_str())) }
                            td.num {
                                (st.attempts.forward)
                                @if st.attempts.compensation > 0 { " + " (st.attempts.compensation) " comp." }
                            }
                            td.num {
                                (st.attempts.failures) " / "
                                // A step retried until it succeeds stores the largest count.
                                @if st.attempts.max_failures == i32::MAX { "∞" } @else { (st.attempts.max_failures) }
                            }
                            td {
                                @if let Some(t) = &st.complete_by { "by " (time(t)) }
                                @else { (duration_ms(i64::try_from(st.deadline.as_millis()).unwrap_or(i64::MAX))) }
                            }
                            td { @if st.maybe_applied { span.badge.st-failed { "maybe applied" } } @else { "no" } }
                            td.progress {
                                @if let Some(p) = &st.progress { code { (view::json_short(p, 80)) } }
                            }
                            td.payload {
                                @if let Some(e) = &st.error {
                                    span.err { (view::json_short(&Value::String(view::error_text(e)), 160)) }
                                } @else if let Some(o) = &st.output {
                                    code { (view::json_short(o, 160)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn timeline(history: &[HistoryEvent]) -> Markup {
    html! {
        ol.timeline #history {
            @for h in history.iter().rev() {
                li class={ "ev-" (h.kind.as_ref()) } {
                    div.when { (time(&h.at)) }
                    div.what {
                        strong { (h.kind.as_ref().replace('_', " ")) }
                        @if let Some(step) = &h.step { " " code { (step) } }
                        @match (h.from, h.to) {
                            (Some(f), Some(t)) => { " " (badge(&f.to_string())) " → " (badge(&t.to_string())) }
                            (None, Some(t)) => { " → " (badge(&t.to_string())) }
                            _ => {}
                        }
                        @if let Some(a) = h.attempt { span.muted { " attempt " (a) } }
                    }
                    div.who { "by " code { (h.actor) } }
                    @if let Some(reason) = h.detail.as_ref().and_then(|d| d.get("reason")).and_then(Value::as_str) {
                        div.reason { "“" (reason) "”" }
                    }
                    @if let Some(d) = &h.detail {
                        @let rest = without_reason(d);
                        @if let Some(rest) = rest {
                            div.detail { code { (view::json_short(&rest, 300)) } }
                        }
                    }
                }
            }
        }
    }
}

/// A history detail without its `reason` (shown on its own line), if anything is left.
fn without_reason(d: &Value) -> Option<Value> {
    match d {
        Value::Object(m) => {
            let mut m = m.clone();
            m.remove("reason");
            (!m.is_empty()).then_some(Value::Object(m))
        }
        Value::Null => None,
        other => Some(other.clone()),
    }
}

/// One action's form: a button that opens a reason field and a confirmation.
fn action_form(
    run: Uuid,
    action: OperatorAction,
    step: Option<&str>,
    label: &str,
    s: &Session,
) -> Markup {
    action_form_with(run, action, step, label, None, s)
}

/// [`action_form`], with what the action would undo shown above its confirmation.
fn action_form_with(
    run: Uuid,
    action: OperatorAction,
    step: Option<&str>,
    label: &str,
    preview: Option<&Result<UndoPreview, String>>,
    s: &Session,
) -> Markup {
    html! {
        details.action data-action=(action) data-step=[step] {
            summary { (label) @if let Some(st) = step { " " code { (st) } } }
            @if let Some(p) = preview { (undo_preview(p)) }
            form method="post" action={ "/console/runs/" (run) "/actions/" (action) } {
                input type="hidden" name="csrf" value=(s.csrf);
                @if let Some(st) = step { input type="hidden" name="step" value=(st); }
                @if action == OperatorAction::Extend {
                    label { "Seconds to add to the deadlines in flight"
                        input type="number" name="by_seconds" min="1" max=(EXTEND_MAX.as_secs()) value="300" required;
                    }
                }
                @if action == OperatorAction::Rollback {
                    p.muted { "The steps after it are compensated in reverse order, then run again from there under new idempotency keys; it and the steps it depends on stay done." }
                    label { "New input (JSON, checked against the run's workflow version; leave empty to keep the run's input)"
                        textarea.mono name="input" rows="4" {}
                    }
                }
                label { "Reason (recorded in the run's history)"
                    textarea name="reason" required maxlength=(REASON_MAX_CHARS) rows="2" {}
                }
                button.confirm type="submit" {
                    "Confirm: " (label.to_lowercase())
                    @if let Some(st) = step { " " (st) }
                }
            }
        }
    }
}

/// What an undo would do, as [`Engine::preview_undo`] says: the compensations in order (a
/// group's steps side by side), what stays and why, the assumptions about attempts in
/// flight, and how the run ends.
fn undo_preview(p: &Result<UndoPreview, String>) -> Markup {
    let p = match p {
        Ok(p) => p,
        Err(e) => return html! { p.muted.undo-preview { "No preview: " (e) } },
    };
    let end = match p.outcome {
        UndoOutcome::Compensated => "The run ends compensated.",
        UndoOutcome::StopsInError => "The run stops in error, for an operator.",
        UndoOutcome::GoesForward => "The run goes forward and completes.",
        _ => "The undo waits.",
    };
    html! {
        div.undo-preview data-undo=(p.undo) data-outcome=(p.outcome) {
            p { "If every compensation succeeds:" }
            @if p.groups.is_empty() {
                p.undo-nothing { "Nothing is undone." }
            } @else {
                ol.undo-groups {
                    @for group in &p.groups {
                        li.undo-group data-steps=(group.iter().map(|u| u.step.as_str()).collect::<Vec<_>>().join(",")) {
                            "Undo "
                            @for (i, u) in group.iter().enumerate() {
                                @if i > 0 { ", " }
                                code { (u.step) }
                                @if u.maybe_applied { " (may have taken effect)" }
                                @if let Some(r) = &u.resource { " [resource " (r) "]" }
                            }
                            @if group.len() > 1 { " — side by side" }
                        }
                    }
                }
            }
            @if !p.kept.is_empty() {
                ul.undo-kept {
                    @for k in &p.kept {
                        li { "Leaves " code { (k.step) } " (" (k.state) "): " (k.reason) }
                    }
                }
            }
            @for a in &p.in_flight { p.muted { "Assumes " (a) "." } }
            p.undo-end { (end) @if let Some(r) = &p.reason { " " (r) } }
        }
    }
}

/// The preview of `undo` among the page's, if it was read.
fn preview_of(
    previews: &[Result<UndoPreview, String>],
    undo: Undo,
) -> Option<&Result<UndoPreview, String>> {
    let i = match undo {
        Undo::Compensate => 0,
        _ => 1,
    };
    previews.get(i)
}

/// The actions that apply to the run as it is.
fn actions(
    run: &Run,
    steps: &[Step],
    previews: &[Result<UndoPreview, String>],
    s: &Session,
) -> Markup {
    let set_aside = run
        .error
        .as_ref()
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        == Some("corrupt_row");
    let error = run.state == RunState::Error;
    let paused = run.state == RunState::Paused;
    let pausable = matches!(
        run.state,
        RunState::Pending | RunState::Running | RunState::Compensating
    );
    html! {
        section.actions #actions {
            h2 { "Act on this run" }
            div.action-list {
                @if error {
                    @for st in steps.iter().filter(|st| matches!(st.state, StepState::Failed | StepState::CompensationFailed)) {
                        (action_form(run.id, OperatorAction::Retry, Some(&st.name), "Retry", s))
                    }
                    @for st in steps.iter().filter(|st| st.state == StepState::CompensationFailed) {
                        (action_form(run.id, OperatorAction::MarkCompensated, Some(&st.name), "Mark compensated", s))
                    }
                    (action_form(run.id, OperatorAction::Resume, None, "Resume", s))
                }
                @if paused {
                    (action_form(run.id, OperatorAction::Resume, None, "Resume", s))
                }
                @if pausable {
                    (action_form(run.id, OperatorAction::Pause, None, "Pause", s))
                }
                @if steps.iter().any(|st| st.state.is_in_flight()) {
                    (action_form(run.id, OperatorAction::Extend, None, "Extend deadlines", s))
                }
                @if !run.state.is_final() && run.state != RunState::Compensating {
                    (action_form_with(run.id, OperatorAction::Compensate, None, "Compensate", preview_of(previews, Undo::Compensate), s))
                }
                @if !run.state.is_final() {
                    (action_form_with(run.id, OperatorAction::Cancel, None, "Cancel", preview_of(previews, Undo::Cancel), s))
                }
                @if set_aside {
                    (action_form(run.id, OperatorAction::Release, None, "Release", s))
                }
                @if super::input::applies(run) {
                    (super::input::form(run, s))
                }
                @if matches!(run.state, RunState::Running | RunState::Error)
                    && !steps.iter().any(|st| st.state.is_compensation() || st.state == StepState::Skipped) {
                    @for st in steps.iter().filter(|st| st.state == StepState::Completed) {
                        (action_form(run.id, OperatorAction::Rollback, Some(&st.name), "Roll back to", s))
                    }
                }
            }
        }
    }
}

/// An action form's fields.
#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    step: String,
    #[serde(default)]
    by_seconds: String,
    #[serde(default)]
    input: String,
}

/// `POST /console/runs/{id}/actions/{action}`: the action, recorded as done by
/// `console:<token name>` for the given reason; then back to the run's page, which says what
/// happened or why it was not allowed.
pub(super) async fn act(
    State(c): State<Console>,
    PageSession(s): PageSession,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = check_post(&s, &form.csrf, Role::Operator) {
        return *refused;
    }
    let engine = &c.admin.engine;
    let Ok(run_id) = id.parse::<Uuid>() else {
        return view::error_page(&s, StatusCode::NOT_FOUND, "A run id is a UUID.");
    };
    let Ok(action) = action.parse::<OperatorAction>() else {
        return view::error_page(&s, StatusCode::NOT_FOUND, "No such action.");
    };
    let step = form.step.trim();
    let refused = |status, msg: String| {
        let engine = engine.clone();
        let s = s.clone();
        let id = id.clone();
        async move { render(&engine, &s, &id, Some(flash("error", &msg)), status).await }
    };
    let Some(reason) = action_reason(&form.reason) else {
        return refused(
            StatusCode::BAD_REQUEST,
            format!("An action needs a reason of 1 to {REASON_MAX_CHARS} characters."),
        )
        .await;
    };
    if action.needs_step() && step.is_empty() {
        return refused(StatusCode::BAD_REQUEST, "Name the step to act on.".into()).await;
    }
    let op = engine
        .operator()
        .on_behalf_of(format!("console:{}", s.name), reason);
    let by = match form.by_seconds.trim() {
        "" => None,
        n => match n.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return refused(
                    StatusCode::BAD_REQUEST,
                    "Seconds are a whole number.".into(),
                )
                .await;
            }
        },
    };
    let mut args = ActionArgs::default();
    if action.needs_step() {
        args = args.with_step(step);
    }
    args.extension = match extension(action, by) {
        Ok(by) => by,
        Err(e) => return refused(StatusCode::BAD_REQUEST, e.message().to_owned()).await,
    };
    let input = form.input.trim();
    if action == OperatorAction::Rollback && !input.is_empty() {
        match serde_json::from_str::<Value>(input) {
            Ok(v) => args = args.with_input(v),
            Err(e) => {
                let msg = format!("The input is not JSON: {e}. Nothing was changed.");
                return refused(StatusCode::BAD_REQUEST, msg).await;
            }
        }
    }
    match op.perform(action, run_id, &args).await {
        Ok(state) => {
            let action = action.as_str();
            tracing::info!(run_id = %run_id, action, by = %s.name, %state, "console action");
            Redirect::to(&format!("/console/runs/{run_id}?done={action}")).into_response()
        }
        Err(e) => super::input::refused(engine, &s, &id, e).await,
    }
}
