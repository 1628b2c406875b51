//! What a caller can make the API spend: concurrency and rate per route class, failed
//! authentications per client, event-stream followers per token and in total.
//!
//! Every limit answers `429 Too Many Requests` with `Retry-After`, before the request reaches
//! its handler (so before any database work) and, for the limits of a class and of a client,
//! before its token is even compared. A request over a limit costs a lock-free check or two
//! and no database statement. [`AdminLimits`] holds the defaults; operations.md says how to
//! choose others.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// The limits of one class of routes: requests at once, and a rate with a burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteLimit {
    /// Requests of the class handled at once; one more is refused, not queued.
    pub concurrency: usize,
    /// Requests of the class per second, sustained.
    pub per_second: u32,
    /// Requests of the class at once above the sustained rate (at least 1).
    pub burst: u32,
}

impl RouteLimit {
    /// `concurrency` at once, `per_second` sustained with bursts of `burst`.
    pub const fn new(concurrency: usize, per_second: u32, burst: u32) -> Self {
        Self {
            concurrency,
            per_second,
            burst,
        }
    }
}

/// How much callers may make the API spend (see [`AdminConfig::with_limits`]).
///
/// The route classes: `callbacks` (`POST /api/v1/callbacks` and `…/callbacks/{token}`, no bearer token),
/// `login` (`POST /console/login`), `reads` (every other `GET`), `actions` (every other
/// `POST`, `PUT`, `DELETE`). `/healthz` has no limit.
///
/// [`AdminConfig::with_limits`]: super::AdminConfig::with_limits
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminLimits {
    /// Callbacks from remotes (default 64 at once, 1000/s, bursts of 2000).
    pub callbacks: RouteLimit,
    /// Reads: API `GET`s and console pages (default 32 at once, 500/s, bursts of 1000).
    pub reads: RouteLimit,
    /// Actions: starts, operator actions, console forms (default 32 at once, 1000/s, bursts
    /// of 2000).
    pub actions: RouteLimit,
    /// Console logins (default 4 at once, 5/s, bursts of 10).
    pub login: RouteLimit,
    /// Failed authentications (a `401`: a wrong or missing bearer token, a refused login) a
    /// client may make in `failure_window` before each of its requests is answered 429
    /// until the window ends (default 100).
    pub failures_per_client: u32,
    /// The window of `failures_per_client` (default 60 s).
    pub failure_window: Duration,
    /// Event streams (`GET /api/v1/runs/{id}/events`, the console's live updates) one token
    /// or console session may follow at once (default 8).
    pub streams_per_token: usize,
    /// Event streams followed at once in total (default 64).
    pub streams_total: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        Self {
            callbacks: RouteLimit::new(64, 1000, 2000),
            reads: RouteLimit::new(32, 500, 1000),
            actions: RouteLimit::new(32, 1000, 2000),
            login: RouteLimit::new(4, 5, 10),
            failures_per_client: 100,
            failure_window: Duration::from_secs(60),
            streams_per_token: 8,
            streams_total: 64,
        }
    }
}

impl AdminLimits {
    /// Refuses limits that would refuse every request.
    pub(crate) fn validate(&self) -> Result<(), String> {
        for (name, l) in [
            ("callbacks", self.callbacks),
            ("reads", self.reads),
            ("actions", self.actions),
            ("login", self.login),
        ] {
            if l.concurrency == 0 || l.per_second == 0 || l.burst == 0 {
                return Err(format!(
                    "admin limits: `{name}` needs a concurrency, a rate and a burst above zero"
                ));
            }
        }
        if self.failures_per_client == 0 || self.failure_window.is_zero() {
            return Err(
                "admin limits: failures_per_client and failure_window must be above zero".into(),
            );
        }
        if self.streams_per_token == 0 || self.streams_total == 0 {
            return Err("admin limits: stream limits must be above zero".into());
        }
        Ok(())
    }
}

