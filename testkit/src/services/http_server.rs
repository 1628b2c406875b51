//! The loopback HTTP face of [`Services`].
//!
//! | route                     | body              | answer                 |
//! |---------------------------|-------------------|------------------------|
//! | `POST /inventory/reserve` | [`ReserveRequest`]| [`Reservation`]        |
//! | `POST /inventory/release` | [`ReleaseRequest`]| [`Released`]           |
//! | `POST /payments/charge`   | [`ChargeRequest`] | [`Charge`]             |
//! | `POST /payments/refund`   | [`RefundRequest`] | [`Refund`]             |
//! | `POST /shipping/ship`     | [`ShipRequest`]   | [`Shipment`]           |
//! | `GET /ledger`             |                   | `Vec<EffectRecord>`    |
//! | `GET /ledger/report`      |                   | [`LedgerReport`]       |
//! | `GET /faults`             |                   | `{service: FaultCounts}` |
//!
//! POST routes need the `Idempotency-Key` header (else 400). Success is 200 + JSON;
//! failures carry a [`ServiceError`] JSON body. Documented semantics, as a real API would
//! state them: 503 (transient), 429 (busy, with `Retry-After`), 422 (refused), 409
//! (conflict) and 400 (bad request) are answered **before anything is applied**. A lost
//! reply applies the effect and then drops the connection or answers 502 or 504 (as a
//! proxy in front of the service would); a hang applies and never answers.
//!
//! [`ReserveRequest`]: super::ReserveRequest
//! [`Reservation`]: super::Reservation
//! [`ReleaseRequest`]: super::ReleaseRequest
//! [`Released`]: super::Released
//! [`ChargeRequest`]: super::ChargeRequest
//! [`Charge`]: super::Charge
//! [`RefundRequest`]: super::RefundRequest
//! [`Refund`]: super::Refund
//! [`ShipRequest`]: super::ShipRequest
//! [`Shipment`]: super::Shipment
//! [`LedgerReport`]: super::LedgerReport

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::bundle::Services;
use super::error::{LostReply, ServiceError};

/// Name of the header carrying the idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The W3C Trace Context header a step's call carries: the run's trace id and the attempt's
/// span id ([`StepContext::trace_parent`](sagaflow::StepContext::trace_parent)).
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// The W3C Trace Context header of vendor state sent with [`TRACEPARENT_HEADER`].
pub const TRACESTATE_HEADER: &str = "tracestate";

/// How long [`ServerHandle::shutdown`] waits for open connections before aborting.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct AppState {
    services: Services,
    stop: watch::Receiver<bool>,
}

/// A running HTTP server. Dropping the handle also stops it (in the background).
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl ServerHandle {
    /// The address actually bound (useful after binding port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://{addr}`, ready for [`HttpServices::new`](super::HttpServices::new).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, answer hung requests with 502 (outcome unknown), and wait (boundedly) for the
    /// server task to finish.
    pub async fn shutdown(mut self) -> io::Result<()> {
        self.stop.send_replace(true);
        let Some(mut task) = self.task.take() else {
            return Ok(());
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(io::Error::other(join)),
            Err(_) => {
                task.abort();
                tracing::warn!(addr = %self.addr, "HTTP server did not stop in time; aborted");
                Ok(())
            }
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Serve `services` over HTTP on `addr` (`127.0.0.1:0` picks a free port).
pub async fn serve(services: Services, addr: SocketAddr) -> io::Result<ServerHandle> {
    spawn(addr, "simulated services", |stop| {
        router(AppState { services, stop })
    })
    .await
}

/// Bind `addr` and serve the router `app` builds (given the stop signal, for handlers that
/// wait on it) until the handle stops it.
pub(crate) async fn spawn(
    addr: SocketAddr,
    what: &'static str,
    app: impl FnOnce(watch::Receiver<bool>) -> Router,
) -> io::Result<ServerHandle> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let app = app(stop_rx.clone());
    let server = axum::serve(listener, app).with_graceful_shutdown(stopped(stop_rx));
    let task = tokio::spawn(async move { server.await });
    tracing::info!(%addr, "{what} listening");
    Ok(ServerHandle {
        addr,
        stop: stop_tx,
        task: Some(task),
    })
}

/// Resolves once a stop was requested (or the handle is gone).
pub(crate) async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/inventory/reserve", post(reserve))
        .route("/inventory/release", post(release))
        .route("/payments/charge", post(charge))
        .route("/payments/refund", post(refund))
        .route("/shipping/ship", post(ship))
        .route("/ledger", get(ledger))
        .route("/ledger/report", get(report))
        .route("/faults", get(faults))
        .with_state(state)
}

async fn reserve(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, &headers, &body, |s, key, req| async move {
        s.inventory().reserve(&key, req).await
    })
    .await
}

