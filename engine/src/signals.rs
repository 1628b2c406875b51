//! In-process fan-out: run status events (SAS-8), alert delivery, and wake-ups between the
//! scheduler's loops.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{Notify, broadcast, watch};
use uuid::Uuid;

use crate::model::Alert;
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

/// Receives every alert after it has been stored.
pub trait AlertSink: Send + Sync + 'static {
    /// Delivers one alert. Must not block: hand the alert off and return.
    fn deliver(&self, alert: &Alert);
}

/// Logs alerts at `error` level.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingSink;

impl AlertSink for TracingSink {
    fn deliver(&self, a: &Alert) {
        tracing::error!(
            alert_id = a.id,
            run_id = ?a.run_id,
            step = ?a.step,
            kind = %a.kind,
            attempts = a.attempts,
            actions = ?a.actions,
            "operator alert: {}",
            a.reason
        );
    }
}

/// The in-process signals of one engine instance, shared by its scheduler, supervisor and
/// public API: run events, alerts, wake-ups between loops, and the fatal error.
pub struct Signals {
    events: broadcast::Sender<RunEvent>,
    alerts: broadcast::Sender<Alert>,
    sinks: Vec<Arc<dyn AlertSink>>,
    /// Wakes the claim loop (new ready steps).
    claim: Notify,
    /// Wakes the evaluation loop (runs marked dirty).
    eval: Notify,
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
    /// A signals delivering alerts to `sinks` (plus in-process subscribers).
    pub fn new(sinks: Vec<Arc<dyn AlertSink>>) -> Self {
        Self {
            events: broadcast::channel(EVENT_CAPACITY).0,
            alerts: broadcast::channel(EVENT_CAPACITY).0,
            sinks,
            claim: Notify::new(),
            eval: Notify::new(),
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

    /// Delivers a stored alert to every sink and subscriber.
    pub fn alert(&self, alert: &Alert) {
        crate::metrics::alert_raised(&alert.kind);
        for s in &self.sinks {
            s.deliver(alert);
        }
        let _ = self.alerts.send(alert.clone());
    }
}
