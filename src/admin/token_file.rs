//! Tokens read from a file: one token per line, `name role secret`.
//!
//! ```text
//! # who        role        secret
//! ops          operator    9f2c6b1e0d8a4c7f93b5e2a1d6c4f8b0
//! dashboards   read-only   4e7a1c9b3f6d2e8a0c5b7f1d9e3a6c2b
//! ```
//!
//! Fields are separated by spaces or tabs; blank lines and lines starting with `#` are
//! skipped. A name (letters, digits, `-`, `_`, `.`) says who acted in history (`api:<name>`)
//! and logs; the role is `read-only` or `operator`; the secret, at least
//! [`TOKEN_SECRET_MIN_CHARS`] characters, is what a caller sends as `Authorization: Bearer`.
//! Errors name the file and the line, never a secret.

use std::path::{Path, PathBuf};

use super::{AdminConfig, AdminToken, Role};

/// Environment variable naming the token file read by [`AdminConfig::from_env_or_file`].
pub const ADMIN_TOKEN_FILE_ENV: &str = "SAGAFLOW_ADMIN_TOKEN_FILE";

/// The shortest secret a token may have, in characters (in a token file, in
/// [`ADMIN_TOKEN_ENV`](super::ADMIN_TOKEN_ENV), through [`AdminToken::new`]).
pub const TOKEN_SECRET_MIN_CHARS: usize = 16;

/// Why a token file was refused. No variant holds a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("cannot read the token file {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("the token file {} holds no token (one `name role secret` per line)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A line is not `name role secret`.
    #[error(
        "{}:{line}: expected three fields, `name role secret`, separated by spaces",
        path.display()
    )]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
    },
    /// A name with other characters than letters, digits, `-`, `_` and `.`.
    #[error(
        "{}:{line}: a token name may hold only letters, digits, `-`, `_` and `.`",
        path.display()
    )]
    InvalidName {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
    },
    /// A role other than `read-only` and `operator`.
    #[error(
        "{}:{line}: unknown role for token `{name}` (use `read-only` or `operator`)",
        path.display()
    )]
    UnknownRole {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// The token's name.
        name: String,
    },
    /// A name used by an earlier line.
    #[error("{}:{line}: token name `{name}` is already used on line {first}", path.display())]
    DuplicateName {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// The name.
        name: String,
        /// The line that used it first.
        first: usize,
    },
    /// A secret used by an earlier line (the two tokens could not be told apart).
    #[error(
        "{}:{line}: token `{name}` has the same secret as `{other}` on line {first}",
        path.display()
    )]
    DuplicateSecret {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// The token's name.
        name: String,
        /// The token that has it first.
        other: String,
        /// Its line.
        first: usize,
    },
    /// The environment variable holds a secret shorter than [`TOKEN_SECRET_MIN_CHARS`].
    #[error("{var} has {chars} characters, fewer than the {TOKEN_SECRET_MIN_CHARS} required")]
    WeakEnvToken {
        /// The variable.
        var: &'static str,
        /// How many characters it has.
        chars: usize,
    },
    /// Other users than the owner may write the file: anyone of them could add a token.
    #[error(
        "the token file {} may be written by other users than its owner (mode {mode:o}): \
         `chmod 600` it",
        path.display()
    )]
    Writable {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A secret shorter than [`TOKEN_SECRET_MIN_CHARS`].
    #[error(
        "{}:{line}: the secret of token `{name}` has {chars} characters, fewer than the \
         {TOKEN_SECRET_MIN_CHARS} required",
        path.display()
    )]
    ShortSecret {
        /// The file.
        path: PathBuf,
        /// The line (1-based).
        line: usize,
        /// The token's name.
        name: String,
        /// How many characters it has.
        chars: usize,
    },
}

