//! The webhook sink: POSTs each notice's JSON to a URL, signed with HMAC-SHA256.
//!
//! Each request carries:
//!
//! - `Content-Type: application/json` and the notice's body (a [`crate::NoticeBody`]);
//! - `Sagaflow-Delivery`: the notice's dedupe id, the same on every delivery of the notice;
//! - `Sagaflow-Topic`: `alert` or `run_finished`;
//! - `Sagaflow-Signature: t=<unix seconds>,v1=<hex>`, where `<hex>` is the HMAC-SHA256, keyed
//!   with the shared secret, of the text `<unix seconds>.<body>`. A receiver recomputes it,
//!   compares in constant time and refuses a `t` too far from its clock (a replay);
//!   [`verify_signature`] does all three.
//!
//! A 2xx answer delivers the notice. 408, 425, 429 and 5xx answers and transport errors are
//! tried again with backoff (after `Retry-After` when the answer gives one in seconds); any
//! other answer is a refusal and dead-letters the notice at once.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};
use sagaflow_engine::{
    DeliveryError, DeliveryPolicy, Error, Notice, NoticeSink, NoticeTopic, Result,
};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The least length of a webhook's signing secret.
pub const WEBHOOK_SECRET_MIN_CHARS: usize = 16;

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "Sagaflow-Signature";
/// The header that carries the notice's dedupe id.
pub const DELIVERY_HEADER: &str = "Sagaflow-Delivery";
/// The header that carries the notice's topic.
pub const TOPIC_HEADER: &str = "Sagaflow-Topic";

/// Delivers notices to an HTTP endpoint (see the [module](self) for the request).
#[derive(Clone)]
pub struct WebhookSink {
    name: String,
    url: reqwest::Url,
    secret: String,
    client: reqwest::Client,
    policy: DeliveryPolicy,
    topics: Option<Vec<NoticeTopic>>,
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secret; the URL as `redacted` shows it (its path may hold a token).
        f.debug_struct("WebhookSink")
            .field("name", &self.name)
            .field("url", &redacted(&self.url))
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// The URL as logs, errors and alerts show it: scheme, host and port only. Userinfo and the
/// query may hold credentials, and so may the path: Slack, Discord and Microsoft Teams
/// webhooks carry their secret in it (`/services/T…/B…/<secret>`). A path is shown as `/…`.
fn redacted(url: &reqwest::Url) -> String {
    let path = if url.path().len() > 1 { "/…" } else { "" };
    format!(
        "{}://{}{}{path}",
        url.scheme(),
        url.host_str().unwrap_or(""),
        url.port().map(|p| format!(":{p}")).unwrap_or_default()
    )
}

impl WebhookSink {
    /// A sink named `name` (deliveries are recorded under it: keep it stable) posting to
    /// `url`, signed with `secret` (at least [`WEBHOOK_SECRET_MIN_CHARS`] characters).
    ///
    /// # Errors
    /// [`Error::Config`] for an empty name, a URL that is not `http(s)://`, an `https://` URL
    /// in a build without the `tls` feature, or a short secret. The message never holds the
    /// secret.
    pub fn new(name: impl Into<String>, url: &str, secret: impl Into<String>) -> Result<Self> {
        let name = name.into();
        let secret = secret.into();
        if name.trim().is_empty() {
            return Err(Error::Config("a webhook sink needs a name".into()));
        }
        let url = reqwest::Url::parse(url).map_err(|e| {
            Error::Config(format!("webhook sink `{name}`: the URL is not valid: {e}"))
        })?;
        match url.scheme() {
            "http" => {}
            "https" if cfg!(feature = "tls") => {}
            "https" => {
                return Err(Error::Config(format!(
                    "webhook sink `{name}`: https URLs need sagaflow's `tls` feature"
                )));
            }
            other => {
                return Err(Error::Config(format!(
                    "webhook sink `{name}`: the URL's scheme must be http or https, not `{other}`"
                )));
            }
        }
        if secret.chars().count() < WEBHOOK_SECRET_MIN_CHARS {
            return Err(Error::Config(format!(
                "webhook sink `{name}`: the signing secret must have at least {WEBHOOK_SECRET_MIN_CHARS} characters"
            )));
        }
        let policy = DeliveryPolicy::default();
        let client = reqwest::Client::builder()
            .timeout(policy.timeout)
            // A redirect is not followed: the signed notice would go to wherever the answer
            // points. It is a refusal (the notice is dead-lettered); fix the URL instead.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("sagaflow/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Config(format!("webhook sink `{name}`: {e}")))?;
        Ok(Self {
            name,
            url,
            secret,
            client,
            policy,
            topics: None,
        })
    }

