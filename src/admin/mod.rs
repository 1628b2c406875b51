//! The HTTP API for operators and for services in other languages: an axum [`Router`] that an
//! application nests in its own server ([`Engine::admin_router`]).
//!
//! Everything but `GET /healthz` needs a bearer token (`Authorization: Bearer …`). Tokens have
//! a role: [`Role::ReadOnly`] reads, [`Role::Operator`] also starts runs; a token file names
//! several ([`AdminConfig::from_token_file`]). Tokens are compared
//! in constant time, never logged, never echoed. Request bodies are limited in size. Answers
//! are JSON; an error reads `{"error": {"code": "...", "message": "..."}}`.
//!
//! | Route | Role | Answers |
//! |---|---|---|
//! | `GET /healthz` | none | 200 `{"status": "running"}`; 503 once the engine stopped |
//! | `GET /api/v1/definitions` | read | the published definitions ([`Engine::definitions`]) |
//! | `POST /api/v1/workflows/{name}/runs` | operator | 201 a new run; 200 the run already holding the business key; 400 an input the workflow refuses; 404 an unknown workflow; 413 a body over the limit; 415 a body that is not JSON |
//! | `GET /api/v1/runs` | read | a page of runs ([`Engine::list_runs`]): `workflow`, `state`, `business_key`, `created_after`, `created_before` (epoch ms), `sort` (`created` or `attempts`), `limit`, `cursor`; 400 for an unknown parameter or a cursor it did not give out |
//! | `GET /api/v1/runs/{id}` | read | the run with its steps, history and alerts; 404 |
//! | `POST /api/v1/runs/{id}/actions/{action}` | operator | an operator action ([`OperatorAction`](crate::OperatorAction): `retry`, `resume`, `compensate`, `cancel`, `pause`, `extend`, `release`, `mark_compensated`) with a reason, recorded in history as done by `api:<token name>`; 409 when the run's state does not allow it |
//! | `GET /api/v1/stats` | read | the queue, the oldest due step's age, unfinished runs per workflow and state, runs finished in the last 1/5/15 minutes ([`Engine::stats`]) |
//! | `GET /api/v1/alerts` | read | the open alerts |
//! | `POST /api/v1/alerts/{id}/resolve` | operator | resolves an open alert with a reason, stored with the alert as done by `api:<token name>`; 404 when it is not open |
//! | `GET /api/v1/resources` | read | the remote resources: limits in force, the code's defaults, the operator's override (who, why), attempts in flight and steps waiting ([`Engine::resources`]) |
//! | `PUT /api/v1/resources/{name}/limits` | operator | overrides a resource's limits for every instance (`{"limits": ResourceLimits, "reason": "…"}`), stored with `api:<token name>` and the reason; 400 `invalid_limits` with why, 404 `resource_not_found` |
//! | `DELETE /api/v1/resources/{name}/limits` | operator | clears the override (`{"reason": "…"}`): the code's limits apply again; 404 `resource_not_found` |
//! | `GET /api/v1/schedules` | read | the recurring schedules: workflow, cron expression, zone, next tick, last firing and run, an operator's pause (who, why) ([`Engine::schedules`]) |
//! | `POST /api/v1/schedules/{name}/pause` | operator | pauses a schedule on every instance (`{"reason": "…"}`), stored with `api:<token name>` and the reason; 404 `schedule_not_found` |
//! | `POST /api/v1/schedules/{name}/resume` | operator | resumes it at its first tick after now (`{"reason": "…"}`), logged with `api:<token name>`; 404 `schedule_not_found` |
//! | `GET /api/v1/instances` | read | the engine instances registered on the database: started, silent for, live, and the `name@version` keys of the workflows each runs ([`Engine::instances`]) |
//! | `GET /api/v1/runs/{id}/events` | read | server-sent events: the run's state now, then each change, until it is `completed` or `compensated`; 404 |
//! | `GET /api/v1/openapi.json` | read | this API as an OpenAPI 3.1 document, generated from the code |
//! | `GET /metrics` | read | the engine's metrics in the Prometheus text format ([`crate::metrics`]); 501 when the process installed no Prometheus recorder |
//!
//! The same router serves a web console under `/console/` (see `docs/console.md`): log in
//! with one of these tokens, then browse runs, alerts and definitions and act on runs.

mod actions;
mod alerts;
mod answers;
mod auth;
mod console;
mod definitions;
mod deliveries;
mod error;
mod events;
mod exact;
mod health;
mod input;
mod instances;
mod migrations;
mod openapi;
mod resources;
mod restart;
mod routes;
mod runs;
mod schedules;
mod scrape;
pub(crate) mod serve;
mod stats;
pub(crate) mod throttle;
mod token_file;
mod traceparent;
mod waits;

use std::sync::Arc;

use axum::Router;

pub use auth::{AdminToken, Role, WeakToken};
pub use events::EVENTS_POLL;
#[cfg(feature = "internals")]
pub(crate) use routes::API_ROUTES;
pub use routes::REPLICA_LAG_HEADER;
pub use serve::stop_signal;
pub use throttle::{AdminLimits, RouteLimit};
pub use token_file::{ADMIN_TOKEN_FILE_ENV, TOKEN_SECRET_MIN_CHARS, TokenFileError};

use crate::Engine;

