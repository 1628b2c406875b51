//! An HTTP client for calling JSON APIs from a step: [`HttpAgent`].
//!
//! One agent per remote service, shared by the steps that call it (`step_using`). Each call
//! made with a step's [`StepContext`]:
//!
//! - sends `Idempotency-Key: ctx.idempotency_key()`, the same on every attempt of the step
//!   (a compensation sends its own key), so a service that de-duplicates on it answers a
//!   repeat with the first answer instead of acting twice;
//! - sends `traceparent` (and `tracestate`) from the step's trace context;
//! - gives up by the attempt's deadline: its timeout is [`StepContext::remaining`] minus a
//!   small margin ([`TIMEOUT_MARGIN_DEFAULT`]), so the step answers before the engine drops
//!   the attempt;
//! - turns the answer into the step's result: a 2xx body decoded from JSON, or a
//!   [`StepError`] whose `retryable` and [`Outcome`] say whether to try again and whether the
//!   remote may have acted, as [`status_error`] and the table below say. A 408, 429 or 503
//!   with `Retry-After` is a deferral ([`StepError::try_again_after`]): the step is queued
//!   again after that delay without counting a failure.
//!
//! | What the agent saw | Code | Retryable | Outcome |
//! |---|---|---|---|
//! | 2xx with a JSON body (or an empty one, read as `null`) | `Ok` | | |
//! | 2xx whose body does not decode into the type asked for | `bad_reply` | no | applied |
//! | 2xx whose body was cut off or timed out | `reply_lost` | yes | applied |
//! | 2xx whose body is over [`MAX_RESPONSE_BYTES`] | `reply_too_large` | no | applied |
//! | 408, 429 or 503 with `Retry-After` (seconds or an HTTP date) | `busy` | deferral | not applied |
//! | 408, 429 or 503 without a readable `Retry-After` | `busy` | yes | not applied |
//! | 409 Conflict | `conflict` | yes | unknown |
//! | other 4xx (400, 401, 403, 404, 422, …) | `refused` | no | not applied |
//! | 500, 502, 504 and any other 5xx | `remote_error` | yes | unknown |
//! | 1xx or 3xx (redirects are not followed) | `unexpected_status` | no | not applied |
//! | no connection (refused, DNS failure, connect timeout) | `connect` | yes | not applied |
//! | timeout after the request was sent (or while still connecting) | `timeout` | yes | unknown |
//! | connection reset or other transport error after sending | `transport` | yes | unknown |
//! | request not buildable (bad path, body not serialisable) | `request` | no | not applied |
//! | less than the margin left before the deadline: not sent | `deadline` | yes | not applied |
//!
//! The error's details hold the agent's `remote` name and the `status`; for a 4xx or 5xx
//! whose body is a JSON object, the first string among its `detail`, `title`, `message` and
//! `error` fields, cut to 200 characters, as `reason` (an RFC 9457 problem's explanation).
//!
//! Request bodies and headers are never logged or stored; default headers (an
//! `Authorization` token) are marked sensitive and left out of `Debug`.
//!
//! # Paths built from values
//!
//! A path is appended to the base URL as written. A value that came from elsewhere (an id
//! a remote returned, a customer's reference) goes in through [`segment`] or [`path`],
//! which percent-encode it: `../admin` or `x?all=1` stays one segment of the path and
//! cannot reach another endpoint of the host with the agent's credentials. As a second
//! line, a `.` or `..` segment left in a path is sent encoded twice (the remote sees the
//! name `%2E%2E`, which no route has), never resolved.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use sagaflow_engine::resource::{Resource, ResourceName};
use sagaflow_engine::{Error, Outcome, Result, StepContext, StepError};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use reqwest::{Method, RequestBuilder, Response, StatusCode};

