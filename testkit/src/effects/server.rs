//! The loopback HTTP server of the effect service: operations registered by name, scripted
//! faults per operation, and its [`EffectLedger`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::Value;
use tokio::sync::watch;

use super::client::EffectClient;
use super::ledger::EffectLedger;
use super::refusal::Refusal;
use crate::services::faults::Fault;
use crate::services::http_server::{
    self, IDEMPOTENCY_KEY_HEADER, ServerHandle, TRACEPARENT_HEADER, TRACESTATE_HEADER,
    key_and_body, respond, stopped,
};
use crate::services::{FaultCounts, Scripted, ServiceError};

/// What an operation does with a request: its response, or a refusal.
type Handler = Arc<dyn Fn(&Value) -> Result<Value, Refusal> + Send + Sync>;

/// Why the effect service could not start or take a script.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EffectError {
    /// An operation name that cannot be one path segment.
    #[error("invalid operation name {0:?}: use ASCII letters, digits, `_`, `-` or `.`")]
    InvalidOperation(String),
    /// The same operation registered twice.
    #[error("operation {0:?} is registered twice")]
    DuplicateOperation(String),
    /// A script for an operation the server does not have.
    #[error("the effect server has no operation {0:?}")]
    UnknownOperation(String),
    /// The loopback listener could not be opened.
    #[error("cannot listen on loopback: {0}")]
    Bind(#[from] io::Error),
}

/// Scripted outcomes still queued per operation, and the faults injected so far.
#[derive(Debug, Default)]
struct Scripts {
    queued: HashMap<String, VecDeque<Scripted>>,
    counts: FaultCounts,
}

struct Shared {
    handlers: BTreeMap<String, Handler>,
    ledger: EffectLedger,
    scripts: Mutex<Scripts>,
    calls: Mutex<Vec<Call>>,
}

/// One request the server received, recorded as it arrives (before any scripted fault).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation called.
    pub operation: String,
    /// Its idempotency key (empty when it had none).
    pub key: String,
    /// Its `traceparent` header, if any.
    pub traceparent: Option<String>,
    /// Its `tracestate` header, if any.
    pub tracestate: Option<String>,
}

impl Shared {
    fn scripts(&self) -> MutexGuard<'_, Scripts> {
        self.scripts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The fate of the next call of `operation`: its next scripted outcome, if any.
    fn decide(&self, operation: &str) -> Fault {
        let mut scripts = self.scripts();
        let next = scripts
            .queued
            .get_mut(operation)
            .and_then(VecDeque::pop_front);
        let refusal = format!("{operation} refused");
        let fault = next.map_or(Fault::None, |s| Fault::scripted(s, operation, &refusal));
        fault.count_in(&mut scripts.counts);
        fault
    }
}

/// Registers the operations of an [`EffectServer`]; see [`EffectServer::builder`].
pub struct EffectServerBuilder {
    handlers: Vec<(String, Handler)>,
}

impl fmt::Debug for EffectServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.handlers.iter().map(|(name, _)| name);
        f.debug_struct("EffectServerBuilder")
            .field("operations", &names.collect::<Vec<_>>())
            .finish()
    }
}

impl EffectServerBuilder {
    /// Serve `POST /{name}` with `handler`: the first call per idempotency key runs it and
    /// records what it answered; an `Err` is a business refusal, answered 422 or 409 and
    /// recorded as nothing applied. The handler runs under the ledger's lock: keep it quick
    /// and deterministic (it must give a repeated request the same answer), and do not use the
    /// ledger from inside it.
    pub fn operation<F>(mut self, name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(&Value) -> Result<Value, Refusal> + Send + Sync + 'static,
    {
        self.handlers.push((name.into(), Arc::new(handler)));
        self
    }

    /// Listen on `127.0.0.1` on a free port and serve the registered operations.
    ///
    /// # Errors
    /// [`EffectError::InvalidOperation`] or [`EffectError::DuplicateOperation`] for a name
    /// that cannot be served, [`EffectError::Bind`] when no loopback port can be opened.
    pub async fn start(self) -> Result<EffectServer, EffectError> {
        let mut handlers = BTreeMap::new();
        for (name, handler) in self.handlers {
            let valid = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !valid {
                return Err(EffectError::InvalidOperation(name));
            }
            if handlers.contains_key(&name) {
                return Err(EffectError::DuplicateOperation(name));
            }
            handlers.insert(name, handler);
        }
        let shared = Arc::new(Shared {
            handlers,
            ledger: EffectLedger::new(),
            scripts: Mutex::new(Scripts::default()),
            calls: Mutex::new(Vec::new()),
        });
        let state = shared.clone();
        let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let handle = http_server::spawn(loopback, "effect server", move |stop| {
            Router::new()
                .route("/{operation}", post(call))
                .with_state(AppState {
                    shared: state,
                    stop,
                })
        })
        .await?;
        Ok(EffectServer { handle, shared })
    }
}

/// A running loopback effect service. Dropping it stops the server (in the background);
/// [`shutdown`](Self::shutdown) stops it and waits.
///
/// # Examples
///
/// ```no_run
/// use sagaflow_testkit::effects::{EffectClient, EffectServer};
/// use sagaflow_testkit::services::Scripted;
/// use serde_json::json;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let server = EffectServer::builder()
///     .operation("charge", |req| Ok(json!({ "charged": req["cents"] })))
///     .start()
///     .await?;
/// server.script("charge", [Scripted::Transient, Scripted::BadGatewayAfterApply])?;
/// let client = server.client();
/// let body = json!({ "cents": 500 });
/// assert!(client.call("k1", "charge", &body).await.is_err()); // 503, not applied
/// assert!(client.call("k1", "charge", &body).await.is_err()); // applied, reply lost
/// assert!(client.call("k1", "charge", &body).await.is_ok()); // replayed
/// assert_eq!(server.ledger().applied("charge"), 1);
/// assert_eq!(server.ledger().replays("charge"), 1);
/// # Ok(())
/// # }
/// ```
pub struct EffectServer {
    handle: ServerHandle,
    shared: Arc<Shared>,
}

impl fmt::Debug for EffectServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EffectServer")
            .field("addr", &self.handle.addr())
            .field("operations", &self.shared.handlers.keys())
            .field("scripts", &*self.shared.scripts())
            .finish_non_exhaustive()
    }
}