/// One class's live limits.
struct Class {
    name: &'static str,
    permits: Arc<Semaphore>,
    rate: DefaultDirectRateLimiter,
}

impl Class {
    fn new(name: &'static str, l: RouteLimit) -> Self {
        let per_second = NonZeroU32::new(l.per_second).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(l.burst).unwrap_or(NonZeroU32::MIN);
        Self {
            name,
            permits: Arc::new(Semaphore::new(l.concurrency)),
            rate: RateLimiter::direct(Quota::per_second(per_second).allow_burst(burst)),
        }
    }

    /// A permit to handle one request now, or how long to wait.
    /// The place is taken first, so a request refused for the concurrency spends no rate.
    fn admit(&self) -> Result<OwnedSemaphorePermit, Duration> {
        let permit = self
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| Duration::from_secs(1))?;
        if let Err(not_until) = self.rate.check() {
            use governor::clock::{Clock, DefaultClock};
            return Err(not_until.wait_time_from(DefaultClock::default().now()));
        }
        Ok(permit)
    }
}

/// Failed authentications per client in fixed windows. Written here rather than with
/// governor's keyed limiter: the gate must tell whether a client is blocked *without*
/// spending from its budget (a blocked client's token is not compared at all), and only a
/// failure spends; governor's keyed state has no such read.
struct Failures {
    max: u32,
    window: Duration,
    clients: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// Clients remembered at most; past that, windows that ended are dropped first, then all.
const FAILURE_CLIENTS_MAX: usize = 10_000;

impl Failures {
    /// How long `client` stays blocked, if it is.
    fn blocked(&self, client: IpAddr, now: Instant) -> Option<Duration> {
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let (start, n) = clients.get(&client)?;
        let ends = *start + self.window;
        (*n >= self.max && now < ends).then(|| ends - now)
    }

    fn failed(&self, client: IpAddr, now: Instant) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if clients.len() >= FAILURE_CLIENTS_MAX && !clients.contains_key(&client) {
            let window = self.window;
            clients.retain(|_, (start, _)| now < *start + window);
            if clients.len() >= FAILURE_CLIENTS_MAX {
                clients.clear();
            }
        }
        let entry = clients.entry(client).or_insert((now, 0));
        if now >= entry.0 + self.window {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

/// Event streams followed at once: per token (or console session owner) and in total.
pub(crate) struct Streams {
    per_token: usize,
    total: Arc<Semaphore>,
    by_token: Mutex<HashMap<String, usize>>,
}

/// Held by an open event stream; dropping it (the stream ends or its client goes) frees
/// the place.
pub(crate) struct StreamPlace {
    streams: Arc<Throttle>,
    token: String,
    _total: OwnedSemaphorePermit,
}

impl Drop for StreamPlace {
    fn drop(&mut self) {
        let mut by = self
            .streams
            .streams
            .by_token
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by.get_mut(&self.token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by.remove(&self.token);
            }
        }
    }
}

/// The live limits of one router.
pub(crate) struct Throttle {
    callbacks: Class,
    reads: Class,
    actions: Class,
    login: Class,
    failures: Failures,
    streams: Streams,
}

impl Throttle {
    pub(crate) fn new(l: &AdminLimits) -> Self {
        Self {
            callbacks: Class::new("callbacks", l.callbacks),
            reads: Class::new("reads", l.reads),
            actions: Class::new("actions", l.actions),
            login: Class::new("login", l.login),
            failures: Failures {
                max: l.failures_per_client,
                window: l.failure_window,
                clients: Mutex::new(HashMap::new()),
            },
            streams: Streams {
                per_token: l.streams_per_token,
                total: Arc::new(Semaphore::new(l.streams_total)),
                by_token: Mutex::new(HashMap::new()),
            },
        }
    }

    fn class(&self, method: &Method, path: &str) -> Option<&Class> {
        if path == "/healthz" {
            None
        } else if path == "/api/v1/callbacks" || path.starts_with("/api/v1/callbacks/") {
            Some(&self.callbacks)
        } else if path == "/console/login" && method == Method::POST {
            Some(&self.login)
        } else if method == Method::GET || method == Method::HEAD {
            Some(&self.reads)
        } else {
            Some(&self.actions)
        }
    }