/// The request header that carries the step's idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";
/// Time kept back from an attempt's remaining time: the request's timeout is
/// `ctx.remaining()` minus this, so the step answers before its deadline.
pub const TIMEOUT_MARGIN_DEFAULT: Duration = Duration::from_millis(100);
/// How long establishing a connection may take. A connection not made in time is "not
/// applied" (nothing was sent); the request's own timeout, after it, is "unknown".
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// The largest response body read; a longer one fails the call (`reply_too_large`).
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;
/// Longest `reason` taken from an error response's body.
const REASON_MAX_CHARS: usize = 200;

/// What [`segment`] encodes: everything but RFC 3986's unreserved characters
/// (`A-Z a-z 0-9 - . _ ~`).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `value` as one path segment: percent-encoded, so that `/`, `?`, `#` and `%` in it stay
/// inside the segment, and `.` or `..` is not a dot segment.
///
/// ```
/// use sagaflow::http::segment;
/// assert_eq!(segment("ch_42"), "ch_42");
/// assert_eq!(segment("../admin?x=1"), "..%2Fadmin%3Fx%3D1");
/// assert_eq!(segment(".."), "%2E%2E");
/// ```
pub fn segment(value: &str) -> String {
    match value {
        "." => "%2E".to_owned(),
        ".." => "%2E%2E".to_owned(),
        v => percent_encoding::utf8_percent_encode(v, SEGMENT).to_string(),
    }
}

/// A path from its segments, each encoded by [`segment`] and joined with `/`.
///
/// ```
/// use sagaflow::http::path;
/// let charge = "../refunds"; // an id a remote returned
/// assert_eq!(path(["charges", charge]), "/charges/..%2Frefunds");
/// ```
pub fn path<I, S>(segments: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    segments.into_iter().fold(String::new(), |mut out, s| {
        out.push('/');
        out.push_str(&segment(s.as_ref()));
        out
    })
}

/// `path` with each `.` or `..` segment (before the query) encoded, so that the URL parser
/// does not resolve it to another endpoint.
fn no_dot_segments(path: &str) -> std::borrow::Cow<'_, str> {
    let (p, rest) = match path.find(['?', '#']) {
        Some(i) => path.split_at(i),
        None => (path, ""),
    };
    // Only a segment of 6 bytes or fewer can be one (`%2e%2e` is the longest): the others
    // are passed over without a copy.
    let is_dot = |s: &str| {
        s.len() <= 6 && {
            let lower = s.to_ascii_lowercase().replace("%2e", ".");
            lower == "." || lower == ".."
        }
    };
    if !p.split('/').any(is_dot) {
        return std::borrow::Cow::Borrowed(path);
    }
    let segments: Vec<String> = p
        .split('/')
        // The URL parser resolves `%2e` like `.`: a dot is encoded twice (`%252E`), so the
        // remote sees `%2E`, a name, and the parser no dot segment.
        .map(|s| {
            if is_dot(s) {
                s.replace('%', "%25").replace('.', "%252E")
            } else {
                s.to_owned()
            }
        })
        .collect();
    std::borrow::Cow::Owned(segments.join("/") + rest)
}

/// A client of one remote JSON API, for use inside steps (see the [module](self)).
///
/// Cheap to clone: clones share one connection pool.
///
/// # Examples
///
/// ```no_run
/// use sagaflow::http::{HttpAgent, path};
/// use sagaflow::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Charge { id: String, amount_cents: u64 }
///
/// # fn demo() -> Result<(), sagaflow::Error> {
/// let payments = HttpAgent::builder("payments-api", "http://127.0.0.1:9000")
///     .with_bearer_token("a-token")
///     .build()?;
/// let wf = Workflow::builder("order", 1)
///     .step_using("charge", payments.clone(), |pay, ctx| async move {
///         let body = serde_json::json!({ "amount_cents": 1200 });
///         let charge: Charge = pay.post(&ctx, "/charges", &body).await?;
///         Ok(charge.id)
///     })
///     .compensate_using(payments, |pay, ctx| async move {
///         // An id the remote returned goes in encoded: it cannot reach another endpoint.
///         let charge: String = ctx.output()?;
///         pay.delete::<serde_json::Value>(&ctx, &path(["charges", &charge])).await?;
///         Ok(())
///     })
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HttpAgent {
    name: String,
    base: String,
    client: reqwest::Client,
    margin: Duration,
    limits: Resource,
}