impl EffectServer {
    /// Start registering operations.
    pub fn builder() -> EffectServerBuilder {
        EffectServerBuilder {
            handlers: Vec::new(),
        }
    }

    /// The loopback address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.handle.addr()
    }

    /// `http://127.0.0.1:{port}`, for [`EffectClient::new`].
    pub fn base_url(&self) -> String {
        self.handle.base_url()
    }

    /// A client of this server.
    pub fn client(&self) -> EffectClient {
        EffectClient::new(self.base_url())
    }

    /// The ledger of applied effects (a clone sharing the same entries).
    pub fn ledger(&self) -> EffectLedger {
        self.shared.ledger.clone()
    }

    /// Queue `outcomes` for the next calls of `operation`, one per call, in order, after
    /// any already queued; calls past the script behave normally. Decided per call, whatever
    /// its key:
    /// - [`Scripted::Transient`]: 503, not applied; [`Scripted::BusyNotApplied`]: 429 with
    ///   `Retry-After: 1`, not applied;
    /// - [`Scripted::Permanent`]: 422, [`Scripted::RefuseNotApplied`]: 409, not applied;
    /// - [`Scripted::ResetAfterApply`], [`Scripted::BadGatewayAfterApply`],
    ///   [`Scripted::GatewayTimeoutAfterApply`]: apply (or replay), then drop the connection
    ///   or answer 502 or 504: the caller cannot know it was applied;
    /// - [`Scripted::Hang`]: apply (or replay), then never answer (until the server stops,
    ///   when it answers 502);
    /// - [`Scripted::Ok`]: behave normally.
    ///
    /// # Errors
    /// [`EffectError::UnknownOperation`] when the server has no such operation.
    pub fn script(
        &self,
        operation: &str,
        outcomes: impl IntoIterator<Item = Scripted>,
    ) -> Result<(), EffectError> {
        if !self.shared.handlers.contains_key(operation) {
            return Err(EffectError::UnknownOperation(operation.to_owned()));
        }
        let mut scripts = self.shared.scripts();
        let queue = scripts.queued.entry(operation.to_owned()).or_default();
        queue.extend(outcomes);
        Ok(())
    }

    /// Scripted outcomes of `operation` not consumed yet.
    pub fn scripted_left(&self, operation: &str) -> usize {
        let scripts = self.shared.scripts();
        scripts.queued.get(operation).map_or(0, VecDeque::len)
    }

    /// Every request received so far, in order of arrival, with its trace headers.
    pub fn calls(&self) -> Vec<Call> {
        self.shared
            .calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Faults injected so far by scripts, over all operations.
    pub fn fault_counts(&self) -> FaultCounts {
        self.shared.scripts().counts
    }

    /// Stop accepting, answer hung calls with 502 (outcome unknown), and wait (boundedly)
    /// for the server to finish.
    ///
    /// # Errors
    /// The server task's I/O error, if it failed.
    pub async fn shutdown(self) -> io::Result<()> {
        self.handle.shutdown().await
    }
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
}

/// `POST /{operation}`: decide the call's fault, apply or replay, answer.
async fn call(
    State(st): State<AppState>,
    Path(operation): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(handler) = st.shared.handlers.get(&operation) else {
        let err = ServiceError::Permanent(format!("no operation {operation:?}"));
        return (StatusCode::NOT_FOUND, axum::Json(err)).into_response();
    };
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    st.shared
        .calls
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Call {
            operation: operation.clone(),
            key: header(IDEMPOTENCY_KEY_HEADER).unwrap_or_default(),
            traceparent: header(TRACEPARENT_HEADER),
            tracestate: header(TRACESTATE_HEADER),
        });
    let (key, request) = match key_and_body::<Value>(&headers, &body) {
        Ok(parts) => parts,
        Err(bad_request) => return bad_request.into_response(),
    };
    let apply = || {
        let ledger = &st.shared.ledger;
        ledger.apply_or_replay(&operation, key, &request, |req| handler(req))
    };
    let result = match st.shared.decide(&operation) {
        Fault::None => apply(),
        Fault::Transient(message) => Err(ServiceError::Transient(message)),
        Fault::Permanent(message) => Err(ServiceError::Permanent(message)),
        Fault::Refuse(err) => Err(err),
        Fault::LoseReply(how) => {
            let applied = apply();
            tracing::debug!(operation, key, %how, applied = applied.is_ok(), "losing the reply");
            Err(ServiceError::LostReply(how))
        }
        Fault::Hang => {
            let applied = apply();
            tracing::debug!(operation, key, applied = applied.is_ok(), "hanging call");
            stopped(st.stop.clone()).await;
            Err(ServiceError::Transport("server shutting down".into()))
        }
    };
    respond(result)
}