    /// A place for one more event stream of `token`, or a 429.
    pub(crate) fn stream_place(self: &Arc<Self>, token: &str) -> Result<StreamPlace, ApiError> {
        let total = self
            .streams
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| too_many("event streams (in total)"))?;
        let mut by = self
            .streams
            .by_token
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = by.entry(token.to_owned()).or_insert(0);
        if *n >= self.streams.per_token {
            return Err(too_many("event streams of this token"));
        }
        *n += 1;
        Ok(StreamPlace {
            streams: self.clone(),
            token: token.to_owned(),
            _total: total,
        })
    }
}

fn too_many(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_requests",
        format!("too many {what}: try again later"),
    )
}

fn refused(what: &str, wait: Duration) -> Response {
    let mut r = too_many(what).into_response();
    let secs = wait.as_secs_f64().ceil().max(1.0);
    if let Ok(v) = HeaderValue::from_str(&format!("{secs:.0}")) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// The client's address: the TCP peer when the server was started with connect info
/// (`sagaflow serve`, `with_admin`, the demo); otherwise one shared key for every client.
fn client_of(request: &Request) -> IpAddr {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0.ip())
}

/// Middleware: the limits of the request's class and of its client, checked before
/// anything else; a 401 answer counts as a failed authentication of the client.
pub(crate) async fn limit(
    State(t): State<Arc<Throttle>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = limited(&t, request, next).await;
    // No answer is sniffed into another type than the one it declares.
    response
        .headers_mut()
        .entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    response
}

/// Marks a 401 that is no guess at a credential (a console tab whose session ended): it does
/// not count toward its client's failed authentications.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NotAGuess;

async fn limited(t: &Throttle, request: Request, next: Next) -> Response {
    let Some(class) = t.class(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    let client = client_of(&request);
    if let Some(wait) = t.failures.blocked(client, Instant::now()) {
        return refused("failed authentications from this client", wait);
    }
    let permit = match class.admit() {
        Ok(p) => p,
        Err(wait) => return refused(&format!("{} requests", class.name), wait),
    };
    let response = next.run(request).await;
    drop(permit);
    if response.status() == StatusCode::UNAUTHORIZED
        && response.extensions().get::<NotAGuess>().is_none()
    {
        t.failures.failed(client, Instant::now());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_blocked_after_its_failures_until_the_window_ends() {
        let f = Failures {
            max: 3,
            window: Duration::from_secs(60),
            clients: Mutex::new(HashMap::new()),
        };
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(f.blocked(a, t0), None);
            f.failed(a, t0);
        }
        assert_eq!(f.blocked(a, t0), Some(Duration::from_secs(60)));
        assert_eq!(f.blocked(b, t0), None, "another client is not blocked");
        let later = t0 + Duration::from_secs(61);
        assert_eq!(f.blocked(a, later), None, "the window ended");
        f.failed(a, later);
        assert_eq!(f.blocked(a, later), None, "a new window counts from one");
    }

    #[test]
    fn a_class_refuses_past_its_concurrency_and_its_burst() {
        let c = Class::new("reads", RouteLimit::new(2, 1, 3));
        let one = c.admit().expect("first");
        let _two = c.admit().expect("second");
        assert!(c.admit().is_err(), "a third at once");
        drop(one);
        let _three = c.admit().expect("a freed place (the burst has one left)");
        drop(_two);
        let wait = c.admit().expect_err("the burst is spent");
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
    }

    #[test]
    fn limits_that_refuse_everything_are_refused() {
        assert!(AdminLimits::default().validate().is_ok());
        let zero = AdminLimits {
            reads: RouteLimit::new(0, 1, 1),
            ..AdminLimits::default()
        };
        assert!(zero.validate().expect_err("zero").contains("reads"));
    }
}