impl fmt::Debug for HttpAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the default headers (they may hold a token).
        f.debug_struct("HttpAgent")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("margin", &self.margin)
            .field("limits", self.limits.limits())
            .finish_non_exhaustive()
    }
}

/// Settings of an [`HttpAgent`]; [`HttpAgentBuilder::build`] checks them.
#[derive(Clone)]
pub struct HttpAgentBuilder {
    name: String,
    base: String,
    headers: Vec<(String, String)>,
    margin: Duration,
    connect_timeout: Duration,
    limits: Resource,
}

impl fmt::Debug for HttpAgentBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("HttpAgentBuilder")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("headers", &names)
            .field("margin", &self.margin)
            .field("connect_timeout", &self.connect_timeout)
            .field("limits", self.limits.limits())
            .finish()
    }
}

impl HttpAgentBuilder {
    /// Sends `name: value` with every request (unless the request sets it). The value is
    /// treated as a secret: never logged or printed.
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sends `Authorization: Bearer <token>` with every request.
    #[must_use]
    pub fn with_bearer_token(self, token: impl AsRef<str>) -> Self {
        let value = format!("Bearer {}", token.as_ref());
        self.with_header("authorization", value)
    }

    /// Sets the time kept back from an attempt's remaining time
    /// ([`TIMEOUT_MARGIN_DEFAULT`]).
    #[must_use]
    pub fn with_timeout_margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }

    /// Sets how long establishing a connection may take ([`CONNECT_TIMEOUT_DEFAULT`]).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limits of the remote service, which the agent declares as the resource of its
    /// name: `.with_limits(|r| r.max_in_flight(8).rate(20, Duration::from_secs(1)))`.
    /// Declare them with `EngineBuilder::with_resource(&agent)` and name the agent on its
    /// steps with `.resource(&agent)`.
    #[must_use]
    pub fn with_limits(mut self, limits: impl FnOnce(Resource) -> Resource) -> Self {
        self.limits = limits(Resource::new(self.name.clone()));
        self
    }

    /// The agent.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty name, a base URL that is not `http(s)://` (or
    /// `https://` in a build without the `tls` feature), a zero connect timeout, or a
    /// default header whose name or value is not valid in HTTP (the message names the
    /// header, never its value).
    pub fn build(self) -> Result<HttpAgent> {
        if self.name.trim().is_empty() {
            return Err(Error::Config("an HTTP agent needs a name".into()));
        }
        let url = reqwest::Url::parse(&self.base).map_err(|e| {
            Error::Config(format!(
                "HTTP agent `{}`: base URL `{}` is not a URL: {e}",
                self.name, self.base
            ))
        })?;
        match url.scheme() {
            "http" => {}
            "https" if cfg!(feature = "tls") => {}
            "https" => {
                return Err(Error::Config(format!(
                    "HTTP agent `{}`: an https:// base URL needs sagaflow's `tls` feature",
                    self.name
                )));
            }
            other => {
                return Err(Error::Config(format!(
                    "HTTP agent `{}`: base URL scheme `{other}` is not http or https",
                    self.name
                )));
            }
        }
        if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
            return Err(Error::Config(format!(
                "HTTP agent `{}`: the base URL takes no credentials, query or fragment \
                 (send a token with `with_bearer_token` or `with_header`)",
                self.name
            )));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::Config(format!(
                "HTTP agent `{}`: the connect timeout must be above zero",
                self.name
            )));
        }
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Error::Config(format!(
                    "HTTP agent `{}`: `{name}` is not a header name",
                    self.name
                ))
            })?;
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                Error::Config(format!(
                    "HTTP agent `{}`: the value of header `{name}` is not valid in HTTP",
                    self.name
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(self.connect_timeout)
            // A redirect would replay a POST elsewhere (or turn it into a GET): an API call
            // gets the 3xx as an answer instead.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| {
                Error::Config(format!(
                    "HTTP agent `{}`: cannot build the client: {e}",
                    self.name
                ))
            })?;
        Ok(HttpAgent {
            name: self.name,
            base: url.as_str().trim_end_matches('/').to_owned(),
            client,
            margin: self.margin,
            limits: self.limits,
        })
    }
}