/// Largest request body the API reads by default (bytes): the input limit's default plus room
/// for the envelope.
pub const ADMIN_BODY_LIMIT_DEFAULT: usize = crate::MAX_INPUT_DEFAULT + 16 * 1024;

/// Environment variable holding the operator token of [`AdminConfig::from_env`].
pub const ADMIN_TOKEN_ENV: &str = "SAGAFLOW_ADMIN_TOKEN";

/// Who may call the API, and how much it reads.
#[derive(Clone)]
pub struct AdminConfig {
    tokens: Vec<AdminToken>,
    body_limit: usize,
    limits: AdminLimits,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Token secrets are never printed.
        f.debug_struct("AdminConfig")
            .field("tokens", &self.tokens)
            .field("body_limit", &self.body_limit)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            body_limit: ADMIN_BODY_LIMIT_DEFAULT,
            limits: AdminLimits::default(),
        }
    }
}

impl AdminConfig {
    /// No tokens yet: every route but `/healthz` answers 401 until one is added.
    pub fn new() -> Self {
        Self::default()
    }

    /// One operator token named `admin` from [`ADMIN_TOKEN_ENV`], if it is set and not empty.
    ///
    /// # Errors
    /// [`TokenFileError::WeakEnvToken`] when the variable holds a secret shorter than
    /// [`TOKEN_SECRET_MIN_CHARS`] characters.
    pub fn from_env() -> Result<Self, TokenFileError> {
        let mut config = Self::new();
        if let Ok(secret) = std::env::var(ADMIN_TOKEN_ENV)
            && !secret.trim().is_empty()
        {
            let token = AdminToken::new("admin", secret, Role::Operator).map_err(|e| {
                TokenFileError::WeakEnvToken {
                    var: ADMIN_TOKEN_ENV,
                    chars: e.chars,
                }
            })?;
            config = config.with_token(token);
        }
        Ok(config)
    }

    /// Adds a token.
    #[must_use]
    pub fn with_token(mut self, token: AdminToken) -> Self {
        self.tokens.push(token);
        self
    }

    /// Sets the largest request body read, in bytes (default [`ADMIN_BODY_LIMIT_DEFAULT`]).
    #[must_use]
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Sets what callers may make the API spend (default: [`AdminLimits::default`]).
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) naming the limit, for limits that would
    /// refuse every request (a concurrency, rate, burst, failure budget or stream cap of
    /// zero).
    pub fn with_limits(mut self, limits: AdminLimits) -> crate::Result<Self> {
        limits.validate().map_err(crate::Error::Config)?;
        self.limits = limits;
        Ok(self)
    }

    /// The limits in force.
    pub fn limits(&self) -> &AdminLimits {
        &self.limits
    }

    /// Whether any token is configured.
    pub fn has_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }
}

/// What every handler reads.
#[derive(Clone)]
pub(crate) struct AdminState {
    pub(crate) engine: Engine,
    pub(crate) tokens: Arc<[AdminToken]>,
    pub(crate) throttle: Arc<throttle::Throttle>,
    /// How far behind the read replica is, shared by every page and API read.
    lag: Arc<Recent<Option<std::time::Duration>>>,
}

impl AdminState {
    /// How far behind the read replica is (`None` without one, `Some(Duration::MAX)` when it
    /// cannot say), read at most once per [`EVENTS_POLL`] however many pages and API reads
    /// show it: each reading asks the primary for its WAL position, which the replica is
    /// there to spare it.
    pub(crate) async fn replica_lag(&self) -> Option<std::time::Duration> {
        self.lag
            .get_or(EVENTS_POLL, || async {
                self.engine
                    .replica_lag()
                    .await
                    .unwrap_or(Some(std::time::Duration::MAX))
            })
            .await
    }
}

/// A value read at most once per period, however many callers ask for it: the callers that
/// ask while it is read wait and take the same answer.
#[derive(Default)]
pub(crate) struct Recent<T> {
    last: tokio::sync::Mutex<Option<(std::time::Instant, T)>>,
}

impl<T: Clone> Recent<T> {
    /// The value read less than `period` ago, or `read`'s.
    pub(crate) async fn get_or<F, Fut>(&self, period: std::time::Duration, read: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let mut last = self.last.lock().await;
        if let Some((at, value)) = last.as_ref()
            && at.elapsed() < period
        {
            return value.clone();
        }
        let value = read().await;
        *last = Some((std::time::Instant::now(), value.clone()));
        value
    }
}

impl Engine {
    /// The HTTP API as an axum [`Router`], to nest in the application's own server or to
    /// serve on its own (see the [module documentation](crate::admin) for its routes).
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine) -> std::io::Result<()> {
    /// use sagaflow::admin::AdminConfig;
    /// let config = AdminConfig::from_env().expect("a token of 16 characters or more");
    /// let app = engine.admin_router(config);
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    /// // With the peer's address, failed authentications are counted per client.
    /// let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    /// axum::serve(listener, app).await
    /// # }
    /// ```
    pub fn admin_router(&self, config: AdminConfig) -> Router {
        let state = AdminState {
            engine: self.clone(),
            tokens: config.tokens.into(),
            throttle: Arc::new(throttle::Throttle::new(&config.limits)),
            lag: Arc::default(),
        };
        routes::router(state, config.body_limit)
    }
}
