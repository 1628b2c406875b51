//! Console sessions: the login form, the session cookie and the per-session CSRF token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Form;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use super::super::auth::{Role, caller_for_secret};
use super::{Console, view};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "sagaflow_session";

/// How long a session lasts after its login.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// Sessions kept at most; a login past them ends the session closest to its expiry.
pub(crate) const SESSIONS_MAX: usize = 1000;

/// A logged-in caller, as a handler sees it. `Debug` shows the name and role, never the
/// session id or the CSRF token (either lets whoever reads it act as the caller).
#[derive(Clone)]
pub(crate) struct Session {
    /// The session id (the cookie's value).
    id: String,
    /// The token's name.
    pub(crate) name: String,
    /// The token's role.
    pub(crate) role: Role,
    /// The CSRF token every state-changing form of this session carries.
    pub(crate) csrf: String,
    /// How far the read replica the page was read from is behind (set per page request;
    /// `None` without a replica).
    pub(crate) replica_lag: Option<Duration>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Whether `presented` is this session's CSRF token (constant time).
    pub(crate) fn csrf_matches(&self, presented: &str) -> bool {
        !presented.is_empty() && bool::from(self.csrf.as_bytes().ct_eq(presented.as_bytes()))
    }

    /// Whether the caller may act on runs and alerts.
    pub(crate) fn is_operator(&self) -> bool {
        self.role >= Role::Operator
    }
}

struct Entry {
    session: Session,
    expires: Instant,
}

/// The sessions of one console (in memory: a restart logs everyone out).
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Entry>>,
    ttl: Duration,
}

impl Default for Sessions {
    fn default() -> Self {
        Self {
            map: Mutex::default(),
            ttl: SESSION_TTL,
        }
    }
}

/// 256 random bits, hex-encoded.
fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while the map was held leaves it consistent (every write is one call).
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new session for `name` with `role`.
    fn create(&self, name: String, role: Role) -> Session {
        let session = Session {
            id: random_token(),
            name,
            role,
            csrf: random_token(),
            replica_lag: None,
        };
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, e| e.expires > now);
        // Bounded: a flood of logins (each needs a valid token) cannot grow the map forever.
        while map.len() >= SESSIONS_MAX {
            let Some(oldest) = map
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(
            session.id.clone(),
            Entry {
                session: session.clone(),
                expires: now + self.ttl,
            },
        );
        session
    }

    /// The live session named by the request's cookie.
    pub(crate) fn find(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, COOKIE)?;
        let mut map = self.lock();
        let entry = map.get(id)?;
        if entry.expires <= Instant::now() {
            map.remove(id);
            return None;
        }
        Some(entry.session.clone())
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }
}

/// The value of the cookie `name` in the request's `Cookie` headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Whether the request came through an HTTPS proxy (which then gets a `Secure` cookie).
fn behind_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The `Set-Cookie` value for `id`, or one that deletes the cookie when `id` is `None`.
pub(crate) fn set_cookie(id: Option<&str>, secure: bool) -> String {
    let (value, age) = match id {
        Some(id) => (id, SESSION_TTL.as_secs()),
        None => ("", 0),
    };
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={age}{secure}")
}

/// `GET /console/login`.
pub(super) async fn login_form(State(c): State<Console>, headers: HeaderMap) -> Response {
    if c.sessions.find(&headers).is_some() {
        return Redirect::to("/console/").into_response();
    }
    view::login_page(None).into_response()
}

/// The login form's fields.
#[derive(Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
}

/// `POST /console/login`: a valid token opens a session; anything else is refused with the
/// same words, whatever was wrong.
pub(super) async fn login(
    State(c): State<Console>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let Some(caller) = caller_for_secret(&c.admin.tokens, form.token.trim().as_bytes()) else {
        tracing::info!("console login refused");
        return (
            StatusCode::UNAUTHORIZED,
            view::login_page(Some("That token is not valid.")),
        )
            .into_response();
    };
    tracing::info!(who = %caller.name, "console login");
    let session = c.sessions.create(caller.name, caller.role);
    let cookie = set_cookie(Some(&session.id), behind_https(&headers));
    let mut response = Redirect::to("/console/").into_response();
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// The fields of a form that only carries the CSRF token.
#[derive(Deserialize)]
pub(super) struct CsrfForm {
    #[serde(default)]
    pub(super) csrf: String,
}

/// `POST /console/logout`: ends the session (CSRF-checked, so a foreign page cannot log the
/// operator out either).
pub(super) async fn logout(
    State(c): State<Console>,
    super::PageSession(s): super::PageSession,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Err(refused) = super::check_post(&s, &form.csrf, Role::ReadOnly) {
        return *refused;
    }
    c.sessions.remove(&s.id);
    let mut response = Redirect::to("/console/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&set_cookie(None, behind_https(&headers))) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_http_only_strict_and_scoped_to_the_console() {
        let c = set_cookie(Some("abc"), false);
        assert_eq!(
            c,
            "sagaflow_session=abc; HttpOnly; SameSite=Strict; Path=/console; Max-Age=43200"
        );
        assert!(set_cookie(Some("abc"), true).ends_with("; Secure"));
        assert!(set_cookie(None, false).contains("Max-Age=0"));
    }

    #[test]
    fn sessions_are_found_by_their_cookie_and_ids_are_random() {
        let sessions = Sessions::default();
        let s = sessions.create("ops".into(), Role::Operator);
        assert_eq!(s.id.len(), 64);
        assert_ne!(s.id, s.csrf);
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={}", s.id)).expect("header"),
        );
        assert_eq!(sessions.find(&h).map(|f| f.name), Some("ops".into()));
        let mut wrong = HeaderMap::new();
        wrong.insert(
            header::COOKIE,
            HeaderValue::from_static("sagaflow_session=0000"),
        );
        assert!(sessions.find(&wrong).is_none());
        assert!(sessions.find(&HeaderMap::new()).is_none());
        sessions.remove(&s.id);
        assert!(sessions.find(&h).is_none());
    }

    #[test]
    fn a_session_never_shows_its_id_or_csrf_token() {
        let s = Sessions::default().create("ops".into(), Role::Operator);
        let shown = format!("{s:?}");
        assert!(shown.contains("ops"), "{shown}");
        assert!(
            !shown.contains(&s.id) && !shown.contains(&s.csrf),
            "{shown}"
        );
    }

    #[test]
    fn sessions_are_capped_and_the_oldest_goes_first() {
        let sessions = Sessions::default();
        let first = sessions.create("ops".into(), Role::Operator);
        for _ in 0..SESSIONS_MAX {
            sessions.create("ops".into(), Role::Operator);
        }
        let map = sessions.lock();
        assert_eq!(map.len(), SESSIONS_MAX);
        assert!(!map.contains_key(&first.id), "the oldest session ended");
    }

    #[test]
    fn an_expired_session_is_gone() {
        let sessions = Sessions {
            ttl: Duration::ZERO,
            ..Sessions::default()
        };
        let s = sessions.create("ops".into(), Role::Operator);
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("{COOKIE}={}", s.id)).expect("header"),
        );
        assert!(sessions.find(&h).is_none());
        assert!(sessions.lock().is_empty(), "removed when found expired");
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::default();
        let s = sessions.create("ops".into(), Role::Operator);
        assert!(s.csrf_matches(&s.csrf.clone()));
        assert!(!s.csrf_matches(""));
        assert!(!s.csrf_matches(&s.csrf[1..]));
        assert!(!s.csrf_matches(&format!("{}0", s.csrf)));
    }
}
