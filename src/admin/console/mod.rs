//! The web console: server-rendered pages under `/console/` over the same engine reads and
//! operator actions as the JSON API, behind the same tokens.
//!
//! - A token is typed once into the login form; the console keeps a server-side session
//!   (random 256-bit id, in memory, [`session::SESSION_TTL`]) named by the `sagaflow_session`
//!   cookie (`HttpOnly; SameSite=Strict; Path=/console`, plus `Secure` when the request came
//!   through an HTTPS proxy that says so with `X-Forwarded-Proto: https`).
//! - Pages without a session redirect to the login form (303); fragments and event streams
//!   answer 401.
//! - Every state-changing form carries the session's CSRF token, compared in constant time;
//!   a post without it, or with another, is refused (403) before anything happens. A
//!   read-only token sees no action and is refused (403) on every action.
//! - Templates escape every value (maud); scripts come only from the console's own asset
//!   file (`Content-Security-Policy` without inline script), and the pages refuse framing.

mod graph;
mod input;
mod instances;
mod live;
mod migrations;
mod pages;
mod resources;
mod restart;
mod run;
mod schedules;
mod session;
mod view;
mod waits;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::AdminState;
use super::auth::Role;
use session::Sessions;

/// What the console's handlers read: the API's state and the sessions.
#[derive(Clone)]
pub(crate) struct Console {
    admin: AdminState,
    sessions: Arc<Sessions>,
    /// The overview's fingerprint, shared by every live page that follows no run.
    overview: Arc<live::Overview>,
}

/// The console's routes, merged into the admin router.
pub(super) fn router<S>(admin: AdminState) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    let console = Console {
        admin,
        sessions: Arc::new(Sessions::default()),
        overview: Arc::new(live::Overview::default()),
    };
    Router::new()
        .route("/console", get(|| async { Redirect::to("/console/") }))
        .route("/console/", get(pages::overview))
        .route(
            "/console/login",
            get(session::login_form).post(session::login),
        )
        .route("/console/logout", post(session::logout))
        .route("/console/runs", get(pages::runs))
        .route("/console/runs/{id}", get(run::page))
        .route("/console/runs/{id}/actions/{action}", post(run::act))
        .route("/console/runs/{id}/events", post(waits::send))
        .route("/console/runs/{id}/input", post(input::set_input))
        .route("/console/runs/{id}/restart", post(restart::restart))
        .route("/console/alerts", get(pages::alerts))
        .route("/console/alerts/{id}/resolve", post(pages::resolve))
        .route("/console/deliveries/{id}/redeliver", post(pages::redeliver))
        .route("/console/definitions", get(pages::definitions))
        .route(
            "/console/migrations",
            get(migrations::page).post(migrations::apply),
        )
        .route("/console/resources", get(resources::page))
        .route("/console/instances", get(instances::page))
        .route("/console/resources/{name}/limits", post(resources::change))
        .route("/console/schedules", get(schedules::page))
        .route("/console/schedules/{name}/{op}", post(schedules::change))
        .route("/console/fragments/overview", get(pages::overview_fragment))
        .route("/console/fragments/runs", get(pages::runs_fragment))
        .route("/console/fragments/alerts", get(pages::alerts_fragment))
        .route("/console/fragments/runs/{id}", get(run::fragment))
        .route("/console/events", get(live::events))
        .route("/console/assets/{file}", get(asset))
        .route("/console/{*rest}", get(not_found).post(not_found))
        .layer(middleware::from_fn(security_headers))
        .with_state(console)
}

/// The headers of every console answer: no inline script, no framing, no referrer, and no
/// caching of pages (assets set their own cache header).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
             frame-ancestors 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// The version in asset URLs, so that a new release is never served a cached old asset.
pub(super) const ASSET_VERSION: &str = env!("CARGO_PKG_VERSION");

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// `GET /console/assets/{file}`: the stylesheet and the script, cached for a day.
async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (CSS, "text/css; charset=utf-8"),
        "console.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        body,
    )
        .into_response()
}

/// An unknown console path: the login form without a session, a 404 page with one.
async fn not_found(State(c): State<Console>, headers: HeaderMap) -> Response {
    match c.sessions.find(&headers) {
        None => Redirect::to("/console/login").into_response(),
        Some(s) => view::error_page(&s, StatusCode::NOT_FOUND, "No such page.").into_response(),
    }
}

/// A page's caller: without a session the request is redirected to the login form (303).
pub(super) struct PageSession(pub(super) session::Session);

/// A fragment's or an event stream's caller: without a session, 401.
pub(super) struct LiveSession(pub(super) session::Session);

impl FromRequestParts<Console> for PageSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, Response> {
        let mut session = c
            .sessions
            .find(&parts.headers)
            .ok_or_else(|| Redirect::to("/console/login").into_response())?;
        // The page says how far behind the replica it reads is; a replica that cannot say
        // is shown as such rather than failing the page.
        session.replica_lag = c.admin.replica_lag().await;
        Ok(PageSession(session))
    }
}

impl FromRequestParts<Console> for LiveSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, c: &Console) -> Result<Self, Response> {
        c.sessions
            .find(&parts.headers)
            .map(LiveSession)
            .ok_or_else(|| {
                let mut r = (
                    StatusCode::UNAUTHORIZED,
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    "log in at /console/login",
                )
                    .into_response();
                // A tab whose session ended keeps asking until it reloads: that is no guess
                // at a credential (a session id is 256 random bits, issued by the server), so
                // it does not spend its address's failure budget.
                r.extensions_mut().insert(super::throttle::NotAGuess);
                r
            })
    }
}

/// Refuses a state-changing form whose CSRF token is not the session's (403), then a caller
/// whose role is below `role` (403). Nothing is done for a refused form.
pub(super) fn check_post(
    s: &session::Session,
    csrf: &str,
    role: Role,
) -> Result<(), Box<Response>> {
    if !s.csrf_matches(csrf) {
        tracing::warn!(who = %s.name, "console form refused: missing or wrong CSRF token");
        return Err(Box::new(
            view::error_page(
                s,
                StatusCode::FORBIDDEN,
                "This form has expired or did not come from this console. Reload the page and try again.",
            )
            .into_response(),
        ));
    }
    if s.role < role {
        return Err(Box::new(
            view::error_page(
                s,
                StatusCode::FORBIDDEN,
                "Your token is read-only: it cannot act on runs, alerts or resources.",
            )
            .into_response(),
        ));
    }
    Ok(())
}