fn valid_name(name: &str) -> bool {
    name.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Reads the tokens of a file's text (see the module documentation).
fn parse(path: &Path, text: &str) -> Result<Vec<AdminToken>, TokenFileError> {
    let path = || path.to_owned();
    // name, line, secret
    let mut seen: Vec<(String, usize, String)> = Vec::new();
    let mut tokens = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        let [name, role, secret] = fields[..] else {
            return Err(TokenFileError::Malformed { path: path(), line });
        };
        if !valid_name(name) {
            return Err(TokenFileError::InvalidName { path: path(), line });
        }
        let role = match role {
            "read-only" => Role::ReadOnly,
            "operator" => Role::Operator,
            _ => {
                return Err(TokenFileError::UnknownRole {
                    path: path(),
                    line,
                    name: name.to_owned(),
                });
            }
        };
        let chars = secret.chars().count();
        if chars < TOKEN_SECRET_MIN_CHARS {
            return Err(TokenFileError::ShortSecret {
                path: path(),
                line,
                name: name.to_owned(),
                chars,
            });
        }
        if let Some((_, first, _)) = seen.iter().find(|(n, _, _)| n == name) {
            return Err(TokenFileError::DuplicateName {
                path: path(),
                line,
                name: name.to_owned(),
                first: *first,
            });
        }
        if let Some((other, first, _)) = seen.iter().find(|(_, _, s)| s == secret) {
            return Err(TokenFileError::DuplicateSecret {
                path: path(),
                line,
                name: name.to_owned(),
                other: other.clone(),
                first: *first,
            });
        }
        seen.push((name.to_owned(), line, secret.to_owned()));
        tokens.push(AdminToken::new(name, secret, role).map_err(|e| {
            TokenFileError::ShortSecret {
                path: path(),
                line,
                name: name.to_owned(),
                chars: e.chars,
            }
        })?);
    }
    if tokens.is_empty() {
        return Err(TokenFileError::Empty { path: path() });
    }
    Ok(tokens)
}

