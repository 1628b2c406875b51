//! Bearer tokens and their roles.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AdminState;
use super::error::ApiError;
use super::token_file::TOKEN_SECRET_MIN_CHARS;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Reads runs, definitions, alerts and statistics.
    ReadOnly,
    /// Also starts runs, acts on runs and alerts, and changes the limits of remote resources.
    Operator,
}

/// A named token with a role. Its secret is never printed (`Debug` shows the name and role).
#[derive(Clone)]
pub struct AdminToken {
    name: String,
    secret: String,
    role: Role,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// A token refused by [`AdminToken::new`]. It never holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "admin token `{name}`: the secret has {chars} characters, fewer than the \
     {TOKEN_SECRET_MIN_CHARS} required (a short secret is guessed)"
)]
pub struct WeakToken {
    /// The token's name.
    pub name: String,
    /// How many characters its secret has (surrounding whitespace not counted).
    pub chars: usize,
}

impl AdminToken {
    /// A token: `name` says who it is in history and logs, `secret` is what the caller sends.
    ///
    /// # Errors
    /// [`WeakToken`] for a secret shorter than [`TOKEN_SECRET_MIN_CHARS`] characters
    /// (whitespace around it is not counted, and not part of it).
    pub fn new(
        name: impl Into<String>,
        secret: impl Into<String>,
        role: Role,
    ) -> Result<Self, WeakToken> {
        let name = name.into();
        let secret: String = secret.into();
        let secret = secret.trim();
        let chars = secret.chars().count();
        if chars < TOKEN_SECRET_MIN_CHARS {
            return Err(WeakToken { name, chars });
        }
        Ok(Self {
            name,
            secret: secret.to_owned(),
            role,
        })
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its role.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// The caller a request was authenticated as (a request extension).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) name: String,
    pub(crate) role: Role,
}

impl Caller {
    /// Refuses a caller whose role is below `role`.
    pub(crate) fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::forbidden(role))
        }
    }
}

/// Finds the token a request carries, comparing every configured secret in constant time
/// (all of them, so the time taken does not tell which one matched either).
fn authenticate(tokens: &[AdminToken], header: Option<&str>) -> Option<Caller> {
    let presented = header?.strip_prefix("Bearer ")?.trim().as_bytes();
    caller_for_secret(tokens, presented)
}

/// The caller whose token secret is `presented`, compared like [`authenticate`] does (the
/// console's login form uses it too).
pub(crate) fn caller_for_secret(tokens: &[AdminToken], presented: &[u8]) -> Option<Caller> {
    if presented.is_empty() {
        return None;
    }
    let mut found = None;
    for t in tokens {
        if bool::from(t.secret.as_bytes().ct_eq(presented)) {
            found = Some(Caller {
                name: t.name.clone(),
                role: t.role,
            });
        }
    }
    found
}

/// Middleware: a request without a valid token is answered 401 and goes no further.
pub(crate) async fn require_token(
    State(state): State<AdminState>,
    mut request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match authenticate(&state.tokens, header) {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => ApiError::unauthorized().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::{AdminToken, Role, WeakToken, authenticate};

    fn token(name: &str, secret: &str, role: Role) -> AdminToken {
        AdminToken::new(name, secret, role).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_a_configured_secret_with_the_bearer_scheme_authenticates() {
        let tokens = [
            token("ops", "s3cret-ops-0123456", Role::Operator),
            token("viewer", "s3cret-view-012345", Role::ReadOnly),
        ];
        let who = |h: Option<&str>| authenticate(&tokens, h).map(|c| (c.name, c.role));
        assert_eq!(
            who(Some("Bearer s3cret-ops-0123456")),
            Some(("ops".into(), Role::Operator))
        );
        assert_eq!(
            who(Some("Bearer s3cret-view-012345")),
            Some(("viewer".into(), Role::ReadOnly))
        );
        for bad in [
            None,
            Some(""),
            Some("s3cret-ops-0123456"),
            Some("Basic s3cret-ops-0123456"),
            Some("Bearer s3cret-ops-012345"),
            Some("Bearer s3cret-ops-0123456x"),
            Some("Bearer "),
        ] {
            assert_eq!(who(bad), None, "{bad:?}");
        }
        assert_eq!(
            authenticate(&[], Some("Bearer anything")).map(|c| c.name),
            None
        );
    }

    #[test]
    fn a_token_never_shows_its_secret() {
        let t = token("ops", "s3cret-ops-0123456", Role::Operator);
        assert!(!format!("{t:?}").contains("s3cret"), "{t:?}");
    }

    #[test]
    fn a_short_secret_is_refused_without_being_shown() {
        for (secret, chars) in [("x", 1), ("", 0), ("  fifteen-chars!!  ", 15)] {
            let e = AdminToken::new("ops", secret, Role::Operator).expect_err("weak");
            assert_eq!(
                e,
                WeakToken {
                    name: "ops".into(),
                    chars
                }
            );
            assert!(e.to_string().contains("16 required"), "{e}");
            assert!(secret.trim().is_empty() || !e.to_string().contains(secret.trim()));
        }
        assert!(AdminToken::new("ops", " sixteen-chars-ok ", Role::Operator).is_ok());
    }
}