async fn release(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, &headers, &body, |s, key, req| async move {
        s.inventory().release(&key, req).await
    })
    .await
}

async fn charge(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, &headers, &body, |s, key, req| async move {
        s.payments().charge(&key, req).await
    })
    .await
}

async fn refund(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, &headers, &body, |s, key, req| async move {
        s.payments().refund(&key, req).await
    })
    .await
}

async fn ship(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(st, &headers, &body, |s, key, req| async move {
        s.shipping().ship(&key, req).await
    })
    .await
}

async fn ledger(State(st): State<AppState>) -> Response {
    Json(st.services.ledger().records()).into_response()
}

async fn report(State(st): State<AppState>) -> Response {
    Json(st.services.ledger().report()).into_response()
}

async fn faults(State(st): State<AppState>) -> Response {
    Json(st.services.fault_counts_by_service()).into_response()
}

/// Extract key and body, run `call`, and map its result to a response. A call that
/// hangs is answered 502 (outcome unknown) only when the server shuts down.
async fn handle<Req, Resp, F, Fut>(
    st: AppState,
    headers: &HeaderMap,
    body: &[u8],
    call: F,
) -> Response
where
    Req: DeserializeOwned,
    Resp: Serialize,
    F: FnOnce(Services, String, Req) -> Fut,
    Fut: Future<Output = Result<Resp, ServiceError>>,
{
    let (key, request) = match key_and_body::<Req>(headers, body) {
        Ok(parts) => parts,
        Err(bad_request) => return bad_request.into_response(),
    };
    let result = tokio::select! {
        result = call(st.services.clone(), key.to_owned(), request) => result,
        () = stopped(st.stop.clone()) => {
            // The call may have applied its effect already (a hang applies first): the
            // outcome is unknown, never "not processed".
            Err(ServiceError::Transport("server shutting down".into()))
        }
    };
    respond(result)
}

/// A call answered 400 Bad Request, before anything is applied.
#[derive(Debug)]
pub(crate) struct BadRequest(ServiceError);

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        (StatusCode::BAD_REQUEST, Json(self.0)).into_response()
    }
}

/// The idempotency key (non-empty) and the JSON body of a call; a missing key or a malformed
/// body is a [`BadRequest`].
pub(crate) fn key_and_body<'h, Req: DeserializeOwned>(
    headers: &'h HeaderMap,
    body: &[u8],
) -> Result<(&'h str, Req), BadRequest> {
    let bad_request = |message: String| BadRequest(ServiceError::Permanent(message));
    let key = headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| bad_request(format!("missing {IDEMPOTENCY_KEY_HEADER} header")))?;
    let request =
        serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid JSON body: {e}")))?;
    Ok((key, request))
}

/// The answer to a call: 200 and the JSON response, or the status of the error with the error
/// as JSON body. A lost reply with [`LostReply::Reset`] drops the connection instead.
pub(crate) fn respond<Resp: Serialize>(result: Result<Resp, ServiceError>) -> Response {
    match result {
        Ok(response) => (StatusCode::OK, Json(response)).into_response(),
        Err(ServiceError::LostReply(LostReply::Reset)) => {
            // Drop the connection without an answer, the request fully received and its
            // effect applied. Unwinding the handler ends the connection's task; unlike a
            // panic it prints nothing.
            std::panic::resume_unwind(Box::new("connection reset after apply"))
        }
        Err(err @ ServiceError::Busy { retry_after_ms, .. }) => {
            let mut response = (status_of(&err), Json(&err)).into_response();
            if let Some(ms) = retry_after_ms
                && let Ok(v) = HeaderValue::from_str(&ms.div_ceil(1000).to_string())
            {
                response.headers_mut().insert(RETRY_AFTER, v);
            }
            response
        }
        Err(err) => (status_of(&err), Json(err)).into_response(),
    }
}

fn status_of(err: &ServiceError) -> StatusCode {
    match err {
        ServiceError::Transient(_) => StatusCode::SERVICE_UNAVAILABLE,
        ServiceError::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
        ServiceError::Permanent(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ServiceError::Conflict(_) => StatusCode::CONFLICT,
        ServiceError::Transport(_) | ServiceError::LostReply(LostReply::BadGateway) => {
            StatusCode::BAD_GATEWAY
        }
        ServiceError::LostReply(LostReply::Reset | LostReply::GatewayTimeout) => {
            StatusCode::GATEWAY_TIMEOUT
        }
    }
}