/// Refuses a file that other users than the owner may write (they could add a token of
/// their own); warns when they may read it.
#[cfg(unix)]
fn check_shared(path: &Path) -> Result<(), TokenFileError> {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o022 != 0 {
            return Err(TokenFileError::Writable {
                path: path.to_owned(),
                mode: mode & 0o777,
            });
        }
        if mode & 0o077 != 0 {
            tracing::warn!(
                file = %path.display(),
                mode = format!("{:o}", mode & 0o777),
                "the token file is readable by other users than its owner: `chmod 600` it"
            );
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_shared(_path: &Path) -> Result<(), TokenFileError> {
    Ok(())
}

impl AdminConfig {
    /// The tokens of a token file, with the default body limit. The file holds one token per
    /// line, `name role secret`, separated by spaces or tabs; blank lines and lines starting
    /// with `#` are skipped. A name (letters, digits, `-`, `_`, `.`) says who acted in history
    /// (`api:<name>`); the role is `read-only` or `operator`; the secret, at least
    /// [`TOKEN_SECRET_MIN_CHARS`] characters, is what a caller sends as a bearer token.
    ///
    /// ```text
    /// # who        role        secret
    /// ops          operator    9f2c6b1e0d8a4c7f93b5e2a1d6c4f8b0
    /// dashboards   read-only   4e7a1c9b3f6d2e8a0c5b7f1d9e3a6c2b
    /// ```
    ///
    /// On unix, a file that other users than its owner may write is refused
    /// ([`TokenFileError::Writable`]); one they may only read is loaded with a warning.
    ///
    /// # Errors
    /// [`TokenFileError`], naming the file and the line, never a secret.
    pub fn from_token_file(path: impl AsRef<Path>) -> Result<Self, TokenFileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        check_shared(path)?;
        let tokens = parse(path, &text)?;
        Ok(tokens
            .into_iter()
            .fold(Self::new(), |config, t| config.with_token(t)))
    }

    /// The tokens of the file that [`ADMIN_TOKEN_FILE_ENV`] names when it is set and not
    /// empty; otherwise as [`AdminConfig::from_env`] (the operator token of
    /// [`ADMIN_TOKEN_ENV`](super::ADMIN_TOKEN_ENV), if set).
    ///
    /// # Errors
    /// [`TokenFileError`] when the named file is refused.
    pub fn from_env_or_file() -> Result<Self, TokenFileError> {
        match std::env::var_os(ADMIN_TOKEN_FILE_ENV) {
            Some(file) if !file.is_empty() => Self::from_token_file(file),
            _ => Self::from_env(),
        }
    }

    /// The configured tokens (names and roles; secrets are never printed).
    pub fn tokens(&self) -> &[AdminToken] {
        &self.tokens
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{TokenFileError, parse};
    use crate::admin::Role;

    const A: &str = "aaaaaaaaaaaaaaaa-secret";
    const B: &str = "bbbbbbbbbbbbbbbb-secret";

    fn load(text: &str) -> Result<Vec<(String, Role)>, TokenFileError> {
        parse(Path::new("tokens"), text)
            .map(|ts| ts.iter().map(|t| (t.name().to_owned(), t.role())).collect())
    }

    /// The error's text, checked never to show a secret of the file.
    fn refused(text: &str) -> String {
        let e = load(text).expect_err("refused").to_string();
        for s in [A, B, "short-secret"] {
            assert!(!e.contains(s), "a secret in {e:?}");
        }
        e
    }

    #[test]
    fn a_file_gives_named_tokens_with_roles_and_skips_comments_and_blank_lines() {
        let text = format!("# who role secret\n\n  ops operator {A}\nviewer\tread-only\t{B}  \n");
        assert_eq!(
            load(&text).expect("loaded"),
            [
                ("ops".to_owned(), Role::Operator),
                ("viewer".to_owned(), Role::ReadOnly)
            ]
        );
    }

    #[test]
    fn each_refusal_names_its_line_and_no_secret() {
        for (text, says) in [
            (String::new(), "holds no token".to_owned()),
            (
                "# only a comment\n\n".to_owned(),
                "holds no token".to_owned(),
            ),
            (
                "ops operator\n".to_owned(),
                "tokens:1: expected three fields".to_owned(),
            ),
            (
                format!("ops operator {A} extra\n"),
                "tokens:1: expected three fields".to_owned(),
            ),
            (
                format!("# c\nops admin {A}\n"),
                "tokens:2: unknown role for token `ops`".to_owned(),
            ),
            (
                format!("o/ps operator {A}\n"),
                "tokens:1: a token name may hold only".to_owned(),
            ),
            (
                format!("ops operator {A}\nops read-only {B}\n"),
                "tokens:2: token name `ops` is already used on line 1".to_owned(),
            ),
            (
                format!("ops operator {A}\nviewer read-only {A}\n"),
                "tokens:2: token `viewer` has the same secret as `ops` on line 1".to_owned(),
            ),
            (
                "ops operator short-secret\n".to_owned(),
                "tokens:1: the secret of token `ops` has 12 characters, fewer than the 16"
                    .to_owned(),
            ),
        ] {
            let e = refused(&text);
            assert!(e.contains(&says), "{text:?}: {e}");
        }
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("absent");
        let e = crate::admin::AdminConfig::from_token_file(&missing).expect_err("refused");
        assert!(matches!(e, TokenFileError::Unreadable { .. }), "{e:?}");
        assert!(e.to_string().contains("absent"), "{e}");
    }

    #[test]
    fn a_loaded_file_configures_its_tokens() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, format!("ops operator {A}\n")).expect("write");
        let config = crate::admin::AdminConfig::from_token_file(&file).expect("loaded");
        assert!(config.has_tokens());
        assert_eq!(config.tokens()[0].name(), "ops");
        assert!(!format!("{config:?}").contains(A));
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, format!("ops operator {A}\n")).expect("write");
        for mode in [0o666, 0o620, 0o602] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = crate::admin::AdminConfig::from_token_file(&file).expect_err("refused");
            assert!(
                matches!(e, TokenFileError::Writable { .. }),
                "{mode:o}: {e:?}"
            );
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        for mode in [0o600, 0o644] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).expect("chmod");
            assert!(
                crate::admin::AdminConfig::from_token_file(&file).is_ok(),
                "{mode:o}"
            );
        }
    }
}
