//! `--webhook URL`: the demo's alerts also go to a webhook, through the engine's outbox (at
//! least once, signed). Before a normal exit the demo gives the leader a few seconds to hand
//! over what is pending, and its summary says where the alert notices stand.

use std::time::Duration;

use sagaflow::{DeliveryCounts, DeliveryPolicy, Engine, NoticeTopic, WebhookSink};

use super::DemoResult;
use super::cli::Args;

/// The sink's name, under which its deliveries are recorded: the same on every demo, so a
/// demo run again on a database delivers what an earlier one left pending.
pub(crate) const WEBHOOK_SINK: &str = "webhook";

/// How long a demo about to exit waits for the webhook's pending deliveries.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// How often the counts are read while waiting.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// The webhook sink of `--webhook`, or `None` without it. Its signing secret comes from the
/// environment variable `--webhook-secret-env` names; the error never holds the secret.
pub(crate) fn webhook_sink(args: &Args) -> Result<Option<WebhookSink>, String> {
    let Some(url) = args.webhook.as_deref() else {
        return Ok(None);
    };
    let var = &args.webhook_secret_env;
    let secret = match std::env::var(var) {
        Ok(s) if !s.trim().is_empty() => s,
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            return Err(format!(
                "--webhook needs a signing secret: set {var} (or name another variable with --webhook-secret-env)"
            ));
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(format!(
                "the webhook's signing secret in {var} is not UTF-8"
            ));
        }
    };
    // A demo lives for seconds, not hours: failed tries are repeated sooner than by default.
    let policy = DeliveryPolicy::new(10, Duration::from_millis(200), Duration::from_secs(5));
    let sink = WebhookSink::new(WEBHOOK_SINK, url, secret)
        .map_err(|e| format!("--webhook: {e}"))?
        .with_policy(policy)
        .only(&[NoticeTopic::Alert]);
    Ok(Some(sink))
}

/// Waits, a few seconds at most, until no alert notice is pending for the webhook; returns
/// where the notices stand then.
pub(crate) async fn drain(engine: &Engine) -> DemoResult<DeliveryCounts> {
    let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
    loop {
        let counts = engine.delivery_counts(WEBHOOK_SINK).await?;
        if counts.pending == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(counts);
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// The summary's note on the webhook, beside the count delivered: `alert notices delivered ·
/// 0 pending · 0 dead`, with what a pending or dead notice means.
pub(crate) fn note(c: &DeliveryCounts) -> String {
    let mut note = format!(
        "alert notices delivered · {} pending · {} dead",
        c.pending, c.dead
    );
    if c.pending > 0 {
        note.push_str(" (the next engine on this database delivers them)");
    }
    if c.dead > 0 {
        note.push_str(" (see the delivery_dead_lettered alert)");
    }
    note
}
