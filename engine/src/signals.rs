//! In-process fan-out: run status events (SAS-8), the live feed of alerts, the sinks that the
//! outbox delivers notices to, and wake-ups between the scheduler's loops.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, broadcast, mpsc, watch};
use uuid::Uuid;

use crate::model::{Alert, Notice, NoticeTopic};
use crate::{Error, RunState};

const EVENT_CAPACITY: usize = 4096;

/// A status message about a run, published by the engine instance that moved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEvent {
    /// The run.
    pub run_id: Uuid,
    /// Its workflow name.
    pub workflow: String,
    /// Its state after the change.
    pub state: RunState,
}

/// Where the outbox delivers notices (alerts, and finished runs whose start asked to be
/// told): a log, a channel, a webhook, or an application's own.
///
/// The supervisor leader delivers each stored notice to every sink at least once: a sink
/// that fails is tried again with exponential backoff, up to [`DeliveryPolicy::max_attempts`]
/// tries, after which the notice is dead-lettered for that sink (a
/// `delivery_dead_lettered` alert; an operator can send it again). A leader that dies between
/// a delivery and recording it leaves the notice to the next leader, which delivers it again
/// with the same `dedupe_id`: a sink's receiver must tolerate duplicates.
#[async_trait::async_trait]
pub trait NoticeSink: Send + Sync + 'static {
    /// The sink's name: deliveries are recorded under it, so it must be stable across
    /// restarts and unique among an engine's sinks (`log`, `webhook:ops`, …).
    fn name(&self) -> &str;

    /// Whether the sink takes notices of `topic` (default: every topic).
    fn accepts(&self, topic: NoticeTopic) -> bool {
        let _ = topic;
        true
    }

    /// How often and how patiently it is tried.
    fn policy(&self) -> DeliveryPolicy {
        DeliveryPolicy::default()
    }

    /// Delivers one notice. `Ok` once the receiver has it; an error to be tried again (or
    /// given up on, [`DeliveryError::permanent`]).
    async fn deliver(&self, notice: &Notice) -> Result<(), DeliveryError>;
}

/// How a sink is tried: backoff between tries, and how many before the notice is
/// dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryPolicy {
    /// Tries before a notice is dead-lettered for this sink (at least 1).
    pub max_attempts: u32,
    /// Delay after the first failed try; doubled after each one (with jitter).
    pub min_delay: Duration,
    /// The longest delay between two tries.
    pub max_delay: Duration,
    /// How long one try may take before it counts as failed.
    pub timeout: Duration,
}

impl Default for DeliveryPolicy {
    /// 10 tries, 1 s doubling to 5 min (about 20 minutes in all), 10 s per try.
    fn default() -> Self {
        Self {
            max_attempts: 10,
            min_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
        }
    }
}

impl DeliveryPolicy {
    /// A policy of `max_attempts` tries with backoff from `min_delay` to `max_delay`.
    pub fn new(max_attempts: u32, min_delay: Duration, max_delay: Duration) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            min_delay,
            max_delay: max_delay.max(min_delay),
            ..Self::default()
        }
    }

    /// The same with `timeout` per try.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The delay after the `failed`-th failed try (1-based): exponential, with a random part
    /// added so that sinks failing together do not retry together, and never more than
    /// `max_delay`.
    pub fn delay_after(&self, failed: u32) -> Duration {
        use backon::BackoffBuilder as _;
        backon::ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .without_max_times()
            .with_jitter()
            .build()
            .nth(failed.saturating_sub(1) as usize)
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }
}

/// Why a delivery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct DeliveryError {
    /// What went wrong, in words (stored with the delivery; never a secret).
    pub message: String,
    /// The receiver refused the notice for good: dead-letter it now, without more tries.
    pub permanent: bool,
    /// The receiver asked to be tried again after this long (`Retry-After`).
    pub retry_after: Option<Duration>,
}

impl DeliveryError {
    /// A failure worth trying again.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            permanent: false,
            retry_after: None,
        }
    }

    /// A refusal: the notice is dead-lettered for this sink at once.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            permanent: true,
            retry_after: None,
        }
    }

    /// The same, to be tried again no sooner than `after`.
    #[must_use]
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }
}

/// Logs notices: alerts at `error` level, finished runs at `info`, through `tracing`. An
/// application that installed no `tracing` subscriber would see nothing, so then each
/// notice is written as one line to standard error instead. Every engine has it unless
/// built with `without_log_sink`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogSink;

#[async_trait::async_trait]
impl NoticeSink for LogSink {
    fn name(&self) -> &str {
        "log"
    }

    async fn deliver(&self, n: &Notice) -> Result<(), DeliveryError> {
        let body = n.decoded();
        let alert = body.as_ref().and_then(|b| b.alert.as_ref());
        let run = body.as_ref().and_then(|b| b.run.as_ref());
        if !tracing::dispatcher::has_been_set() {
            let line = match (alert, run) {
                (Some(a), _) => format!(
                    "sagaflow alert {} [{}] run={} step={}: {} (actions: {})",
                    a.id,
                    a.kind,
                    a.run_id.map_or_else(|| "-".into(), |r| r.to_string()),
                    a.step.as_deref().unwrap_or("-"),
                    a.reason,
                    a.actions.join("; ")
                ),
                (None, Some(r)) => {
                    format!(
                        "sagaflow run {} of {} finished: {}",
                        r.id, r.workflow, r.state
                    )
                }
                (None, None) => format!("sagaflow notice {}: {}", n.id, n.body),
            };
            eprintln!("{line}");
            return Ok(());
        }
        match (alert, run) {
            (Some(a), _) => tracing::error!(
                alert_id = a.id,
                run_id = ?a.run_id,
                step = ?a.step,
                kind = %a.kind,
                attempts = a.attempts,
                actions = ?a.actions,
                "operator alert: {}",
                a.reason
            ),
            (None, Some(r)) => tracing::info!(
                run_id = %r.id,
                workflow = %r.workflow,
                state = %r.state,
                "run finished"
            ),
            (None, None) => {
                tracing::warn!(notice = n.id, body = %n.body, "notice of an unknown shape")
            }
        }
        Ok(())
    }
}