impl HttpAgent {
    /// An agent for the service named `name` (its remote resource: keep it stable) at
    /// `base_url`, with the default settings.
    ///
    /// # Errors
    /// As [`HttpAgentBuilder::build`].
    pub fn new(name: impl Into<String>, base_url: &str) -> Result<Self> {
        Self::builder(name, base_url).build()
    }

    /// Settings for an agent named `name` at `base_url` (paths are appended to it).
    pub fn builder(name: impl Into<String>, base_url: &str) -> HttpAgentBuilder {
        let name: String = name.into();
        HttpAgentBuilder {
            limits: Resource::new(name.clone()),
            name,
            base: base_url.to_owned(),
            headers: Vec::new(),
            margin: TIMEOUT_MARGIN_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
        }
    }

    /// The name of the remote resource this agent calls (e.g. `payments-api`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The remote resource this agent calls, with the limits given to its builder (none by
    /// default), for `EngineBuilder::with_resource`.
    pub fn resource(&self) -> Resource {
        self.limits.clone()
    }

    /// The base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// A request for `path` (appended to the base URL), to finish and pass to
    /// [`HttpAgent::send`] or [`HttpAgent::send_raw`]: for methods and options the shortcuts
    /// do not cover.
    ///
    /// Build a path that holds values with [`path`] or [`segment`]; a `.` or `..` segment of
    /// `path` is sent encoded twice, never resolved (see the [module](self)).
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let url = format!(
            "{}/{}",
            self.base,
            no_dot_segments(path.trim_start_matches('/'))
        );
        self.client.request(method, url)
    }

    /// `GET path`, decoded from JSON.
    ///
    /// # Errors
    /// A [`StepError`] as the [module](self)'s table says.
    pub async fn get<T: DeserializeOwned>(
        &self,
        ctx: &StepContext,
        path: &str,
    ) -> std::result::Result<T, StepError> {
        self.send(ctx, self.request(Method::GET, path)).await
    }

    /// `POST path` with `body` as JSON; the answer decoded from JSON.
    ///
    /// # Errors
    /// A [`StepError`] as the [module](self)'s table says.
    pub async fn post<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        ctx: &StepContext,
        path: &str,
        body: &B,
    ) -> std::result::Result<T, StepError> {
        self.send(ctx, self.request(Method::POST, path).json(body))
            .await
    }

    /// `PUT path` with `body` as JSON; the answer decoded from JSON.
    ///
    /// # Errors
    /// A [`StepError`] as the [module](self)'s table says.
    pub async fn put<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        ctx: &StepContext,
        path: &str,
        body: &B,
    ) -> std::result::Result<T, StepError> {
        self.send(ctx, self.request(Method::PUT, path).json(body))
            .await
    }

    /// `DELETE path`; the answer decoded from JSON (ask for `()` or
    /// `Option<serde_json::Value>` when it has no body).
    ///
    /// # Errors
    /// A [`StepError`] as the [module](self)'s table says.
    pub async fn delete<T: DeserializeOwned>(
        &self,
        ctx: &StepContext,
        path: &str,
    ) -> std::result::Result<T, StepError> {
        self.send(ctx, self.request(Method::DELETE, path)).await
    }

    /// Sends `request` (best made with [`HttpAgent::request`]) with the step's idempotency
    /// key, trace context and deadline, and decodes a 2xx answer from JSON (an empty body
    /// reads as `null`).
    ///
    /// # Errors
    /// A [`StepError`] as the [module](self)'s table says.
    pub async fn send<T: DeserializeOwned>(
        &self,
        ctx: &StepContext,
        request: RequestBuilder,
    ) -> std::result::Result<T, StepError> {
        let mut response = self.send_raw(ctx, request).await?;
        let status = response.status();
        if let Some(error) = status_error(status, response.headers()) {
            let reason = if status.is_client_error() || status.is_server_error() {
                read_body(&mut response)
                    .await
                    .ok()
                    .and_then(|b| reason_of(&b))
            } else {
                None
            };
            return Err(self.annotate(error, status, reason));
        }
        let body = read_body(&mut response).await.map_err(|e| {
            let error = match e {
                BodyError::TooLarge => StepError::terminal_unknown(
                    "reply_too_large",
                    format!("the answer is over {MAX_RESPONSE_BYTES} bytes"),
                ),
                // The remote acted (it answered 2xx), but its answer was lost: a retry
                // under the same key replays it.
                BodyError::Transport(e) => StepError::retryable(
                    "reply_lost",
                    format!("the answer was cut off: {}", redacted(&e)),
                ),
            };
            self.annotate(error.with_outcome(Outcome::Applied), status, None)
        })?;
        let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
            b"null"
        } else {
            &body
        };
        serde_json::from_slice(text).map_err(|e| {
            // The remote acted and answered success; its answer will not decode however
            // often it is replayed under the key. Give up, and count the effect as done:
            // the compensation runs if the saga unwinds.
            self.annotate(
                StepError::terminal_unknown(
                    "bad_reply",
                    format!("the answer does not decode into the expected type: {e}"),
                )
                .with_outcome(Outcome::Applied),
                status,
                None,
            )
        })
    }

    /// Sends `request` like [`HttpAgent::send`], but returns the response whatever its
    /// status: only a request that could not be sent or answered is an error. Pass the
    /// answer to [`status_error`] to map its status as `send` does.
    ///
    /// # Errors
    /// A [`StepError`] for the transport rows of the [module](self)'s table.
    pub async fn send_raw(
        &self,
        ctx: &StepContext,
        request: RequestBuilder,
    ) -> std::result::Result<Response, StepError> {
        let mut request = request.build().map_err(|e| {
            self.transport(StepError::refused(
                "request",
                format!("the request cannot be built: {}", redacted(&e)),
            ))
        })?;
        let timeout = ctx.remaining().saturating_sub(self.margin);
        if timeout.is_zero() {
            return Err(self.transport(
                StepError::retryable(
                    "deadline",
                    "too little time left before the attempt's deadline; not sent",
                )
                .not_applied(),
            ));
        }
        let t = request.timeout_mut();
        *t = Some(t.map_or(timeout, |own| own.min(timeout)));
        let key = HeaderValue::from_str(ctx.idempotency_key()).map_err(|_| {
            self.transport(StepError::refused(
                "request",
                "the idempotency key is not valid in an HTTP header",
            ))
        })?;
        let headers = request.headers_mut();
        headers.insert(HeaderName::from_static("idempotency-key"), key);
        // The engine builds both from checked values; a context that holds none sends none.
        if let Ok(parent) = HeaderValue::from_str(&ctx.trace_parent()) {
            headers.insert(HeaderName::from_static("traceparent"), parent);
        }
        if let Some(state) = ctx
            .trace_state()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            headers.insert(HeaderName::from_static("tracestate"), state);
        }
        let (method, path) = (request.method().clone(), request.url().path().to_owned());
        let started = std::time::Instant::now();
        let answer = self.client.execute(request).await;
        match &answer {
            Ok(r) => tracing::debug!(
                remote = %self.name, %method, %path, status = r.status().as_u16(),
                elapsed_ms = started.elapsed().as_millis(), "remote answered"
            ),
            Err(e) => tracing::debug!(
                remote = %self.name, %method, %path, error = %redacted(e),
                elapsed_ms = started.elapsed().as_millis(), "remote call failed"
            ),
        }
        answer.map_err(|e| {
            let error = if e.is_builder() {
                StepError::refused("request", "the request cannot be built")
            } else if e.is_connect() {
                // No connection was made: nothing was sent.
                StepError::retryable("connect", format!("{method} {path}: no connection"))
                    .not_applied()
            } else if e.is_timeout() {
                StepError::retryable(
                    "timeout",
                    format!("{method} {path}: no answer within {timeout:?}"),
                )
            } else {
                StepError::retryable("transport", format!("{method} {path}: transport error"))
            };
            let error = StepError {
                message: format!("{}: {}", error.message, redacted(&e)),
                ..error
            };
            self.transport(error)
        })
    }

    /// Names the remote in an error's message and details.
    fn transport(&self, error: StepError) -> StepError {
        let message = format!("{}: {}", self.name, error.message);
        StepError { message, ..error }.with_details(serde_json::json!({ "remote": self.name }))
    }

    fn annotate(&self, error: StepError, status: StatusCode, reason: Option<String>) -> StepError {
        let mut details = serde_json::json!({ "remote": self.name, "status": status.as_u16() });
        if let Some(reason) = reason {
            details["reason"] = reason.into();
        }
        let message = format!("{}: {}", self.name, error.message);
        StepError { message, ..error }.with_details(details)
    }
}

