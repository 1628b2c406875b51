//! Bearer tokens and their roles.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AdminState;
use super::routes::ApiError;

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

impl AdminToken {
    /// A token: `name` says who it is in history and logs, `secret` is what the caller sends.
    pub fn new(name: impl Into<String>, secret: impl Into<String>, role: Role) -> Self {
        Self {
            name: name.into(),
            secret: secret.into(),
            role,
        }
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
    use super::{AdminToken, Role, authenticate};

    #[test]
    fn only_a_configured_secret_with_the_bearer_scheme_authenticates() {
        let tokens = [
            AdminToken::new("ops", "s3cret-ops", Role::Operator),
            AdminToken::new("viewer", "s3cret-view", Role::ReadOnly),
        ];
        let who = |h: Option<&str>| authenticate(&tokens, h).map(|c| (c.name, c.role));
        assert_eq!(
            who(Some("Bearer s3cret-ops")),
            Some(("ops".into(), Role::Operator))
        );
        assert_eq!(
            who(Some("Bearer s3cret-view")),
            Some(("viewer".into(), Role::ReadOnly))
        );
        for bad in [
            None,
            Some(""),
            Some("s3cret-ops"),
            Some("Basic s3cret-ops"),
            Some("Bearer s3cret-op"),
            Some("Bearer s3cret-opsx"),
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
        let t = AdminToken::new("ops", "s3cret-ops", Role::Operator);
        assert!(!format!("{t:?}").contains("s3cret"), "{t:?}");
    }
}
