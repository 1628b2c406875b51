//! The route table: every route with its handler, the router that serves them, and the
//! OpenAPI document that describes them. The handlers live in one file per resource
//! (`runs`, `actions`, `alerts`, …), the error answer in `error`.

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Router, middleware};

use super::AdminState;
use super::answers::ErrorBody;
use super::auth::require_token;
use super::error::ApiError;
use super::openapi::Security;
use super::{
    actions, alerts, definitions, deliveries, events, health, input, instances, migrations,
    openapi, resources, restart, runs, schedules, scrape, stats, waits,
};
use crate::RunOrder;

/// Declares the routes under `/api/v1` once: the router that serves them and their table,
/// [`API_ROUTES`], which the OpenAPI document is tested against.
macro_rules! api_routes {
    ($($method:ident $path:literal => $handler:path,)*) => {
        /// Every route of the API under `/api/v1`: its method and path, as the router serves
        /// it and as the OpenAPI document names it.
        pub(crate) const API_ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn api_routes() -> Router<AdminState> {
            Router::new()$(.route($path, $method($handler)))*
        }
    };
}

api_routes! {
    get "/api/v1/definitions" => definitions::definitions,
    post "/api/v1/workflows/{name}/runs" => runs::start_run,
    get "/api/v1/runs" => runs::list_runs,
    get "/api/v1/runs/{id}" => runs::run,
    get "/api/v1/runs/{id}/events" => events::run_events,
    get "/api/v1/runs/{id}/follow" => events::follow_run,
    post "/api/v1/runs/{id}/actions/{action}" => actions::act,
    get "/api/v1/runs/{id}/actions/{action}/preview" => actions::preview,
    put "/api/v1/runs/{id}/input" => input::set_input,
    post "/api/v1/runs/{id}/restart" => restart::restart_run,
    get "/api/v1/migrations/{name}/{from}/{to}/plan" => migrations::plan,
    post "/api/v1/migrations/{name}/{from}/{to}/apply" => migrations::apply,
    post "/api/v1/runs/actions/{action}" => actions::act_many,
    get "/api/v1/alerts" => alerts::alerts,
    get "/api/v1/stats" => stats::stats,
    post "/api/v1/alerts/{id}/resolve" => alerts::resolve_alert,
    get "/api/v1/deliveries" => deliveries::deliveries,
    post "/api/v1/deliveries/{id}/redeliver" => deliveries::redeliver,
    get "/api/v1/resources" => resources::resources,
    put "/api/v1/resources/{name}/limits" => resources::set_limits,
    delete "/api/v1/resources/{name}/limits" => resources::clear_limits,
    post "/api/v1/runs/{id}/events/{name}" => waits::send_event,
    post "/api/v1/workflows/{workflow}/keys/{key}/events/{name}" => waits::send_event_by_key,
    get "/api/v1/waiting" => waits::waiting,
    get "/api/v1/schedules" => schedules::schedules,
    post "/api/v1/schedules/{name}/pause" => schedules::pause,
    post "/api/v1/schedules/{name}/resume" => schedules::resume,
    get "/api/v1/instances" => instances::instances,
    get "/api/v1/openapi.json" => openapi::openapi_json,
    get "/metrics" => scrape::metrics,
}

/// The OpenAPI document of the API (served by [`super::openapi`]).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sagaflow HTTP API",
        description = "Start workflow runs, follow and read them, take operator actions, read \
                       alerts and statistics, read and override the limits of remote \
                       resources, read, pause and resume recurring schedules, list the engine \
                       instances and what they run. Answers are JSON; an error answer is an \
                       `ErrorBody`."
    ),
    paths(
        health::healthz,
        definitions::definitions,
        runs::start_run,
        runs::list_runs,
        runs::run,
        events::run_events,
        events::follow_run,
        actions::act,
        actions::preview,
        input::set_input,
        restart::restart_run,
        migrations::plan,
        migrations::apply,
        actions::act_many,
        alerts::alerts,
        alerts::resolve_alert,
        deliveries::deliveries,
        deliveries::redeliver,
        resources::resources,
        resources::set_limits,
        resources::clear_limits,
        waits::send_event,
        waits::send_event_by_key,
        waits::callback_by_header,
        waits::callback,
        waits::waiting,
        schedules::schedules,
        schedules::pause,
        schedules::resume,
        instances::instances,
        stats::stats,
        openapi::openapi_json,
        scrape::metrics,
    ),
    components(schemas(ErrorBody, RunOrder, super::answers::RunStateEvent, crate::RunUpdate)),
    modifiers(&Security),
)]
pub(super) struct ApiDoc;