/// What an answer's status means for the step: `None` for a 2xx, otherwise the error of the
/// [module](self)'s table (a deferral when a 408, 429 or 503 carries a `Retry-After` in
/// seconds or as an HTTP date).
pub fn status_error(status: StatusCode, headers: &HeaderMap) -> Option<StepError> {
    let what = format!(
        "answered {} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let what = what.trim_end().to_owned();
    Some(match status.as_u16() {
        200..=299 => return None,
        408 | 429 | 503 => match retry_after(headers, SystemTime::now()) {
            Some(delay) => StepError::try_again_after("busy", what, delay),
            None => StepError::retryable("busy", what).not_applied(),
        },
        // With `Idempotency-Key`, a 409 says a request with this key is still being
        // processed: an earlier attempt may yet act. Try again; the outcome is unknown.
        409 => StepError::retryable("conflict", what),
        400..=499 => StepError::refused("refused", what),
        500..=599 => StepError::retryable("remote_error", what),
        _ => StepError::refused("unexpected_status", what),
    })
}

/// The delay a `Retry-After` header asks for at `now`: whole seconds, or an HTTP date (a
/// date in the past is no delay). `None` when absent or unreadable.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Past u64 seconds it is absurd anyway: the engine caps the delay.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

enum BodyError {
    TooLarge,
    Transport(reqwest::Error),
}

/// The response body, at most [`MAX_RESPONSE_BYTES`].
async fn read_body(response: &mut Response) -> std::result::Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The explanation an error answer gives, if its body is a JSON object with one.
fn reason_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    ["detail", "title", "message", "error"]
        .iter()
        .find_map(|k| v.get(k).and_then(serde_json::Value::as_str))
        .map(|s| s.chars().take(REASON_MAX_CHARS).collect())
}