/// Hands notices to an application's task through a bounded channel: made with
/// [`ChannelSink::new`], which returns the receiving end. A full channel is tried again
/// later; a dropped receiver dead-letters what is sent to it.
#[derive(Debug, Clone)]
pub struct ChannelSink {
    name: String,
    tx: mpsc::Sender<Notice>,
}

impl ChannelSink {
    /// A sink named `name` and its receiver, holding up to `capacity` notices.
    pub fn new(name: impl Into<String>, capacity: usize) -> (Self, mpsc::Receiver<Notice>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Self {
                name: name.into(),
                tx,
            },
            rx,
        )
    }
}

#[async_trait::async_trait]
impl NoticeSink for ChannelSink {
    fn name(&self) -> &str {
        &self.name
    }

    async fn deliver(&self, n: &Notice) -> Result<(), DeliveryError> {
        self.tx.try_send(n.clone()).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => DeliveryError::transient("the channel is full"),
            mpsc::error::TrySendError::Closed(_) => {
                DeliveryError::permanent("the channel's receiver was dropped")
            }
        })
    }
}

/// The in-process signals of one engine instance, shared by its scheduler, supervisor and
/// public API: run events, alerts, wake-ups between loops, and the fatal error.
pub struct Signals {
    events: broadcast::Sender<RunEvent>,
    alerts: broadcast::Sender<Alert>,
    sinks: Vec<Arc<dyn NoticeSink>>,
    /// Wakes the claim loop (new ready steps).
    claim: Notify,
    /// Wakes the evaluation loop (runs marked dirty).
    eval: Notify,
    /// Wakes the outbox's delivery (this instance stored a notice).
    notices: Notify,
    /// The error that stopped the engine for good, once there is one.
    fatal: watch::Sender<Option<Error>>,
}

impl fmt::Debug for Signals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signals")
            .field("sinks", &self.sinks.len())
            .finish_non_exhaustive()
    }
}

impl Signals {
    /// A signals whose outbox delivers to `sinks` (plus in-process subscribers).
    pub fn new(sinks: Vec<Arc<dyn NoticeSink>>) -> Self {
        Self {
            events: broadcast::channel(EVENT_CAPACITY).0,
            alerts: broadcast::channel(EVENT_CAPACITY).0,
            sinks,
            claim: Notify::new(),
            eval: Notify::new(),
            notices: Notify::new(),
            fatal: watch::channel(None).0,
        }
    }

    /// Wakes the claim loop: steps became due. A wake-up with nobody waiting is kept for
    /// the next wait, so none is lost.
    pub fn wake_claimer(&self) {
        self.claim.notify_one();
    }

    /// Wakes the evaluation loop: runs were marked for evaluation.
    pub fn wake_evaluator(&self) {
        self.eval.notify_one();
    }

    /// Waits for [`Signals::wake_claimer`] (or a wake-up given while nobody waited).
    pub async fn claimer_woken(&self) {
        self.claim.notified().await;
    }

    /// Waits for [`Signals::wake_evaluator`].
    pub async fn evaluator_woken(&self) {
        self.eval.notified().await;
    }

    /// Records the error that stops this engine instance for good (its database is lost).
    /// The first one wins and is logged once; later calls change nothing.
    pub fn fail(&self, error: Error) {
        let first = self.fatal.send_if_modified(|f| {
            if f.is_some() {
                return false;
            }
            *f = Some(error.clone());
            true
        });
        if first {
            tracing::error!(error = %error, "sagaflow engine stopped: its database is lost");
        }
    }

    /// The error that stopped this engine, if one did.
    pub fn fatal(&self) -> Option<Error> {
        self.fatal.borrow().clone()
    }

    /// Waits until a fatal error is recorded, and returns it.
    pub async fn fatal_error(&self) -> Error {
        let mut rx = self.fatal.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(f) => f.clone().unwrap_or(Error::Shutdown),
            // The signals outlives every waiter that holds a reference to it.
            Err(_) => Error::Shutdown,
        }
    }

    /// Subscribes to run status events.
    pub fn subscribe_events(&self) -> broadcast::Receiver<RunEvent> {
        self.events.subscribe()
    }

    /// Subscribes to alerts.
    pub fn subscribe_alerts(&self) -> broadcast::Receiver<Alert> {
        self.alerts.subscribe()
    }

    /// Publishes a status event (dropped when nobody listens).
    pub fn publish(&self, event: RunEvent) {
        let _ = self.events.send(event);
    }

    /// Publishes a stored alert to this instance's live subscribers, and wakes the delivery
    /// of the outbox, which hands it (stored with the alert) to the sinks.
    pub fn alert(&self, alert: &Alert) {
        crate::metrics::alert_raised(&alert.kind);
        let _ = self.alerts.send(alert.clone());
        self.wake_delivery();
    }

    /// Wakes the outbox's delivery: a notice was stored.
    pub fn wake_delivery(&self) {
        self.notices.notify_one();
    }

    /// The wake-up of the outbox's delivery.
    pub fn delivery_wake(&self) -> &Notify {
        &self.notices
    }

    /// The sinks the outbox delivers to, in the order configured.
    pub fn sinks(&self) -> &[Arc<dyn NoticeSink>] {
        &self.sinks
    }
}