pub(super) fn router(state: AdminState, body_limit: usize) -> Router {
    let api = api_routes()
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            replica_lag_header,
        ))
        .layer(middleware::from_fn(refuse_nul))
        .layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/healthz", get(health::healthz))
        // A remote's callback carries its own credential, the token in a header or the path.
        .route("/api/v1/callbacks", post(waits::callback_by_header))
        .route("/api/v1/callbacks/{token}", post(waits::callback))
        .merge(api)
        .layer(middleware::map_response(json_refusals))
        .merge(super::console::router(state.clone()))
        .layer(DefaultBodyLimit::max(body_limit))
        // Outermost: a request over a limit is refused before its token is compared.
        .layer(middleware::from_fn_with_state(
            state.throttle.clone(),
            super::throttle::limit,
        ))
        .with_state(state)
}

/// The code of a refusal that axum made before a handler ran, by its status.
fn refusal_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "invalid_request",
    }
}

/// A refusal made by an extractor or the router (a path parameter that does not parse, a
/// method the route does not serve) comes from axum as plain text or empty: it is answered as the
/// API's JSON error envelope instead, with the same status and headers (`Allow` of a 405
/// among them), so that a client reads every refusal the same way.
async fn json_refusals(res: Response) -> Response {
    // axum's refusals are plain text, or empty with no type at all (a 405).
    let plain = res
        .headers()
        .get(CONTENT_TYPE)
        .is_none_or(|v| v.to_str().is_ok_and(|t| t.starts_with("text/plain")));
    if !plain || !res.status().is_client_error() {
        return res;
    }
    let status = res.status();
    let (parts, body) = res.into_parts();
    // axum's refusal texts are one line; a longer body is cut, not read whole.
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let text = if text.is_empty() {
        status.canonical_reason().unwrap_or("refused").to_owned()
    } else {
        text
    };
    let mut out = ApiError::new(status, refusal_code(status), text).into_response();
    for (name, value) in &parts.headers {
        if name != CONTENT_TYPE && name != CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// The header that tells a client how far behind the primary the read replica that served
/// its `GET` was, in milliseconds ([`Engine::replica_lag`](crate::Engine::replica_lag): `0`
/// once caught up, else an upper bound; read at most once a second for all callers, as the
/// console's figure is). Sent only by an engine that reads from a replica
/// ([`EngineBuilder::with_read_replica`](crate::EngineBuilder::with_read_replica)).
pub const REPLICA_LAG_HEADER: &str = "sagaflow-replica-lag-ms";

/// Adds [`REPLICA_LAG_HEADER`] to the answer of a `GET` while reads go to a replica.
async fn replica_lag_header(
    axum::extract::State(state): axum::extract::State<AdminState>,
    req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let read = req.method() == axum::http::Method::GET;
    let mut res = next.run(req).await;
    if !read || !state.engine.reads().is_replica() {
        return res;
    }
    // A lag the replica cannot tell is left out rather than sent as a figure.
    if let Some(lag) = state
        .replica_lag()
        .await
        .filter(|l| *l != std::time::Duration::MAX)
    {
        let ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        res.headers_mut().insert(
            axum::http::HeaderName::from_static(REPLICA_LAG_HEADER),
            axum::http::HeaderValue::from(ms),
        );
    }
    res
}

/// A path or query holding NUL (`%00`) is refused with 400 `invalid_request` before a
/// handler runs: no name or filter holds it, and PostgreSQL cannot store or compare it in
/// text (the document's strings say so by their pattern; bodies: [`super::error`]).
async fn refuse_nul(req: axum::extract::Request, next: middleware::Next) -> Response {
    let uri = req.uri();
    let nul = uri.path().contains("%00") || uri.query().is_some_and(|q| q.contains("%00"));
    if nul {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the path or query holds NUL (%00), which no text of the API may",
        )
        .into_response();
    }
    next.run(req).await
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}