    /// Tries and backoff (default: [`DeliveryPolicy::default`]).
    #[must_use]
    pub fn with_policy(mut self, policy: DeliveryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Posts only notices of these topics (default: all).
    #[must_use]
    pub fn only(mut self, topics: &[NoticeTopic]) -> Self {
        self.topics = Some(topics.to_vec());
        self
    }
}

/// The signature header's value for `body` at `unix_secs`.
pub fn sign(secret: &str, unix_secs: i64, body: &[u8]) -> String {
    format!(
        "t={unix_secs},v1={}",
        hex::encode(mac(secret, unix_secs, body))
    )
}

fn mac(secret: &str, unix_secs: i64, body: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: this cannot fail.
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    m.update(unix_secs.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m.finalize().into_bytes().to_vec()
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The header is not `t=<seconds>,v1=<hex>`.
    #[error("the signature header is malformed")]
    Malformed,
    /// `t` is further from the receiver's clock than the tolerance.
    #[error("the signature's time is {0} s away from this clock")]
    Stale(i64),
    /// The MAC does not match.
    #[error("the signature does not match")]
    Mismatch,
}

/// Checks a [`SIGNATURE_HEADER`] value for `body`: well formed, made with `secret`, and
/// stamped within `tolerance` of `now_unix` (seconds). For receivers written in Rust.
///
/// # Errors
/// [`SignatureError`].
pub fn verify_signature(
    secret: &str,
    header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance: Duration,
) -> std::result::Result<(), SignatureError> {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("v1", v)) => v1 = hex::decode(v).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return Err(SignatureError::Malformed);
    };
    let skew = now_unix.saturating_sub(t);
    if skew.unsigned_abs() > tolerance.as_secs() {
        return Err(SignatureError::Stale(skew));
    }
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    m.verify_slice(&v1).map_err(|_| SignatureError::Mismatch)
}

#[async_trait::async_trait]
impl NoticeSink for WebhookSink {
    fn name(&self) -> &str {
        &self.name
    }

    fn accepts(&self, topic: NoticeTopic) -> bool {
        self.topics.as_ref().is_none_or(|t| t.contains(&topic))
    }

    fn policy(&self) -> DeliveryPolicy {
        self.policy
    }

    async fn deliver(&self, n: &Notice) -> std::result::Result<(), DeliveryError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let answer = self
            .client
            .post(self.url.clone())
            .timeout(self.policy.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(DELIVERY_HEADER, &n.dedupe_id)
            .header(TOPIC_HEADER, n.topic.as_ref())
            .header(SIGNATURE_HEADER, sign(&self.secret, now, n.body.as_bytes()))
            .body(n.body.clone())
            .send()
            .await
            .map_err(|e| {
                // Without the URL: reqwest's message names it, and it may hold a token.
                DeliveryError::transient(format!(
                    "could not post to {}: {}",
                    redacted(&self.url),
                    e.without_url()
                ))
            })?;
        let status = answer.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = answer
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let code = status.as_u16();
        let message = if status.is_redirection() {
            format!(
                "{} answered {status}: redirects are not followed (a signed notice goes only to the configured URL); configure the URL it redirects to",
                redacted(&self.url)
            )
        } else {
            format!("{} answered {status}", redacted(&self.url))
        };
        if status.is_server_error() || matches!(code, 408 | 425 | 429) {
            let e = DeliveryError::transient(message);
            return Err(match retry_after {
                Some(d) => e.retry_after(d),
                None => e,
            });
        }
        Err(DeliveryError::permanent(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_and_a_changed_body_or_old_stamp_does_not() {
        let header = sign("0123456789abcdef", 1_700_000_000, b"{\"a\":1}");
        let ok = verify_signature(
            "0123456789abcdef",
            &header,
            b"{\"a\":1}",
            1_700_000_010,
            Duration::from_secs(300),
        );
        assert_eq!(ok, Ok(()));
        let tampered = verify_signature(
            "0123456789abcdef",
            &header,
            b"{\"a\":2}",
            1_700_000_010,
            Duration::from_secs(300),
        );
        assert_eq!(tampered, Err(SignatureError::Mismatch));
        let replayed = verify_signature(
            "0123456789abcdef",
            &header,
            b"{\"a\":1}",
            1_700_001_000,
            Duration::from_secs(300),
        );
        assert_eq!(replayed, Err(SignatureError::Stale(1000)));
        assert_eq!(
            verify_signature("0123456789abcdef", "v1=zz", b"", 0, Duration::ZERO),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn bad_configurations_are_refused_without_the_secret() {
        let short = WebhookSink::new("ops", "http://127.0.0.1:9/hook", "tooshort")
            .expect_err("short secret");
        assert!(short.to_string().contains("16 characters"), "{short}");
        assert!(!short.to_string().contains("tooshort"));
        let scheme =
            WebhookSink::new("ops", "ftp://x/y", "0123456789abcdef").expect_err("bad scheme");
        assert!(scheme.to_string().contains("scheme"), "{scheme}");
        let sink = WebhookSink::new(
            "ops",
            "http://u:pw@127.0.0.1:9/services/T01/B02/pathsecret?token=t",
            "0123456789abcdef",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let shown = format!("{sink:?}");
        assert!(
            !shown.contains("pw")
                && !shown.contains("token")
                && !shown.contains("pathsecret")
                && !shown.contains("0123456789abcdef"),
            "{shown}"
        );
        assert!(shown.contains("http://127.0.0.1:9/…"), "{shown}");
    }
}