/// reqwest's error and its causes, without the URL (its query may hold a token).
fn redacted(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text
            .replace(&format!(" for url ({url})"), "")
            .replace(url.as_str(), "<url>");
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

impl ResourceName for &HttpAgent {
    fn resource_name(&self) -> String {
        self.name.clone()
    }
}

impl From<&HttpAgent> for Resource {
    fn from(agent: &HttpAgent) -> Self {
        agent.resource()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_retry_after(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_str(v).expect("header"));
        h
    }

    fn status(n: u16, headers: &HeaderMap) -> Option<StepError> {
        status_error(StatusCode::from_u16(n).expect("status"), headers)
    }

    #[test]
    fn statuses_map_as_the_table_says() {
        let none = HeaderMap::new();
        assert!(status(200, &none).is_none() && status(204, &none).is_none());
        for (n, retryable, outcome) in [
            (400, false, Outcome::NotApplied),
            (401, false, Outcome::NotApplied),
            (404, false, Outcome::NotApplied),
            (422, false, Outcome::NotApplied),
            (408, true, Outcome::NotApplied),
            (429, true, Outcome::NotApplied),
            (503, true, Outcome::NotApplied),
            (409, true, Outcome::Unknown),
            (500, true, Outcome::Unknown),
            (502, true, Outcome::Unknown),
            (504, true, Outcome::Unknown),
            (301, false, Outcome::NotApplied),
        ] {
            let e = status(n, &none).expect("an error");
            assert_eq!((e.retryable, e.outcome), (retryable, outcome), "{n}: {e:?}");
            assert!(!e.is_deferral(), "{n} without Retry-After");
        }
        for n in [408, 429, 503] {
            let e = status(n, &with_retry_after("3")).expect("an error");
            assert!(e.is_deferral(), "{n}");
            assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        }
        // Only those three defer.
        assert!(
            !status(500, &with_retry_after("3"))
                .expect("error")
                .is_deferral()
        );
        assert!(
            !status(429, &with_retry_after("soon"))
                .expect("error")
                .is_deferral()
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&with_retry_after("120"), now),
            Some(Duration::from_secs(120))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(&with_retry_after(&later), now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(
            retry_after(&with_retry_after(&earlier), now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(&with_retry_after("99999999999999999999999"), now),
            Some(Duration::from_secs(u64::MAX))
        );
        assert_eq!(retry_after(&with_retry_after("-1"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn an_error_body_gives_a_short_reason() {
        assert_eq!(
            reason_of(br#"{"title":"Invalid","detail":"amount must be positive"}"#),
            Some("amount must be positive".into())
        );
        assert_eq!(reason_of(br#"{"message":"no"}"#), Some("no".into()));
        assert_eq!(reason_of(b"<html>"), None);
        let long = format!(r#"{{"error":"{}"}}"#, "x".repeat(1000));
        assert_eq!(reason_of(long.as_bytes()).map(|r| r.len()), Some(200));
    }

    #[test]
    fn bad_settings_are_refused_without_printing_secrets() {
        let bad = |b: HttpAgentBuilder| b.build().expect_err("refused").to_string();
        assert!(bad(HttpAgent::builder(" ", "http://127.0.0.1:1")).contains("name"));
        assert!(bad(HttpAgent::builder("a", "not a url")).contains("not a URL"));
        assert!(bad(HttpAgent::builder("a", "ftp://h")).contains("scheme"));
        assert!(bad(HttpAgent::builder("a", "http://u:p@h")).contains("credentials"));
        let e = bad(HttpAgent::builder("a", "http://h").with_header("x-token", "bad\nsecret"));
        assert!(e.contains("x-token") && !e.contains("secret"), "{e}");
        assert!(
            bad(HttpAgent::builder("a", "http://h").with_header("bad header", "v"))
                .contains("bad header")
        );
        assert!(
            bad(HttpAgent::builder("a", "http://h").with_connect_timeout(Duration::ZERO))
                .contains("connect timeout")
        );
        let agent = HttpAgent::builder("payments-api", "http://127.0.0.1:9000/api/")
            .with_bearer_token("a-very-secret-token")
            .build()
            .expect("agent");
        assert_eq!(agent.name(), "payments-api");
        assert_eq!(agent.base_url(), "http://127.0.0.1:9000/api");
        let shown = format!("{agent:?}");
        assert!(!shown.contains("a-very-secret-token"), "{shown}");
        let req = agent
            .request(Method::GET, "/charges/1")
            .build()
            .expect("request");
        assert_eq!(req.url().as_str(), "http://127.0.0.1:9000/api/charges/1");
    }
}
